"""How one managed ledger (and its writer and cursors) reaches storage.

Every call is bounded by the factory's operation timeout; cleanups of orphans only log their
failures; background tasks are kept until cancelled. Stored metadata follows the ownership rule:
the ledger list is written with a compare-and-swap on the version this instance wrote last, so a
conflict means another owner took over (the ledger is fenced). A conflict on a cursor node is
ours to override only while that version is still the stored one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from magnetar.common.tasks import TaskSet
from magnetar.ledger.api import LedgerClient, ReadHandle
from magnetar.managed_ledger.api import ManagedLedgerError, ManagedLedgerFencedError
from magnetar.managed_ledger.metadata import (
    LedgerInfo,
    ManagedLedgerInfo,
    cursor_name_from_node,
    cursor_path,
    ledger_path,
)
from magnetar.metadata.api import NOT_EXISTS, BadVersionError, MetadataError, MetadataStore, NotFoundError

log = logging.getLogger(__name__)

T = TypeVar("T")


def now_ms() -> int:
    """Wall-clock milliseconds (ledger timestamps)."""
    return int(time.time() * 1000)


class LedgerStorage:
    """The metadata store and ledger client of the managed ledger ``name``, shared with its writer.

    Every call is bounded by ``op_timeout_seconds``; background tasks are kept until
    :meth:`close_tasks`. ``on_fenced(why)`` is called when a write shows another owner took over.
    """

    # Slots: one of these per idle topic, ~60 bytes less each than an instance dict (CPython 3.11).
    __slots__ = (
        "_info_version",
        "_on_fenced",
        "_path",
        "_tasks",
        "client",
        "name",
        "op_timeout_seconds",
        "store",
    )

    def __init__(
        self,
        name: str,
        store: MetadataStore,
        client: LedgerClient,
        op_timeout_seconds: float,
        on_fenced: Callable[[str], None],
    ) -> None:
        self.name = name
        self.store = store
        self.client = client
        self.op_timeout_seconds = op_timeout_seconds
        self._on_fenced = on_fenced
        self._path = ledger_path(name)
        self._info_version = NOT_EXISTS
        self._tasks = TaskSet("managed ledger", owner=name)

    async def io(self, aw: Awaitable[T], what: str) -> T:
        """Await a storage call bounded by the operation timeout (:class:`ManagedLedgerError` on timeout)."""
        try:
            async with asyncio.timeout(self.op_timeout_seconds):
                return await aw
        except TimeoutError:
            raise ManagedLedgerError(f"{self.name}: {what} timed out") from None

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run ``coro`` as a background task kept (and failures logged) until it ends or is cancelled."""
        return self._tasks.spawn(coro)

    async def close_tasks(self) -> None:
        """Cancel every background task except the calling one, and wait (bounded) for them to end."""
        await self._tasks.close()

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

    # ------------------------------------------------------------------ stored metadata

    async def read_info(self) -> ManagedLedgerInfo:
        """The stored ledger list and properties (empty for a new managed ledger); later writes CAS on it."""
        value = await self.io(self.store.get(self._path), "read managed ledger info")
        if value is None:
            return ManagedLedgerInfo()
        info = ManagedLedgerInfo.parse(value.data)
        self._info_version = value.stat.version
        return info

    async def write_info(self, ledgers: list[LedgerInfo], properties: dict[str, str]) -> None:
        """CAS the ledger list; a version conflict means another owner took over."""
        data = ManagedLedgerInfo(ledgers, properties).serialize()
        try:
            stat = await self.io(self.store.put(self._path, data, self._info_version), "write info")
        except BadVersionError:
            self._on_fenced("the ledger list was changed by another owner")
            raise ManagedLedgerFencedError(f"{self.name}: another owner updated the ledger list") from None
        self._info_version = stat.version

    async def _check_still_owner(self, why: str) -> None:
        """Fence (and raise) unless the stored ledger list is still the version written last."""
        value = await self.io(self.store.get(self._path), "read managed ledger info")
        if value is None or value.stat.version != self._info_version:
            self._on_fenced(why)
            raise ManagedLedgerFencedError(f"{self.name} is fenced: another owner opened it") from None

    async def read_cursors(self) -> list[tuple[str, bytes, int]]:
        """``(name, stored state, version)`` of every stored cursor."""
        nodes = await self.io(self.store.get_children(self._path), "list cursors")
        values = await asyncio.gather(*(self.io(self.store.get(f"{self._path}/{n}"), "read cursor") for n in nodes))
        return [
            (cursor_name_from_node(node), value.data, value.stat.version)
            for node, value in zip(nodes, values, strict=True)
            if value is not None
        ]

    async def store_cursor_state(
        self, cursor: str, data: bytes, version: int, *, wanted: Callable[[], bool] | None = None
    ) -> int | None:
        """CAS-write a durable cursor's stored state (:data:`NOT_EXISTS`: create it); its new version.

        A version conflict is ours to override only while we own the ledger (it is then e.g. a
        late write of a previous owner, or a node left by a crashed delete); otherwise the ledger
        is fenced. ``None`` when, after a conflict, ``wanted()`` says the write is no longer wanted.
        """
        path = cursor_path(self.name, cursor)
        create = version == NOT_EXISTS
        what = "create cursor" if create else "persist cursor"
        try:
            stat = await self.io(self.store.put(path, data, version), what)
        except BadVersionError:
            why = "a cursor was created by another owner" if create else f"cursor {cursor} was updated by another owner"
            await self._check_still_owner(why)
            if wanted is not None and not wanted():
                return None
            cur = await self.io(self.store.get(path), "read cursor")
            stat = await self.io(self.store.put(path, data, cur.stat.version if cur else NOT_EXISTS), what)
        return stat.version

    async def delete_cursor_state(self, cursor: str, version: int) -> None:
        """CAS-delete a cursor's node; a version conflict is overridden only while we own the ledger."""
        path = cursor_path(self.name, cursor)
        try:
            try:
                await self.io(self.store.delete(path, version), "delete cursor")
            except BadVersionError:
                await self._check_still_owner(f"cursor {cursor} was updated by another owner")
                await self.io(self.store.delete(path), "delete cursor")
        except NotFoundError:
            pass
        except MetadataError as e:
            raise ManagedLedgerError(f"{self.name}: cannot delete cursor {cursor}: {e}") from e

    async def delete_metadata(self) -> None:
        """Delete the stored ledger list and every cursor node."""
        await self.io(self.store.delete_recursive(self._path), "delete metadata")
