"""Reading a ledger: per-bookie request planning over the fragments, replica fallback, the LAC."""

from __future__ import annotations

import asyncio
import logging

from magnetar.bookie.api import BookieError, BookieNoSuchEntryError

from . import digest
from .api import LedgerClosedError, LedgerEntry, LedgerError, NoSuchEntryError, ReadHandle
from .context import LedgerContext
from .errors import DigestError
from .metadata import LedgerMetadata, LedgerState

log = logging.getLogger(__name__)


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

    # Slots: one of these per idle topic, ~60 bytes less each than an instance dict (CPython 3.11).
    __slots__ = (
        "_rotation",
        "ctx",
        "ledger_id",
        "metadata",
    )

    def __init__(self, ctx: LedgerContext, ledger_id: int, metadata: LedgerMetadata) -> None:
        self.ctx = ctx
        self.ledger_id = ledger_id
        self.metadata = metadata
        self._rotation = 0

    async def fetch(self, first: int, last: int, exclude: frozenset[str] = frozenset()) -> list[tuple[int, bytes, int]]:
        """``(entry_id, data, total_length)`` for ``first..last`` (not asking bookies in
        ``exclude``); LedgerError if unreadable."""
        self._rotation += 1
        try:
            return await self._read_range(first, last, exclude)
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
        rows = await self._fetch(first, last)
        return [LedgerEntry(self.ledger_id, eid, data) for eid, data, _ in rows]

    async def _fetch(self, first: int, last: int) -> list[tuple[int, bytes, int]]:
        try:
            return await self._reader.fetch(first, last)
        except LedgerError:
            if not await self._reload_metadata():
                raise
            return await self._reader.fetch(first, last)  # on the new fragments

    async def _reload_metadata(self) -> bool:
        """Re-read stale metadata (ensemble change, auto-recovery, close); whether it changed."""
        md, _ = await self.ctx.manager.read(self.ledger_id)
        if md == self.metadata:
            return False
        self.metadata = self._reader.metadata = md
        if md.state is LedgerState.CLOSED:
            self._lac, self._length = md.last_entry_id, md.length
        return True

    async def refresh_last_add_confirmed(self) -> int:
        """Ask the bookies of the last fragment how far the writer has confirmed (open ledgers)."""
        try:
            lac = await read_last_add_confirmed(self.ctx, self.ledger_id, self.metadata)
        except LedgerError:
            # Every bookie of the fragment we know failed: the writer has probably moved on.
            if not await self._reload_metadata():
                raise
            if self.metadata.state is LedgerState.CLOSED:
                return self._lac
            lac = await read_last_add_confirmed(self.ctx, self.ledger_id, self.metadata)
        if lac > self._lac:
            self._length = (await self._fetch(lac, lac))[0][2]
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
