"""Ledger recovery: take an open ledger away from its writer and close it at its true end.

1. Mark the metadata IN_RECOVERY (compare-and-swap).
2. Fence the ledger on the bookies of the last fragment; enough of them must answer that every
   write set has ``write_quorum - ack_quorum + 1`` fenced members, so the old writer can no
   longer assemble an ack quorum for anything.
3. From the highest LAC they report, read forward, a window of entries at a time in parallel.
   An entry is there once any replica returns it intact; it is known absent once
   ``write_quorum - ack_quorum + 1`` replicas say they lack it (then fewer than an ack quorum can
   hold it, so it was never acknowledged). The first absent entry ends the ledger.
4. Re-add what was found to its write set with the recovery flag (through the fence), then
   close the ledger at the last entry found (compare-and-swap).

No step waits for more answers than it needs: fencing stops once the fenced bookies cover every
write set, and a read once its entry is decided, so a bookie that never answers (partitioned,
connection open) costs nothing while the others suffice.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from magnetar.bookie.api import BookieError, BookieNoSuchEntryError, BookieUnauthorizedError

from . import digest
from .api import LedgerError
from .context import LedgerContext
from .errors import DigestError, LedgerUnauthorizedError, MetadataVersionConflictError
from .handles import LedgerWriteHandle
from .metadata import LedgerMetadata, LedgerState

log = logging.getLogger(__name__)


def fenced_enough(ensemble_size: int, write_quorum: int, ack_quorum: int, fenced: set[int]) -> bool:
    """Whether fencing bookies ``fenced`` (indexes) leaves no write set able to reach an ack quorum."""
    need = write_quorum - ack_quorum + 1
    for start in range(ensemble_size):
        members = {(start + i) % ensemble_size for i in range(write_quorum)}
        if len(members & fenced) < need:
            return False
    return True


async def recover_ledger(
    ctx: LedgerContext, ledger_id: int, metadata: LedgerMetadata, version: int
) -> tuple[LedgerMetadata, int]:
    """Fence, find the end, re-replicate and close; returns the CLOSED metadata and its version."""
    md, version = await _claim(ctx, ledger_id, metadata, version)
    if md.state is LedgerState.CLOSED:
        return md, version
    key = digest.master_key(md.password)
    # The last fragment starts at the writer's LAC + 1 of its ensemble change: everything before
    # it is confirmed even if the bookies of the last fragment never heard that LAC.
    max_lac = max(await _fence(ctx, ledger_id, md, key), md.ensembles[-1][0] - 1)
    length = 0
    if max_lac >= 0:
        found = await _recovery_read(ctx, ledger_id, md, max_lac)
        if found is None:
            raise LedgerError(f"recovery of ledger {ledger_id}: its confirmed entry {max_lac} is missing")
        length = found[1]
    handle = LedgerWriteHandle(
        ctx, ledger_id, md, version, next_entry_id=max_lac + 1, lac=max_lac, length=length, recovery=True
    )
    try:
        futures = []
        entry_id = max_lac + 1
        window = max(1, ctx.config.recovery_read_window)
        end_found = False
        while not end_found:
            results = await asyncio.gather(
                *(_recovery_read(ctx, ledger_id, md, e) for e in range(entry_id, entry_id + window)),
                return_exceptions=True,
            )
            for r in results:  # in entry order: the first absent entry is the end
                if isinstance(r, BaseException):
                    raise r
                if r is None:
                    end_found = True
                    break
                futures.append(handle.append_nowait(r[0]))
                entry_id += 1
        if futures:
            await asyncio.wait_for(asyncio.gather(*futures), ctx.config.add_timeout_s + 1)
        log.info(
            "recovered ledger %d: LAC was %d, closing at %d (%d entries re-replicated)",
            ledger_id,
            max_lac,
            handle.last_add_confirmed,
            len(futures),
        )
        # Re-adds may have changed the ensemble: close on top of the handle's metadata.
        return await _close(ctx, ledger_id, handle.metadata, handle.version, handle.last_add_confirmed, handle.length)
    except TimeoutError as e:
        raise LedgerError(f"recovery of ledger {ledger_id} timed out re-adding entries") from e
    finally:
        handle._release()


async def _claim(ctx: LedgerContext, ledger_id: int, md: LedgerMetadata, version: int) -> tuple[LedgerMetadata, int]:
    for _ in range(ctx.config.metadata_retries):
        if md.state is LedgerState.CLOSED:
            return md, version
        # Re-marking an IN_RECOVERY ledger bumps its version: a recoverer that died half-way
        # is superseded, and racing recoverers find out at the closing compare-and-swap.
        claimed = md.evolve(state=LedgerState.IN_RECOVERY)
        try:
            return claimed, await ctx.manager.write(ledger_id, claimed, version)
        except MetadataVersionConflictError:
            md, version = await ctx.manager.read(ledger_id)
    raise LedgerError(f"could not mark ledger {ledger_id} in recovery: too many metadata conflicts")


async def _first_decided(aws: list[Any], decide: Callable[[int, Any], tuple[bool, Any]]) -> tuple[bool, Any, list[Any]]:
    """Run ``aws`` at once; after each completes (index, result or exception) ``decide`` says whether
    the answer is known. Returns ``(decided, answer, results so far)``; the rest are cancelled."""
    tasks = [asyncio.ensure_future(aw) for aw in aws]
    for t in tasks:
        # Answers after the deciding one are not looked at: read them, or asyncio logs each as never retrieved. A
        # cancelled read can still end in one (3.11's wait_for turns a cancel that meets the reply into the reply).
        t.add_done_callback(_retrieve)
    index = {t: i for i, t in enumerate(tasks)}
    results: list[Any] = [None] * len(tasks)
    pending = set(tasks)
    try:
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for t in sorted(done, key=index.__getitem__):
                r = t.exception() if t.exception() is not None else t.result()
                results[index[t]] = r
                decided, answer = decide(index[t], r)
                if decided:
                    return True, answer, results
        return False, None, results
    finally:
        for t in pending:
            t.cancel()


def _retrieve(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


async def _fence(ctx: LedgerContext, ledger_id: int, md: LedgerMetadata, key: bytes) -> int:
    """Fence the last fragment's bookies until they cover every write set; the highest LAC they report."""
    bookies = md.ensembles[-1][1]
    timeout = ctx.config.bookie_op_timeout_s
    fenced: set[int] = set()
    lacs: list[int] = []

    async def one(address: str) -> tuple[int, int]:
        return await asyncio.wait_for(ctx.registry.client(address).fence(ledger_id, key), timeout)

    def decide(i: int, r: Any) -> tuple[bool, Any]:
        if isinstance(r, BookieUnauthorizedError):
            raise LedgerUnauthorizedError(f"bookie {bookies[i]} refused the key of ledger {ledger_id}")
        if isinstance(r, BaseException):
            if not isinstance(r, BookieError | TimeoutError):
                raise r
            log.warning("fencing ledger %d on %s failed: %r", ledger_id, bookies[i], r)
            return False, None
        fenced.add(i)
        lacs.append(r[0])
        return fenced_enough(md.ensemble_size, md.write_quorum, md.ack_quorum, fenced), None

    decided, _, _ = await _first_decided([one(a) for a in bookies], decide)
    if not decided:
        raise LedgerError(f"could not fence ledger {ledger_id} on enough bookies ({len(fenced)}/{len(bookies)})")
    return max(lacs)


