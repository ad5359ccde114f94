"""Event-loop lag and GC pause probe: where a server's latency tail comes from.

Off by default (the broker's debug setting ``eventLoopProbeIntervalMs``). When on, a timer asks the
loop to run a callback every interval and records how late it ran: the loop's lag, i.e. how long a
callback that became ready waited behind the others (a long callback, a burst of receipts, another
thread holding the GIL). Cyclic-GC collections are timed through :data:`gc.callbacks`, per
generation. Both feed histograms rendered in Prometheus' text format; a lag or a collection at or
above the warning threshold is also logged. The cost is one timer callback per interval and two
``perf_counter`` calls per collection.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from bisect import bisect_left
from typing import Any

log = logging.getLogger(__name__)

#: Upper bounds (seconds) of the histogram buckets; a publish's latency target is 10-20 ms.
BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


class Histogram:
    """Counts of observations per bucket, their sum and the largest one."""

    __slots__ = ("count", "counts", "max", "sum")

    def __init__(self) -> None:
        self.counts = [0] * (len(BUCKETS_S) + 1)  # the last one is +Inf
        self.count = 0
        self.sum = 0.0
        self.max = 0.0

    def observe(self, value: float) -> None:
        """Record one observation (seconds)."""
        self.counts[bisect_left(BUCKETS_S, value)] += 1
        self.count += 1
        self.sum += value
        if value > self.max:
            self.max = value

    def lines(self, name: str, labels: str) -> list[str]:
        """Prometheus histogram samples; ``labels`` is ``'a="x",b="y"'`` (may be empty)."""
        sep = "," if labels else ""
        out = []
        running = 0
        for bound, n in zip((*map(str, BUCKETS_S), "+Inf"), self.counts, strict=True):
            running += n
            out.append(f'{name}_bucket{{{labels}{sep}le="{bound}"}} {running}')
        out.append(f"{name}_sum{{{labels}}} {self.sum}")
        out.append(f"{name}_count{{{labels}}} {self.count}")
        return out


class LoopProbe:
    """Measures the running loop's lag every ``interval_s`` and the pause of every GC collection."""

    def __init__(self, interval_s: float, warn_s: float) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be positive")
        self.interval_s = interval_s
        self.warn_s = warn_s
        self.lag = Histogram()
        #: Collections of generation 0, 1 and 2.
        self.gc_pauses = (Histogram(), Histogram(), Histogram())
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._due = 0.0
        self._gc_start = 0.0

    def start(self) -> None:
        """Start measuring (on the event loop)."""
        if self._loop is not None:
            return
        self._loop = asyncio.get_running_loop()
        gc.callbacks.append(self._on_gc)
        self._schedule()

    def close(self) -> None:
        """Stop measuring; the histograms keep their counts."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        self._loop = None

    def _schedule(self) -> None:
        assert self._loop is not None
        # Measured with time.monotonic: uvloop's loop.time() is cached per iteration in whole ms.
        self._due = time.monotonic() + self.interval_s
        self._handle = self._loop.call_later(self.interval_s, self._tick)

    def _tick(self) -> None:
        lag = max(0.0, time.monotonic() - self._due)
        self.lag.observe(lag)
        if lag >= self.warn_s:
            log.warning("event loop lag %.1f ms", lag * 1e3)
        if self._loop is not None:
            self._schedule()

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_start = time.perf_counter()
            return
        pause = time.perf_counter() - self._gc_start
        self.gc_pauses[info["generation"]].observe(pause)
        if pause >= self.warn_s:
            log.warning("GC generation %d collection took %.1f ms", info["generation"], pause * 1e3)

    def metric_lines(self, labels: str) -> list[str]:
        """``magnetar_event_loop_lag_seconds`` and ``magnetar_gc_pause_seconds`` (per generation)."""
        sep = "," if labels else ""
        lines = [
            "# HELP magnetar_event_loop_lag_seconds How late the event loop ran a timer due every probe interval",
            "# TYPE magnetar_event_loop_lag_seconds histogram",
            *self.lag.lines("magnetar_event_loop_lag_seconds", labels),
            "# HELP magnetar_gc_pause_seconds Duration of cyclic-GC collections, per generation",
            "# TYPE magnetar_gc_pause_seconds histogram",
        ]
        for gen, hist in enumerate(self.gc_pauses):
            lines += hist.lines("magnetar_gc_pause_seconds", f'{labels}{sep}generation="{gen}"')
        return lines
