"""Read and write handles: striping, quorums, pipelined in-order acks, replica fallback on reads."""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from magnetar.bookie.api import (
    BookieClient,
    BookieError,
    BookieFencedError,
    BookieNoSuchEntryError,
    BookieUnavailableError,
)

from . import digest
from .api import (
    LedgerClosedError,
    LedgerEntry,
    LedgerError,
    LedgerFencedError,
    NoSuchEntryError,
    ReadHandle,
    WriteHandle,
)
from .errors import DigestError, MetadataVersionConflictError
from .ledger_manager import LedgerManager
from .metadata import LedgerMetadata, LedgerState
from .placement import EnsemblePlacement
from .registry import BookieRegistry

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LedgerClientConfig:
    """Settings of :class:`~magnetar.ledger.client.BookieLedgerClient`."""

    #: Metadata root (ledger ``n`` lives at ``<root>/L%010d``).
    ledgers_root: str = "/ledgers"
    #: Ledger ids reserved per metadata compare-and-swap.
    id_block_size: int = 1000
    #: An add not acknowledged by an ack quorum within this time fails the write handle.
    add_timeout_s: float = 30.0
    #: Bound of one read request to one bookie.
    read_timeout_s: float = 30.0
    #: Bound of fence / last-add-confirmed / delete requests to one bookie.
    bookie_op_timeout_s: float = 10.0
    #: Entries asked of one bookie in one read request.
    read_batch_entries: int = 256
    #: Compare-and-swap retries before a metadata update gives up.
    metadata_retries: int = 10


@dataclass(slots=True)
class LedgerContext:
    """What handles share with their client."""

    manager: LedgerManager
    registry: BookieRegistry
    config: LedgerClientConfig
    placement: EnsemblePlacement = field(default_factory=EnsemblePlacement)
    #: Open write handles per bookie address (placement prefers the least used).
    usage: collections.Counter[str] = field(default_factory=collections.Counter)


class _ReadFailed(Exception):
    """Internal: no replica could serve an entry."""


class EntryReader:
    """Reads a ledger's entries from its bookies.

    A range is cut into per-bookie requests: with ``ensemble_size == write_quorum`` every bookie
    has every entry and requests rotate over the ensemble; with striping, a bookie holds runs of
    ``write_quorum`` consecutive entries, so each request takes the replica with the longest run.
    A failing, short or corrupt answer is retried, for the entries it missed, on the other
    replicas.
    """

    def __init__(self, ctx: LedgerContext, ledger_id: int, metadata: LedgerMetadata) -> None:
        self.ctx = ctx
        self.ledger_id = ledger_id
        self.metadata = metadata
        self._rotation = 0

    async def fetch(self, first: int, last: int) -> list[tuple[int, bytes, int]]:
        """``(entry_id, data, total_length)`` for ``first..last``; LedgerError if unreadable."""
        self._rotation += 1
        try:
            return await self._read_range(first, last, frozenset())
        except _ReadFailed as e:
            raise LedgerError(str(e)) from e.__cause__

    def _plan(self, first: int, last: int, excluded: frozenset[str]) -> list[tuple[int, int, str]]:
        md = self.metadata
        E, Qw = md.ensemble_size, md.write_quorum
        batch = self.ctx.config.read_batch_entries
        chunks: list[tuple[int, int, str]] = []
        frags = md.ensembles
        for fi, (fstart, bookies) in enumerate(frags):
            fend = frags[fi + 1][0] - 1 if fi + 1 < len(frags) else last
            lo, hi = max(first, fstart), min(last, fend)
            e = lo
            while e <= hi:
                best, best_run = None, 0
                for i in range(Qw):
                    idx = (e + i + (self._rotation + len(chunks) if Qw == E else 0)) % E
                    if bookies[idx] in excluded:
                        continue
                    # Bookie idx holds e .. e + ((idx - e) mod E) when striped.
                    run = hi - e + 1 if Qw == E else (idx - e) % E + 1
                    if run > best_run:
                        best, best_run = bookies[idx], run
                if best is None:
                    raise _ReadFailed(f"no replica of entry {self.ledger_id}:{e} could serve it")
                end = min(e + min(best_run, batch) - 1, hi)
                chunks.append((e, end, best))
                e = end + 1
        return chunks

    async def _read_range(self, first: int, last: int, excluded: frozenset[str]) -> list[tuple[int, bytes, int]]:
        chunks = self._plan(first, last, excluded)
        if len(chunks) == 1:
            return await self._read_chunk(*chunks[0], excluded)
        parts = await asyncio.gather(*(self._read_chunk(a, b, addr, excluded) for a, b, addr in chunks))
        return [x for part in parts for x in part]

    async def _read_chunk(
        self, first: int, last: int, address: str, excluded: frozenset[str]
    ) -> list[tuple[int, bytes, int]]:
        out: list[tuple[int, bytes, int]] = []
        lid = self.ledger_id
        try:
            client = self.ctx.registry.client(address)
            got = await asyncio.wait_for(client.read_entries(lid, first, last), self.ctx.config.read_timeout_s)
            for expected, (eid, stored) in zip(range(first, last + 1), got, strict=False):
                if eid != expected:
                    break
                data, total = digest.unframe(lid, eid, stored)
                out.append((eid, data, total))
            problem: str = "returned too few entries"
        except (BookieError, DigestError, TimeoutError) as e:
            problem = f"failed: {e!r}"
        if len(out) == last - first + 1:
            return out
        log.debug("bookie %s %s for %d:%d..%d; trying other replicas", address, problem, lid, first, last)
        try:
            rest = await self._read_range(first + len(out), last, excluded | {address})
        except _ReadFailed as e:
            raise _ReadFailed(f"{e} (last problem: {address} {problem})") from None
        return out + rest