async def _recovery_read(
    ctx: LedgerContext, ledger_id: int, md: LedgerMetadata, entry_id: int
) -> tuple[bytes, int] | None:
    """``(data, total length)`` of an entry, or ``None`` once enough replicas say it is absent."""
    write_set = md.write_set(entry_id)
    timeout = ctx.config.read_timeout_s
    need_missing = md.write_quorum - md.ack_quorum + 1
    missing = 0

    async def one(address: str) -> tuple[bytes, int]:
        got = await asyncio.wait_for(ctx.registry.client(address).read_entries(ledger_id, entry_id, entry_id), timeout)
        if not got or got[0][0] != entry_id:
            raise BookieNoSuchEntryError(f"no entry {ledger_id}:{entry_id}")
        return digest.unframe(ledger_id, entry_id, got[0][1])

    def decide(_i: int, r: Any) -> tuple[bool, Any]:
        nonlocal missing
        if isinstance(r, tuple):
            return True, r
        if isinstance(r, BookieNoSuchEntryError):
            missing += 1
            return missing >= need_missing, None
        if not isinstance(r, BookieError | DigestError | TimeoutError):
            raise r
        return False, None

    decided, answer, results = await _first_decided([one(a) for a in write_set], decide)
    if decided:
        return answer
    raise LedgerError(f"recovery of ledger {ledger_id} cannot tell whether entry {entry_id} exists: {results}")


async def _close(
    ctx: LedgerContext, ledger_id: int, md: LedgerMetadata, version: int, last: int, length: int
) -> tuple[LedgerMetadata, int]:
    for _ in range(ctx.config.metadata_retries):
        closed = md.evolve(state=LedgerState.CLOSED, last_entry_id=last, length=length)
        try:
            return closed, await ctx.manager.write(ledger_id, closed, version)
        except MetadataVersionConflictError:
            md, version = await ctx.manager.read(ledger_id)
        if md.state is LedgerState.CLOSED:
            return md, version  # a concurrent recovery finished first
    raise LedgerError(f"could not close ledger {ledger_id}: too many metadata conflicts")
