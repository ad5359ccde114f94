"""The managed ledger: one topic's log as an ordered list of ledgers, only the last writable.

Writes go through :class:`~magnetar.managed_ledger.writer.LedgerWriter` (the current ledger's
handle, pipelined adds, rollover); this module keeps the ledger list, positions, reads, cursors,
trimming and the lifecycle.

Ownership. A new owner opens the last ledger with recovery (fencing the old writer) and CASes the
ledger list; a CAS failure, or a fenced append, means someone else owns the topic now.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from enum import Enum
from typing import TYPE_CHECKING

from magnetar.ledger.api import LedgerError, NoSuchLedgerError
from magnetar.managed_ledger import positions, retention, seek
from magnetar.managed_ledger.api import (
    EARLIEST,
    LATEST,
    AddCallback,
    AddRunCallback,
    CursorNotFoundError,
    Entry,
    InitialPosition,
    ManagedCursor,
    ManagedLedger,
    ManagedLedgerClosedError,
    ManagedLedgerConfig,
    ManagedLedgerError,
    ManagedLedgerFencedError,
    Position,
    make_position,
)
from magnetar.managed_ledger.cursor import ManagedCursorImpl
from magnetar.managed_ledger.metadata import CursorInfo, LedgerInfo
from magnetar.managed_ledger.reader import EntryReader
from magnetar.managed_ledger.storage import LedgerStorage, now_ms
from magnetar.managed_ledger.writer import LedgerWriter

if TYPE_CHECKING:
    from magnetar.managed_ledger.factory import ManagedLedgerFactoryImpl

log = logging.getLogger(__name__)

#: No cursor waiting for entries (shared: ``frozenset()`` makes a new 216-byte object on every call).
_NO_CURSORS: frozenset[ManagedCursorImpl] = frozenset()


class State(Enum):
    """Lifecycle of a :class:`ManagedLedgerImpl`."""

    OPENING = "opening"
    OPEN = "open"
    FENCED = "fenced"
    CLOSED = "closed"


class ManagedLedgerImpl(ManagedLedger):
    """:class:`ManagedLedger` over a :class:`~magnetar.ledger.api.LedgerClient` and a metadata store.

    Built by :class:`~magnetar.managed_ledger.factory.ManagedLedgerFactoryImpl`; not constructed directly.
    """

    # Slots: one of these per idle topic, ~60 bytes less each than an instance dict (CPython 3.11).
    __slots__ = (
        "_cache",
        "_closed_entries",
        "_closed_size",
        "_config",
        "_cursors",
        "_factory",
        "_last_confirmed",
        "_ledger_ids",
        "_ledgers",
        "_loop",
        "_meta_lock",
        "_opening_cursors",
        "_properties",
        "_property_writes",
        "_reader",
        "_shutdown_task",
        "_state",
        "_storage",
        "_trim_timer",
        "_waiting",
        "_writer",
        "name",
    )

    def __init__(self, factory: ManagedLedgerFactoryImpl, name: str, config: ManagedLedgerConfig) -> None:
        self.name = name
        self._factory = factory
        self._config = config
        self._storage = LedgerStorage(
            name, factory.store, factory.client, factory.op_timeout_seconds, on_fenced=self._set_fenced
        )
        self._loop = asyncio.get_running_loop()
        self._state = State.OPENING
        self._properties: dict[str, str] = {}
        # Ledger list: ids ascending; the last one is the current (writable) ledger once open.
        self._ledgers: dict[int, LedgerInfo] = {}
        self._ledger_ids: list[int] = []
        self._closed_entries = 0  # totals of closed ledgers in the list
        self._closed_size = 0
        self._last_confirmed = EARLIEST
        self._writer = LedgerWriter(self, self._storage, config)
        # Cursors: durable ones stay here after their instance is closed (they still hold back trimming).
        self._cursors: dict[str, ManagedCursorImpl] = {}
        self._opening_cursors: dict[str, asyncio.Task[ManagedCursorImpl]] = {}
        # The shared empty frozenset while no cursor waits (most of the time: an empty set is 216 bytes).
        self._waiting: set[ManagedCursorImpl] | frozenset[ManagedCursorImpl] = _NO_CURSORS
        # Housekeeping.
        self._meta_lock = asyncio.Lock()
        #: Property writes in flight, kept until they end (see ``set_properties``).
        self._property_writes: set[asyncio.Task[None]] | None = None  # made by the first write
        self._trim_timer: asyncio.TimerHandle | None = None
        self._shutdown_task: asyncio.Task[None] | None = None
        self._cache = factory.cache.for_ledger(name, self._slowest_reader)
        self._reader = EntryReader(self._storage, self._cache, self._writer, self._ledgers.__contains__)

    # ------------------------------------------------------------------ properties

    @property
    def state(self) -> State:
        """Current lifecycle state."""
        return self._state

    @property
    def fenced(self) -> bool:
        """Whether another owner took this managed ledger over (writes fail from now on)."""
        return self._state is State.FENCED

    @property
    def config(self) -> ManagedLedgerConfig:
        """The settings this ledger was opened with."""
        return self._config

    @property
    def ledger_ids(self) -> list[int]:
        """Ids of the ledgers currently in the list (oldest first; the last is the current one)."""
        return list(self._ledger_ids)

    @property
    def last_confirmed_entry(self) -> Position:
        return self._last_confirmed

    @property
    def first_position(self) -> Position:
        return self.normalize_position(Position(-1, 0))

    @property
    def number_of_entries(self) -> int:
        cur = self._writer.current
        return self._closed_entries + (cur.entries if cur is not None and not cur.closed else 0)

    @property
    def total_size(self) -> int:
        cur = self._writer.current
        return self._closed_size + (cur.size if cur is not None and not cur.closed else 0)

    @property
    def cursors(self) -> dict[str, ManagedCursor]:
        return dict(self._cursors)

    # ------------------------------------------------------------------ open / recovery

    @property
    def properties(self) -> dict[str, str]:
        return dict(self._properties)

    async def set_properties(self, updates: dict[str, str | None]) -> None:
        self._check_open()
        # The write runs to its end even when the caller is cancelled (a client disconnecting): cut off
        # between the stored CAS and noting its version, the ledger would take its own write for another
        # owner's at the next CAS and fence itself.
        write = self._loop.create_task(self._write_properties(updates))
        if self._property_writes is None:
            self._property_writes = set()
        self._property_writes.add(write)
        write.add_done_callback(self._property_write_done)
        await asyncio.shield(write)

    def _property_write_done(self, write: asyncio.Task[None]) -> None:
        if self._property_writes is not None:
            self._property_writes.discard(write)
        if not write.cancelled():
            write.exception()  # retrieved: a caller still waiting gets it through the shield

    async def _write_properties(self, updates: dict[str, str | None]) -> None:
        async with self._meta_lock:
            previous = dict(self._properties)
            for key, value in updates.items():
                if value is None:
                    self._properties.pop(key, None)
                else:
                    self._properties[key] = value
            try:
                await self._storage.write_info([self._ledgers[i] for i in self._ledger_ids], self._properties)
            except BaseException:
                self._properties = previous
                raise

    def ledgers_info(self) -> list[dict[str, int]]:
        return [
            {"ledgerId": lid, "entries": li.entries, "size": li.size, "timestamp": li.timestamp_ms}
            for lid, li in ((lid, self._ledgers[lid]) for lid in self._ledger_ids)
        ]

    async def initialize(self) -> None:
        """Open (or take over) the managed ledger: recover its ledgers and cursors (factory use)."""
        info = await self._storage.read_info()
        self._properties = dict(info.properties)
        for li in info.ledgers:
            if not li.closed:
                await self._recover_ledger(li)
        keep = [li for li in info.ledgers if li.entries > 0]
        empty = [li.ledger_id for li in info.ledgers if li.entries == 0]
        for li in keep:
            self._ledgers[li.ledger_id] = li
            self._ledger_ids.append(li.ledger_id)
            self._closed_entries += li.entries
            self._closed_size += li.size
        async with self._meta_lock:
            await self._writer.create_ledger()
        if keep:
            self._last_confirmed = Position(keep[-1].ledger_id, keep[-1].entries - 1)
        else:
            current = self._writer.current
            assert current is not None
            self._last_confirmed = Position(current.ledger_id, -1)
        for lid in empty:
            await self._storage.delete_ledger_quietly(lid)
        await self._recover_cursors()
        self._state = State.OPEN
        self._writer.start()
        self._schedule_trim(0.0)
        log.debug("opened managed ledger %s: ledgers=%s lac=%s", self.name, self._ledger_ids, self._last_confirmed)

    async def _recover_ledger(self, li: LedgerInfo) -> None:
        """Fence and seal a ledger a previous owner left open; learn its true length."""
        try:
            handle = await self._storage.io(
                self._storage.client.open_ledger(li.ledger_id, recovery=True), f"recover ledger {li.ledger_id}"
            )
        except NoSuchLedgerError:
            log.warning("%s: ledger %d in the list does not exist; dropping it", self.name, li.ledger_id)
            li.entries, li.size = 0, 0
        else:
            li.entries = handle.last_add_confirmed + 1
            li.size = handle.length
            await self._storage.close_handle_quietly(handle)
        li.closed = True
        li.timestamp_ms = now_ms()

    async def _recover_cursors(self) -> None:
        first = self.first_position
        for name, data, version in await self._storage.read_cursors():
            try:
                info = CursorInfo.parse(data)
            except (ValueError, KeyError, TypeError) as e:
                log.error("%s: cursor %s has unreadable state (%s); starting it at the end", self.name, name, e)
                info = CursorInfo(self._last_confirmed)
            md = info.mark_delete
            if md.ledger_id < first.ledger_id:  # its ledgers were trimmed
                md = Position(first.ledger_id, -1)
            if md > self._last_confirmed:
                md = self._last_confirmed
            self._cursors[name] = ManagedCursorImpl.recovered(self, name, info, md, version)

    async def add_ledger(self, li: LedgerInfo) -> None:
        """Record a new ledger as the last of the list (caller holds :attr:`list_lock`)."""
        lid = li.ledger_id
        if self._ledger_ids and lid <= self._ledger_ids[-1]:
            raise ManagedLedgerError(f"ledger client returned id {lid}, not above {self._ledger_ids[-1]}")
        await self._storage.write_info([*(self._ledgers[i] for i in self._ledger_ids), li], self._properties)
        self._ledgers[lid] = li
        self._ledger_ids.append(lid)

    # ------------------------------------------------------------------ writes (seam with the writer: WriterHost)

    async def add_entry(self, data: bytes) -> Position:
        return await self._writer.add(data)

    def add_entry_async(self, data: bytes, callback: AddCallback) -> None:
        self._writer.add_async(data, callback)

    def add_entries_async(self, datas: Sequence[bytes], callback: AddRunCallback) -> None:
        self._writer.add_many(datas, callback)

    @property
    def writable(self) -> bool:
        """Whether the managed ledger is open (not opening, fenced or closed)."""
        return self._state is State.OPEN

    @property
    def list_lock(self) -> asyncio.Lock:
        """Serialises changes of the ledger list."""
        return self._meta_lock

    def not_writable_error(self) -> ManagedLedgerError:
        """The error an add fails with while not :attr:`writable`."""
        if self._state is State.FENCED:
            return ManagedLedgerFencedError(f"{self.name} is fenced: another owner opened it")
        return ManagedLedgerClosedError(f"{self.name} is {self._state.value}")

    def fence(self, why: str) -> None:
        """Another owner took over: fail what is queued and stop."""
        self._set_fenced(why)

    def on_ledger_sealed(self, li: LedgerInfo) -> None:
        """The current ledger was closed with its final length."""
        self._closed_entries += li.entries
        self._closed_size += li.size

    def on_rolled_over(self) -> None:
        """A rollover finished: an older ledger may be trimmable now."""
        self._schedule_trim(self._factory.trim_delay_seconds)

    def entries_added(self, ledger_id: int, first_entry_id: int, datas: Sequence[bytes]) -> None:
        """Adds were confirmed at consecutive entries of ``ledger_id``: advance the LAC, cache them while a cursor
        may read them, wake waiting cursors."""
        last = make_position((ledger_id, first_entry_id + len(datas) - 1))
        if last > self._last_confirmed:
            self._last_confirmed = last
        if self._cursors or self._opening_cursors:
            # As Pulsar's OpAddEntry (hasActiveCursors): without a cursor nobody reads the entry from memory,
            # and inserting it only to age it out again costs ~1 µs per entry; a cursor opened later reads it
            # from the ledger.
            self._cache.insert_run(ledger_id, first_entry_id, datas)
        if self._waiting:
            self._notify_waiting()

    def _notify_waiting(self) -> None:
        waiting, self._waiting = self._waiting, _NO_CURSORS
        for cursor in waiting:
            cursor.wake()

    async def drop_empty_ledgers(self) -> None:
        """Drop closed ledgers without entries from the list and delete them (caller holds the lock)."""
        empty = [lid for lid in self._ledger_ids if self._ledgers[lid].closed and self._ledgers[lid].entries == 0]
        if not empty:
            return
        await self._storage.write_info([self._ledgers[i] for i in self._ledger_ids if i not in empty], self._properties)
        for lid in empty:
            self._forget_ledger(lid)
        for lid in empty:
            await self._storage.delete_ledger_quietly(lid)

    # ------------------------------------------------------------------ positions

    def normalize_position(self, pos: Position) -> Position:
        """The first stored (or next-to-be-written) position at or after ``pos``."""
        return positions.normalize(self._ledger_ids, self._ledgers, pos)

    def next_position(self, position: Position) -> Position:
        lid, eid = position
        li = self._ledgers.get(lid)
        if li is not None and (eid + 1 < li.entries or li is self._writer.current):
            return Position(lid, eid + 1)
        return self.normalize_position(Position(lid, eid + 1))

    def previous_position(self, position: Position) -> Position:
        return positions.previous(self._ledger_ids, self._ledgers, position)

    def entries_between(self, start: Position, end: Position) -> int:
        return positions.count_between(self._ledger_ids, self._ledgers, start, end)

    def is_stored(self, pos: Position) -> bool:
        """Whether ``pos`` is an entry of a ledger in the list."""
        li = self._ledgers.get(pos.ledger_id)
        return li is not None and 0 <= pos.entry_id < li.entries

    # ------------------------------------------------------------------ reads

    async def read_entry(self, position: Position) -> Entry:
        self._check_open()
        if not self.is_stored(position):
            raise ManagedLedgerError(f"{self.name}: no entry at {position} (not written or trimmed)")
        entries = await self.read_runs([(position.ledger_id, position.entry_id, position.entry_id)])
        if not entries:
            raise ManagedLedgerError(f"{self.name}: entry {position} could not be read")
        return entries[0]

    async def read_runs(self, runs: list[tuple[int, int, int]]) -> list[Entry]:
        """Read ``(ledger, first, last)`` runs in order, from the cache where possible."""
        return await self._reader.read_runs(runs)

    def _slowest_reader(self) -> Position | None:
        """Smallest read position of open cursors (cache eviction); ``None`` with no open cursors."""
        slowest: Position | None = None
        for c in self._cursors.values():
            if c.closed:
                continue
            p = c.read_position
            if slowest is None or p < slowest:
                slowest = p
        return slowest

    async def find_newest_matching(
        self, predicate: Callable[[Entry], bool | Awaitable[bool]], start: Position | None = None
    ) -> Position | None:
        self._check_open()
        first = self.normalize_position(start) if start is not None and start != EARLIEST else self.first_position
        spans = positions.stored_spans(self._ledger_ids, self._ledgers, first, self._last_confirmed)
        return await seek.newest_matching(spans, self.read_entry, predicate)

    # ------------------------------------------------------------------ cursors

    async def open_cursor(
        self,
        name: str,
        initial_position: InitialPosition = InitialPosition.LATEST,
        properties: dict[str, str] | None = None,
    ) -> ManagedCursor:
        self._check_open()
        existing = self._cursors.get(name)
        if existing is not None:
            if not existing.durable:
                raise ManagedLedgerError(f"{self.name}: {name} is a non-durable cursor")
            if existing.closed:
                existing = existing.reopened()
                self._cursors[name] = existing
            return existing
        pending = self._opening_cursors.get(name)
        if pending is None:
            # One creation per cursor, in a task of its own: a caller that is cancelled (a client
            # disconnecting) neither cancels it for the others waiting nor cuts its stored write short.
            pending = self._loop.create_task(self._create_cursor(name, initial_position, properties))
            self._opening_cursors[name] = pending
            pending.add_done_callback(lambda task: self._cursor_created(name, task))
        return await asyncio.shield(pending)

    async def _create_cursor(
        self, name: str, initial_position: InitialPosition, properties: dict[str, str] | None
    ) -> ManagedCursorImpl:
        if initial_position is InitialPosition.EARLIEST:
            md = self.previous_position(self.first_position)
        else:
            md = self._last_confirmed
        cursor = ManagedCursorImpl(self, name, durable=True, mark_delete=md, properties=properties)
        await cursor.create()
        self._cursors[name] = cursor
        return cursor

    def _cursor_created(self, name: str, task: asyncio.Task[ManagedCursorImpl]) -> None:
        if self._opening_cursors.get(name) is task:
            del self._opening_cursors[name]
        if not task.cancelled():
            task.exception()  # retrieved: the callers get it through the shield

    def new_non_durable_cursor(self, name: str, start: Position, *, inclusive: bool = True) -> ManagedCursor:
        self._check_open()
        existing = self._cursors.get(name)
        if existing is not None:
            if existing.durable:
                raise ManagedLedgerError(f"{self.name}: {name} is a durable cursor")
            existing.close_now()
        if start == EARLIEST:
            read = self.first_position
        elif start == LATEST:
            read = self.next_position(self._last_confirmed)
        else:
            read = start if inclusive else self.next_position(start)
            if read < self.first_position:
                read = self.first_position
        cursor = ManagedCursorImpl(
            self, name, durable=False, mark_delete=self.previous_position(read), read_position=read
        )
        self._cursors[name] = cursor
        return cursor

    async def delete_cursor(self, name: str) -> None:
        self._check_open()
        cursor = self._cursors.pop(name, None)
        if cursor is None:
            raise CursorNotFoundError(f"{self.name}: no cursor {name!r}")
        await cursor.remove()
        self._schedule_trim(0.0)

    # ------------------------------------------------------------------ seam with the cursors (CursorLedger)

    def entries_in_ledger(self, ledger_id: int) -> int:
        """Entries of a ledger in the list (0 for one not in it)."""
        li = self._ledgers.get(ledger_id)
        return 0 if li is None else li.entries

    def wait_for_entries(self, cursor: ManagedCursorImpl) -> None:
        """Call ``cursor.wake()`` once after the next add."""
        waiting = self._waiting
        if not isinstance(waiting, set):
            waiting = self._waiting = set()
        waiting.add(cursor)

    def stop_waiting(self, cursor: ManagedCursorImpl) -> None:
        """Forget a :meth:`wait_for_entries` registration."""
        if isinstance(self._waiting, set):
            self._waiting.discard(cursor)

    def on_cursor_closed(self, cursor: ManagedCursorImpl) -> None:
        """A non-durable cursor closed itself."""
        if self._cursors.get(cursor.name) is cursor:
            del self._cursors[cursor.name]
        self.stop_waiting(cursor)

    def on_mark_delete_moved(self, cursor: ManagedCursorImpl) -> None:
        """Called when a durable cursor's mark-delete advanced: maybe a ledger became trimmable."""
        ids = self._ledger_ids
        if len(ids) > 1 and self._trim_timer is None:
            first = self._ledgers[ids[0]]
            if cursor.mark_delete_position >= Position(first.ledger_id, first.entries - 1):
                self._schedule_trim(self._factory.trim_delay_seconds)

    def cursor_dirty(self, cursor: ManagedCursorImpl) -> None:
        """A durable cursor has state to persist: the factory flushes it with others."""
        self._factory.schedule_cursor_flush(cursor, self._config.cursor_flush_interval_seconds)

    async def store_cursor_state(
        self, cursor: str, data: bytes, version: int, *, wanted: Callable[[], bool] | None = None
    ) -> int | None:
        """CAS-write a durable cursor's stored state (see :meth:`LedgerStorage.store_cursor_state`)."""
        return await self._storage.store_cursor_state(cursor, data, version, wanted=wanted)

    async def delete_cursor_state(self, cursor: str, version: int) -> None:
        """CAS-delete a cursor's stored state (see :meth:`LedgerStorage.delete_cursor_state`)."""
        await self._storage.delete_cursor_state(cursor, version)

    # ------------------------------------------------------------------ trimming

    def _schedule_trim(self, delay: float) -> None:
        if self._trim_timer is not None or self._state is not State.OPEN:
            return
        self._trim_timer = self._loop.call_later(delay, self._on_trim_timer)

    def _on_trim_timer(self) -> None:
        self._trim_timer = None
        if self._state is State.OPEN:
            self._storage.spawn(self.trim())

    def check_trim(self) -> None:
        """Trim what retention allows now (the factory's periodic check, for retention by time)."""
        self._schedule_trim(0.0)

    def _trim_candidates(self) -> list[int]:
        durable = [c.mark_delete_position for c in self._cursors.values() if c.durable]
        # With no durable cursor nothing is waiting for the data: all of it counts as consumed.
        slowest = min(durable) if durable else self._last_confirmed
        ledgers = (self._ledgers[lid] for lid in self._ledger_ids)
        return retention.trimmable(ledgers, self._writer.current, slowest, self.total_size, self._config, now_ms())

    async def trim(self) -> list[int]:
        """Delete consumed ledgers outside retention now; returns the deleted ledger ids."""
        if self._state is not State.OPEN:
            return []
        async with self._meta_lock:
            if self._state is not State.OPEN:
                return []
            doomed = self._trim_candidates()
            if not doomed:
                return []
            remaining = [self._ledgers[i] for i in self._ledger_ids if i not in doomed]
            try:
                await self._storage.write_info(remaining, self._properties)
            except ManagedLedgerFencedError:
                return []
            except ManagedLedgerError as e:
                log.warning("%s: trimming failed: %s", self.name, e)
                return []
            for lid in doomed:
                self._forget_ledger(lid)
            self._move_cursors_past_trimmed()
        for lid in doomed:
            await self._storage.delete_ledger_quietly(lid)
        log.debug("%s: trimmed ledgers %s", self.name, doomed)
        return doomed

    def _forget_ledger(self, lid: int) -> None:
        li = self._ledgers.pop(lid)
        self._ledger_ids.remove(lid)
        if li.closed:
            self._closed_entries -= li.entries
            self._closed_size -= li.size
        self._cache.evict_ledger(lid)
        self._reader.forget_ledger(lid)

    def _move_cursors_past_trimmed(self) -> None:
        if not self._ledger_ids:
            return
        first_id = self._ledger_ids[0]
        for cursor in self._cursors.values():
            cursor.ledgers_trimmed_before(first_id)

    # ------------------------------------------------------------------ lifecycle

    def _check_open(self) -> None:
        if self._state is State.CLOSED:
            raise ManagedLedgerClosedError(f"{self.name} is closed")

    def _set_fenced(self, why: str) -> None:
        if self._state is not State.OPEN:
            return
        log.warning("%s: fenced (%s)", self.name, why)
        self._state = State.FENCED
        self._writer.stop_accepting()
        self._writer.fail_queued(ManagedLedgerFencedError(f"{self.name} is fenced: another owner opened it"))
        self._cancel_timers()

    def _cancel_timers(self) -> None:
        if self._trim_timer is not None:
            self._trim_timer.cancel()
            self._trim_timer = None

    async def close(self) -> None:
        await self.shutdown(seal=True)
        self._factory.forget(self)

    async def shutdown(self, *, seal: bool) -> None:
        """Stop this instance without leaving the factory; ``seal`` closes the current ledger (factory use)."""
        # Concurrent close()/delete() calls share one shutdown.
        if self._shutdown_task is None:
            self._shutdown_task = self._storage.spawn(self._do_shutdown(seal=seal))
        await asyncio.shield(self._shutdown_task)

    async def _do_shutdown(self, *, seal: bool) -> None:
        if self._state is State.CLOSED:
            return
        was_open = self._state is State.OPEN
        self._writer.stop_accepting()
        self._cancel_timers()
        timeout = self._factory.op_timeout_seconds
        # Let a rollover and in-flight appends finish so their callers get real answers.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._writer.quiesce()
        # Flush while the store is still ours to write.
        if was_open:
            results = await asyncio.gather(
                *(c.flush() for c in self._cursors.values() if c.durable), return_exceptions=True
            )
            for r in results:
                if isinstance(r, BaseException):
                    log.warning("%s: cursor flush on close failed: %s", self.name, r)
        self._state = State.CLOSED
        self._writer.fail_queued(ManagedLedgerClosedError(f"{self.name} is closed"))
        for cursor in list(self._cursors.values()):
            cursor.close_now()
        sealing = seal and was_open
        if sealing:
            async with self._meta_lock:
                try:
                    await self._writer.seal()
                    await self._storage.write_info([self._ledgers[i] for i in self._ledger_ids], self._properties)
                except (ManagedLedgerError, LedgerError) as e:
                    log.warning("%s: could not seal the current ledger on close: %s", self.name, e)
        await self._writer.release(close_handle=not sealing)
        await self._reader.close()
        self._cache.close()
        await self._storage.close_tasks()  # (not this shutdown task itself)

    async def delete(self) -> None:
        await self.shutdown(seal=False)
        self._factory.forget(self)
        for lid in list(self._ledger_ids):
            await self._storage.delete_ledger_quietly(lid)
        await self._storage.delete_metadata()

    def __repr__(self) -> str:
        return f"ManagedLedgerImpl({self.name!r}, {self._state.value}, ledgers={self._ledger_ids})"