class LedgerReadHandle(ReadHandle):
    """A ledger opened for reading (closed, or open and read up to its last add confirmed)."""

    def __init__(self, ctx: LedgerContext, ledger_id: int, metadata: LedgerMetadata, lac: int, length: int) -> None:
        self.ctx = ctx
        self.ledger_id = ledger_id
        self.metadata = metadata
        self._lac = lac
        self._length = length
        self._reader = EntryReader(ctx, ledger_id, metadata)
        self._closed = False

    @property
    def last_add_confirmed(self) -> int:
        return self._lac

    @property
    def length(self) -> int:
        return self._length

    async def read(self, first: int, last: int) -> list[LedgerEntry]:
        if self._closed:
            raise LedgerClosedError(f"read handle of ledger {self.ledger_id} is closed")
        if first < 0 or last < first:
            raise NoSuchEntryError(f"bad range {first}..{last}")
        if last > self._lac and self.metadata.state is not LedgerState.CLOSED:
            await self.refresh_last_add_confirmed()
        if last > self._lac:
            raise NoSuchEntryError(f"entry {self.ledger_id}:{last} is past the last add confirmed {self._lac}")
        rows = await self._reader.fetch(first, last)
        return [LedgerEntry(self.ledger_id, eid, data) for eid, data, _ in rows]

    async def refresh_last_add_confirmed(self) -> int:
        """Ask the bookies of the last fragment how far the writer has confirmed (open ledgers)."""
        lac = await read_last_add_confirmed(self.ctx, self.ledger_id, self.metadata)
        if lac > self._lac:
            self._length = (await self._reader.fetch(lac, lac))[0][2]
            self._lac = lac
        return self._lac

    async def close(self) -> None:
        self._closed = True


async def read_last_add_confirmed(ctx: LedgerContext, ledger_id: int, metadata: LedgerMetadata) -> int:
    """Highest LAC piggybacked to any bookie of the last fragment (needs one answer at least)."""
    bookies = metadata.ensembles[-1][1]
    timeout = ctx.config.bookie_op_timeout_s

    async def one(address: str) -> int:
        try:
            lac, _ = await asyncio.wait_for(ctx.registry.client(address).read_last_add_confirmed(ledger_id), timeout)
        except BookieNoSuchEntryError:
            return -1  # the bookie never saw an entry of this ledger
        return lac

    results = await asyncio.gather(*(one(a) for a in bookies), return_exceptions=True)
    lacs = [r for r in results if isinstance(r, int)]
    for r in results:
        if isinstance(r, BaseException) and not isinstance(r, BookieError | TimeoutError):
            raise r
    if not lacs:
        raise LedgerError(f"no bookie answered for ledger {ledger_id}: {results}")
    return max(lacs)


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


class _PendingAdd:
    __slots__ = ("acked", "acks", "entry_id", "failures", "future", "started", "stored", "total_length")

    def __init__(self, entry_id: int, stored: bytes, total_length: int, future: asyncio.Future[int]) -> None:
        self.entry_id = entry_id
        self.stored = stored
        self.total_length = total_length
        self.future = future
        self.acks = 0
        self.failures = 0
        self.acked = False
        self.started = time.monotonic()


