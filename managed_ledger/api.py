"""The managed-ledger interface the broker codes against.

A managed ledger is one topic's log: an ordered list of ledgers of which only the last is
writable. Positions are ``(ledger_id, entry_id)`` and order like tuples. Cursors are
subscriptions' read state: a mark-delete position (everything at or before it is acked) plus
individually acked positions after it, persisted in the metadata store and recovered on open.
"""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from functools import partial
from typing import NamedTuple, cast


class Position(NamedTuple):
    """An entry's address in a managed ledger; ``entry_id == -1`` means "before the ledger's first entry"."""

    ledger_id: int
    entry_id: int

    def __str__(self) -> str:
        return f"{self.ledger_id}:{self.entry_id}"


#: ``make_position((ledger_id, entry_id))``: a :class:`Position` built in C, for per-entry hot paths (calling
#: the class runs NamedTuple's ``__new__``, Python code: ~2x the cost).
make_position = cast("Callable[[tuple[int, int]], Position]", partial(tuple.__new__, Position))


#: Where an asynchronous add's outcome goes: ``(position, None)`` or ``(None, error)``.
AddCallback = Callable[[Position | None, BaseException | None], None]


#: Told the outcome of a run of adds (:meth:`ManagedLedger.add_entries_async`), in order: ``(index, position,
#: count, None)`` when ``count`` consecutive adds from the run's ``index``-th one were stored at consecutive
#: positions of one ledger starting at ``position``, or ``(index, None, 1, error)`` when that one failed.
AddRunCallback = Callable[[int, Position | None, int, BaseException | None], None]


#: Before every position (a cursor marked here has acked nothing).
EARLIEST = Position(-1, -1)
#: After every position.
LATEST = Position(2**63 - 1, 2**63 - 1)


class Entry(NamedTuple):
    """One stored entry: its position and its bytes exactly as added."""

    position: Position
    data: bytes


class InitialPosition(Enum):
    """Where a new durable cursor starts."""

    LATEST = "latest"
    EARLIEST = "earliest"


class ManagedLedgerError(Exception):
    """Base class of managed-ledger failures."""


class ManagedLedgerFencedError(ManagedLedgerError):
    """Another owner opened this managed ledger; this instance may not write any more."""


class ManagedLedgerClosedError(ManagedLedgerError):
    """The managed ledger (or cursor) has been closed."""


class CursorNotFoundError(ManagedLedgerError):
    """No cursor of that name."""


@dataclass(slots=True)
class ManagedLedgerConfig:
    """Per-topic storage settings (Pulsar's ``managedLedger*`` broker settings and namespace policies)."""

    ensemble_size: int = 1
    write_quorum: int = 1
    ack_quorum: int = 1
    max_entries_per_ledger: int = 50_000
    max_size_per_ledger_bytes: int = 2048 * 1024 * 1024
    min_ledger_rollover_seconds: float = 600.0
    max_ledger_rollover_seconds: float = 4 * 3600.0
    #: Retention of fully acked data: -1 keeps forever, 0 deletes as soon as possible.
    retention_time_seconds: float = 0.0
    retention_size_bytes: int = 0
    #: How long cursor changes may stay in memory before they are persisted (group commit).
    cursor_flush_interval_seconds: float = 0.1
    #: Individually-acked ranges persisted per cursor (the first ones; later ones are tracked in
    #: memory only and redelivered after a crash), bounding the stored value.
    max_unacked_ranges_to_persist: int = 10_000
    #: Partly acked batches whose index state is persisted per cursor (the oldest ones), likewise.
    max_batch_deleted_index_to_persist: int = 10_000


