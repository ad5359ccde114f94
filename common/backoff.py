"""Retry delays that grow after each failure and start over after a success (Pulsar's ``Backoff``)."""

from __future__ import annotations

import random
import time
from collections.abc import Callable


class Backoff:
    """Exponential back-off: ``initial`` doubling up to ``max_delay`` seconds, with up to 10% jitter down.

    ``mandatory_stop`` (seconds, 0: none) shortens the one delay that would overshoot that much
    time since the first failure, so a retry happens right at that point, as Pulsar's Backoff does.
    """

    __slots__ = ("_clock", "_first", "_next", "_stop_made", "initial", "mandatory_stop", "max_delay")

    def __init__(
        self,
        initial: float,
        max_delay: float,
        mandatory_stop: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if initial < 0 or max_delay < 0 or mandatory_stop < 0:
            raise ValueError("back-off times must not be negative")
        self.initial = initial
        self.max_delay = max(max_delay, initial)
        self.mandatory_stop = mandatory_stop
        self._clock = clock
        self.reset()

    def reset(self) -> None:
        """Start over from ``initial`` (call after a success)."""
        self._next = self.initial
        self._first: float | None = None
        self._stop_made = False

    def next(self) -> float:
        """The delay before the next retry, in seconds."""
        current = self._next
        self._next = min(self._next * 2, self.max_delay)
        if self.mandatory_stop and not self._stop_made:
            now = self._clock()
            if self._first is None:
                self._first = now
            elapsed = now - self._first
            if elapsed + current > self.mandatory_stop:
                current = max(self.initial, self.mandatory_stop - elapsed)
                self._stop_made = True
        if current > 0.01:  # spread simultaneous retries, never below ``initial``
            current = max(self.initial, current - random.uniform(0, current / 10))
        return current
