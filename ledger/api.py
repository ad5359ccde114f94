"""Interface between the managed ledger and the ledger client.

A ledger has a single writer, is append-only with entry ids 0..n, and once closed is
immutable. The managed ledger only uses these types; whether the bookies are in-process
(standalone) or remote (cluster) is the ledger client's business.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import NamedTuple


class LedgerError(Exception):
    """Base class of ledger failures."""


class NoSuchLedgerError(LedgerError):
    """The ledger does not exist (never created, or deleted)."""


class NoSuchEntryError(LedgerError):
    """The entry is past the last confirmed entry or was never written."""


class LedgerFencedError(LedgerError):
    """Another client opened the ledger for recovery; this writer may not add any more."""


class LedgerClosedError(LedgerError):
    """The ledger is closed for writes."""


class NotEnoughBookiesError(LedgerError):
    """Fewer writable bookies than the ensemble needs."""


@dataclass(frozen=True, slots=True)
class LedgerConfig:
    """Replication settings of a new ledger (Pulsar's namespace ``persistence`` policy)."""

    ensemble_size: int = 1
    write_quorum: int = 1
    ack_quorum: int = 1
    password: bytes = b""
    custom_metadata: dict[str, bytes] = field(default_factory=dict)
    #: The new ledger's id must be at least this (a managed ledger's ledger ids grow, across owners).
    min_ledger_id: int = 0


class LedgerEntry(NamedTuple):
    """One entry as read back: ids and the exact bytes that were added."""

    ledger_id: int
    entry_id: int
    data: bytes


class ReadHandle(abc.ABC):
    """A ledger opened for reading."""

    __slots__ = ()  # so that a subclass declaring __slots__ has no instance dict

    ledger_id: int

    @property
    @abc.abstractmethod
    def last_add_confirmed(self) -> int:
        """Id of the last entry known to be durably replicated; -1 if the ledger is empty."""

    @property
    @abc.abstractmethod
    def length(self) -> int:
        """Total bytes of the confirmed entries."""

    @abc.abstractmethod
    async def read(self, first: int, last: int) -> list[LedgerEntry]:
        """Entries ``first..last`` inclusive; raises :class:`NoSuchEntryError` past the LAC."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release the handle (does not change the ledger)."""


#: Told an append's outcome: ``(entry_id, None)`` or ``(None, error)``.
AppendCallback = Callable[[int | None, BaseException | None], None]


#: Told the outcome of a run of appends (:meth:`WriteHandle.append_many`), in order: ``(index, first_entry_id,
#: count, None)`` when ``count`` consecutive appends from the run's ``index``-th one completed, or
#: ``(index, None, 1, error)`` when that one failed.
RunCallback = Callable[[int, int | None, int, BaseException | None], None]


def _tell_run(callback: RunCallback, index: int, entry_id: int | None, exc: BaseException | None) -> None:
    callback(index, entry_id, 1, exc)


def _tell(callback: AppendCallback, fut: asyncio.Future[int]) -> None:
    if fut.cancelled():
        callback(None, LedgerError("append cancelled"))
    elif (exc := fut.exception()) is not None:
        callback(None, exc)
    else:
        callback(fut.result(), None)


class WriteHandle(ReadHandle):
    """The single writer of a ledger."""

    __slots__ = ()

    @abc.abstractmethod
    async def append(self, data: bytes) -> int:
        """Add one entry; returns its id once it is durable on an ack quorum of bookies.

        Appends issued concurrently complete in order; they are group-committed.
        """

    def append_nowait(self, data: bytes) -> asyncio.Future[int]:
        """:meth:`append` issued now (entries keep call order), its outcome as a future. This default
        runs :meth:`append` as a task."""
        return asyncio.ensure_future(self.append(data))

    def append_async(self, data: bytes, callback: AppendCallback) -> None:
        """:meth:`append_nowait` for the hot path: ``callback(entry_id, None)`` or ``callback(None, error)``
        once the add completed (never before this returns; errors found at once are raised). Handles
        call it directly; this default goes through the future."""
        self.append_nowait(data).add_done_callback(partial(_tell, callback))

    def append_many(self, datas: Sequence[bytes], callback: RunCallback) -> None:
        """:meth:`append_async` of several entries, in order, with one callback told per completed run (see
        :data:`RunCallback`): the publish path appends a socket read's worth of a producer's sends at once.
        This default appends them one by one."""
        for index, data in enumerate(datas):
            self.append_async(data, partial(_tell_run, callback, index))

    @abc.abstractmethod
    async def close(self) -> None:
        """Seal the ledger at its last confirmed entry (metadata compare-and-swap)."""


class LedgerClient(abc.ABC):
    """Creates, opens and deletes ledgers."""

    @abc.abstractmethod
    async def create_ledger(self, config: LedgerConfig) -> WriteHandle:
        """Create a new ledger on an ensemble of writable bookies and open it for writing."""

    @abc.abstractmethod
    async def open_ledger(self, ledger_id: int, *, recovery: bool = True, password: bytes = b"") -> ReadHandle:
        """Open an existing ledger.

        With ``recovery`` an open ledger is fenced (its writer can no longer add), its true last
        entry is found and re-replicated, and it is closed there. Without it, the handle sees
        what is confirmed so far.
        """

    @abc.abstractmethod
    async def delete_ledger(self, ledger_id: int) -> None:
        """Delete the ledger and its data; a missing ledger is not an error."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Close the client and its bookie connections."""