class ManagedCursor(abc.ABC):
    """One subscription's (or reader's) position in a managed ledger."""

    __slots__ = ()

    name: str
    durable: bool

    @property
    @abc.abstractmethod
    def mark_delete_position(self) -> Position:
        """Everything at or before this position is acknowledged."""

    @property
    @abc.abstractmethod
    def read_position(self) -> Position:
        """The next position :meth:`read_entries` will return (or wait for)."""

    @property
    @abc.abstractmethod
    def properties(self) -> dict[str, str]:
        """Subscription properties, persisted with the cursor."""

    @abc.abstractmethod
    def has_more_entries(self) -> bool:
        """Whether an entry is available at or after the read position."""

    @abc.abstractmethod
    async def read_entries(self, max_entries: int) -> list[Entry]:
        """Read up to ``max_entries`` from the read position, skipping acked ones, and advance."""

    @abc.abstractmethod
    async def read_entries_or_wait(self, max_entries: int) -> list[Entry]:
        """Like :meth:`read_entries` but waits until at least one entry exists. Cancellable."""

    @abc.abstractmethod
    async def replay_entries(self, positions: Iterable[Position]) -> list[Entry]:
        """Read the given positions (for redelivery), in position order, leaving out acked or trimmed ones."""

    @abc.abstractmethod
    def delete(self, positions: Iterable[Position]) -> None:
        """Individually acknowledge positions; moves the mark-delete position over contiguous acks."""

    @abc.abstractmethod
    def mark_delete(self, position: Position) -> None:
        """Cumulatively acknowledge everything up to and including ``position``."""

    @abc.abstractmethod
    def is_acked(self, position: Position) -> bool:
        """Whether ``position`` is acknowledged (at/below mark-delete, or individually)."""

    @abc.abstractmethod
    def batch_unacked(self, position: Position) -> list[int] | None:
        """For a partly acknowledged batch entry, the bit set (64-bit words, bit set = not yet acked) of
        its messages still to acknowledge; None when nothing is recorded for it."""

    @abc.abstractmethod
    def set_batch_unacked(self, position: Position, words: list[int] | None) -> None:
        """Record (or with None forget) which messages of a batch entry are still unacknowledged."""

    @abc.abstractmethod
    def acked_ranges(self) -> list[tuple[Position, Position]]:
        """Individually acknowledged positions after the mark-delete position, as closed ranges."""

    @abc.abstractmethod
    def rewind(self) -> None:
        """Move the read position back to the first unacknowledged entry."""

    @abc.abstractmethod
    def seek(self, read_position: Position) -> None:
        """Move only the read position (acks are untouched)."""

    @abc.abstractmethod
    async def reset(self, position: Position) -> None:
        """Reset the subscription so ``position`` is the next entry delivered: mark-delete moves to just
        before it and individual acks after it are dropped (Pulsar's resetCursor / seek)."""

    @abc.abstractmethod
    def backlog_entries(self) -> int:
        """Entries after the mark-delete position that are not individually acknowledged."""

    @abc.abstractmethod
    def set_property(self, key: str, value: str | None) -> None:
        """Set (or with ``None`` remove) a subscription property; persisted with the cursor."""

    @abc.abstractmethod
    async def flush(self) -> None:
        """Persist pending acknowledgement state now (durable cursors)."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Flush and stop using this cursor instance (the stored cursor stays)."""


