"""The writing end of a managed ledger: the current ledger's write handle, the adds and the rollover.

``add`` normally awaits the write handle's ``append`` directly (no extra task per entry);
concurrent calls are pipelined and the handle completes them in order. When the current ledger is
full (or failed) the writer stops accepting direct appends, waits for the in-flight ones, closes
the ledger, creates the next one and has the managed ledger record it in its list (a
compare-and-swap). Appends arriving meanwhile are queued and re-issued in arrival order by tasks
that start in FIFO order; direct appends resume only once the last of them has been issued, so
nothing overtakes.

Every add ends, in bounded time, with a position or a :class:`ManagedLedgerError` (never a
cancellation): adds are numbered on arrival, and once one fails for good (out of retries, or no
ledger could be created) every add that arrived before that moment and is not yet stored fails too,
in order, so a later entry is never stored behind an earlier one that failed. A ledger whose close
fails is still sealed here (its readers recover it) and the next add rolls over again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Protocol

from magnetar.ledger.api import LedgerConfig, LedgerError, LedgerFencedError, WriteHandle
from magnetar.managed_ledger.api import (
    AddCallback,
    AddRunCallback,
    ManagedLedgerClosedError,
    ManagedLedgerConfig,
    ManagedLedgerError,
    ManagedLedgerFencedError,
    Position,
    make_position,
)
from magnetar.managed_ledger.metadata import LedgerInfo
from magnetar.managed_ledger.storage import LedgerStorage, now_ms

log = logging.getLogger(__name__)

#: How often one entry is re-issued on a fresh ledger after write failures before the add fails.
MAX_ADD_ATTEMPTS = 3


class WriterHost(Protocol):
    """The managed ledger as its :class:`LedgerWriter` sees it."""

    @property
    def ledger_ids(self) -> list[int]:
        """Ids of the managed ledger's ledgers, oldest first."""

    @property
    def writable(self) -> bool:
        """Whether the managed ledger is open (not opening, fenced or closed)."""

    @property
    def list_lock(self) -> asyncio.Lock:
        """Serialises changes of the ledger list."""

    def not_writable_error(self) -> ManagedLedgerError:
        """The error an add fails with while not :attr:`writable`."""

    def fence(self, why: str) -> None:
        """Another owner took over: stop for good."""

    async def add_ledger(self, li: LedgerInfo) -> None:
        """Record a new ledger as the last of the list (caller holds :attr:`list_lock`)."""

    def on_ledger_sealed(self, li: LedgerInfo) -> None:
        """The current ledger was closed with its final length."""

    async def drop_empty_ledgers(self) -> None:
        """Remove closed ledgers without entries (caller holds :attr:`list_lock`)."""

    def on_rolled_over(self) -> None:
        """A rollover finished (an older ledger may be trimmable now)."""

    def entries_added(self, ledger_id: int, first_entry_id: int, datas: Sequence[bytes]) -> None:
        """Adds were confirmed at consecutive entries of ``ledger_id`` from ``first_entry_id``."""


@dataclass(slots=True, eq=False)
class _PendingAdd:
    data: bytes
    future: asyncio.Future[Position]
    seq: int  # arrival order
    attempts: int = 0


def _settle(fut: asyncio.Future[Position], position: Position | None, exc: BaseException | None) -> None:
    if fut.done():
        return
    if exc is not None:
        fut.set_exception(exc)
    else:
        assert position is not None
        fut.set_result(position)


def _deliver(callback: AddCallback, fut: asyncio.Future[Position]) -> None:
    """Hand a queued or retried add's outcome (its future) to the direct add's callback."""
    if fut.cancelled():
        callback(None, ManagedLedgerClosedError("add cancelled"))
    elif (exc := fut.exception()) is not None:
        callback(None, exc)
    else:
        callback(fut.result(), None)


def _tell_one(callback: AddRunCallback, index: int, position: Position | None, exc: BaseException | None) -> None:
    """One add of a run, added on its own: its outcome as the run's callback takes it."""
    callback(index, position, 1, exc)


def _finish(
    item: _PendingAdd | None, callback: AddCallback | None, pos: Position | None, exc: BaseException | None
) -> None:
    if callback is not None:
        callback(pos, exc)
    elif item is not None and not item.future.done():
        if exc is not None:
            item.future.set_exception(exc)
        else:
            assert pos is not None
            item.future.set_result(pos)


