"""The write handle: striping over the ensemble, quorums, pipelined in-order acks, ensemble changes."""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from functools import partial
from typing import Any

from magnetar.bookie.api import (
    BookieClient,
    BookieError,
    BookieFencedError,
    BookieUnavailableError,
)
from magnetar.common.tasks import TaskSet

from . import digest
from .api import (
    AppendCallback,
    LedgerClosedError,
    LedgerEntry,
    LedgerError,
    LedgerFencedError,
    NoSuchEntryError,
    NotEnoughBookiesError,
    RunCallback,
    WriteHandle,
)
from .context import LedgerContext
from .errors import MetadataVersionConflictError
from .metadata import LedgerMetadata, LedgerState
from .reads import EntryReader

log = logging.getLogger(__name__)


class _UnknownBookie(BookieClient):
    """Stands in for an ensemble member the registry does not know: every call fails."""

    def __init__(self, address: str) -> None:
        self.address = address

    def _fail(self) -> BookieUnavailableError:
        return BookieUnavailableError(f"unknown bookie {self.address}")

    async def add_entry(self, *args: Any, **kwargs: Any) -> None:
        raise self._fail()

    async def read_entries(self, ledger_id: int, first: int, last: int) -> list[tuple[int, bytes]]:
        raise self._fail()

    async def read_last_add_confirmed(self, ledger_id: int) -> tuple[int, int]:
        raise self._fail()

    async def fence(self, ledger_id: int, master_key: bytes) -> tuple[int, int]:
        raise self._fail()

    async def delete_ledger(self, ledger_id: int) -> None:
        raise self._fail()

    async def close(self) -> None:
        pass


class _Run:
    """The appends of one :meth:`LedgerWriteHandle.append_many` call: their ops share it as their callback, so
    completions are told per run of consecutive entries, not per entry."""

    __slots__ = ("callback", "first")

    def __init__(self, callback: RunCallback, first: int) -> None:
        self.callback = callback
        self.first = first  # entry id of the run's first append (index 0)


class _PendingAdd:
    __slots__ = ("acked", "acks", "callback", "data", "entry_id", "future", "head", "mask", "started", "total_length")

    def __init__(
        self,
        entry_id: int,
        head: bytes,
        data: bytes,
        total_length: int,
        future: asyncio.Future[int] | None,
        callback: AppendCallback | _Run | None,
    ) -> None:
        self.entry_id = entry_id
        # The stored entry is head + data, never joined here: the bookie clients write the two parts.
        self.head = head
        self.data = data
        self.total_length = total_length
        #: Exactly one of the two is set: the future of :meth:`append_nowait`, or the callback of
        #: :meth:`append_async` (told directly: no future and no done-callback hop per entry), or the
        #: :class:`_Run` of :meth:`append_many`.
        self.future = future
        self.callback = callback
        self.acks = 0
        self.mask = 0  # bit i: ensemble slot i acknowledged (undone when slot i is replaced)
        self.acked = False
        self.started = time.monotonic()


#: Slots of a handle without failures (``frozenset()`` allocates 216 bytes each time since Python 3.10).
_NO_SLOTS: frozenset[int] = frozenset()
_NO_BOOKIES: frozenset[str] = frozenset()

#: Pending adds of a handle that never had one (shared, read-only: maxlen 0 so nothing can be kept in it).
_NO_ADDS: collections.deque[_PendingAdd] = collections.deque(maxlen=0)


def _slot_lists(clients: tuple[BookieClient, ...]) -> tuple[list[Any], ...]:
    """Per ensemble slot: the client, and the cheapest add it offers.

    RemoteBookieClient.add_encoded_cb takes an entry encoded once for all its replicas and calls the
    slot's callback straight from its connection (no future); LocalBookieClient.add_parts_async calls
    back from the journal (no future either); both take the digest header and the data as two buffers.
    LocalBookieClient.add_parts_many takes a run of entries with one callback.
    add_entry_nowait returns a future (no task); anything else gets a task (these two get the stored
    entry joined).
    """
    return (
        list(clients),
        [getattr(c, "add_encoded_cb", None) for c in clients],
        [getattr(c, "encode_add_parts", None) for c in clients],
        [getattr(c, "add_parts_async", None) for c in clients],
        [getattr(c, "add_entry_nowait", None) for c in clients],
        [getattr(c, "add_parts_many", None) for c in clients],
    )


