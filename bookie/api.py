"""What a ledger client asks of one bookie, in-process or over the network.

The ledger client does striping, quorums, fencing and recovery over a set of these;
:class:`~magnetar.bookie.local.LocalBookieClient` calls an in-process bookie directly, and the
cluster's network client speaks the bookie protocol with the same methods.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Callable, Sequence
from functools import partial

#: Told the outcome of a journal record or an add: ``None`` once durable, else the error.
Waiter = Callable[[BaseException | None], None]


def settle(fut: asyncio.Future[None], exc: BaseException | None) -> None:
    """A :data:`Waiter` (and remote add callback) for a future: resolve it, unless it is already done."""
    if fut.done():
        return
    if exc is None:
        fut.set_result(None)
    else:
        fut.set_exception(exc)


class BookieError(Exception):
    """Base class of bookie failures."""


class BookieUnavailableError(BookieError):
    """The bookie cannot be reached or is shutting down."""


class BookieFencedError(BookieError):
    """The ledger is fenced on this bookie; adds without the recovery flag are refused."""


class BookieReadOnlyError(BookieError):
    """The bookie is read-only (disk nearly full, or asked to be)."""


class BookieNoSuchEntryError(BookieError):
    """The bookie has no such entry (or no such ledger)."""


class BookieUnauthorizedError(BookieError):
    """The master key does not match the ledger's."""


class BookieTooManyRequestsError(BookieError):
    """The bookie's write cache stayed full for its throttle time: try another bookie (retryable)."""


class BookieClient(abc.ABC):
    """Operations on one bookie. All are bounded by a timeout."""

    address: str

    @abc.abstractmethod
    async def add_entry(
        self,
        ledger_id: int,
        entry_id: int,
        master_key: bytes,
        last_add_confirmed: int,
        data: bytes,
        *,
        recovery: bool = False,
    ) -> None:
        """Store one entry; returns after it is fdatasync'ed in the bookie's journal."""

    @abc.abstractmethod
    async def read_entries(self, ledger_id: int, first: int, last: int) -> list[tuple[int, bytes]]:
        """Entries ``first..last`` this bookie has, as ``(entry_id, data)`` in order.

        Stops at the first missing entry; raises :class:`BookieNoSuchEntryError` if ``first`` is missing.
        """

    @abc.abstractmethod
    async def read_last_add_confirmed(self, ledger_id: int) -> tuple[int, int]:
        """``(lac, last_entry_id)``: the highest LAC piggybacked on any add, and the highest entry stored."""

    @abc.abstractmethod
    async def fence(self, ledger_id: int, master_key: bytes) -> tuple[int, int]:
        """Fence the ledger (later non-recovery adds fail) and return ``(lac, last_entry_id)``."""

    @abc.abstractmethod
    async def delete_ledger(self, ledger_id: int) -> None:
        """Forget the ledger's entries (space is reclaimed by garbage collection)."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release the connection."""


class FutureAdds(abc.ABC):
    """Adds as futures: :meth:`add_entry_nowait` is the hot path (no coroutine or task per add).

    Mixed into the bookies and their clients (see :class:`CallbackAdds`); :meth:`add_entry` just awaits the future.
    """

    @abc.abstractmethod
    def add_entry_nowait(
        self,
        ledger_id: int,
        entry_id: int,
        master_key: bytes,
        last_add_confirmed: int,
        data: bytes,
        recovery: bool = False,
    ) -> asyncio.Future[None]:
        """Start one add; the future resolves once the entry is durable in the bookie's journal."""

    async def add_entry(
        self,
        ledger_id: int,
        entry_id: int,
        master_key: bytes,
        last_add_confirmed: int,
        data: bytes,
        *,
        recovery: bool = False,
    ) -> None:
        """Store one entry durably (see :meth:`add_entry_nowait`)."""
        await self.add_entry_nowait(ledger_id, entry_id, master_key, last_add_confirmed, data, recovery)


class CallbackAdds(FutureAdds):
    """Adds with a callback (:meth:`add_parts_async`, no future per add); :meth:`add_entry_nowait` wraps it
    in a future. Mixed into the in-process bookie and its local client."""

    @abc.abstractmethod
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
        """Start one add of the stored entry ``head + data`` (kept and written as the two buffers, never
        joined: ``head`` is the digest header, ``data`` the entry's one copy, shared with the managed
        ledger's cache): ``done(None)`` once it is durable, else ``done(error)``; called on the event loop,
        never from here (errors found at once are raised)."""

    @abc.abstractmethod
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
        """:meth:`add_parts_async` of several entries of one ledger (``heads[i] + datas[i]`` stored as entry
        ``entry_ids[i]``) with one callback: ``done(None)`` once all are durable, else ``done(error)`` (the
        first); called on the event loop, never from here (errors found at once are raised, none added)."""

    def add_entry_async(
        self,
        ledger_id: int,
        entry_id: int,
        master_key: bytes,
        last_add_confirmed: int,
        data: bytes,
        recovery: bool,
        done: Waiter,
    ) -> None:
        """:meth:`add_parts_async` of a stored entry in one piece."""
        self.add_parts_async(ledger_id, entry_id, master_key, last_add_confirmed, b"", data, recovery, done)

    def add_entry_nowait(
        self,
        ledger_id: int,
        entry_id: int,
        master_key: bytes,
        last_add_confirmed: int,
        data: bytes,
        recovery: bool = False,
    ) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.add_parts_async(
            ledger_id, entry_id, master_key, last_add_confirmed, b"", data, recovery, partial(settle, fut)
        )
        return fut