class LedgerWriter:
    """Writes a managed ledger's entries to its current ledger and rolls over to the next one."""

    # Slots: one of these per idle topic, ~60 bytes less each than an instance dict (CPython 3.11).
    __slots__ = (
        "_accepting",
        "_config",
        "_current",
        "_current_created",
        "_doomed_before",
        "_doomed_error",
        "_drain_waiters",
        "_handle",
        "_host",
        "_inflight",
        "_issued_bytes",
        "_issued_entries",
        "_items",
        "_loop",
        "_name",
        "_next_seq",
        "_queue",
        "_requeue",
        "_retry",
        "_rolling",
        "_rollover_task",
        "_rollover_timer",
        "_storage",
    )

    def __init__(self, host: WriterHost, storage: LedgerStorage, config: ManagedLedgerConfig) -> None:
        self._host = host
        self._storage = storage
        self._config = config
        self._name = storage.name
        self._loop = asyncio.get_running_loop()
        # The current ledger.
        self._current: LedgerInfo | None = None
        self._current_created = 0.0  # loop time, for rollover age
        self._handle: WriteHandle | None = None
        self._issued_entries = 0
        self._issued_bytes = 0
        # Direct appends vs. queued ones (see module docstring).
        self._accepting = False
        self._rolling = False
        self._queue: list[_PendingAdd] = []  # only appended, then taken whole: a list is 700 B less than a deque
        self._requeue: list[_PendingAdd] = []
        self._retry: list[_PendingAdd] = []
        self._inflight = 0
        self._drain_waiters: list[asyncio.Future[None]] = []
        self._rollover_task: asyncio.Task[None] | None = None
        self._rollover_timer: asyncio.TimerHandle | None = None
        # Arrival numbers: adds numbered below ``_doomed_before`` fail instead of being retried.
        self._next_seq = 0
        self._doomed_before = 0
        self._doomed_error: ManagedLedgerError | None = None
        # Adds with a future of their own (queued or retried), failed for sure on release.
        self._items: set[_PendingAdd] | None = None  # made by the first such add

    @property
    def current(self) -> LedgerInfo | None:
        """The ledger being written (``None`` before the first one exists)."""
        return self._current

    @property
    def handle(self) -> WriteHandle | None:
        """The current ledger's write handle (``None`` while there is no writable ledger)."""
        return self._handle

    def start(self) -> None:
        """The managed ledger is open: accept direct appends."""
        self._accepting = True

    # ------------------------------------------------------------------ adds

    async def add(self, data: bytes) -> Position:
        """Append one entry; its position once the ledger confirmed it, else a ManagedLedgerError."""
        fut: asyncio.Future[Position] = self._loop.create_future()
        self.add_async(data, partial(_settle, fut))
        return await fut

    def add_async(self, data: bytes, callback: AddCallback) -> None:
        """Append one entry without a task or coroutine: ``callback(position, None)`` once the ledger
        confirmed it, else ``callback(None, ManagedLedgerError)``; exactly once, possibly before this
        returns (an add refused at once). Entries are issued in call order."""
        seq = self._next_seq
        self._next_seq += 1
        if self._accepting:
            self._issue(data, seq, None, callback)
            return
        host = self._host
        if not host.writable:
            callback(None, host.not_writable_error())
            return
        item = self._new_item(data, seq)
        item.future.add_done_callback(partial(_deliver, callback))
        self._queue.append(item)
        if self._handle is None and not self._rolling:
            self._start_rollover()  # no writable ledger (an earlier rollover failed): try again

    def add_many(self, datas: Sequence[bytes], callback: AddRunCallback) -> None:
        """Append entries in order with one callback told per run (see :data:`AddRunCallback`).

        While the current ledger accepts direct appends and this run does not fill it, the run goes to the
        write handle in one call (:meth:`WriteHandle.append_many`): one callback per run of stored entries
        instead of one per entry. Otherwise (a rollover in progress or due within the run, no writable
        ledger) each entry is added as :meth:`add_async` adds it, with the same ordering and failure rules.
        """
        n = len(datas)
        if not n:
            return
        size = sum(map(len, datas))
        if not self._accepting or self._fills_ledger(self._issued_entries + n, self._issued_bytes + size):
            for index, data in enumerate(datas):
                self.add_async(data, partial(_tell_one, callback, index))
            return
        handle, cur = self._handle, self._current
        assert handle is not None and cur is not None
        seq = self._next_seq
        self._next_seq += n
        self._inflight += n
        if not self._issued_entries and self._rollover_timer is None:
            self._arm_rollover_timer()
        self._issued_entries += n
        self._issued_bytes += size
        try:
            handle.append_many(datas, partial(self._issued_run, datas, seq, callback, cur))
        except BaseException as e:  # the handle failed or is closing: each add retries or fails on its own
            for index, data in enumerate(datas):
                self._issued(data, seq + index, None, partial(_tell_one, callback, index), cur, None, e)

    def _issued_run(
        self,
        datas: Sequence[bytes],
        seq: int,
        callback: AddRunCallback,
        cur: LedgerInfo,
        index: int,
        entry_id: int | None,
        count: int,
        exc: BaseException | None,
    ) -> None:
        """``count`` appends of a run ended from its ``index``-th: confirm them, or retry / fail the one that
        failed as :meth:`_issued` does for a single add."""
        if exc is not None:
            self._issued(datas[index], seq + index, None, partial(_tell_one, callback, index), cur, None, exc)
            return
        assert entry_id is not None
        self._inflight -= count
        if not self._inflight and self._drain_waiters:
            self._tell_drained()
        stored = datas[index : index + count]
        if entry_id + count > cur.entries:
            cur.entries = entry_id + count
        cur.size += sum(map(len, stored))
        self._host.entries_added(cur.ledger_id, entry_id, stored)
        callback(index, make_position((cur.ledger_id, entry_id)), count, None)

    def _fills_ledger(self, entries: int, size: int) -> bool:
        """Whether the current ledger is due to roll over once it holds ``entries`` entries of ``size`` bytes
        (Pulsar's rule: by entries or size, once it is older than the minimum rollover time)."""
        cfg = self._config
        return (
            entries >= cfg.max_entries_per_ledger or size >= cfg.max_size_per_ledger_bytes
        ) and self._loop.time() - self._current_created >= cfg.min_ledger_rollover_seconds

    def _arm_rollover_timer(self) -> None:
        # Rolls over max_ledger_rollover_seconds after the ledger's creation (Pulsar's rule: only a ledger
        # with entries rolls over on time).
        self._rollover_timer = self._loop.call_at(
            self._current_created + max(self._config.max_ledger_rollover_seconds, 0.001), self._on_rollover_timer
        )

    def _new_item(self, data: bytes, seq: int) -> _PendingAdd:
        item = _PendingAdd(data, self._loop.create_future(), seq)
        items = self._items
        if items is None:
            items = self._items = set()
        items.add(item)
        item.future.add_done_callback(lambda _f: items.discard(item))
        return item

    def _doomed(self) -> ManagedLedgerError:
        err = self._doomed_error
        assert err is not None
        return type(err)(str(err))  # a fresh instance per add (no shared traceback)

    def _issue(self, data: bytes, seq: int, item: _PendingAdd | None, callback: AddCallback | None) -> None:
        """Issue one add to the current handle (synchronously, so entries go out in call order). The
        outcome goes to ``callback`` (a direct add) or to ``item``'s future (a queued or retried add)."""
        handle = self._handle
        cur = self._current
        assert handle is not None and cur is not None
        self._inflight += 1
        if not self._issued_entries and self._rollover_timer is None:
            self._arm_rollover_timer()
        self._issued_entries += 1
        self._issued_bytes += len(data)
        if self._fills_ledger(self._issued_entries, self._issued_bytes):
            self._start_rollover()
        try:
            handle.append_async(data, partial(self._issued, data, seq, item, callback, cur))
        except BaseException as e:  # the handle failed or is closing
            self._issued(data, seq, item, callback, cur, None, e)

    def _issued(
        self,
        data: bytes,
        seq: int,
        item: _PendingAdd | None,
        callback: AddCallback | None,
        cur: LedgerInfo,
        entry_id: int | None,
        exc: BaseException | None,
    ) -> None:
        """An issued add ended: confirm it, retry it on the next ledger, or fail it."""
        # Runs once per entry: the success path calls nothing it does not need.
        self._inflight -= 1
        if not self._inflight and self._drain_waiters:
            self._tell_drained()
        if exc is None:
            assert entry_id is not None
            pos = make_position((cur.ledger_id, entry_id))
            if entry_id >= cur.entries:
                cur.entries = entry_id + 1
            cur.size += len(data)
            self._host.entries_added(cur.ledger_id, entry_id, (data,))
            if callback is not None:
                callback(pos, None)
            else:
                _finish(item, None, pos, None)
            return
        if isinstance(exc, LedgerFencedError):
            self._host.fence("the current ledger was fenced by another owner")
            _finish(item, callback, None, ManagedLedgerFencedError(f"{self._name} is fenced: another owner opened it"))
            return
        if not isinstance(exc, LedgerError):
            err = (
                exc if isinstance(exc, ManagedLedgerError) else ManagedLedgerError(f"{self._name}: add failed: {exc!r}")
            )
            _finish(item, callback, None, err)
            return
        if seq < self._doomed_before:  # an add before this one failed for good: so does this one
            _finish(item, callback, None, self._doomed())
            return
        attempts = 1 if item is None else item.attempts + 1
        if not self._host.writable or attempts >= MAX_ADD_ATTEMPTS:
            err = ManagedLedgerError(f"{self._name}: add failed: {exc}")
            self.fail_queued(err)
            _finish(item, callback, None, err)
            return
        if item is None:
            item = self._new_item(data, seq)
            assert callback is not None
            item.future.add_done_callback(partial(_deliver, callback))
        item.attempts = attempts
        log.warning("%s: write to ledger %d failed (%s); continuing on a new ledger", self._name, cur.ledger_id, exc)
        self._retry.append(item)  # failures complete in issue order, so retries keep it
        self._start_rollover()

    def _tell_drained(self) -> None:
        """No append is in flight any more: wake :meth:`_wait_drained`."""
        waiters, self._drain_waiters = self._drain_waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    async def _wait_drained(self) -> None:
        """Wait until no append is in flight."""
        if self._inflight:
            fut: asyncio.Future[None] = self._loop.create_future()
            self._drain_waiters.append(fut)
            await fut

    def _pump(self) -> None:
        """Issue queued adds in order (synchronously), then reopen the direct path if none is left."""
        items = [*self._retry, *self._requeue, *self._queue]
        self._retry.clear()
        self._requeue.clear()
        self._queue.clear()
        for item in items:
            if item.future.done():  # the caller gave up, or a failure before it doomed it
                continue
            if not self._host.writable:
                item.future.set_exception(self._host.not_writable_error())
            elif item.seq < self._doomed_before:
                item.future.set_exception(self._doomed())
            elif self._rolling or self._handle is None:
                self._requeue.append(item)  # a rollover began mid-wave: back in line, still in order
            else:
                self._issue(item.data, item.seq, item, None)
        self._accepting = self._host.writable and self._handle is not None and not self._rolling and not self._requeue

    def fail_queued(self, exc: ManagedLedgerError) -> None:
        """Fail with ``exc`` every add that arrived so far and is not stored yet: queued ones now,
        in-flight ones should their write fail (none of them is retried)."""
        self._doomed_before = self._next_seq
        self._doomed_error = exc
        items = [*self._retry, *self._requeue, *self._queue]
        self._retry.clear()
        self._requeue.clear()
        self._queue.clear()
        for it in items:
            if not it.future.done():
                it.future.set_exception(exc)

    # ------------------------------------------------------------------ ledgers and rollover

    async def create_ledger(self) -> None:
        """Create the next ledger, have it recorded in the list and write to it (caller holds the list lock)."""
        cfg = self._config
        storage = self._storage
        ids = self._host.ledger_ids  # the next id must be above them, whichever broker wrote them
        config = LedgerConfig(
            cfg.ensemble_size, cfg.write_quorum, cfg.ack_quorum, min_ledger_id=ids[-1] + 1 if ids else 0
        )
        handle = await storage.io(
            storage.client.create_ledger(config),
            "create ledger",
        )
        lid = handle.ledger_id
        li = LedgerInfo(lid, 0, 0, now_ms(), closed=False)
        try:
            await self._host.add_ledger(li)
        except BaseException:
            await storage.close_handle_quietly(handle)
            await storage.delete_ledger_quietly(lid)
            raise
        self._current = li
        self._current_created = self._loop.time()
        self._handle = handle
        self._issued_entries = 0
        self._issued_bytes = 0
        # The time-based rollover timer is armed by the ledger's first add: an idle topic holds none.
        if self._rollover_timer is not None:
            self._rollover_timer.cancel()
            self._rollover_timer = None

    def _on_rollover_timer(self) -> None:
        self._rollover_timer = None
        if not self._host.writable or self._rolling:
            return
        if self._issued_entries > 0:
            self._start_rollover()

    def _start_rollover(self) -> None:
        if self._rolling or not self._host.writable:
            return
        self._rolling = True
        self._accepting = False
        if self._rollover_timer is not None:
            self._rollover_timer.cancel()
            self._rollover_timer = None
        self._rollover_task = self._storage.spawn(self._rollover())

    async def _rollover(self) -> None:
        host = self._host
        try:
            try:
                async with asyncio.timeout(self._storage.op_timeout_seconds):
                    await self._wait_drained()
            except TimeoutError:
                log.warning("%s: in-flight adds did not complete before rollover", self._name)
            async with host.list_lock:
                if not host.writable:
                    return
                await self.seal()
                await self.create_ledger()
                await host.drop_empty_ledgers()
        except ManagedLedgerFencedError:
            self._rolling = False
            self.fail_queued(host.not_writable_error())
            return
        except Exception as e:
            log.warning("%s: ledger rollover failed: %s", self._name, e)
            self._rolling = False
            self.fail_queued(ManagedLedgerError(f"{self._name}: no writable ledger: {e}"))
            return
        self._rolling = False
        assert self._current is not None
        log.debug("%s: rolled over to ledger %d", self._name, self._current.ledger_id)
        self._pump()
        host.on_rolled_over()

    async def seal(self) -> None:
        """Close the current write handle and record its final size (caller holds the list lock)."""
        handle, cur = self._handle, self._current
        if handle is None or cur is None or cur.closed:
            return
        try:
            await self._storage.io(handle.close(), f"close ledger {cur.ledger_id}")
        except LedgerFencedError:
            self._host.fence("the current ledger was fenced by another owner")
            raise ManagedLedgerFencedError(f"{self._name} is fenced") from None
        except Exception as e:
            # The ledger is sealed here all the same (its readers open it with recovery, which
            # closes it in BookKeeper too); keep what we know was confirmed.
            log.warning("%s: closing ledger %d failed: %s", self._name, cur.ledger_id, e)
        else:
            cur.entries = max(cur.entries, handle.last_add_confirmed + 1)
            cur.size = max(cur.size, handle.length)
        self._handle = None
        cur.closed = True
        cur.timestamp_ms = now_ms()
        self._host.on_ledger_sealed(cur)

    # ------------------------------------------------------------------ stopping

    def stop_accepting(self) -> None:
        """Take no more direct appends and start no timed rollover (closing or fenced)."""
        self._accepting = False
        if self._rollover_timer is not None:
            self._rollover_timer.cancel()
            self._rollover_timer = None

    async def quiesce(self) -> None:
        """Wait for a running rollover, in-flight appends and queued waves to finish."""
        while True:
            task = self._rollover_task
            if self._rolling and task is not None and not task.done():
                await asyncio.wait({task})
            elif self._inflight:
                await self._wait_drained()
            else:
                return

    async def release(self, *, close_handle: bool) -> None:
        """Let go of the write handle (``close_handle``: close it first, when it was not sealed) and
        fail every add still waiting: each one ends with an error, none stays pending."""
        handle, self._handle = self._handle, None
        if close_handle and handle is not None:
            await self._storage.close_handle_quietly(handle)
        err = ManagedLedgerClosedError(f"{self._name} is closed")
        self.fail_queued(err)
        for it in list(self._items or ()):
            if not it.future.done():
                it.future.set_exception(err)