class ManagedLedger(abc.ABC):
    """One topic's log."""

    __slots__ = ()

    name: str

    @property
    @abc.abstractmethod
    def config(self) -> ManagedLedgerConfig:
        """The ledger's settings; its owner may change the retention fields while it is open."""

    @property
    @abc.abstractmethod
    def last_confirmed_entry(self) -> Position:
        """Position of the last durable entry; ``(current_ledger, -1)`` when the log has none."""

    @property
    @abc.abstractmethod
    def first_position(self) -> Position:
        """Position of the oldest entry still stored (or of where the next one will go if empty)."""

    @property
    @abc.abstractmethod
    def number_of_entries(self) -> int:
        """Entries currently stored (all ledgers)."""

    @property
    @abc.abstractmethod
    def total_size(self) -> int:
        """Bytes currently stored."""

    @property
    @abc.abstractmethod
    def cursors(self) -> dict[str, ManagedCursor]:
        """Open cursors by name (durable and non-durable)."""

    @property
    @abc.abstractmethod
    def properties(self) -> dict[str, str]:
        """Managed-ledger properties (persisted with the ledger list)."""

    @abc.abstractmethod
    async def set_properties(self, updates: dict[str, str | None]) -> None:
        """Set (or with ``None`` remove) properties; durable when this returns."""

    @abc.abstractmethod
    def ledgers_info(self) -> list[dict[str, int]]:
        """The ledger list for diagnostics: ``ledgerId``, ``entries``, ``size``, ``timestamp`` per ledger."""

    @abc.abstractmethod
    async def add_entry(self, data: bytes) -> Position:
        """Append one entry; returns once it is durable. Concurrent calls are group-committed in order."""

    @abc.abstractmethod
    def add_entry_async(self, data: bytes, callback: AddCallback) -> None:
        """:meth:`add_entry` for the publish hot path, without a task or coroutine per entry: ``callback``
        gets ``(position, None)`` once the entry is durable, else ``(None, ManagedLedgerError)``, exactly
        once and possibly before this returns. Entries are stored in call order."""

    @abc.abstractmethod
    def add_entries_async(self, datas: Sequence[bytes], callback: AddRunCallback) -> None:
        """:meth:`add_entry_async` of several entries, stored in order, with ``callback`` told per run of
        consecutive stored entries (see :data:`AddRunCallback`): every entry is answered exactly once, possibly
        before this returns. The publish path adds a socket read's worth of a producer's sends this way."""

    @abc.abstractmethod
    async def open_cursor(
        self,
        name: str,
        initial_position: InitialPosition = InitialPosition.LATEST,
        properties: dict[str, str] | None = None,
    ) -> ManagedCursor:
        """Open (recovering) or create a durable cursor."""

    @abc.abstractmethod
    def new_non_durable_cursor(self, name: str, start: Position, *, inclusive: bool = True) -> ManagedCursor:
        """An in-memory cursor whose first read is ``start`` (or the entry after it when not inclusive).

        ``EARLIEST`` / ``LATEST`` are accepted; nothing is persisted.
        """

    @abc.abstractmethod
    async def delete_cursor(self, name: str) -> None:
        """Remove a cursor and its stored state; it no longer holds back trimming."""

    @abc.abstractmethod
    async def read_entry(self, position: Position) -> Entry:
        """Read one entry (peek, last-message lookups)."""

    @abc.abstractmethod
    def next_position(self, position: Position) -> Position:
        """The position of the entry following ``position`` (may be the not-yet-written next one)."""

    @abc.abstractmethod
    def previous_position(self, position: Position) -> Position:
        """The position of the entry before ``position`` (for mark-delete arithmetic)."""

    @abc.abstractmethod
    def entries_between(self, start: Position, end: Position) -> int:
        """Number of stored entries in ``[start, end]``."""

    @abc.abstractmethod
    async def find_newest_matching(
        self, predicate: Callable[[Entry], bool | Awaitable[bool]], start: Position | None = None
    ) -> Position | None:
        """Binary search (entries are assumed to match up to a point) for the newest entry matching
        ``predicate``, e.g. ``publish_time <= t``; ``None`` if even the first does not match."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Flush cursors, close the current ledger, release resources."""

    @abc.abstractmethod
    async def delete(self) -> None:
        """Delete all ledgers, cursors and metadata of this managed ledger."""


class ManagedLedgerFactory(abc.ABC):
    """Opens managed ledgers by name; one per process."""

    @abc.abstractmethod
    async def open(self, name: str, config: ManagedLedgerConfig | None = None) -> ManagedLedger:
        """Open (recovering: fences the previous owner's ledger) or create the managed ledger ``name``."""

    @abc.abstractmethod
    async def exists(self, name: str) -> bool:
        """Whether stored metadata for ``name`` exists."""

    @abc.abstractmethod
    async def delete(self, name: str) -> None:
        """Delete a managed ledger that is not open, with all its data."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Close every open managed ledger."""
