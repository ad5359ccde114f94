"""The bookie: durable storage of ledger entries.

Add path (all on the event loop, no I/O): check the master key and the fence, put the entry into
the write cache, queue a journal record and return a future that the journal resolves after
fdatasync. Reads come from the write cache or, for flushed entries, from the entry logs via a
thread pool (one executor call per read). A checkpoint moves the write cache to the entry logs,
persists the index and lets old journals go; startup loads the index and replays the journal
after the last checkpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from enum import Enum

from crc32c import crc32c

from magnetar.common.tasks import TaskSet

from .api import (
    BookieError,
    BookieFencedError,
    BookieNoSuchEntryError,
    BookieReadOnlyError,
    BookieUnauthorizedError,
    BookieUnavailableError,
    CallbackAdds,
    Waiter,
)
from .config import BookieConfig
from .dirlock import DirLock
from .disk_space import DiskSpaceMonitor
from .index import LedgerState
from .journal import Journal
from .journal_format import REC_ADD, REC_DELETE, REC_FENCE, REC_KEY, JournalPosition
from .schedule import PeriodicJobs
from .storage import KEEP_CRC_FROM, CachedEntries, LedgerStorage, WriteCache
from .throttle import AddThrottle, HeldGroup, consume

log = logging.getLogger(__name__)

#: The checkpoint loop's shortest sleep: how soon a due job that could not run (a failed checkpoint) is retried.
_RETRY_S = 0.25
_FREE_SPACE_EVERY_S = 10.0
#: What an entry costs in a read reply besides its data (entry id + length on the wire).
_READ_ENTRY_OVERHEAD = 12


class BookieStatus(Enum):
    NEW = "new"
    STARTING = "starting"
    RUNNING = "running"
    CLOSING = "closing"
    CLOSED = "closed"


class Bookie(CallbackAdds):
    """One bookie's storage, served in-process (see :class:`~magnetar.bookie.local.LocalBookieClient`).

    ``Bookie(BookieConfig(data_dir=...))``, then ``await start()`` ... ``await close()``.
    """

    def __init__(self, config: BookieConfig) -> None:
        self.config = config
        self.status = BookieStatus.NEW
        self._accepting = False
        #: Free space below ``min_free_bytes`` makes the bookie read-only (checked by the checkpoint loop).
        self.disk = DiskSpaceMonitor(
            (config.journal_dir, config.ledger_dir),  # type: ignore[arg-type]
            config.min_free_bytes,
            config.read_timeout_s,
            config.address,
        )
        self._forced_read_only = False
        #: The last checkpoint failed (disk full, I/O error): refuse adds until one succeeds.
        self._storage_failed = False
        self.journal = Journal(
            config.journal_dir,  # type: ignore[arg-type]
            file_size=config.journal_file_size,
            group_max_bytes=config.journal_group_max_bytes,
            max_wait_s=config.journal_max_wait_s,
            adaptive_wait=config.journal_adaptive_wait,
            add_timeout_s=config.add_timeout_s,
            reuse_files=config.journal_reuse_files,
            on_new_file=self._journal_rotated if config.checkpoint_on_journal_rotation else None,
        )
        self.storage = LedgerStorage(
            config.ledger_dir,  # type: ignore[arg-type]
            entry_log_size=config.entry_log_size,
            index_compact_bytes=config.index_compact_bytes,
            direct_io=config.entry_log_direct_io,
        )
        self._ledgers: dict[int, LedgerState] = {}
        # Write cache: ledger -> entry -> stored entry as (head, data), and the snapshot a running
        # checkpoint is flushing.
        self._cache: WriteCache = {}
        self._cache_bytes = 0
        self._flushing: WriteCache | None = None
        self._flush_fut: asyncio.Future[None] | None = None
        # Ledgers whose state changed without an entry in the cache (fence, new key), and deletes,
        # both waiting for the next checkpoint.
        self._dirty: set[int] = set()
        self._pending_deletes: set[int] = set()
        self._last_mark: JournalPosition | None = None
        #: When checkpoints, free-space checks and compactions are due.
        self.jobs = PeriodicJobs(config, _FREE_SPACE_EVERY_S, time.monotonic())
        self._ckpt_lock = asyncio.Lock()
        self._tasks = TaskSet(f"bookie {self.address}")
        self._ckpt_wake = asyncio.Event()
        # The journal started a file since the last checkpoint (set from its writer thread: a plain flag).
        self._journal_new_file = False
        # Adds held back while the write cache is full and the previous one is still being flushed.
        self.throttle = AddThrottle(config.address, config.max_throttle_time_s)
        self._throttled = self.throttle.queue  # the same deque, tested on every add
        self._cache_max = config.write_cache_max_bytes
        self._ckpt_executor: ThreadPoolExecutor | None = None
        self._read_executor: ThreadPoolExecutor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._dir_lock = DirLock()
        #: Rounds of the checkpoint loop: one per due job or wake-up, none while idle (for tests and tools).
        self.checkpoint_loop_rounds = 0

    @property
    def address(self) -> str:
        return self.config.address

    @property
    def cache_bytes(self) -> int:
        """Memory of the write cache not yet being flushed, entries' bytes and overhead (a metric)."""
        return self._cache_bytes

    @property
    def throttled_adds(self) -> int:
        """Adds that waited for room in the write cache (a metric)."""
        return self.throttle.throttled_adds

    @property
    def rejected_adds(self) -> int:
        """Adds rejected after ``max_throttle_time_s`` (a metric)."""
        return self.throttle.rejected_adds

    @property
    def read_only(self) -> bool:
        return self.disk.full or self._forced_read_only or self._storage_failed

    def set_read_only(self, read_only: bool) -> None:
        """Refuse (or accept again) new adds, e.g. for maintenance."""
        self._forced_read_only = read_only

    # ---------------------------------------------------------------- life cycle

    async def start(self) -> None:
        """Load the index, replay the journal, open a new journal file and start serving."""
        if self.status is not BookieStatus.NEW:
            raise BookieError(f"bookie cannot start from state {self.status.value}")
        self.status = BookieStatus.STARTING
        loop = self._loop = asyncio.get_running_loop()
        self._ckpt_executor = ThreadPoolExecutor(1, thread_name_prefix="bookie-checkpoint")
        self._read_executor = ThreadPoolExecutor(self.config.read_threads, thread_name_prefix="bookie-read")
        timeout = self.config.checkpoint_timeout_s
        try:
            await asyncio.wait_for(loop.run_in_executor(self._ckpt_executor, self._lock_dirs), timeout)
            states, mark = await asyncio.wait_for(loop.run_in_executor(self._ckpt_executor, self.storage.load), timeout)
            self._ledgers = states
            self._last_mark = mark
            replayed = await asyncio.wait_for(loop.run_in_executor(self._ckpt_executor, self._replay, mark), timeout)
            await asyncio.wait_for(loop.run_in_executor(self._ckpt_executor, self.journal.open), timeout)
        except BaseException:
            self.status = BookieStatus.CLOSED
            await self._shutdown_executors()
            self._dir_lock.release()
            raise
        self.journal.start(loop)
        self.jobs.restart(time.monotonic())
        self._tasks.spawn(self._checkpoint_loop(), name=f"bookie-checkpoint-{self.address}")
        self.status = BookieStatus.RUNNING
        self._accepting = True
        log.info(
            "bookie %s started: %d ledgers, %d journal records replayed",
            self.address,
            len(self._ledgers),
            replayed,
        )

    def _lock_dirs(self) -> None:
        """Refuse to run two bookies on the same directories (they would corrupt each other)."""
        self._dir_lock.acquire((self.config.journal_dir, self.config.ledger_dir))  # type: ignore[arg-type]

    def _replay(self, mark: JournalPosition | None) -> int:
        """Apply journal records after the checkpoint mark (blocking; before serving)."""
        n = 0
        ledgers, cache = self._ledgers, self._cache
        for rtype, lid, eid, lac, data in self.journal.replay(mark):
            n += 1
            if rtype == REC_ADD:
                st = ledgers.get(lid)
                if st is None:
                    log.warning("journal has entries of ledger %d without its key", lid)
                    st = ledgers[lid] = LedgerState(b"")
                if lac > st.lac:
                    st.lac = lac
                if eid > st.last_entry:
                    st.last_entry = eid
                entries = cache.get(lid)
                if entries is None:
                    entries = cache[lid] = CachedEntries()
                self._cache_bytes += entries.put(eid, b"", data)
            elif rtype == REC_KEY:
                if lid not in ledgers:
                    ledgers[lid] = LedgerState(data)
                    self._dirty.add(lid)
            elif rtype == REC_FENCE:
                st = ledgers.get(lid)
                if st is not None:
                    st.fenced = True
                    self._dirty.add(lid)
            elif rtype == REC_DELETE:
                self._forget(lid)
        return n

    async def close(self) -> None:
        """Stop accepting requests, write a final checkpoint, stop threads and tasks."""
        if self.status in (BookieStatus.CLOSING, BookieStatus.CLOSED, BookieStatus.NEW):
            self.status = BookieStatus.CLOSED
            return
        self.status = BookieStatus.CLOSING
        self._accepting = False
        self.throttle.fail_all(BookieUnavailableError(f"bookie {self.address} is closing"))
        await self._tasks.close()
        await self.journal.close()
        if self._flush_fut is not None and not self._flush_fut.done():
            # A checkpoint interrupted by the cancellation above still runs in its thread.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(self._flush_fut), self.config.checkpoint_timeout_s)
        try:
            await self.checkpoint()
        except Exception:
            log.exception("final checkpoint of bookie %s failed; the journal will be replayed", self.address)
        if self._ckpt_executor is not None and self._flushing is None:
            try:
                await asyncio.wait_for(
                    self._loop.run_in_executor(self._ckpt_executor, self.storage.close),  # type: ignore[union-attr]
                    self.config.checkpoint_timeout_s,
                )
            except (OSError, TimeoutError) as e:
                log.error("closing the storage of bookie %s failed: %r", self.address, e)
        await self._shutdown_executors()
        self._dir_lock.release()
        self.status = BookieStatus.CLOSED
        log.info("bookie %s closed", self.address)

    async def _shutdown_executors(self) -> None:
        for ex in (self._read_executor, self._ckpt_executor):
            if ex is not None:
                ex.shutdown(wait=False, cancel_futures=True)

    def _check_running(self) -> None:
        if not self._accepting:
            raise BookieUnavailableError(f"bookie {self.address} is {self.status.value}")

    # ---------------------------------------------------------------- requests

    def _new_ledger(self, ledger_id: int, master_key: bytes) -> LedgerState:
        st = self._ledgers[ledger_id] = LedgerState(master_key)
        # Nobody awaits this record: the add or fence that follows it in the journal does.
        self.journal.append(REC_KEY, ledger_id, -1, -1, master_key).add_done_callback(consume)
        return st

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
        """Accept the entry ``head + data``: ``done(None)`` once it is durable in the journal, else
        ``done(error)``; called on the event loop, never from here. Raises at once on a wrong key, a fenced
        ledger or a read-only / stopped bookie. No future or extra loop callback per add, and the two parts
        are journaled and cached as they are (never joined)."""
        self.add_parts_many(ledger_id, (entry_id,), master_key, last_add_confirmed, (head,), (data,), recovery, done)

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
        """:meth:`add_parts_async` for entries of one ledger with one waiter (the hot path of every local
        publish: a socket read's worth of a producer's sends is cached and journaled in one call). ``done``
        hears once: ``None`` when all are durable, else the first error."""
        self._check_writable()
        if self._throttled or self._cache_bytes >= self._cache_max:
            # Held back one by one: the throttle admits adds in arrival order and may time some out.
            group = HeldGroup(len(entry_ids), done)
            hold, loop = self.throttle.hold, self._loop
            assert loop is not None  # adds are accepted only once started
            for entry_id, head, data in zip(entry_ids, heads, datas, strict=True):
                args = (ledger_id, entry_id, master_key, last_add_confirmed, head, data, recovery)
                hold(loop, args).add_done_callback(group.tell)
            return
        # The cache may pass its limit by this one call's entries: the next add is held back.
        stored, crcs = self._cache_add(ledger_id, entry_ids, master_key, last_add_confirmed, heads, datas, recovery)
        self.journal.append_many(REC_ADD, ledger_id, entry_ids, last_add_confirmed, heads, stored, done, crcs)

    def _check_writable(self) -> None:
        if not self._accepting:
            raise BookieUnavailableError(f"bookie {self.address} is {self.status.value}")
        if self.disk.full or self._forced_read_only or self._storage_failed:
            raise BookieReadOnlyError(f"bookie {self.address} is read-only")

    def _add_now(self, args: tuple[int, int, bytes, int, bytes, bytes, bool]) -> asyncio.Future[None]:
        """A held-back add admitted: ``args`` as :meth:`add_parts_async` takes them."""
        ledger_id, entry_id, master_key, last_add_confirmed, head, data, recovery = args
        (data,), crcs = self._cache_add(
            ledger_id, (entry_id,), master_key, last_add_confirmed, (head,), (data,), recovery
        )
        crc = None if crcs is None else crcs[0]
        return self.journal.append(REC_ADD, ledger_id, entry_id, last_add_confirmed, data, head, crc)

    def _cache_add(
        self,
        ledger_id: int,
        entry_ids: Sequence[int],
        master_key: bytes,
        last_add_confirmed: int,
        heads: Sequence[bytes],
        datas: Sequence[bytes | memoryview],
        recovery: bool,
    ) -> tuple[list[bytes], list[int | None] | None]:
        """Check adds of one ledger against its state and put them in the write cache; returns the data to
        journal after each head, and the CRCs computed for the records of big entries (None if there is no
        big entry). Keep it free of allocations it does not need: every add passes here."""
        st = self._ledgers.get(ledger_id)
        if st is None:
            st = self._new_ledger(ledger_id, master_key)
        elif st.master_key != master_key:
            raise BookieUnauthorizedError(f"wrong master key for ledger {ledger_id}")
        if st.fenced and not recovery:
            raise BookieFencedError(f"ledger {ledger_id} is fenced")
        if last_add_confirmed > st.lac:
            st.lac = last_add_confirmed
        entries = self._cache.get(ledger_id)
        if entries is None:
            entries = self._cache[ledger_id] = CachedEntries()
        put = entries.put
        stored: list[bytes] = []
        crcs: list[int | None] | None = None
        grown = 0
        for entry_id, head, data in zip(entry_ids, heads, datas, strict=True):
            if type(data) is memoryview:
                # A view may be of a buffer its owner reuses. bytes, and the bytearray a big entry was read
                # into by the broker (never written again), are the entry's one copy: kept as they are.
                data = bytes(data)
            if len(data) < KEEP_CRC_FROM:
                grown += put(entry_id, head, data)
            else:
                # Checksummed once, for the journal record and (at the checkpoint) the entry log.
                crc = crc32c(data, crc32c(head))
                grown += put(entry_id, head, data, crc)
                if crcs is None:
                    crcs = [None] * len(entry_ids)
                crcs[len(stored)] = crc
            stored.append(data)
        last = max(entry_ids)
        if last > st.last_entry:
            st.last_entry = last
        self._cache_bytes += grown
        if self._cache_bytes >= self._cache_max:
            self._ckpt_wake.set()  # checkpoint now rather than when the interval is up
        return stored, crcs

    def _release_throttled(self) -> None:
        """Admit held-back adds in arrival order while the write cache has room."""
        self.throttle.release(
            lambda: self._cache_bytes < self._cache_max,
            lambda *args: self._add_now(args) if self._accepting and not self.read_only else None,
            lambda: BookieReadOnlyError(f"bookie {self.address} is read-only or stopping"),
        )

    async def read_entries(self, ledger_id: int, first: int, last: int) -> list[tuple[int, bytes]]:
        """Entries ``first..last`` in order, stopping at the first one this bookie lacks."""
        entries, _ = await self.read_entries_bounded(ledger_id, first, last, None)
        return entries

    async def read_entries_bounded(
        self, ledger_id: int, first: int, last: int, max_bytes: int | None
    ) -> tuple[list[tuple[int, bytes]], bool]:
        """Like :meth:`read_entries`, but stop once the entries hold about ``max_bytes``.

        Returns ``(entries, more)``; ``more`` says the reply was cut for size (at least one entry
        is returned). Sizes are known from the write cache and the index before any disk read,
        so a huge range never reads more from disk than one reply carries.
        """
        self._check_running()
        if ledger_id not in self._ledgers or first < 0 or last < first:
            raise BookieNoSuchEntryError(f"no entry {ledger_id}:{first}")
        cached = self._cache.get(ledger_id)
        flushing = self._flushing.get(ledger_id) if self._flushing is not None else None
        locations = self.storage.index.ledgers.get(ledger_id)
        out: list[bytes | None] = []
        disk: list[tuple[int, int, int, int]] = []
        disk_at: list[int] = []
        budget = -1 if max_bytes is None else max_bytes
        size = 0
        more = False
        eid = first
        while eid <= last:
            parts = cached.get(eid) if cached is not None else None
            if parts is None and flushing is not None:
                parts = flushing.get(eid)
            loc = data = None
            if parts is None:
                loc = locations.lookup(eid) if locations is not None else None
                if loc is None:
                    break
                n = loc[2]
            else:
                head, data = parts
                if head:
                    data = head + data  # a read of a cached entry joins it (adds never do)
                n = len(data)
            if budget >= 0:
                size += n + _READ_ENTRY_OVERHEAD
                if size > budget and out:
                    more = True
                    break
            if loc is not None:
                disk_at.append(len(out))
                disk.append(loc)
            out.append(data)
            eid += 1
        if not out:
            raise BookieNoSuchEntryError(f"no entry {ledger_id}:{first}")
        if disk:
            try:
                datas = await self._read_disk(ledger_id, disk)
            except BookieNoSuchEntryError:
                # The log was compacted away between lookup and read: the index has moved on.
                locations = self.storage.index.ledgers.get(ledger_id)
                again = [locations.lookup(first + i) if locations is not None else None for i in disk_at]
                disk = [loc for loc in again if loc is not None]
                if len(disk) != len(disk_at):
                    raise
                datas = await self._read_disk(ledger_id, disk)
            for i, data in zip(disk_at, datas, strict=True):
                out[i] = data
        return list(zip(range(first, first + len(out)), out, strict=True)), more  # type: ignore[arg-type]

    async def _read_disk(self, ledger_id: int, items: list[tuple[int, int, int, int]]) -> list[bytes]:
        fut = self._loop.run_in_executor(self._read_executor, self.storage.read_many, items)  # type: ignore[union-attr]
        try:
            return await asyncio.wait_for(fut, self.config.read_timeout_s)
        except TimeoutError as e:
            raise BookieUnavailableError(f"read of ledger {ledger_id} timed out") from e

    async def read_last_add_confirmed(self, ledger_id: int) -> tuple[int, int]:
        """``(lac, last_entry_id)`` as known to this bookie."""
        self._check_running()
        st = self._ledgers.get(ledger_id)
        if st is None:
            raise BookieNoSuchEntryError(f"no ledger {ledger_id}")
        return st.lac, st.last_entry

    async def fence(self, ledger_id: int, master_key: bytes) -> tuple[int, int]:
        """Fence the ledger (durably) and return ``(lac, last_entry_id)``."""
        self._check_running()
        st = self._ledgers.get(ledger_id)
        if st is None:
            # Fencing a ledger this bookie never saw still has to stop a slow writer later.
            st = self._new_ledger(ledger_id, master_key)
        elif st.master_key != master_key:
            raise BookieUnauthorizedError(f"wrong master key for ledger {ledger_id}")
        st.fenced = True
        self._dirty.add(ledger_id)
        result = (st.lac, st.last_entry)
        # Resolves after every add accepted before it is durable too (journal order).
        await self.journal.append(REC_FENCE, ledger_id, -1, st.lac, b"")
        return result

    async def delete_ledger(self, ledger_id: int) -> None:
        """Forget the ledger; its space is reclaimed by the next checkpoint's garbage collection."""
        self._check_running()
        if ledger_id not in self._ledgers:
            return
        self._forget(ledger_id)
        await self.journal.append(REC_DELETE, ledger_id, -1, -1, b"")

    def _forget(self, ledger_id: int) -> None:
        self._ledgers.pop(ledger_id, None)
        entries = self._cache.pop(ledger_id, None)
        if entries:
            self._cache_bytes -= entries.size()
        self._dirty.discard(ledger_id)
        self._pending_deletes.add(ledger_id)

    # ---------------------------------------------------------------- checkpoints

    async def checkpoint(self) -> None:
        """Flush the write cache to the entry log, persist the index, delete old journals."""
        if self._ckpt_executor is None:
            return
        await self._acquire_ckpt_lock()
        try:
            await self._checkpoint_locked()
        finally:
            self._ckpt_lock.release()

    async def _acquire_ckpt_lock(self) -> None:
        """Take the checkpoint lock within ``checkpoint_timeout_s``.

        This and the other waits of the checkpoint loop's jobs use ``asyncio.timeout``, not ``wait_for``: on
        Python 3.11 ``wait_for`` returns the result of an inner future that completed as the task was cancelled,
        so the cancellation is lost, the loop sleeps on and ``close()`` waits out its grace period."""
        try:
            async with asyncio.timeout(self.config.checkpoint_timeout_s):
                await self._ckpt_lock.acquire()
        except TimeoutError as e:
            raise BookieError("checkpoint lock wait timed out") from e

    async def _checkpoint_locked(self) -> None:
        if self._flushing is not None:
            raise BookieError("the previous checkpoint is still running")
        mark = self.journal.synced_position
        snapshot = self._cache
        if not snapshot and not self._dirty and not self._pending_deletes and mark == self._last_mark:
            self.jobs.last_checkpoint = time.monotonic()
            return
        self._cache = {}
        self._cache_bytes = 0
        self._flushing = snapshot
        if self._throttled:
            self._release_throttled()
        dirty = self._dirty | snapshot.keys()
        self._dirty = set()
        states = {lid: st.copy() for lid in dirty if (st := self._ledgers.get(lid)) is not None}
        deleted = sorted(self._pending_deletes)
        self._pending_deletes = set()
        loop = self._loop
        assert loop is not None
        fut = self._flush_fut = loop.run_in_executor(self._ckpt_executor, self._flush, snapshot, states, deleted, mark)
        fut.add_done_callback(lambda f: self._flush_done(f, snapshot, dirty, deleted, mark))
        try:
            async with asyncio.timeout(self.config.checkpoint_timeout_s):
                await asyncio.shield(fut)
        except TimeoutError as e:
            raise BookieError("checkpoint timed out") from e
        except OSError as e:
            raise BookieError(f"checkpoint failed: {e!r}") from e

    def _flush(
        self,
        snapshot: WriteCache,
        states: dict[int, LedgerState],
        deleted: list[int],
        mark: JournalPosition,
    ) -> None:
        removed = self.storage.flush(
            snapshot, states, deleted, mark, duty=self.config.checkpoint_flush_duty, urgent=self._held_back
        )
        journals = self.journal.delete_before(mark.seq)
        log.debug(
            "checkpoint at %s: %d ledgers flushed, %d journals and %d entry logs removed",
            mark,
            len(snapshot),
            journals,
            len(removed),
        )

    def _held_back(self) -> bool:
        """Whether adds wait for the running checkpoint (its flush then does not pause).

        Called on the checkpoint thread: it only reads a deque's length and an int.
        """
        return bool(self._throttled) or self._cache_bytes >= self._cache_max

    def _flush_done(
        self,
        fut: asyncio.Future[None],
        snapshot: WriteCache,
        dirty: set[int],
        deleted: list[int],
        mark: JournalPosition,
    ) -> None:
        """Runs on the loop when the flush thread finishes, even if the waiter timed out."""
        self._flushing = None
        self.jobs.last_checkpoint = time.monotonic()
        # The checkpoint loop sleeps until its next job and leaves checkpoints and compaction out while a flush
        # runs: it learns here that they can run again (a full cache or held-back adds want one now).
        self._ckpt_wake.set()
        if fut.cancelled() or fut.exception() is not None:
            exc = None if fut.cancelled() else fut.exception()
            if not self._storage_failed:
                log.error("checkpoint failed, bookie %s is read-only until one succeeds: %r", self.address, exc)
            self._storage_failed = True
            # Held-back adds would only time out: tell them now, like any add from here on.
            self.throttle.fail_all(BookieReadOnlyError(f"bookie {self.address} is read-only (checkpoint failed)"))
            # Put everything back so the next checkpoint retries it; newer data wins.
            for lid, entries in snapshot.items():
                if lid not in self._ledgers:
                    continue
                current = self._cache.get(lid)
                if current is None:
                    current = self._cache[lid] = CachedEntries()
                for eid in entries:
                    if eid not in current:
                        self._cache_bytes += current.put(eid, entries.heads[eid], entries.datas[eid])
            self._dirty |= {lid for lid in dirty if lid in self._ledgers}
            self._pending_deletes |= set(deleted)
            return
        if self._storage_failed:
            log.warning("checkpoint succeeded again, bookie %s is writable", self.address)
            self._storage_failed = False
        self._last_mark = mark

    async def compact(self, *, major: bool) -> list[int]:
        """Run one entry-log compaction now (minor or major threshold); returns the removed log ids.

        Runs on the checkpoint thread between checkpoints, so it never races a flush.
        """
        cfg = self.config
        threshold = cfg.major_compaction_threshold if major else cfg.minor_compaction_threshold
        if self._ckpt_executor is None or threshold <= 0:
            return []
        await self._acquire_ckpt_lock()
        try:
            if self._flushing is not None:
                raise BookieError("a checkpoint is still running")
            fut = self._loop.run_in_executor(self._ckpt_executor, self.storage.compact, threshold)  # type: ignore[union-attr]
            try:
                async with asyncio.timeout(cfg.compaction_timeout_s):
                    return await asyncio.shield(fut)
            except TimeoutError as e:
                raise BookieError("compaction timed out") from e
            except OSError as e:
                raise BookieError(f"compaction failed: {e!r}") from e
        finally:
            self._ckpt_lock.release()

    def _journal_rotated(self) -> None:
        """The journal's first group in a new file is durable (writer thread): checkpoint now, so that the
        previous file is freed before the preparation of the next one gives up waiting and writes zeros."""
        self._journal_new_file = True
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed under a last write
                loop.call_soon_threadsafe(self._ckpt_wake.set)

    async def _checkpoint_loop(self) -> None:
        """Checkpoint every ``checkpoint_interval_s``, as soon as the write cache is full or the journal has
        started a file, check free space and compact when due. Between jobs it sleeps until the next one is
        due or :attr:`_ckpt_wake` is set, so an idle bookie costs a wake-up per job, not one per polling tick."""
        jobs = self.jobs
        while True:
            self.checkpoint_loop_rounds += 1
            now = time.monotonic()
            if jobs.space_check_due(now):
                await self.disk.check()
            full = self._cache_bytes >= self.config.write_cache_max_bytes
            if (full or self._journal_new_file or jobs.checkpoint_due(now)) and self._flushing is None:
                self._journal_new_file = False
                try:
                    await self.checkpoint()
                except BookieError as e:
                    log.warning("checkpoint skipped: %s", e)
                except Exception:  # keep checkpointing: the next attempt may succeed
                    log.exception("checkpoint failed")
            elif self._flushing is None and not self._throttled and (major := jobs.compaction_due(now)) is not None:
                try:
                    await self.compact(major=major)
                except BookieError as e:
                    log.warning("compaction skipped: %s", e)
                except Exception:
                    log.exception("compaction failed")
            idle = self._flushing is None
            at = jobs.next_due(checkpoint=idle, compaction=idle and not self._throttled)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(at - time.monotonic(), _RETRY_S)):
                    await self._ckpt_wake.wait()
            self._ckpt_wake.clear()

    # ---------------------------------------------------------------- introspection

    def ledger_state(self, ledger_id: int) -> LedgerState | None:
        """A copy of the ledger's state, or None (for tests and tools)."""
        st = self._ledgers.get(ledger_id)
        return None if st is None else st.copy()

    def ledger_ids(self) -> list[int]:
        return sorted(self._ledgers)

    def entry_ids(self, ledger_id: int) -> list[int]:
        """Ids of the entries of ``ledger_id`` stored here (cache and disk), sorted."""
        if ledger_id not in self._ledgers:
            return []
        ids: set[int] = set(self._cache.get(ledger_id, ()))
        if self._flushing is not None:
            ids.update(self._flushing.get(ledger_id, ()))
        locations = self.storage.index.ledgers.get(ledger_id)
        if locations is not None:
            ids.update(locations.entry_ids())
        return sorted(ids)
