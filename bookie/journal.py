"""Write-ahead journal with group commit.

Every add (and every fence, ledger key and ledger delete) is appended here and acknowledged only
once it is on disk. A dedicated writer thread takes everything queued since its last write, writes
it with one ``pwrite``, calls ``fdatasync`` once and then resolves the whole group's futures with a
single ``loop.call_soon_threadsafe``. While it syncs, new adds pile up into the next group, so the
group size adapts to the load by itself ("natural batching").

The on-disk format (files, records, CRCs) and its replay are in :mod:`.journal_format`.

A new file is an obsolete one reused (renamed, header rewritten: BookKeeper's ``journalReuseFiles``)
or, when none is free, a fresh one pre-written with zeros, which costs as much write bandwidth (and CPU:
~15 ms per 64 MiB) as the records themselves. The next file is prepared while the open one fills. At
start-up that is done at once (nothing competes with it then); later zeros are written only once the
open file is half full, and until then the preparation waits for a checkpoint to free an obsolete file
(a fresh bookie frees its first one a checkpoint after its first rotation: preparing the third file at
once zeroed a file that waiting would have reused, under load).

A record never spans files. The event loop, which computes the CRCs, decides where each file ends:
it cuts the open group at the boundary and marks the next group as the first of the next file.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future as ThreadFuture
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import NamedTuple

from crc32c import crc32c

from magnetar.common.tasks import TaskSet

from .api import BookieError, BookieUnavailableError, Waiter, settle
from .journal_format import (
    CRC,
    DATA_CRC,
    FILE_HDR,
    FREE_SUFFIX,
    REC_ADD,
    REC_HEADER_SIZE,
    REC_TAIL,
    SUFFIX,
    JournalPosition,
    JournalRecord,
    crc_seed,
    file_header,
    journal_files,
    replay_file,
    run_record,
)

log = logging.getLogger(__name__)

_ZEROS = bytes(1 << 20)
#: Records with less data than this are copied into the group's buffer; bigger ones (batches) are
#: written from their own bytes (``pwritev``), not copied once more on the event loop.
_INLINE_MAX = 4096
_IOV_MAX = 1024
#: Adaptive group wait: a wait that gathered another add earns this much credit, one that did not costs
#: one; the writer waits while it has credit, and otherwise tries a wait once per probe interval.
_WAIT_CREDIT_GAIN = 2
_WAIT_CREDIT_MAX = 8
_WAIT_PROBE_INTERVAL_S = 1.0
#: The next file's preparation waits this long at most between looks for a free file (a safety net:
#: a freed file, the open file reaching half and ``close()`` all wake it).
_PREPARE_RECHECK_S = 60.0
_NEVER = 1 << 62


class _PreparationAbandoned(Exception):
    """The journal closed while the next file's preparation waited for a free file."""


#: Told the outcome of one record: ``None`` once it is durable, else the error.
class _Group(NamedTuple):
    """Records written together with one ``pwritev`` and one ``fdatasync``."""

    parts: list[bytes | bytearray]
    size: int
    waiters: list[Waiter]
    #: The group starts the next journal file (the writer rotates before writing it).
    new_file: bool