#: :func:`_slot_lists` by ensemble clients, shared between handles (bounded: cleared when full).
_SLOT_LISTS: dict[tuple[BookieClient, ...], tuple[list[Any], ...]] = {}
_SLOT_LISTS_MAX = 256


class LedgerWriteHandle(WriteHandle):
    """The single writer of a ledger.

    Appends are pipelined: each is sent to its write set at once and completes (in entry order)
    when an ack quorum has it; the LAC sent with an add is the highest entry completed so far.
    A fenced bookie fails the handle with :class:`LedgerFencedError`. Any other failure (error or
    add timeout) of an ensemble member triggers an *ensemble change*: a replacement bookie takes
    the failed slot in a new fragment starting at LAC + 1 (metadata compare-and-swap) and the
    pending adds of that slot are re-sent to it. Without a replacement the handle carries on
    degraded while every write set can still reach its ack quorum, and fails with
    :class:`NotEnoughBookiesError` otherwise.
    """

    # 34 attributes: past CPython's 30 shared-key attributes an instance dict is a full dict of its
    # own (~1.5 KiB per idle topic); slots cost 8 bytes each.
    __slots__ = (
        "_async",
        "_bad",
        "_cb_adds",
        "_change_task",
        "_changed_at",
        "_changing",
        "_clients",
        "_closed",
        "_closing",
        "_degraded_logged",
        "_drained",
        "_encoders",
        "_error",
        "_failed",
        "_lac",
        "_length",
        "_loop",
        "_many",
        "_master_key",
        "_next_entry",
        "_nowait",
        "_on_close",
        "_pending",
        "_pending_length",
        "_reader",
        "_recovery",
        "_slot_done",
        "_slot_gen",
        "_tasks",
        "_timer",
        "ctx",
        "ensemble_changes",
        "ledger_id",
        "metadata",
        "version",
    )

    def __init__(
        self,
        ctx: LedgerContext,
        ledger_id: int,
        metadata: LedgerMetadata,
        version: int,
        *,
        next_entry_id: int = 0,
        lac: int = -1,
        length: int = 0,
        recovery: bool = False,
        on_close: Callable[[LedgerWriteHandle], None] | None = None,
    ) -> None:
        self.ctx = ctx
        self.ledger_id = ledger_id
        self.metadata = metadata
        self.version = version
        self._master_key = digest.master_key(metadata.password)
        self._recovery = recovery
        self._on_close = on_close
        self._loop = asyncio.get_running_loop()
        self._next_entry = next_entry_id
        self._lac = lac
        self._length = length
        self._pending_length = length
        # The shared empty _NO_ADDS until the first add: an empty deque costs 760 bytes per idle topic.
        self._pending: collections.deque[_PendingAdd] = _NO_ADDS
        self._drained: asyncio.Future[None] | None = None  # made by wait_pending, set when _pending empties
        self._error: LedgerError | None = None
        #: Slots of the current ensemble that failed and wait for a replacement.
        # Empty frozensets until the first bookie failure (an empty set costs 216 bytes per idle topic).
        self._failed: set[int] | frozenset[int] = _NO_SLOTS
        #: Bookies that failed this handle: never chosen again as a replacement (no flapping).
        self._bad: set[str] | frozenset[str] = _NO_BOOKIES
        #: Per-slot generation, bumped when the slot's bookie is replaced: late answers of the
        #: replaced bookie carry the old generation and are ignored.
        self._slot_gen: list[int] = [0] * metadata.ensemble_size
        self._changing = False  # an ensemble change is in progress: completions wait for it
        self._change_task: asyncio.Task[None] | None = None
        self._tasks = TaskSet("writer of ledger", owner=ledger_id)
        self._changed_at = 0.0  # add timeouts count from the last ensemble change at the earliest
        self.ensemble_changes = 0
        self._degraded_logged = False
        self._closing = False
        self._closed = False
        self._reader = EntryReader(ctx, ledger_id, metadata)
        self._set_ensemble(metadata.ensembles[-1][1])
        # Armed while adds are pending (or slots wait for a replacement), not for the whole life of the
        # handle: an idle topic costs no timer and no wakeups.
        self._timer: asyncio.TimerHandle | None = None

    def _set_ensemble(self, bookies: list[str]) -> None:
        clients = tuple(self._client_of(a) for a in bookies)
        # The per-slot lists are shared by every handle on the same bookie clients (read-only until an
        # ensemble change, which copies them first): ~0.5 KiB less per open ledger.
        lists = _SLOT_LISTS.get(clients)
        if lists is None:
            if len(_SLOT_LISTS) >= _SLOT_LISTS_MAX:
                _SLOT_LISTS.clear()
            lists = _SLOT_LISTS[clients] = _slot_lists(clients)
        self._clients, self._cb_adds, self._encoders, self._async, self._nowait, self._many = lists
        self._slot_done: list[Callable[[_PendingAdd, BaseException | None], None]] = [
            partial(self._on_slot_done, idx, gen) for idx, gen in enumerate(self._slot_gen)
        ]

    def _client_of(self, address: str) -> BookieClient:
        try:
            return self.ctx.registry.client(address)
        except BookieError:
            return _UnknownBookie(address)  # e.g. decommissioned: its adds just fail

    # ---------------------------------------------------------------- properties

    @property
    def last_add_confirmed(self) -> int:
        return self._lac

    @property
    def length(self) -> int:
        return self._length

    @property
    def pending_adds(self) -> int:
        return len(self._pending)

    # ---------------------------------------------------------------- appends

    async def append(self, data: bytes) -> int:
        return await self.append_nowait(data)

    def append_nowait(self, data: bytes) -> asyncio.Future[int]:
        """Start an append; the future gives its entry id once an ack quorum has it (in order)."""
        fut: asyncio.Future[int] = self._loop.create_future()
        self._start(data, fut, None)
        return fut

    def append_async(self, data: bytes, callback: AppendCallback) -> None:
        """Start an append whose outcome goes straight to ``callback`` when it completes (in order)."""
        self._start(data, None, callback)

    def append_many(self, datas: Sequence[bytes], callback: RunCallback) -> None:
        """Start appends of ``datas`` (consecutive entries) whose outcomes go to ``callback`` per completed run.

        Where every bookie of the write set takes a run in one call (an in-process bookie:
        ``add_parts_many``) and every entry has the same write set (ensemble = write quorum), each of them
        gets the whole run with one callback; otherwise each entry is sent as :meth:`append_async` sends it.
        Either way completions are told per run of consecutive entries."""
        if self._error is not None:
            raise self._error
        if self._closing:
            raise LedgerClosedError(f"ledger {self.ledger_id} is closed")
        if not datas:
            return
        lid = self.ledger_id
        first = self._next_entry
        run = _Run(callback, first)
        header = digest.frame_header
        total = self._pending_length
        heads: list[bytes] = []
        ops: list[_PendingAdd] = []
        for eid, data in enumerate(datas, first):
            total += len(data)
            head = header(lid, eid, total, data)
            heads.append(head)
            ops.append(_PendingAdd(eid, head, data, total, None, run))
        self._next_entry = first + len(ops)
        self._pending_length = total
        pending = self._pending
        if pending is _NO_ADDS:
            pending = self._pending = collections.deque()
        pending.extend(ops)
        if self._timer is None:
            self._arm_timer()
        md = self.metadata
        many = self._many
        Qw = md.write_quorum
        if md.ensemble_size != Qw or self._changing or self._failed or None in many[:Qw]:
            for op in ops:
                self._send(op)
            return
        eids = range(first, first + len(ops))
        key, lac, recovery, gens = self._master_key, self._lac, self._recovery, self._slot_gen
        for idx in range(Qw):
            done = partial(self._on_run_result, ops, idx, gens[idx])
            try:
                many[idx](lid, eids, key, lac, heads, datas, recovery, done)
            except BookieError as e:
                done(e)

    def _on_run_result(self, ops: list[_PendingAdd], idx: int, gen: int, exc: BaseException | None) -> None:
        """Replica ``idx``'s answer for a whole run (``add_parts_many``): as :meth:`_on_replica_result` for
        each of its entries."""
        if gen != self._slot_gen[idx]:
            return  # an answer of a bookie that was replaced meanwhile: the replacement counts
        if exc is not None:
            self._on_replica_result(ops[0], idx, gen, exc)  # a failure concerns the bookie, not the entry
            return
        qa, bit = self.metadata.ack_quorum, 1 << idx
        for op in ops:
            if not op.acked:
                op.mask |= bit
                op.acks += 1
                if op.acks >= qa:
                    op.acked = True
        self._complete_in_order()

    def _start(self, data: bytes, future: asyncio.Future[int] | None, callback: AppendCallback | None) -> None:
        if self._error is not None:
            raise self._error
        if self._closing:
            raise LedgerClosedError(f"ledger {self.ledger_id} is closed")
        eid = self._next_entry
        self._next_entry = eid + 1
        total = self._pending_length + len(data)
        self._pending_length = total
        head = digest.frame_header(self.ledger_id, eid, total, data)
        op = _PendingAdd(eid, head, data, total, future, callback)
        pending = self._pending
        if pending is _NO_ADDS:
            pending = self._pending = collections.deque()
        pending.append(op)
        if self._timer is None:
            self._arm_timer()
        self._send(op)

    def _send(self, op: _PendingAdd) -> None:
        # Hot path: the body of _send_to, inlined (no call per replica).
        lid, key, lac, recovery = self.ledger_id, self._master_key, self._lac, self._recovery
        md = self.metadata
        E = md.ensemble_size
        eid, head, data = op.entry_id, op.head, op.data
        gens = self._slot_gen
        encoder = body = None
        for i in range(md.write_quorum):
            idx = (eid + i) % E
            try:
                add_cb = self._cb_adds[idx]
                if add_cb is not None:
                    if self._encoders[idx] is not encoder:  # once per entry (per wire format)
                        encoder = self._encoders[idx]
                        body = encoder(lid, eid, key, lac, head, data, recovery)
                    add_cb(body, self._slot_done[idx], op)
                    continue
                if (cb_add := self._async[idx]) is not None:
                    cb_add(
                        lid, eid, key, lac, head, data, recovery, partial(self._on_replica_result, op, idx, gens[idx])
                    )
                    continue
                nowait = self._nowait[idx]
                if nowait is not None:
                    fut = nowait(lid, eid, key, lac, head + data, recovery)
                else:
                    fut = asyncio.ensure_future(
                        self._clients[idx].add_entry(lid, eid, key, lac, head + data, recovery=recovery)
                    )
            except BookieError as e:
                self._on_replica_result(op, idx, gens[idx], e)
                continue
            fut.add_done_callback(partial(self._on_add_done, op, idx, gens[idx]))

    def _send_to(self, op: _PendingAdd, idx: int) -> None:
        lid, eid, head, data, recovery = self.ledger_id, op.entry_id, op.head, op.data, self._recovery
        gen = self._slot_gen[idx]
        nowait = self._nowait[idx]
        try:
            add_cb = self._cb_adds[idx]
            if add_cb is not None:
                add_cb(
                    self._encoders[idx](lid, eid, self._master_key, self._lac, head, data, recovery),
                    self._slot_done[idx],
                    op,
                )
                return
            if (cb_add := self._async[idx]) is not None:
                cb_add(
                    lid,
                    eid,
                    self._master_key,
                    self._lac,
                    head,
                    data,
                    recovery,
                    partial(self._on_replica_result, op, idx, gen),
                )
                return
            if nowait is not None:
                fut = nowait(lid, eid, self._master_key, self._lac, head + data, recovery)
            else:
                fut = asyncio.ensure_future(
                    self._clients[idx].add_entry(lid, eid, self._master_key, self._lac, head + data, recovery=recovery)
                )
        except BookieError as e:
            self._on_replica_result(op, idx, gen, e)
            return
        fut.add_done_callback(partial(self._on_add_done, op, idx, gen))

    def _on_add_done(self, op: _PendingAdd, idx: int, gen: int, fut: asyncio.Future[None]) -> None:
        if fut.cancelled():
            self._on_replica_result(op, idx, gen, BookieUnavailableError("add cancelled"))
        else:
            self._on_replica_result(op, idx, gen, fut.exception())

    def _on_slot_done(self, idx: int, gen: int, op: _PendingAdd, exc: BaseException | None) -> None:
        """A replica's answer through ``add_entry_cb`` (success tested first: it runs per replica)."""
        if exc is None and gen == self._slot_gen[idx]:
            self._replica_acked(op, idx)
            return
        self._on_replica_result(op, idx, gen, exc)

    def _replica_acked(self, op: _PendingAdd, idx: int) -> None:
        """Count replica ``idx``'s ack; complete adds in order once the ack quorum is reached."""
        if op.acked:
            return
        op.mask |= 1 << idx
        op.acks += 1
        if op.acks >= self.metadata.ack_quorum:
            op.acked = True
            self._complete_in_order()

    def _on_replica_result(self, op: _PendingAdd, idx: int, gen: int, exc: BaseException | None) -> None:
        if gen != self._slot_gen[idx]:
            return  # an answer of a bookie that was replaced meanwhile: the replacement counts
        if exc is None:
            self._replica_acked(op, idx)
            return
        if isinstance(exc, BookieFencedError):
            self._fail(LedgerFencedError(f"ledger {self.ledger_id} was fenced by a recovering client"))
            return
        self._on_bookie_failure(idx, exc)

    def _complete_in_order(self) -> None:
        if self._changing:
            return  # the new fragment starts at LAC + 1: the LAC may not move until it is in place
        pending = self._pending
        while pending and pending[0].acked:
            op = pending.popleft()
            cb = op.callback
            if type(cb) is _Run:  # tell the run of acked entries of the same append_many at once
                first = op.entry_id
                while pending and pending[0].acked and pending[0].callback is cb:
                    op = pending.popleft()
                self._lac = op.entry_id
                self._length = op.total_length
                cb.callback(first - cb.first, first, op.entry_id - first + 1, None)
                continue
            self._lac = op.entry_id
            self._length = op.total_length
            if cb is not None:
                cb(op.entry_id, None)  # type: ignore[operator]  # an AppendCallback
            elif not op.future.done():  # type: ignore[union-attr]  # one of the two is set
                op.future.set_result(op.entry_id)  # type: ignore[union-attr]
        if not pending:
            self._tell_drained()

    # ---------------------------------------------------------------- ensemble changes

    def _on_bookie_failure(self, idx: int, exc: BaseException) -> None:
        """A bookie of the current ensemble failed an add (or timed out): replace it."""
        if idx in self._failed or self._error is not None:
            return  # once per bookie, not once per add
        if not isinstance(self._failed, set):
            self._failed = set()
        self._failed.add(idx)
        if not isinstance(self._bad, set):
            self._bad = set()
        self._bad.add(self._clients[idx].address)
        log.warning(
            "bookie %s failed an add to ledger %d: %r; changing the ensemble",
            self.metadata.ensembles[-1][1][idx],
            self.ledger_id,
            exc,
        )
        self._start_change()
        if self._timer is None:  # degraded: retried from the timer (see _check_timeouts)
            self._arm_timer()

    def _start_change(self) -> None:
        # While closing, only pending adds still need the ensemble; the seal needs none.
        if self._closing and not self._pending:
            return
        if self._change_task is None and self._error is None and not self._closed:
            self._changing = True
            self._change_task = self._tasks.spawn(self._change_ensemble(), name=f"ensemble change {self.ledger_id}")

    async def _change_ensemble(self) -> None:
        """Replace failed slots until none is left (or none can be replaced), then resume."""
        unreplaced: set[int] = set()
        try:
            # Failures reported during a round (they join self._failed) get a round of their own.
            while (failed := self._failed - unreplaced) and self._error is None:
                try:
                    replaced = await self._replace_bookies(failed)
                except LedgerError as e:
                    self._fail(e)
                    return
                except Exception as e:  # e.g. the metadata store is unavailable
                    self._fail(LedgerError(f"ensemble change of ledger {self.ledger_id} failed: {e!r}"))
                    return
                if replaced:
                    self._install(replaced)
                unreplaced |= failed - replaced.keys()
            if unreplaced and self._error is None:
                self._degrade(unreplaced)
        finally:
            self._changing = False
            self._change_task = None
            if self._error is None:
                self._complete_in_order()

    async def _replace_bookies(self, failed: AbstractSet[int]) -> dict[int, str]:
        """Pick replacements for ``failed`` slots and CAS the new fragment into the metadata."""
        ctx = self.ctx
        timeout = ctx.config.bookie_op_timeout_s
        candidates = await asyncio.wait_for(ctx.registry.writable_bookies(), timeout)
        md, version = self.metadata, self.version
        ensemble = list(md.ensembles[-1][1])
        replaced: dict[int, str] = {}
        for idx in sorted(failed):
            try:
                # Excluding the whole ensemble (failed members too) keeps the slots distinct.
                exclude = [*ensemble, *replaced.values(), *self._bad]
                replaced[idx] = ctx.placement.replacement(candidates, exclude, ctx.usage)
            except NotEnoughBookiesError:
                continue
        if not replaced:
            return replaced
        first = self._lac + 1
        for _ in range(ctx.config.metadata_retries):
            last_first, last_bookies = md.ensembles[-1]
            bookies = list(last_bookies)
            for idx, address in replaced.items():
                bookies[idx] = address
            if last_first == first:  # nothing was confirmed in the last fragment: replace it
                ensembles = [*md.ensembles[:-1], (first, bookies)]
            else:
                ensembles = [*md.ensembles, (first, bookies)]
            new_md = md.evolve(ensembles=ensembles)
            try:
                self.version = await ctx.manager.write(self.ledger_id, new_md, version)
            except MetadataVersionConflictError:
                md, version = await ctx.manager.read(self.ledger_id)
                allowed = (LedgerState.OPEN, LedgerState.IN_RECOVERY) if self._recovery else (LedgerState.OPEN,)
                if md.state not in allowed:
                    raise LedgerFencedError(f"ledger {self.ledger_id} was fenced by a recovering client") from None
                if md.ensembles[-1] != (last_first, last_bookies):
                    raise LedgerError(f"ledger {self.ledger_id}: its last fragment changed under its writer") from None
                continue  # a benign change (e.g. auto-recovery of an earlier fragment): rebase
            self.metadata = new_md
            self._reader.metadata = new_md
            log.info(
                "ledger %d: ensemble change at entry %d: %s",
                self.ledger_id,
                first,
                ", ".join(f"{last_bookies[i]} -> {a}" for i, a in sorted(replaced.items())),
            )
            return replaced
        raise LedgerError(f"ensemble change of ledger {self.ledger_id}: too many metadata conflicts")

    def _install(self, replaced: dict[int, str]) -> None:
        """Use the replacements from now on and re-send them what the replaced bookies owed."""
        old = self._clients
        # Private copies before changing them: until now they may be shared with other handles.
        self._clients, self._cb_adds, self._encoders, self._async, self._nowait, self._many = (
            list(x) for x in (old, self._cb_adds, self._encoders, self._async, self._nowait, self._many)
        )
        for idx, address in replaced.items():
            if self._on_close is not None:  # only client-created handles count in placement usage
                self.ctx.usage[old[idx].address] -= 1
                self.ctx.usage[address] += 1
            self._slot_gen[idx] += 1
            self._slot_done[idx] = partial(self._on_slot_done, idx, self._slot_gen[idx])
            client = self._client_of(address)
            self._clients[idx] = client
            self._cb_adds[idx] = getattr(client, "add_encoded_cb", None)
            self._encoders[idx] = getattr(client, "encode_add_parts", None)
            self._nowait[idx] = getattr(client, "add_entry_nowait", None)
            self._async[idx] = getattr(client, "add_parts_async", None)
            self._many[idx] = getattr(client, "add_parts_many", None)
            if isinstance(self._failed, set):
                self._failed.discard(idx)
        self.ensemble_changes += 1
        self._degraded_logged = False
        self._changed_at = time.monotonic()
        md = self.metadata
        E, Qw, Qa = md.ensemble_size, md.write_quorum, md.ack_quorum
        for op in list(self._pending):
            for idx in replaced:
                if (idx - op.entry_id) % E >= Qw:
                    continue  # not in this entry's write set
                bit = 1 << idx
                if op.mask & bit:  # the replaced bookie's copy is not in the new fragment
                    op.mask &= ~bit
                    op.acks -= 1
                    op.acked = op.acks >= Qa
                self._send_to(op, idx)

    def _degrade(self, unreplaced: set[int]) -> None:
        """No replacement for ``unreplaced`` slots: carry on if every write set still has Qa."""
        md = self.metadata
        E, Qw, Qa = md.ensemble_size, md.write_quorum, md.ack_quorum
        worst = max(sum(1 for i in range(Qw) if (s + i) % E in self._failed) for s in range(E))
        bookies = md.ensembles[-1][1]
        names = ", ".join(bookies[i] for i in sorted(unreplaced))
        if Qw - worst < Qa:
            self._fail(
                NotEnoughBookiesError(
                    f"ledger {self.ledger_id}: no writable bookie outside its ensemble {bookies} to replace "
                    f"failed {names}, and without it writes cannot reach the ack quorum ({Qa} of {Qw})"
                )
            )
            return
        level = logging.DEBUG if self._degraded_logged else logging.WARNING  # retried every tick
        self._degraded_logged = True
        log.log(level, "ledger %d: no replacement for %s; writing degraded, retrying later", self.ledger_id, names)

    def _fail(self, err: LedgerError) -> None:
        """Fail every pending add and all later ones (later adds cannot complete in order)."""
        if self._error is None:
            self._error = err
        pending, self._pending = self._pending, _NO_ADDS
        for op in pending:
            op.acked = True  # late acks of a failed add count for nothing
            cb = op.callback
            if type(cb) is _Run:
                cb.callback(op.entry_id - cb.first, None, 1, self._error)
            elif cb is not None:
                cb(None, self._error)  # type: ignore[operator]  # an AppendCallback
            elif not op.future.done():  # type: ignore[union-attr]  # one of the two is set
                op.future.set_exception(self._error)  # type: ignore[union-attr]
        self._tell_drained()

    def _tell_drained(self) -> None:
        """No add is pending any more: wake :meth:`wait_pending`."""
        drained, self._drained = self._drained, None
        if drained is not None and not drained.done():
            drained.set_result(None)

    def _arm_timer(self) -> None:
        period = max(0.05, min(1.0, self.ctx.config.add_timeout_s / 4))
        self._timer = self._loop.call_later(period, self._check_timeouts)

    def _check_timeouts(self) -> None:
        if self._closed:
            return
        if self._pending and self._error is None:
            op = self._pending[0]
            now = time.monotonic()
            timeout = self.ctx.config.add_timeout_s
            if now - op.started > timeout * 3:
                # Bounded even if replacements keep timing out too.
                self._fail(LedgerError(f"add of entry {self.ledger_id}:{op.entry_id} timed out"))
            elif not self._changing and now - max(op.started, self._changed_at) > timeout:
                E = self.metadata.ensemble_size
                for i in range(self.metadata.write_quorum):
                    idx = (op.entry_id + i) % E
                    if not op.mask & (1 << idx):
                        self._on_bookie_failure(idx, TimeoutError(f"add of entry {op.entry_id} timed out"))
        if self._failed and self._change_task is None and self._error is None:
            self._start_change()  # degraded: a bookie may have become writable since
        if self._pending or self._failed:
            self._arm_timer()
        else:
            self._timer = None

    # ---------------------------------------------------------------- reads

    async def read(self, first: int, last: int) -> list[LedgerEntry]:
        if first < 0 or last < first or last > self._lac:
            raise NoSuchEntryError(f"entries {first}..{last} are not all confirmed (LAC {self._lac})")
        rows = await self._reader.fetch(first, last)
        return [LedgerEntry(self.ledger_id, eid, data) for eid, data, _ in rows]

    # ---------------------------------------------------------------- close

    async def wait_pending(self) -> None:
        """Wait (bounded by the add timeout) until no add is in flight."""
        if self._pending:
            # Adds complete in order (or all fail together): the queue drained means every add answered.
            # asyncio.wait, not wait_for: a cancelled close must not cancel the shared waiter.
            if self._drained is None:
                self._drained = self._loop.create_future()
            _, not_done = await asyncio.wait({self._drained}, timeout=self.ctx.config.add_timeout_s + 1)
            if not_done:
                self._fail(LedgerError(f"adds to ledger {self.ledger_id} timed out"))

    def _release(self) -> None:
        if self._pending:  # close() was cancelled or failed: no add may stay pending forever
            self._fail(LedgerClosedError(f"write handle of ledger {self.ledger_id} was released"))
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._tasks.cancel()
        if not self._closed:
            self._closed = True
            if self._on_close is not None:
                self._on_close(self)

    async def close(self) -> None:
        """Seal the ledger at its LAC; :class:`LedgerFencedError` if a recovery took it over."""
        if self._closed:
            return
        self._closing = True
        try:
            await self.wait_pending()
            task = self._change_task
            if task is not None:  # seal on top of the ensemble change's metadata, not beside it
                await asyncio.wait({task}, timeout=self.ctx.config.add_timeout_s)
            if isinstance(self._error, LedgerFencedError):
                raise self._error
            await self._seal()
        finally:
            self._release()

    async def _seal(self) -> None:
        lac, length = self._lac, self._length
        md, version = self.metadata, self.version
        for _ in range(self.ctx.config.metadata_retries):
            closed = md.evolve(state=LedgerState.CLOSED, last_entry_id=lac, length=length)
            try:
                self.version = await self.ctx.manager.write(self.ledger_id, closed, version)
                self.metadata = closed
                return
            except MetadataVersionConflictError:
                md, version = await self.ctx.manager.read(self.ledger_id)
            if md.state is LedgerState.CLOSED:
                if md.last_entry_id == lac and md.length == length:
                    self.metadata, self.version = md, version
                    return
                raise LedgerFencedError(
                    f"ledger {self.ledger_id} was closed by another client at entry {md.last_entry_id}"
                )
            if md.state is LedgerState.IN_RECOVERY and not self._recovery:
                raise LedgerFencedError(f"ledger {self.ledger_id} is being recovered by another client")
            # Still ours (e.g. another recoverer re-claimed it): retry against the new version.
        raise LedgerError(f"could not close ledger {self.ledger_id}: too many metadata conflicts")
