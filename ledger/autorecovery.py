"""Auto-recovery: re-replicate the entries of lost bookies onto the remaining ones.

A bookie is *lost* when some ledger's ensembles name it but the :class:`BookieRegistry` no
longer lists it (neither writable nor read-only) for ``lost_bookie_grace_s``. One pass:

1. **Audit.** Scan the ledger metadata; every ledger using a lost bookie is marked
   under-replicated: ``<root>/ledgers/L%010d`` (JSON: lost bookies, time of marking).
   Marking is idempotent, so any number of auditors may run.
2. **Replicate.** For each mark, take the ledger's lock ``<root>/locks/L%010d``: an ephemeral
   key of this worker's metadata session, so a crashed worker's locks vanish and exactly one
   worker handles a ledger at a time. Then, for every fragment holding a lost bookie (closed
   ledgers: all fragments; open ledgers: all but the last, which its writer still owns):
   choose a writable replacement outside the fragment's ensemble, read each entry whose write
   set includes the lost slot from the surviving replicas, add it to the replacement with the
   recovery flag, and finally swap the replacements into the ensembles with one metadata
   compare-and-swap. An open ledger whose *last* fragment lost a bookie is left to its writer
   (an ensemble change happens on its next add) for ``open_ledger_grace_s``; after that its
   writer is presumed gone and the ledger is recovered (fenced and closed), then replicated.
3. The mark is deleted once no fragment names a lost bookie; the lock is released.

Runs in a broker (:meth:`AutoRecovery.start` / :meth:`AutoRecovery.close`) or on its own
(``magnetar autorecovery``). Counters for metrics are in :attr:`AutoRecovery.stats`;
:meth:`AutoRecovery.status` is for the admin API.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import os
import socket
import time
from dataclasses import asdict, dataclass, field

from magnetar.bookie.api import BookieError
from magnetar.common.tasks import TaskSet
from magnetar.metadata.api import NOT_EXISTS, BadVersionError, MetadataError, MetadataStore, NotFoundError, Session

from . import digest
from .api import LedgerError, NoSuchLedgerError
from .context import LedgerClientConfig, LedgerContext
from .errors import MetadataVersionConflictError
from .ledger_manager import LedgerManager
from .metadata import LedgerMetadata, LedgerState
from .placement import EnsemblePlacement
from .reads import EntryReader
from .recovery import recover_ledger
from .registry import BookieRegistry

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class AutoRecoveryConfig:
    """Settings of :class:`AutoRecovery`."""

    #: Seconds between passes (a pass also runs on :meth:`AutoRecovery.trigger`).
    check_interval_s: float = 30.0
    #: A bookie must be missing this long before its ledgers are marked (restarts are not losses).
    lost_bookie_grace_s: float = 30.0
    #: An open ledger whose last fragment lost a bookie is fenced and closed after this long.
    open_ledger_grace_s: float = 60.0
    #: Recovery adds in flight at once (per ledger).
    copy_window: int = 256
    #: TTL of the worker's metadata session (its locks vanish this long after it dies).
    session_ttl_s: float = 10.0
    #: Where marks and locks live.
    underreplication_root: str = "/ledgers/underreplication"


@dataclass(slots=True)
class AutoRecoveryStats:
    """Counters since start (``under_replicated``: marks seen at the end of the last pass)."""

    passes: int = 0
    ledgers_marked: int = 0
    ledgers_recovered: int = 0
    fragments_recovered: int = 0
    entries_copied: int = 0
    failures: int = 0
    under_replicated: int = 0
    lost_bookies: list[str] = field(default_factory=list)


class AutoRecovery:
    """Detects lost bookies and re-replicates their ledgers (see the module docstring).

    ``AutoRecovery(store, registry, AutoRecoveryConfig())``; :meth:`run_once` does one pass,
    :meth:`start` runs passes in a background task until :meth:`close`.
    """

    def __init__(
        self,
        store: MetadataStore,
        registry: BookieRegistry,
        config: AutoRecoveryConfig | None = None,
        *,
        client_config: LedgerClientConfig | None = None,
        placement: EnsemblePlacement | None = None,
        worker_id: str | None = None,
    ) -> None:
        self.store = store
        self.registry = registry
        self.config = config or AutoRecoveryConfig()
        cc = client_config or LedgerClientConfig()
        self.ctx = LedgerContext(
            manager=LedgerManager(store, cc.ledgers_root, cc.id_block_size),
            registry=registry,
            config=cc,
            placement=placement or EnsemblePlacement(),
        )
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{id(self):x}"
        root = self.config.underreplication_root.rstrip("/")
        self._marks = f"{root}/ledgers"
        self._locks = f"{root}/locks"
        self.stats = AutoRecoveryStats()
        self._missing_since: dict[str, float] = {}
        self._session: Session | None = None
        self._task: asyncio.Task[None] | None = None
        self._tasks = TaskSet("autorecovery")
        self._wakeup = asyncio.Event()
        self._pass_lock = asyncio.Lock()
        self._last_pass_ms = 0
        self._last_error: str | None = None
        self._closed = False

    # ---------------------------------------------------------------- life cycle

    async def start(self) -> None:
        """Run passes every ``check_interval_s`` in a background task."""
        if self._task is None:
            self._task = self._tasks.spawn(self._run(), name="autorecovery")

    def trigger(self) -> None:
        """Run a pass now (e.g. from a registry watch noticing a bookie leave)."""
        self._wakeup.set()

    async def close(self) -> None:
        """Stop the background task and end the session (releasing any lock held)."""
        self._closed = True
        await self._tasks.close()
        self._task = None
        if self._session is not None:
            with contextlib.suppress(MetadataError):
                await self._session.close()
            self._session = None

    async def _run(self) -> None:
        while not self._closed:
            self._wakeup.clear()
            try:
                await self.run_once()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # keep the worker alive; the next pass retries
                self._last_error = repr(e)
                log.warning("auto-recovery pass failed: %r", e)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), self.config.check_interval_s)

    # ---------------------------------------------------------------- passes

    async def run_once(self) -> None:
        """One audit and one replication pass (passes of this worker never overlap)."""
        async with self._pass_lock:
            await self.audit()
            await self.replicate_marked()
            self.stats.under_replicated = len(await self.under_replicated_ledgers())
            self.stats.passes += 1
            self._last_pass_ms = int(time.time() * 1000)

    async def lost_bookies(self, used: set[str]) -> set[str]:
        """Which of ``used`` are lost (missing from the registry for the grace period)."""
        available = set(await asyncio.wait_for(self.registry.available_bookies(), self.ctx.config.bookie_op_timeout_s))
        now = time.monotonic()
        missing = used - available
        for address in list(self._missing_since):
            if address not in missing:
                del self._missing_since[address]  # back (or no longer used)
        for address in missing:
            self._missing_since.setdefault(address, now)
        grace = self.config.lost_bookie_grace_s
        return {a for a in missing if now - self._missing_since[a] >= grace}

    async def audit(self) -> list[int]:
        """Mark every ledger that uses a lost bookie; returns the ids marked in this pass."""
        manager = self.ctx.manager
        used: dict[int, LedgerMetadata] = {}
        for lid in await manager.ledger_ids():
            with contextlib.suppress(NoSuchLedgerError):  # deleted meanwhile
                used[lid] = (await manager.read(lid))[0]
        lost = await self.lost_bookies({b for md in used.values() for b in md.all_bookies()})
        self.stats.lost_bookies = sorted(lost)
        marked = []
        for lid, md in used.items():
            hit = md.all_bookies() & lost
            if hit and await self._mark(lid, hit):
                marked.append(lid)
        if marked:
            log.warning("lost bookies %s: marked %d ledger(s) under-replicated", sorted(lost), len(marked))
        return marked

    async def _mark(self, ledger_id: int, lost: set[str]) -> bool:
        doc = {"lostBookies": sorted(lost), "markedAt": int(time.time() * 1000), "by": self.worker_id}
        try:
            await self.store.put(self._mark_path(ledger_id), json.dumps(doc).encode(), NOT_EXISTS)
        except BadVersionError:
            return False  # already marked
        self.stats.ledgers_marked += 1
        return True

    async def under_replicated_ledgers(self) -> list[int]:
        names = await self.store.get_children(self._marks)
        return sorted(int(n[1:]) for n in names if n.startswith("L") and n[1:].isdigit())

    async def replicate_marked(self) -> int:
        """Replicate every marked ledger not locked by another worker; returns how many were fixed."""
        fixed = 0
        for lid in await self.under_replicated_ledgers():
            if self._closed:
                break
            try:
                if await self.replicate_ledger(lid):
                    fixed += 1
            except (LedgerError, BookieError, MetadataError, TimeoutError) as e:
                self.stats.failures += 1
                self._last_error = f"ledger {lid}: {e!r}"
                log.warning("auto-recovery of ledger %d failed (retried next pass): %r", lid, e)
        return fixed

    async def replicate_ledger(self, ledger_id: int) -> bool:
        """Under the ledger's lock, re-replicate it; whether the mark could be cleared.

        False when another worker holds the lock or work remains (an open ledger's last fragment).
        """
        if not await self._lock(ledger_id):
            return False
        try:
            done = await self._replicate(ledger_id)
            if done:
                with contextlib.suppress(NotFoundError):
                    await self.store.delete(self._mark_path(ledger_id))
            return done
        finally:
            with contextlib.suppress(MetadataError):
                await self.store.delete(self._lock_path(ledger_id))

    async def _lock(self, ledger_id: int) -> bool:
        if self._session is None:
            self._session = await self.store.create_session(self.config.session_ttl_s)
        try:
            await self.store.put(self._lock_path(ledger_id), self.worker_id.encode(), NOT_EXISTS, session=self._session)
        except BadVersionError:
            return False  # another worker has it
        return True

    async def _replicate(self, ledger_id: int) -> bool:
        ctx = self.ctx
        try:
            md, version = await ctx.manager.read(ledger_id)
        except NoSuchLedgerError:
            return True  # deleted: nothing to protect
        lost = await self.lost_bookies(md.all_bookies())
        if not lost:
            return True
        if md.state is not LedgerState.CLOSED and set(md.ensembles[-1][1]) & lost:
            if await self._mark_age(ledger_id) < self.config.open_ledger_grace_s:
                log.info("ledger %d: its writer may still replace %s itself; waiting", ledger_id, sorted(lost))
            else:
                log.warning("ledger %d: open with lost bookies in its last fragment; recovering it", ledger_id)
                md, version = await recover_ledger(ctx, ledger_id, md, version)
        writable = await asyncio.wait_for(ctx.registry.writable_bookies(), ctx.config.bookie_op_timeout_s)
        usage: collections.Counter[str] = collections.Counter()
        plan: dict[int, dict[int, str]] = {}  # fragment index -> {slot: replacement}
        frags = md.ensembles
        last_fragment = len(frags) - 1
        for fi, (first, bookies) in enumerate(frags):
            if fi == last_fragment and md.state is not LedgerState.CLOSED:
                continue  # the writer's fragment
            slots = [i for i, b in enumerate(bookies) if b in lost]
            if not slots:
                continue
            chosen = ctx.placement.choose(writable, len(slots), usage, exclude=bookies)
            usage.update(chosen)
            replace = dict(zip(slots, chosen, strict=True))
            last = frags[fi + 1][0] - 1 if fi < last_fragment else md.last_entry_id
            if last >= first:
                await self._copy(ledger_id, md, first, last, replace, lost)
            plan[fi] = replace
        if plan:
            md = await self._swap(ledger_id, md, version, plan)
            self.stats.fragments_recovered += len(plan)
            self.stats.ledgers_recovered += 1
            log.info("ledger %d: re-replicated %d fragment(s) off %s", ledger_id, len(plan), sorted(lost))
        return not (md.all_bookies() & lost)

    async def _mark_age(self, ledger_id: int) -> float:
        value = await self.store.get(self._mark_path(ledger_id))
        if value is None:
            return 0.0
        return max(0.0, time.time() - value.stat.created_ms / 1000)

    async def _copy(
        self, ledger_id: int, md: LedgerMetadata, first: int, last: int, replace: dict[int, str], lost: set[str]
    ) -> None:
        """Copy the entries of ``first..last`` that ``replace``'s slots held to their replacements."""
        ctx = self.ctx
        E, Qw = md.ensemble_size, md.write_quorum
        key = digest.master_key(md.password)
        reader = EntryReader(ctx, ledger_id, md)
        timeout = ctx.config.add_timeout_s
        clients = {slot: ctx.registry.client(address) for slot, address in replace.items()}
        excluded = frozenset(lost)
        step = max(1, min(ctx.config.read_batch_entries, self.config.copy_window))
        for lo in range(first, last + 1, step):
            hi = min(last, lo + step - 1)
            adds = []
            for eid, data, total in await reader.fetch(lo, hi, excluded):
                stored = digest.frame(ledger_id, eid, total, data)
                for slot, client in clients.items():
                    if (slot - eid) % E < Qw:  # the lost bookie held this entry
                        # Recovery flag: closed ledgers are fenced on the bookies that closed them.
                        add = client.add_entry(ledger_id, eid, key, last, stored, recovery=True)
                        adds.append(asyncio.wait_for(add, timeout))
            await asyncio.gather(*adds)
            self.stats.entries_copied += len(adds)

    async def _swap(
        self, ledger_id: int, md: LedgerMetadata, version: int, plan: dict[int, dict[int, str]]
    ) -> LedgerMetadata:
        """CAS the replacements into the ensembles; rebases over changes to other fragments."""
        expected = {fi: md.ensembles[fi] for fi in plan}
        for _ in range(self.ctx.config.metadata_retries):
            ensembles = list(md.ensembles)
            for fi, replace in plan.items():
                first, bookies = ensembles[fi]
                ensembles[fi] = (first, [replace.get(i, b) for i, b in enumerate(bookies)])
            new_md = md.evolve(ensembles=ensembles)
            try:
                await self.ctx.manager.write(ledger_id, new_md, version)
                return new_md
            except MetadataVersionConflictError:
                md, version = await self.ctx.manager.read(ledger_id)
            if any(fi >= len(md.ensembles) or md.ensembles[fi] != frag for fi, frag in expected.items()):
                raise LedgerError(f"ledger {ledger_id}: fragments changed during re-replication")
            if md.state is not LedgerState.CLOSED and max(plan) == len(md.ensembles) - 1:
                raise LedgerError(f"ledger {ledger_id}: a re-replicated fragment became the writer's")
        raise LedgerError(f"ledger {ledger_id}: too many metadata conflicts swapping ensembles")

    def _mark_path(self, ledger_id: int) -> str:
        return f"{self._marks}/L{ledger_id:010d}"

    def _lock_path(self, ledger_id: int) -> str:
        return f"{self._locks}/L{ledger_id:010d}"

    # ---------------------------------------------------------------- admin

    async def status(self) -> dict[str, object]:
        """What the admin API shows: counters, lost bookies, marked ledgers, last pass."""
        return {
            "workerId": self.worker_id,
            "running": self._task is not None and not self._task.done(),
            "lastPassMs": self._last_pass_ms,
            "lastError": self._last_error,
            "underReplicatedLedgers": await self.under_replicated_ledgers(),
            **{_camel(k): v for k, v in asdict(self.stats).items()},
        }


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.title() for p in rest)
