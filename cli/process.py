"""Lifecycle of the long-running sub-commands (standalone, broker, bookie, autorecovery).

Components close in reverse order of start, each step bounded; SIGTERM and SIGINT ask for an orderly
shutdown; the event loop is uvloop where available.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import gc
import logging
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

log = logging.getLogger("magnetar.process")

#: Seconds one component may take to close before shutdown moves on.
CLOSE_TIMEOUT_S = 30.0


class Closers:
    """What to close at shutdown: :meth:`close_all` runs it last-registered first."""

    def __init__(self) -> None:
        self._closers: list[Callable[[], Awaitable[Any]]] = []

    def add(self, closer: Callable[[], Awaitable[Any]]) -> None:
        """Register something to close (after everything registered later)."""
        self._closers.append(closer)

    async def close_all(self) -> None:
        """Close in reverse order of registration; a failing or hanging step is logged and skipped."""
        while self._closers:
            closer = self._closers.pop()
            try:
                await asyncio.wait_for(closer(), CLOSE_TIMEOUT_S)
            except Exception:
                log.exception("error during shutdown")


def stop_on_signals() -> asyncio.Event:
    """An event set by SIGTERM or SIGINT (where the loop supports signal handlers)."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    return stop


#: Cyclic-GC thresholds of the server processes (Python's defaults: 700, 10, 10). A full collection
#: walks every tracked object (entry caches, indexes, cursors: hundreds of thousands under load), and with
#: the defaults it ran often enough to cost ~8 µs of a ~33 µs non-batched publish; the hot paths make
#: almost no cyclic garbage, so full collections are made rare and young ones less frequent. The young
#: generation is kept well above what a publish pipeline holds in flight (~10 tracked objects per SEND
#: awaiting its receipt, 1,000 SENDs per connection by default): at 10,000 a young collection ran ~10 times
#: a second under one non-batched producer, each walking and promoting the in-flight SENDs (~1 µs per
#: message); at 50,000 about once in 6 s (docs/benchmarks.md, "Non-batched publish, round 4").
GC_THRESHOLDS = (50_000, 10, 1_000)

#: How long the thread holding the GIL may keep it while another thread waits for it (Python's default
#: is 5 ms). The event loop thread is busy under load, and every other thread of a server (the journal
#: writer, the checkpoint flush, executors) needs the GIL back after each blocking call: the journal
#: writer three times per group commit (wakeup, ``pwritev``, ``fdatasync``), so at the default a
#: group's receipts waited up to ~15 ms for the GIL alone. Forced switches happen only while threads
#: contend, so an idle or single-threaded process pays nothing.
SWITCH_INTERVAL_S = 0.0005


def freeze_startup_objects() -> None:
    """Take what a server holds once it has started out of the cyclic GC's reach (``gc.freeze``).

    Modules, classes, functions, routes and settings (~40,000 tracked objects) live as long as the
    process, and the collector otherwise walks them again in each older-generation collection: the
    first generation-1 collection under load (20,000 msg/s) stopped the event loop for 50-60 ms.
    Startup's garbage is collected first, so none of it is frozen; frozen objects are still freed by
    reference counting."""
    gc.collect()
    gc.freeze()
    log.debug("froze %d objects alive after start-up", gc.get_freeze_count())


def run_event_loop(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` on uvloop where available (with the server's GC thresholds and GIL switch
    interval); returns its result."""
    gc.set_threshold(*GC_THRESHOLDS)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return asyncio.run(main)
    return uvloop.run(main)


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where the C library has none (musl, macOS)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


class HeapTrimmer:
    """Gives the heap memory Python freed back to the OS every ``interval`` seconds (glibc ``malloc_trim``).

    glibc keeps freed chunks for reuse, and ``free`` returns only the top of a heap to the OS: after a
    burst of large payloads (batched 1 KB publishing holds ~100 KiB entries) most of the freed memory
    lies between live chunks and stays resident. Measured at the peak of ``publish-batched-1KB``: 209 MiB
    resident, 41 MiB in use, 108 MiB free in glibc's arenas; one ``malloc_trim(0)`` took it to 103 MiB in
    10-70 ms. The call runs on a worker thread (it holds one arena lock at a time, so the event loop
    waits only if it allocates from the arena being trimmed). Off unless ``mallocTrimIntervalSeconds``
    is set: under the publish benchmark a 1 s interval doubled the broker CPU per batched message (the pages
    given back are faulted in again at once) and left the RSS peak where it was.
    """

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.trims = 0
        self._task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> bool:
        """Start trimming; False (and nothing started) where ``malloc_trim`` is not available."""
        trim = _malloc_trim()
        if trim is None:
            return False
        self._task = asyncio.get_running_loop().create_task(self._run(trim), name="heap trimmer")
        return True

    async def _run(self, trim: Callable[[int], int]) -> None:
        while True:
            await asyncio.sleep(self.interval)
            await asyncio.to_thread(trim, 0)
            self.trims += 1

    async def close(self) -> None:
        """Stop trimming (waits for a trim in progress)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


def report_leftover_tasks() -> None:
    """After shutdown: every component keeps and cancels its own tasks on close, so name any that outlived it."""
    current = asyncio.current_task()
    leftover = sorted(
        f"{t.get_name()} ({getattr(t.get_coro(), '__qualname__', '?')})"
        for t in asyncio.all_tasks()
        if t is not current and not t.done()
    )
    if leftover:
        log.warning("%d task(s) still pending after shutdown: %s", len(leftover), ", ".join(leftover))
