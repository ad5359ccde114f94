"""cli/process.py: the event-loop runner of the server processes."""

from __future__ import annotations

import gc

from magnetar.cli.process import GC_THRESHOLDS, run_event_loop


def test_event_loop_runs_with_the_server_gc_thresholds() -> None:
    """Full collections over a broker's heap cost a quarter of a non-batched publish at Python's defaults."""
    before = gc.get_threshold()

    async def main() -> tuple[int, int, int]:
        return gc.get_threshold()

    try:
        assert run_event_loop(main()) == GC_THRESHOLDS
        assert GC_THRESHOLDS[2] >= 100 * 10  # full collections at most a hundredth as often as the default
    finally:
        gc.set_threshold(*before)