def _write_zeros(fd: int, pos: int, end: int) -> None:
    """Allocate ``[pos, end)`` of ``fd`` by writing zeros, durably."""
    while pos < end:
        pos += os.pwrite(fd, memoryview(_ZEROS)[: min(end - pos, len(_ZEROS))], pos)
    os.fsync(fd)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Journal:
    """The group-committing journal of one bookie.

    Life cycle: :meth:`replay` (blocking, before start) -> :meth:`open` (blocking: first file) ->
    :meth:`start` (on the event loop) -> :meth:`append` ... -> :meth:`close`.
    """

    def __init__(
        self,
        directory: Path,
        *,
        file_size: int,
        group_max_bytes: int,
        max_wait_s: float = 0.0,
        adaptive_wait: bool = True,
        add_timeout_s: float = 30.0,
        sync_data: bool = True,
        reuse_files: int = 4,
        on_new_file: Callable[[], None] | None = None,
    ) -> None:
        self.directory = Path(directory)
        #: Called on the writer thread once the first group of a new file is durable: a checkpoint from then
        #: on frees the previous file, for the preparation of the next one to reuse instead of writing zeros.
        self.on_new_file = on_new_file
        #: fdatasync each group before resolving its adds (BookKeeper's journalSyncData). False leaves
        #: flushing to the OS: adds survive a broker crash but not a power loss or kernel crash.
        self.sync_data = sync_data
        self.file_size = file_size
        self.group_max_bytes = group_max_bytes
        self.max_wait_s = max_wait_s
        #: Wait ``max_wait_s`` only while such waits gather more adds (see :meth:`_should_wait`).
        self.adaptive_wait = adaptive_wait
        #: Group waits done, and those that another add joined (tests, stats).
        self.waits = 0
        self.waits_joined = 0
        # Writer thread only: credit of the adaptive wait, when it last probed, whether the next group waited.
        self._wait_credit = 0
        self._last_probe = 0.0
        self._waited = False
        self.add_timeout_s = add_timeout_s
        #: Obsolete files kept (as ``.free``) to be reused instead of pre-writing new ones; 0 deletes them.
        self.reuse_files = reuse_files
        #: Journal files made by reusing an obsolete one, and by pre-writing zeros (tests, stats).
        self.files_reused = 0
        self.files_zeroed = 0
        #: Total bytes written since start (drives checkpoints).
        self.bytes_written = 0
        #: Group commits done (one write + one fdatasync each) and the biggest one, for tests and stats.
        self.groups_written = 0
        self.max_group_bytes = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()
        # Wakes the idle writer: a C queue (threading.Event.set is Python code, ~1 µs on every add that
        # finds the writer idle); a stale token only makes one spurious wakeup.
        self._wake: queue.SimpleQueue[None] = queue.SimpleQueue()
        # Current (open) group: its parts (the last one a buffer collecting small records), size and
        # waiters; and groups sealed because they reached group_max_bytes.
        self._tail = bytearray()
        self._parts: list[bytes | bytearray] = [self._tail]
        self._size_queued = 0
        self._futs: list[Waiter] = []
        self._new_file = False
        self._sealed: collections.deque[_Group] = collections.deque()
        # Where the next queued record will be written (file seq, offset, that file's CRC seed), kept
        # under the lock by the appenders; the writer follows the groups' new_file marks.
        self._q_seq = 0
        self._q_off = 0
        self._q_seed = 0
        self._idle = False
        self._stopping = False
        self._failed: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._thread_done: asyncio.Future[None] | None = None
        self._tasks = TaskSet("journal")
        # (start time, waiters) of the group being written, for the watchdog.
        self._inflight: tuple[float, list[Waiter]] | None = None
        # Owned by the writer thread after open().
        self._seq = 0
        self._fd = -1
        self._size = 0
        self._off = 0
        self._synced = JournalPosition(0, 0)
        self._prealloc = ThreadPoolExecutor(1, thread_name_prefix="journal-prealloc")
        self._next_file: ThreadFuture[tuple[int, int]] | None = None
        # Serialises taking and adding ``.free`` files (preallocation thread vs checkpoint thread).
        self._free_lock = threading.Lock()
        # Wakes a preparation waiting for a free file: one was freed, the open file is half full, a rotation
        # needs the file now (``_rushed``), or the journal closes. The writer wakes it once per file, at
        # ``_prepare_due`` (an offset of the open file).
        self._prepare_wake = threading.Event()
        self._rushed = False
        self._prepare_due = 0

    # ---------------------------------------------------------------- replay (before start)

    def replay(self, start: JournalPosition | None) -> Iterator[JournalRecord]:
        """Yield every intact record at or after ``start`` (blocking; run in a thread)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for p in self.directory.glob("*.tmp"):
            p.unlink(missing_ok=True)  # an interrupted pre-allocation
        for seq, path in journal_files(self.directory):
            self._seq = max(self._seq, seq)
            if start is None or seq >= start.seq:
                yield from replay_file(path, seq, start)

    # ---------------------------------------------------------------- files

    def _create_file(self, seq: int, size: int, patient: bool = False) -> int:
        """Make ``seq``'s file (a free one reused, else pre-written with zeros); returns an fd open for writing.

        ``patient``: before writing zeros, wait for a free file until the open file is half full, a rotation
        needs this one, or the journal closes (then raise :class:`_PreparationAbandoned`)."""
        path = self.directory / f"{seq:016x}{SUFFIX}"
        tmp = path.with_suffix(".tmp")
        while True:
            try:
                fd = self._reuse_free_file(tmp, seq, size)
            except OSError as e:  # a free file is a saving, never a reason to fail: pre-write a new one
                log.warning("journal: reusing a free file failed (%r); writing a new one", e)
                fd = None
                break
            if fd is not None or not patient or self._rushed or self._off * 2 >= self._size:
                break
            if self._stopping:
                raise _PreparationAbandoned
            # Cleared before the next look: a wake-up that comes meanwhile is seen by that look or the next wait.
            self._prepare_wake.wait(_PREPARE_RECHECK_S)
            self._prepare_wake.clear()
        if fd is None:
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, file_header(seq))
                _write_zeros(fd, FILE_HDR.size, size)
            except BaseException:
                os.close(fd)
                raise
            self.files_zeroed += 1
        try:
            os.rename(tmp, path)
            _fsync_dir(self.directory)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _reuse_free_file(self, tmp: Path, seq: int, size: int) -> int | None:
        """Take the oldest ``.free`` file of ``size`` bytes as ``tmp`` with ``seq``'s header (durable);
        returns its fd, or None when there is none (a crash leaves ``tmp``, which replay deletes)."""
        while True:
            with self._free_lock:
                free = sorted(self.directory.glob(f"*{FREE_SUFFIX}"))
                if not free:
                    return None
                os.rename(free[0], tmp)
            fd = os.open(tmp, os.O_RDWR)
            try:
                if os.fstat(fd).st_size != size:  # made under another journal_file_size
                    os.close(fd)
                    tmp.unlink()
                    continue
                os.pwrite(fd, file_header(seq), 0)
                os.fdatasync(fd)
                # Writes not aligned to pages read a page that is not cached before changing it, on the
                # writer's path: start reading the file in now (nothing to do when it is still cached).
                # Advice only: a filesystem that refuses it still gets the file reused.
                with contextlib.suppress(OSError):
                    os.posix_fadvise(fd, 0, size, os.POSIX_FADV_WILLNEED)
            except BaseException:
                os.close(fd)
                raise
            self.files_reused += 1
            return fd

    def _prepare_next(self, patient: bool = True) -> None:
        """Start preparing the file after the open one (which is new: ``_off`` at its start); ``patient``:
        as :meth:`_create_file` takes it."""
        seq = self._seq + 1
        size = self.file_size
        self._rushed = False
        self._prepare_due = self._size // 2

        def create() -> tuple[int, int]:
            return self._create_file(seq, size, patient), size

        self._next_file = self._prealloc.submit(create)

    def open(self) -> None:
        """Create a fresh journal file after the existing ones (blocking)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for seq, _ in journal_files(self.directory):
            self._seq = max(self._seq, seq)
        self._seq += 1
        self._fd = self._create_file(self._seq, self.file_size)
        self._size = self.file_size
        self._off = FILE_HDR.size
        self._synced = JournalPosition(self._seq, self._off)
        self._q_seq, self._q_off, self._q_seed = self._seq, self._off, crc_seed(self._seq)
        self._prepare_next(patient=False)

    def _rotate(self) -> None:
        assert self._next_file is not None
        if not self._next_file.done():
            self._rushed = True
            self._prepare_wake.set()
        try:
            fd, size = self._next_file.result(timeout=self.add_timeout_s)
        except _PreparationAbandoned:  # close() came first; the queued records still need their file
            fd, size = self._create_file(self._seq + 1, self.file_size), self.file_size
        os.close(self._fd)
        self._seq += 1
        self._fd, self._size, self._off = fd, size, FILE_HDR.size
        self._prepare_next()

    def _extend(self, end: int) -> None:
        """A record bigger than a whole file: allocate the file up to ``end`` (rare: huge entries, tiny files)."""
        _write_zeros(self._fd, self._size, end)
        self._size = end

    def delete_before(self, seq: int) -> int:
        """Let go of journal files wholly before file ``seq`` (blocking): up to ``reuse_files`` are kept as
        ``.free`` files for reuse, the rest deleted. Returns how many files were let go."""
        n = 0
        for s, path in journal_files(self.directory):
            if s < seq and s < self._seq:
                if not self._keep_free(path):
                    path.unlink(missing_ok=True)
                n += 1
        if n:
            _fsync_dir(self.directory)
            self._prepare_wake.set()
        return n

    def _keep_free(self, path: Path) -> bool:
        with self._free_lock:
            if len(list(self.directory.glob(f"*{FREE_SUFFIX}"))) >= self.reuse_files:
                return False
            try:
                if path.stat().st_size != self.file_size:
                    return False
                os.rename(path, path.with_suffix(FREE_SUFFIX))
            except FileNotFoundError:
                return False
        return True

    @property
    def synced_position(self) -> JournalPosition:
        """Everything before this position is durable (read from any thread)."""
        return self._synced

    # ---------------------------------------------------------------- writer

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start the writer thread and the stall watchdog (call on the event loop)."""
        self._loop = loop
        self._thread_done = loop.create_future()
        self._thread = threading.Thread(target=self._run, name="journal-writer", daemon=True)
        self._thread.start()
        self._tasks.spawn(self._watch(), name="journal-watchdog")

    def append(
        self,
        rtype: int,
        ledger_id: int,
        entry_id: int,
        lac: int,
        data: bytes,
        head: bytes = b"",
        crc: int | None = None,
    ) -> asyncio.Future[None]:
        """Queue one record; the future resolves once it is fdatasync'ed (event loop thread only). ``crc``: as
        :meth:`append_many` takes it."""
        fut: asyncio.Future[None] = self._loop.create_future()  # type: ignore[union-attr]
        self.append_many(rtype, ledger_id, (entry_id,), lac, (head,), (data,), partial(settle, fut), (crc,))
        return fut

    def append_cb(
        self, rtype: int, ledger_id: int, entry_id: int, lac: int, data: bytes, done: Waiter, head: bytes = b""
    ) -> None:
        """:meth:`append` with a callback instead of a future (no future and no extra loop callback per
        record). ``done`` is called once, on the event loop, never from here.

        The record's data is ``head + data``, never joined: ``head`` (small: an entry's digest header)
        goes into the group's buffer, a big ``data`` is written from its own bytes."""
        self.append_many(rtype, ledger_id, (entry_id,), lac, (head,), (data,), done)

    def append_many(
        self,
        rtype: int,
        ledger_id: int,
        entry_ids: Sequence[int],
        lac: int,
        heads: Sequence[bytes],
        datas: Sequence[bytes],
        done: Waiter,
        crcs: Sequence[int | None] | None = None,
    ) -> None:
        """Queue the records of ``entry_ids`` (data ``heads[i] + datas[i]``, as :meth:`append_cb` takes them)
        with one waiter: ``done`` is called once, on the event loop, when all of them are durable
        (the publish hot path journals a whole socket read of a producer's sends this way: one lock, one
        waiter). The records stay in order and may span groups; ``done`` hears when the last group is synced.
        ``crcs[i]``, when given and not None, is ``crc32c(heads[i] + datas[i])``, already computed by the caller
        (for big entries: a small one's record is checksummed over its bytes, which costs less than another CRC).
        Adds of consecutive entries that are all small go into one ``REC_ADD_RUN`` record; others get one
        record each.
        """
        if self._failed is not None or self._stopping:
            raise BookieUnavailableError(f"journal is not writable: {self._failed or 'closing'}")
        run = None
        if crcs is None and rtype == REC_ADD and len(entry_ids) > 1 and max(map(len, datas)) < _INLINE_MAX:
            run = run_record(ledger_id, entry_ids, lac, heads, datas)  # built before taking the lock
        with self._lock:
            if run is not None and CRC.size + len(run) <= self.file_size - FILE_HDR.size:
                self._queue_run(run)
            else:  # one record per entry
                pack_tail, pack_crc = REC_TAIL.pack, CRC.pack
                file_size = self.file_size
                if crcs is None:
                    crcs = [None] * len(entry_ids)
                buf, seed, off = self._tail, self._q_seed, self._q_off
                size = 0
                for entry_id, head, data, dcrc in zip(entry_ids, heads, datas, crcs, strict=True):
                    n = len(data)
                    rec = REC_HEADER_SIZE + len(head) + n
                    if off + rec > file_size and off > FILE_HDR.size:  # (a fresh file takes any record)
                        self._size_queued += size
                        size = 0
                        self._start_next_file()
                        buf, seed, off = self._tail, self._q_seed, FILE_HDR.size
                    if dcrc is None:
                        tail = pack_tail(len(head) + n, rtype, ledger_id, entry_id, lac) + head
                        crc = crc32c(data, crc32c(tail, seed))
                    else:
                        tail = pack_tail(len(head) + n, rtype | DATA_CRC, ledger_id, entry_id, lac)
                        crc = crc32c(pack_crc(dcrc), crc32c(tail, seed))
                        tail += head
                    buf += pack_crc(crc)
                    buf += tail
                    if n < _INLINE_MAX:
                        buf += data
                    else:
                        buf = self._tail = bytearray()
                        self._parts += (data, buf)
                    size += rec
                    off += rec
                self._q_off = off
                self._size_queued += size
            self._futs.append(done)
            if self._size_queued >= self.group_max_bytes:
                self._sealed.append(self._cut())
            wake = self._idle
            self._idle = False
        if wake:
            self._wake.put(None)

    def _queue_run(self, run: bytearray) -> None:
        """Queue a ``REC_ADD_RUN`` record made by :func:`run_record` (caller holds the lock)."""
        rec = CRC.size + len(run)
        if self._q_off + rec > self.file_size:
            self._start_next_file()
        tail = self._tail
        tail += CRC.pack(crc32c(run, self._q_seed))
        tail += run
        self._q_off += rec
        self._size_queued += rec

    def _cut(self) -> _Group:
        """Close the open group and start the next one (caller holds the lock)."""
        group = _Group(self._parts, self._size_queued, self._futs, self._new_file)
        self._tail = bytearray()
        self._parts, self._size_queued, self._futs, self._new_file = [self._tail], 0, [], False
        return group

    def _start_next_file(self) -> None:
        """Queue the next records into the next file (caller holds the lock)."""
        if self._size_queued or self._futs:
            self._sealed.append(self._cut())
        self._q_seq += 1
        self._q_off = FILE_HDR.size
        self._q_seed = crc_seed(self._q_seq)
        self._new_file = True

    def _take(self) -> _Group | None:
        with self._lock:
            if self._sealed:
                return self._sealed.popleft()
            if self._futs:
                return self._cut()
            if not self._stopping:
                self._idle = True
            return None

    def _run(self) -> None:
        loop = self._loop
        assert loop is not None
        try:
            while True:
                group = self._take()
                if group is None:
                    if self._stopping:
                        break
                    self._wake.get()  # an add to an idle writer and close() put here: no polling while idle
                    if self._should_wait():
                        time.sleep(self.max_wait_s)  # let a few more adds join this group
                        self._waited = True
                    continue
                if self._waited:
                    self._learn(len(group.waiters) > 1)
                futs = group.waiters
                self._inflight = (time.monotonic(), futs)
                try:
                    self._write(group)
                except BaseException as e:
                    log.exception("journal write failed; the bookie stops accepting adds")
                    self._failed = e
                    self._fail_all(futs, e)
                    break
                self._inflight = None
                loop.call_soon_threadsafe(_resolve, futs)
        except RuntimeError:
            pass  # event loop closed under us: nothing left to notify
        finally:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_set_done, self._thread_done)

    def _should_wait(self) -> bool:
        """Whether an add that woke the idle writer waits ``max_wait_s`` for others (writer thread).

        Each add alone in its group costs an ``fdatasync`` and two thread wake-ups, so with adds arriving
        a few hundred microseconds apart (paced producers, many request/response clients) a short wait
        halves the bookie's work. But a lone producer waiting for each receipt before its next send gains
        nothing and would only be slowed down: the writer waits while recent waits gathered more adds, and
        otherwise tries one wait per probe interval to notice when they would again."""
        if self.max_wait_s <= 0:
            return False
        if not self.adaptive_wait or self._wait_credit > 0:
            return True
        now = time.monotonic()
        if now - self._last_probe >= _WAIT_PROBE_INTERVAL_S:
            self._last_probe = now
            return True
        return False

    def _learn(self, joined: bool) -> None:
        self._waited = False
        self.waits += 1
        if joined:
            self.waits_joined += 1
            self._wait_credit = min(_WAIT_CREDIT_MAX, self._wait_credit + _WAIT_CREDIT_GAIN)
        else:
            self._wait_credit = max(0, self._wait_credit - 1)

    def _write(self, group: _Group) -> None:
        parts, n = group.parts, group.size
        if group.new_file:
            self._rotate()
        if self._off + n > self._size:
            self._extend(self._off + n)
        fd, off = self._fd, self._off
        pos = off
        for i in range(0, len(parts), _IOV_MAX):
            batch = parts[i : i + _IOV_MAX]
            total = sum(map(len, batch))
            done = os.pwritev(fd, batch, pos)
            if done < total:  # short write: finish it the slow way
                rest = memoryview(b"".join(batch))
                while done < total:
                    done += os.pwrite(fd, rest[done:], pos + done)
            pos += total
        if self.sync_data:
            os.fdatasync(fd)
        self._off = off + n
        if self._off >= self._prepare_due:  # the open file is half full: stop waiting for a free one
            self._prepare_due = _NEVER
            self._prepare_wake.set()
        self.bytes_written += n
        self.groups_written += 1
        if n > self.max_group_bytes:
            self.max_group_bytes = n
        self._synced = JournalPosition(self._seq, self._off)
        if group.new_file and self.on_new_file is not None:
            self.on_new_file()

    def _fail_all(self, futs: list[Waiter], exc: BaseException) -> None:
        """Fail ``futs`` and everything still queued (writer thread)."""
        with self._lock:
            pending = [futs, *(g.waiters for g in self._sealed), self._futs]
            self._sealed.clear()
            self._cut()
        err = BookieUnavailableError(f"journal failed: {exc}")
        with contextlib.suppress(RuntimeError):
            for group in pending:
                self._loop.call_soon_threadsafe(_fail, group, err)  # type: ignore[union-attr]

    async def _watch(self) -> None:
        """Fail adds stuck behind a stalled fdatasync instead of letting callers wait forever."""
        period = min(1.0, self.add_timeout_s / 4)
        while True:
            await asyncio.sleep(period)
            inflight = self._inflight
            if inflight is not None and time.monotonic() - inflight[0] > self.add_timeout_s:
                log.warning("journal write stalled for more than %.1fs", self.add_timeout_s)
                with self._lock:
                    groups = [inflight[1], *(g.waiters for g in self._sealed), self._futs]
                err = BookieUnavailableError("journal write timed out")
                for group in groups:
                    _fail(group, err)

    async def close(self, wait_s: float = 10.0) -> None:
        """Write out what is queued, then stop the writer thread."""
        self._stopping = True
        self._wake.put(None)
        self._prepare_wake.set()
        await self._tasks.close()
        if self._thread_done is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._thread_done), wait_s)
            except TimeoutError:
                log.error("journal writer did not stop within %.1fs", wait_s)
                return
        # Let a running pre-allocation finish: a new journal on this directory must not race it.
        try:
            await asyncio.wait_for(asyncio.to_thread(self._prealloc.shutdown, True, cancel_futures=True), wait_s)
        except TimeoutError:
            log.error("journal pre-allocation did not finish within %.1fs", wait_s)
        if self._fd >= 0:
            await asyncio.to_thread(os.close, self._fd)
            self._fd = -1
        if self._next_file is not None and self._next_file.done() and not self._next_file.cancelled():
            with contextlib.suppress(Exception):
                os.close(self._next_file.result()[0])

    def check_writable(self) -> None:
        """Raise if the journal can no longer accept records."""
        if self._failed is not None:
            raise BookieUnavailableError(f"journal failed: {self._failed}")


def _resolve(waiters: list[Waiter]) -> None:
    """A group is durable: tell its waiters (a group failed by the watchdog meanwhile was emptied)."""
    for done in waiters:
        try:
            done(None)
        except Exception:  # one faulty waiter must not strand the rest of the group
            log.exception("journal waiter failed")
    waiters.clear()


def _fail(waiters: list[Waiter], exc: BookieError) -> None:
    for done in waiters:
        try:
            done(exc)
        except Exception:
            log.exception("journal waiter failed")
    waiters.clear()  # each waiter hears once: a late write of this group tells nobody


def _set_done(fut: asyncio.Future[None] | None) -> None:
    if fut is not None and not fut.done():
        fut.set_result(None)
