"""Broker memory under the benchmark: the process tree's VmRSS sampled in the background during a row.

The sampler is a daemon thread of the measuring process (the bench's own process is idle while worker
processes run a scenario), reading /proc/PID/status of the broker's tree every ``interval`` seconds
(~1 ms of this process's CPU per read, none of the broker's), so the broker's CPU accounting is untouched.
"""

from __future__ import annotations

import statistics
import threading
from collections.abc import Callable, Sequence

MIB = 1024 * 1024

#: Sampling period (seconds) of a row's RSS.
SAMPLE_INTERVAL = 0.5
#: At most this many samples per row (over an hour at 0.5 s): the thread then ends by itself.
MAX_SAMPLES = 10_000


def rss_summary(samples: Sequence[int]) -> tuple[float, float] | None:
    """(median, peak) of RSS samples in bytes, as MiB; None without samples."""
    if not samples:
        return None
    return statistics.median(samples) / MIB, max(samples) / MIB


class RssSampler:
    """Calls ``read`` (bytes, or None when unknown) every ``interval`` seconds from ``start`` to ``stop``."""

    def __init__(
        self, read: Callable[[], int | None], interval: float = SAMPLE_INTERVAL, max_samples: int = MAX_SAMPLES
    ) -> None:
        self._read = read
        self._interval = interval
        self._max = max_samples
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: Samples taken so far, in bytes (appended by the sampling thread only).
        self.samples: list[int] = []

    @property
    def running(self) -> bool:
        """True while the sampling thread runs."""
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Take a first sample now, then one per interval, in a daemon thread."""
        self._thread = threading.Thread(target=self._loop, name="rss-sampler", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while len(self.samples) < self._max:
            value = self._read()
            if value:  # None or 0: the process is gone or not known
                self.samples.append(value)
            if self._stop.wait(self._interval):
                return

    def stop(self) -> list[int]:
        """Stop sampling (waits for the thread, at most one read plus a second) and return the samples."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(1.0 + self._interval)
        return list(self.samples)
