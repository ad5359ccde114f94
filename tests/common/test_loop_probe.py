"""common/loop_probe.py: the debug event-loop lag and GC pause probe."""

from __future__ import annotations

import asyncio
import gc
import logging
import time

import pytest

from magnetar.common.loop_probe import BUCKETS_S, Histogram, LoopProbe


def test_histogram_buckets_are_cumulative() -> None:
    h = Histogram()
    for v in (0.0001, 0.003, 0.003, 0.07, 5.0):
        h.observe(v)
    lines = h.lines("x", 'a="b"')
    buckets = [line for line in lines if line.startswith("x_bucket")]
    assert len(buckets) == len(BUCKETS_S) + 1
    assert buckets[0] == 'x_bucket{a="b",le="0.0005"} 1'
    assert 'x_bucket{a="b",le="0.005"} 3' in buckets
    assert 'x_bucket{a="b",le="0.1"} 4' in buckets
    assert buckets[-1] == 'x_bucket{a="b",le="+Inf"} 5'
    assert 'x_count{a="b"} 5' in lines and h.max == 5.0


def block_loop(seconds: float) -> None:
    """Hold the calling thread (here: the event loop) without yielding."""
    time.sleep(seconds)


def test_a_blocked_loop_shows_as_lag_and_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> LoopProbe:
        probe = LoopProbe(0.005, warn_s=0.04)
        probe.start()
        try:
            await asyncio.sleep(0.05)
            block_loop(0.08)  # one callback holding the loop, as a burst of receipts or a long scan would
            await asyncio.sleep(0.05)
        finally:
            probe.close()
        return probe

    with caplog.at_level(logging.WARNING, logger="magnetar.common.loop_probe"):
        probe = asyncio.run(main())
    assert probe.lag.count >= 5
    assert probe.lag.max >= 0.06
    assert any("event loop lag" in r.getMessage() for r in caplog.records)


def test_gc_collections_are_timed_per_generation_until_closed() -> None:
    async def main() -> LoopProbe:
        probe = LoopProbe(1.0, warn_s=10.0)
        probe.start()
        gc.collect()
        gc.collect(0)
        probe.close()
        gc.collect()  # after close: not counted
        return probe

    probe = asyncio.run(main())
    assert probe.gc_pauses[2].count == 1 and probe.gc_pauses[2].sum > 0
    assert probe.gc_pauses[0].count >= 1