class LedgerWriteHandle(WriteHandle):
    """The single writer of a ledger.

    Appends are pipelined: each is sent to its write set at once and completes (in entry order)
    when an ack quorum has it; the LAC sent with an add is the highest entry completed so far.
    A fenced bookie fails the handle with :class:`LedgerFencedError`; any other failure that
    leaves an add short of its ack quorum fails the handle (ensemble changes will replace the
    bookie instead: see :meth:`_on_bookie_failure`).
    """

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
        self._pending: collections.deque[_PendingAdd] = collections.deque()
        self._error: LedgerError | None = None
        self._failed_bookies: set[int] = set()
        self._closing = False
        self._closed = False
        self._reader = EntryReader(ctx, ledger_id, metadata)
        self._set_ensemble(metadata.ensembles[-1][1])
        self._timer: asyncio.TimerHandle | None = None
        self._arm_timer()

    def _set_ensemble(self, bookies: list[str]) -> None:
        clients: list[BookieClient] = []
        for address in bookies:
            try:
                clients.append(self.ctx.registry.client(address))
            except BookieError:
                clients.append(_UnknownBookie(address))  # e.g. decommissioned: its adds just fail
        self._clients = clients
        # LocalBookieClient offers a future-returning add: no task per add on the hot path.
        self._nowait: list[Any] = [getattr(c, "add_entry_nowait", None) for c in clients]

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
        if self._error is not None:
            raise self._error
        if self._closing:
            raise LedgerClosedError(f"ledger {self.ledger_id} is closed")
        eid = self._next_entry
        self._next_entry = eid + 1
        total = self._pending_length + len(data)
        self._pending_length = total
        op = _PendingAdd(eid, digest.frame(self.ledger_id, eid, total, data), total, self._loop.create_future())
        self._pending.append(op)
        self._send(op)
        return op.future

    def _send(self, op: _PendingAdd) -> None:
        lid, key, lac, recovery = self.ledger_id, self._master_key, self._lac, self._recovery
        md = self.metadata
        E = md.ensemble_size
        eid, stored = op.entry_id, op.stored
        for i in range(md.write_quorum):
            idx = (eid + i) % E
            nowait = self._nowait[idx]
            try:
                if nowait is not None:
                    fut = nowait(lid, eid, key, lac, stored, recovery)
                else:
                    fut = asyncio.ensure_future(
                        self._clients[idx].add_entry(lid, eid, key, lac, stored, recovery=recovery)
                    )
            except BookieError as e:
                self._on_replica_result(op, idx, e)
                continue
            fut.add_done_callback(partial(self._on_add_done, op, idx))

    def _on_add_done(self, op: _PendingAdd, idx: int, fut: asyncio.Future[None]) -> None:
        if fut.cancelled():
            self._on_replica_result(op, idx, BookieUnavailableError("add cancelled"))
        else:
            self._on_replica_result(op, idx, fut.exception())

    def _on_replica_result(self, op: _PendingAdd, idx: int, exc: BaseException | None) -> None:
        if exc is None:
            if op.acked or op.future.done():
                return
            op.acks += 1
            if op.acks >= self.metadata.ack_quorum:
                op.acked = True
                self._complete_in_order()
            return
        if isinstance(exc, BookieFencedError):
            self._fail(LedgerFencedError(f"ledger {self.ledger_id} was fenced by a recovering client"))
            return
        self._on_bookie_failure(idx, exc)
        if op.acked or op.future.done():
            return
        op.failures += 1
        md = self.metadata
        if op.failures > md.write_quorum - md.ack_quorum:
            self._fail(LedgerError(f"add of entry {self.ledger_id}:{op.entry_id} failed: {exc!r}"))

    def _complete_in_order(self) -> None:
        pending = self._pending
        while pending and pending[0].acked:
            op = pending.popleft()
            self._lac = op.entry_id
            self._length = op.total_length
            if not op.future.done():
                op.future.set_result(op.entry_id)

    def _on_bookie_failure(self, idx: int, exc: BaseException) -> None:
        """A bookie of the current ensemble failed an add.

        TODO(ensemble change, next issue): replace ``self._clients[idx]`` with
        ``ctx.placement.replacement(...)``, CAS a new fragment starting at ``lac + 1`` into the
        metadata and re-send the pending adds of the affected write sets. Until then an add
        that cannot reach its ack quorum fails the handle.
        """
        if idx not in self._failed_bookies:  # once per bookie, not once per add
            self._failed_bookies.add(idx)
            log.warning(
                "bookie %s failed an add to ledger %d: %r",
                self.metadata.ensembles[-1][1][idx],
                self.ledger_id,
                exc,
            )

    def _fail(self, err: LedgerError) -> None:
        """Fail every pending add and all later ones (later adds cannot complete in order)."""
        if self._error is None:
            self._error = err
        pending, self._pending = self._pending, collections.deque()
        for op in pending:
            if not op.future.done():
                op.future.set_exception(self._error)

    def _arm_timer(self) -> None:
        period = max(0.05, min(1.0, self.ctx.config.add_timeout_s / 4))
        self._timer = self._loop.call_later(period, self._check_timeouts)

    def _check_timeouts(self) -> None:
        if self._closed:
            return
        if self._pending and time.monotonic() - self._pending[0].started > self.ctx.config.add_timeout_s:
            op = self._pending[0]
            self._fail(LedgerError(f"add of entry {self.ledger_id}:{op.entry_id} timed out"))
        self._arm_timer()

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
            futs = [op.future for op in self._pending]
            try:
                await asyncio.wait_for(asyncio.gather(*futs, return_exceptions=True), self.ctx.config.add_timeout_s + 1)
            except TimeoutError:
                self._fail(LedgerError(f"adds to ledger {self.ledger_id} timed out"))

    def _release(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
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
