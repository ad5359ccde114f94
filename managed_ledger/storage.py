"""How one managed ledger (and its writer) reaches storage: bounded calls, quiet cleanups, owned tasks."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Coroutine
from typing import Any, TypeVar

from magnetar.ledger.api import LedgerClient, ReadHandle
from magnetar.managed_ledger.api import ManagedLedgerError
from magnetar.metadata.api import MetadataStore

log = logging.getLogger(__name__)

T = TypeVar("T")


def now_ms() -> int:
    """Wall-clock milliseconds (ledger timestamps)."""
    return int(time.time() * 1000)


class LedgerStorage:
    """The metadata store and ledger client of the managed ledger ``name``, shared with its writer.

    Every call is bounded by ``op_timeout_seconds``; background tasks are kept until :meth:`cancel_tasks`.
    """

    def __init__(self, name: str, store: MetadataStore, client: LedgerClient, op_timeout_seconds: float) -> None:
        self.name = name
        self.store = store
        self.client = client
        self.op_timeout_seconds = op_timeout_seconds
        self._loop = asyncio.get_running_loop()
        self._tasks: set[asyncio.Task[Any]] = set()

    async def io(self, aw: Awaitable[T], what: str) -> T:
        """Await a storage call bounded by the operation timeout (:class:`ManagedLedgerError` on timeout)."""
        try:
            async with asyncio.timeout(self.op_timeout_seconds):
                return await aw
        except TimeoutError:
            raise ManagedLedgerError(f"{self.name}: {what} timed out") from None

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run ``coro`` as a background task kept (and failures logged) until it ends or is cancelled."""
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("%s: background task failed", self.name, exc_info=task.exception())

    def cancel_tasks(self) -> None:
        """Cancel every background task except the calling one."""
        for task in list(self._tasks):
            if task is not asyncio.current_task():
                task.cancel()

    async def close_handle_quietly(self, handle: ReadHandle) -> None:
        """Close a ledger handle; a failure is only logged."""
        try:
            await self.io(handle.close(), "close handle")
        except Exception as e:
            log.debug("%s: closing ledger handle %s failed: %s", self.name, handle.ledger_id, e)

    async def delete_ledger_quietly(self, lid: int) -> None:
        """Delete a ledger; a failure is only logged (an orphan costs space only)."""
        try:
            await self.io(self.client.delete_ledger(lid), f"delete ledger {lid}")
        except Exception as e:  # an orphan costs space only; never fail the caller for it
            log.warning("%s: deleting ledger %d failed: %s", self.name, lid, e)
