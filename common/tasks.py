"""Keeping background tasks: every fire-and-forget task belongs to a :class:`TaskSet` of its owner.

asyncio holds only a weak reference to a running task, so an unreferenced task can vanish
mid-flight, its exception is reported (if ever) only when it is garbage collected, and at shutdown
it is destroyed while pending. A ``TaskSet`` keeps a strong reference until the task finishes,
logs a failure once when it happens, and cancels and awaits what is left when its owner closes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

log = logging.getLogger(__name__)


class TaskSet:
    """The background tasks of one owner (a connection, topic, dispatcher, managed ledger...).

    ``expected`` lists exception types that are part of normal operation (a peer went away, a
    ledger was closed): they are logged as one warning line, anything else with its traceback.
    Callers that care about a task's outcome can still await the task :meth:`spawn` returns.
    """

    __slots__ = ("_closed", "_expected", "_log", "_owner", "_tasks", "name")

    def __init__(
        self,
        name: str,
        *,
        owner: object = None,
        expected: tuple[type[BaseException], ...] = (),
        logger: logging.Logger | None = None,
    ) -> None:
        self.name = name
        #: Appended to ``name`` in log lines (``"dispatcher", owner=sub_name``): per-topic sets keep
        #: their owner's existing name or id instead of a formatted string of their own each.
        self._owner = owner
        self._expected = expected
        self._log = logger or log
        # Made on the first spawn and dropped when empty again: most sets (one per topic, ledger,
        # dispatcher...) are empty most of the time, and an empty set costs 216 bytes.
        self._tasks: set[asyncio.Task[Any]] | None = None
        self._closed = False

    @property
    def label(self) -> str:
        """``name``, followed by the owner when one was given (for log lines)."""
        return self.name if self._owner is None else f"{self.name} {self._owner}"

    def __len__(self) -> int:
        """Tasks still running."""
        return len(self._tasks or ())

    @property
    def closed(self) -> bool:
        """True once :meth:`cancel` or :meth:`close` was called."""
        return self._closed

    def spawn(self, coro: Coroutine[Any, Any, T], *, name: str | None = None) -> asyncio.Task[T]:
        """Run ``coro`` as a task kept until it finishes.

        On a closed set the task is cancelled before it starts (its owner is gone), so nothing
        outlives :meth:`close`.
        """
        task = asyncio.get_running_loop().create_task(coro, name=name)
        if self._closed:
            task.cancel()
            return task
        if self._tasks is None:
            self._tasks = set()
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        if self._tasks is not None:
            self._tasks.discard(task)
            if not self._tasks:
                self._tasks = None
        self._report(task)

    def _report(self, task: asyncio.Task[Any]) -> None:
        if task.cancelled():
            return
        exc = task.exception()  # retrieving it also stops asyncio's "never retrieved" report
        if exc is None:
            return
        if isinstance(exc, self._expected):
            self._log.warning("%s: task %s failed: %r", self.label, task.get_name(), exc)
        else:
            self._log.error("%s: task %s failed", self.label, task.get_name(), exc_info=exc)

    def cancel(self) -> None:
        """Cancel every task now and refuse new ones (for owners that close synchronously)."""
        self._closed = True
        current = _current_task()
        for task in tuple(self._tasks or ()):
            if task is not current:  # a task of this set may be closing its owner
                task.cancel()

    async def close(self, grace: float = 5.0) -> None:
        """Cancel every task and wait up to ``grace`` seconds for them to finish."""
        self.cancel()
        current = _current_task()
        pending = [t for t in self._tasks or () if not t.done() and t is not current]
        still: set[asyncio.Task[Any]] = set()
        if pending:
            _, still = await asyncio.wait(pending, timeout=grace)
        if still:
            self._log.warning(
                "%s: %d task(s) still running %.1fs after cancel: %s",
                self.label,
                len(still),
                grace,
                ", ".join(sorted(t.get_name() for t in still)),
            )


async def awaited(aw: Awaitable[T]) -> T:
    """A coroutine for any awaitable (a listener may return a future), so it can be spawned."""
    return await aw


def _current_task() -> asyncio.Task[Any] | None:
    try:
        return asyncio.current_task()
    except RuntimeError:  # no running loop
        return None
