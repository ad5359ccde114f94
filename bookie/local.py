"""In-process bookie client: the ledger client's view of a bookie living in the same process."""

from __future__ import annotations

from collections.abc import Sequence

from .api import BookieClient, BookieUnavailableError, CallbackAdds, Waiter
from .bookie import Bookie


class LocalBookieClient(CallbackAdds, BookieClient):
    """Implements :class:`BookieClient` by calling a :class:`Bookie` directly.

    ``LocalBookieClient(bookie)``; the bookie bounds every wait itself (journal watchdog, read
    timeouts). :meth:`close` releases only this client, never the bookie.
    """

    def __init__(self, bookie: Bookie) -> None:
        self._bookie = bookie
        self.address = bookie.address
        self._closed = False

    def _check(self) -> Bookie:
        if self._closed:
            raise BookieUnavailableError(f"client of {self.address} is closed")
        return self._bookie

    def add_parts_async(
        self,
        ledger_id: int,
        entry_id: int,
        master_key: bytes,
        last_add_confirmed: int,
        head: bytes,
        data: bytes,
        recovery: bool,
        done: Waiter,
    ) -> None:
        """Fastest path: ``done(None | error)`` once durable, no future per add and no joined copy of the
        stored entry (see :meth:`Bookie.add_parts_async`)."""
        self._check().add_parts_async(ledger_id, entry_id, master_key, last_add_confirmed, head, data, recovery, done)

    def add_parts_many(
        self,
        ledger_id: int,
        entry_ids: Sequence[int],
        master_key: bytes,
        last_add_confirmed: int,
        heads: Sequence[bytes],
        datas: Sequence[bytes],
        recovery: bool,
        done: Waiter,
    ) -> None:
        """Many adds of one ledger, one callback (see :meth:`Bookie.add_parts_many`)."""
        self._check().add_parts_many(ledger_id, entry_ids, master_key, last_add_confirmed, heads, datas, recovery, done)

    async def read_entries(self, ledger_id: int, first: int, last: int) -> list[tuple[int, bytes]]:
        return await self._check().read_entries(ledger_id, first, last)

    async def read_last_add_confirmed(self, ledger_id: int) -> tuple[int, int]:
        return await self._check().read_last_add_confirmed(ledger_id)

    async def fence(self, ledger_id: int, master_key: bytes) -> tuple[int, int]:
        return await self._check().fence(ledger_id, master_key)

    async def delete_ledger(self, ledger_id: int) -> None:
        await self._check().delete_ledger(ledger_id)

    async def close(self) -> None:
        self._closed = True
