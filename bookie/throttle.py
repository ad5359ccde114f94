"""Write-cache throttling: adds held back while the bookie's write cache is full.

BookKeeper holds an add back while the write cache is full and the previous checkpoint is still
flushing, and rejects it with TOO_MANY_REQUESTS once it waited ``max_throttle_time_s``. The
bookie owns the cache; this queue only keeps the held-back adds, their deadlines and the metrics.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from functools import partial
from typing import Any

from .api import BookieError, BookieTooManyRequestsError, BookieUnavailableError, Waiter


class AddThrottle:
    """Held-back adds ``(deadline, args, future)`` in arrival order.

    ``queue`` is public and never replaced, so the bookie's add path can test it without a call.
    """

    def __init__(self, address: str, max_wait_s: float) -> None:
        self._address = address
        self._max_wait_s = max_wait_s
        self.queue: collections.deque[tuple[float, tuple[Any, ...], asyncio.Future[None]]] = collections.deque()
        self._timer: asyncio.TimerHandle | None = None
        #: Adds that waited for room, and adds rejected after the throttle time (metrics).
        self.throttled_adds = 0
        self.rejected_adds = 0

    def hold(self, loop: asyncio.AbstractEventLoop, args: tuple[Any, ...]) -> asyncio.Future[None]:
        """Hold an add back; the future resolves with the add's outcome once it is admitted."""
        fut: asyncio.Future[None] = loop.create_future()
        deadline = loop.time() + self._max_wait_s
        self.queue.append((deadline, args, fut))
        self.throttled_adds += 1
        if self._timer is None:
            self._timer = loop.call_at(deadline, self._expire, loop)
        return fut

    def release(
        self,
        has_room: Callable[[], bool],
        add: Callable[..., asyncio.Future[None] | None],
        refused: Callable[[], BookieError],
    ) -> None:
        """Admit held-back adds in arrival order while ``has_room()``.

        ``add(*args)`` starts one (raising its error, or returning None when the bookie no longer
        takes adds, which fails the add with ``refused()``).
        """
        queue = self.queue
        while queue and has_room():
            _, args, fut = queue.popleft()
            if fut.done():
                continue
            try:
                inner = add(*args)
            except BookieError as e:
                fut.set_exception(e)
                continue
            if inner is None:
                fut.set_exception(refused())
            else:
                inner.add_done_callback(partial(chain, fut))

    def _expire(self, loop: asyncio.AbstractEventLoop) -> None:
        """Reject adds that waited ``max_throttle_time_s`` (BookKeeper: TOO_MANY_REQUESTS)."""
        self._timer = None
        now = loop.time()
        queue = self.queue
        while queue and queue[0][0] <= now:
            _, _, fut = queue.popleft()
            if not fut.done():
                self.rejected_adds += 1
                fut.set_exception(
                    BookieTooManyRequestsError(f"bookie {self._address}: write cache full, the ledger disk is behind")
                )
        if queue:
            self._timer = loop.call_at(queue[0][0], self._expire, loop)

    def fail_all(self, exc: BookieError) -> None:
        """Fail every held-back add with ``exc`` (closing, or the storage failed)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        held = list(self.queue)
        self.queue.clear()
        for _, _, fut in held:
            if not fut.done():
                fut.set_exception(exc)


class HeldGroup:
    """Adds of one call held back one by one: tells the call's single ``done`` once all answered (the first
    error, else ``None``)."""

    __slots__ = ("_done", "_error", "_left")

    def __init__(self, count: int, done: Waiter) -> None:
        self._left = count
        self._done = done
        self._error: BaseException | None = None

    def tell(self, fut: asyncio.Future[None]) -> None:
        """One held add's future is done."""
        exc = BookieUnavailableError("add cancelled") if fut.cancelled() else fut.exception()
        if exc is not None and self._error is None:
            self._error = exc
        self._left -= 1
        if not self._left:
            self._done(self._error)


def chain(outer: asyncio.Future[None], inner: asyncio.Future[None]) -> None:
    """Copy ``inner``'s outcome to ``outer`` (or just consume it if ``outer`` is already done)."""
    if outer.done():
        consume(inner)
    elif inner.cancelled():
        outer.cancel()
    elif (exc := inner.exception()) is not None:
        outer.set_exception(exc)
    else:
        outer.set_result(None)


def consume(fut: asyncio.Future[None]) -> None:
    """Retrieve a future's exception so asyncio does not log it as never retrieved."""
    if not fut.cancelled():
        fut.exception()
