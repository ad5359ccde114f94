"""Lifecycle of the long-running sub-commands (standalone, broker, bookie, autorecovery).

Components close in reverse order of start, each step bounded; SIGTERM and SIGINT ask for an orderly
shutdown; the event loop is uvloop where available.
"""

from __future__ import annotations

import asyncio
import contextlib
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
#: almost no cyclic garbage, so full collections are made rare and young ones less frequent.
GC_THRESHOLDS = (10_000, 10, 1_000)

#: How long the thread holding the GIL may keep it while another thread waits for it (Python's default
#: is 5 ms). The event loop thread is busy under load, and every other thread of a server (the journal
#: writer, the checkpoint flush, executors) needs the GIL back after each blocking call: the journal
#: writer three times per group commit (wakeup, ``pwritev``, ``fdatasync``), so at the default a
#: group's receipts waited up to ~15 ms for the GIL alone. Forced switches happen only while threads
#: contend, so an idle or single-threaded process pays nothing.
SWITCH_INTERVAL_S = 0.0005


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
