"""cli/process.py: the event-loop runner of the server processes."""

from __future__ import annotations

import gc
import sys
import threading
import time
from pathlib import Path

from magnetar.broker.config import BrokerConfig
from magnetar.cli.process import GC_THRESHOLDS, SWITCH_INTERVAL_S, run_event_loop


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


def test_young_generation_holds_more_than_a_connections_sends_in_flight() -> None:
    """Each SEND awaiting its receipt holds ~10 tracked objects (slot, partials, pending add, callbacks);
    a young generation no bigger than that window was collected ~10 times a second under one producer."""
    in_flight = BrokerConfig().max_pending_publish_requests_per_connection * 10
    assert GC_THRESHOLDS[0] >= 5 * in_flight


def test_event_loop_runs_with_a_short_gil_switch_interval() -> None:
    """The journal writer and checkpoint threads need the GIL back while the loop is busy."""
    before = sys.getswitchinterval()

    async def main() -> float:
        return sys.getswitchinterval()

    try:
        assert run_event_loop(main()) == SWITCH_INTERVAL_S
        assert SWITCH_INTERVAL_S <= 0.001
    finally:
        sys.setswitchinterval(before)


def test_a_thread_back_from_a_syscall_waits_little_for_a_busy_loop() -> None:
    """A thread returning from a blocking call (the journal's fdatasync) gets the GIL within about
    the switch interval while the event loop runs Python code; at Python's default that is ~5 ms a
    time, three times per journal group commit."""
    before = sys.getswitchinterval()
    waits: list[float] = []

    def syscall_thread(stop: threading.Event) -> None:
        for _ in range(40):  # bounded
            if stop.is_set():
                break
            t = time.perf_counter()
            time.sleep(0.001)  # releases the GIL like os.fdatasync
            waits.append(time.perf_counter() - t - 0.001)

    async def main() -> None:
        stop = threading.Event()
        th = threading.Thread(target=syscall_thread, args=(stop,))
        th.start()
        deadline = time.monotonic() + 5.0
        while th.is_alive() and time.monotonic() < deadline:  # a busy loop: one long Python callback
            sum(range(100))
        stop.set()
        th.join(5.0)

    try:
        run_event_loop(main())
    finally:
        sys.setswitchinterval(before)
    waits.sort()
    assert len(waits) >= 20
    assert waits[len(waits) // 2] < 0.0025, f"median GIL wait {waits[len(waits) // 2] * 1e3:.2f} ms"


def _rss_anon_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1])
    raise AssertionError("no RssAnon in /proc/self/status")


def test_heap_trimmer_gives_freed_heap_back_and_stops_on_close() -> None:
    """Freed small objects stay in glibc's heap (RSS) until malloc_trim; the trimmer calls it periodically."""
    import asyncio

    from magnetar.cli.process import HeapTrimmer

    async def main() -> tuple[int, int, int, bool]:
        trimmer = HeapTrimmer(0.05)
        assert trimmer.start(), "glibc malloc_trim is available on Linux"
        # ~64 MiB of 100 KiB chunks, every other one kept: the freed half is fragmented (not at the heap's
        # top), which free() alone never returns to the OS.
        blocks = [bytearray(100 * 1024) for _ in range(640)]
        kept = blocks[::2]
        del blocks
        before = _rss_anon_kib()
        trims_before = trimmer.trims
        for _ in range(100):  # bounded: up to 5 s
            await asyncio.sleep(0.05)
            if trimmer.trims >= trims_before + 2:
                break
        after = _rss_anon_kib()
        await trimmer.close()
        assert kept
        return before, after, trimmer.trims - trims_before, trimmer.running

    before, after, trims, running = run_event_loop(main())
    assert trims >= 2
    assert before - after > 16 * 1024, (before, after)  # most of the ~32 MiB freed went back
    assert not running
