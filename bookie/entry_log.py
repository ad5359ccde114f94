"""Entry log files: the long-term home of entries, written in bulk at checkpoints.

``<log_id:08x>.log`` holds a 16-byte header and then records::

    length u32 | crc32c(data) u32 | ledger_id i64 | entry_id i64 | data[length]

The index points at the data (just after a record header) so a read is a single ``pread``; runs
of adjacent entries are fetched with one ``pread`` and sliced. The header makes every file
self-describing (for a future compactor or index rebuild).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import mmap
import os
import struct
import threading
from array import array
from bisect import bisect_right
from collections import deque
from itertools import accumulate, repeat
from operator import add
from pathlib import Path

from crc32c import crc32c

from .api import BookieError, BookieNoSuchEntryError

log = logging.getLogger(__name__)

_FILE_MAGIC = b"MGL1"
_FILE_HDR = struct.Struct("<4sIQ")  # magic, version, log id
ENTRY_HEADER = struct.Struct("<IIqq")
ENTRY_HEADER_SIZE = ENTRY_HEADER.size
_SUFFIX = ".log"
_WRITE_CHUNK = 4 << 20
_IOV_MAX = 1024
#: Parts averaging less than this many bytes are joined before they are staged (O_DIRECT).
_JOIN_BELOW = 4096
#: The one call that writes entry data (a seam for fault-injection tests: EIO cannot be made on demand).
_writev = os.writev
#: ``O_DIRECT`` writes go from a page-aligned staging buffer, in whole blocks of this size.
_ALIGN = 4096
O_DIRECT = getattr(os, "O_DIRECT", 0)


def entry_log_ids(directory: Path) -> list[int]:
    """Ids of the entry log files present in ``directory``."""
    ids = []
    for p in directory.glob(f"*{_SUFFIX}"):
        with contextlib.suppress(ValueError):
            ids.append(int(p.stem, 16))
    return sorted(ids)


def entry_log_path(directory: Path, log_id: int) -> Path:
    return directory / f"{log_id:08x}{_SUFFIX}"


def entry_log_has_data(directory: Path, log_id: int) -> bool:
    """Whether the log holds anything past its file header."""
    try:
        return entry_log_path(directory, log_id).stat().st_size > _FILE_HDR.size
    except FileNotFoundError:
        return False


class EntryLogWriter:
    """Appends entries to the current entry log, rotating by size (used by one thread at a time).

    Writes are buffered; :meth:`sync` writes the buffer and fsyncs every file touched since the
    previous sync. A new process never appends to an older file: it starts a new one, so a tail
    torn by a crash is never followed by live data.

    Locations are handed out before the bytes are written, so a failed write or fsync (ENOSPC,
    EIO) leaves them pointing at bytes that may not exist: the caller must then :meth:`abandon`
    everything since the last :meth:`sync` (the files are cut back, later writes go to a new log).

    With ``direct_io`` the written entries do not go through the page cache. Each byte written lands
    on a new page of a new file: cached, those pages make the page cache grow by the whole write rate,
    and a page the kernel has to take fresh costs it several times what a reused one does (up to
    ~230 µs of kernel time per 128 KiB written in this project's VMs, depending on the host's memory).
    Logs are then written with ``O_DIRECT``: entries are copied into one page-aligned staging buffer
    (reused, so always resident) and written from it in whole blocks; a sync writes the partial last
    block padded with zeros and rewrites it with the next bytes. Where the filesystem refuses
    ``O_DIRECT`` (EINVAL at open or at the first write) the log is written through the page cache.
    """

    def __init__(self, directory: Path, max_size: int, *, direct_io: bool = False) -> None:
        self.directory = Path(directory)
        self.max_size = max_size
        #: Write logs with ``O_DIRECT`` where the filesystem takes it (``BookieConfig.entry_log_direct_io``).
        self.direct_io = direct_io
        # O_DIRECT: whether the current log uses it, the staging buffer (its write position is the
        # number of bytes staged) and the file offset of its first byte (a multiple of _ALIGN).
        self._direct = False
        self._stage: mmap.mmap | None = None
        self._stage_view: memoryview | None = None
        self._stage_off = 0
        self._stage_dirty = False  # staged bytes not yet written out (a sync then writes the tail)
        self.log_id = -1
        self._fd = -1
        self._pos = 0
        self._parts: list[bytes] = []
        self._pending = 0
        self._unsynced: list[int] = []  # fds of rolled files waiting for their final fsync
        #: Log and size as of the last successful sync: everything past it is unconfirmed.
        self._synced_log_id = -1
        self._synced_pos = 0
        #: A write or sync failed and :meth:`abandon` has not completed yet.
        self.failed = False

    def open(self, min_id: int = 1) -> None:
        """Start a new log after the existing ones and at or above ``min_id`` (blocking)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        ids = entry_log_ids(self.directory)
        self._start(max(min_id, ids[-1] + 1 if ids else 1))
        self._synced_log_id, self._synced_pos = self.log_id, self._pos
        # The first log of this process must survive a power cut together with its name.
        self._fsync_dir()

    def _start(self, log_id: int) -> None:
        path = entry_log_path(self.directory, log_id)
        header = _FILE_HDR.pack(_FILE_MAGIC, 1, log_id)
        if self.direct_io and O_DIRECT:
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | O_DIRECT, 0o644)
            except OSError as e:
                if e.errno != errno.EINVAL:  # EINVAL: this filesystem has no O_DIRECT
                    raise
            else:
                stage = self._staging()
                view = self._stage_view
                assert view is not None
                stage.seek(0)
                stage.write(header)  # rewritten with the first entries
                stage[len(header) : _ALIGN] = bytes(_ALIGN - len(header))
                try:
                    # Some filesystems take O_DIRECT at open and refuse the writes: write the header's
                    # block now, then cut the file back to the header (a log without entries stays
                    # that small). Not through the _writev seam: no entry data is written here.
                    if os.pwrite(fd, view[:_ALIGN], 0) != _ALIGN:
                        raise OSError(errno.ENOSPC, "short write of an entry log header")
                    os.ftruncate(fd, len(header))
                except OSError as e:
                    os.close(fd)
                    if e.errno != errno.EINVAL:
                        path.unlink(missing_ok=True)
                        raise
                else:
                    self._direct, self._stage_off, self._stage_dirty = True, 0, False
                    self.log_id, self._fd, self._pos = log_id, fd, len(header)
                    return
        self._direct = False
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            if os.write(fd, header) != _FILE_HDR.size:
                raise OSError(errno.ENOSPC, "short write of an entry log header")
        except BaseException:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        self.log_id, self._fd, self._pos = log_id, fd, _FILE_HDR.size

    def add_many(
        self,
        ledger_id: int,
        entry_ids: list[int],
        datas: list[bytes],
        heads: list[bytes] | None = None,
        known_crcs: list[int | None] | None = None,
    ) -> tuple[array, list[int], set[int]]:
        """Buffer entries of one ledger; returns their locations, crc32c values and the logs used.

        With ``heads``, entry ``i`` is ``heads[i] + datas[i]``, written as the two buffers (the write
        cache keeps an add's digest header apart from its data: nothing is joined to be written).
        ``known_crcs[i]``, where not None, is entry ``i``'s crc32c, already computed (for its journal record).
        The locations are valid only once :meth:`sync` has returned.

        A location is ``log_id << 32 | offset of the data``. The per-entry work runs in C
        (``map``/``accumulate``): a checkpoint holds the GIL as briefly as possible.
        """
        lens = list(map(len, datas)) if heads is None else list(map(add, map(len, heads), map(len, datas)))
        if known_crcs is None:
            crcs = list(map(crc32c, datas)) if heads is None else list(map(crc32c, datas, map(crc32c, heads)))
        else:
            hs = heads if heads is not None else repeat(b"")
            crcs = [crc32c(d, crc32c(h)) if c is None else c for c, h, d in zip(known_crcs, hs, datas, strict=False)]
        headers = list(map(ENTRY_HEADER.pack, lens, crcs, repeat(ledger_id), entry_ids))
        ends = list(accumulate(map(add, lens, repeat(ENTRY_HEADER_SIZE))))  # relative record ends
        locs = array("q")
        logs: set[int] = set()
        i, n = 0, len(datas)
        while i < n:
            before = ends[i - 1] if i else 0
            j = bisect_right(ends, before + self.max_size - self._pos, lo=i)
            if j == i:
                if self._pos > _FILE_HDR.size:
                    self._roll()
                    continue
                j = i + 1  # one entry bigger than a whole file gets a file of its own
            starts = accumulate(
                map(add, lens[i : j - 1], repeat(ENTRY_HEADER_SIZE)), initial=(self.log_id << 32) + self._pos
            )
            locs.extend(map(add, starts, repeat(ENTRY_HEADER_SIZE)))
            if heads is None:
                parts: list[bytes] = [b""] * (2 * (j - i))
                parts[0::2] = headers[i:j]
                parts[1::2] = datas[i:j]
            else:
                parts = [b""] * (3 * (j - i))
                parts[0::3] = headers[i:j]
                parts[1::3] = heads[i:j]
                parts[2::3] = datas[i:j]
            self._parts.extend(parts)
            size = ends[j - 1] - before
            self._pos += size
            self._pending += size
            logs.add(self.log_id)
            if self._pending >= _WRITE_CHUNK:
                self._write_out()
            i = j
        return locs, crcs, logs

    def _write_out(self) -> None:
        parts = self._parts
        if not parts:
            return
        if self.failed:
            raise OSError(errno.EIO, "entry log writer failed; abandon() first")
        self._parts = []
        self._pending = 0
        try:
            if self._direct:
                self._stage_parts(parts)
                return
            # writev straight from the entries' bytes: no joined copy made while holding the GIL.
            for i in range(0, len(parts), _IOV_MAX):
                batch = parts[i : i + _IOV_MAX]
                written = _writev(self._fd, batch)
                total = sum(map(len, batch))
                if written < total:  # short write (e.g. disk nearly full): finish it the slow way
                    rest = memoryview(b"".join(batch))[written:]
                    while rest:
                        rest = rest[os.write(self._fd, rest) :]
        except BaseException:
            self.failed = True
            raise

    def _staging(self) -> mmap.mmap:
        if self._stage is None:
            self._stage = mmap.mmap(-1, _WRITE_CHUNK)  # page-aligned, as O_DIRECT wants
            self._stage_view = memoryview(self._stage)
        return self._stage

    def _stage_parts(self, parts: list[bytes]) -> None:
        """Copy ``parts`` into the staging buffer, writing it out whenever it is full (O_DIRECT)."""
        stage = self._stage
        assert stage is not None
        i, n = 0, len(parts)
        self._stage_dirty = True
        while i < n:
            room = _WRITE_CHUNK - stage.tell()
            ends = list(accumulate(map(len, parts[i : i + _IOV_MAX])))
            j = i + bisect_right(ends, room)
            if j > i:
                if ends[j - i - 1] < _JOIN_BELOW * (j - i):
                    # Small parts (a 100-byte entry is three): one join and one copy cost less than a
                    # method call per part.
                    stage.write(b"".join(parts[i:j]))
                else:
                    deque(map(stage.write, parts[i:j]), maxlen=0)  # the per-part loop runs in C
                i = j
            else:  # the next part does not fit whole: stage its head, keep the rest for the next round
                head = memoryview(parts[i])
                stage.write(head[:room])
                parts[i] = head[room:]  # type: ignore[call-overload]
            if stage.tell() == _WRITE_CHUNK:
                self._write_stage(_WRITE_CHUNK)
                self._stage_off += _WRITE_CHUNK
                stage.seek(0)

    def _write_stage(self, size: int) -> None:
        """Write the first ``size`` staged bytes (a multiple of _ALIGN) at the stage's file offset."""
        view = self._stage_view
        assert view is not None
        os.lseek(self._fd, self._stage_off, os.SEEK_SET)
        if _writev(self._fd, [view[:size]]) != size:
            raise OSError(errno.ENOSPC, f"short write to entry log {self.log_id}")

    def _write_stage_tail(self) -> None:
        """Write what is staged, the last partial block padded with zeros; keep that block staged so that
        the next write rewrites it with the bytes that follow (O_DIRECT)."""
        stage = self._stage
        assert stage is not None
        fill = stage.tell()
        if fill == 0 or not self._stage_dirty:
            return
        size = -(-fill // _ALIGN) * _ALIGN
        stage[fill:size] = bytes(size - fill)
        self._write_stage(size)
        self._stage_dirty = False
        whole = fill - fill % _ALIGN
        if whole:
            stage.move(0, whole, fill - whole)
            self._stage_off += whole
            stage.seek(fill - whole)

    def _roll(self) -> None:
        self._write_out()
        if self._direct:
            try:
                self._write_stage_tail()
            except BaseException:
                self.failed = True
                raise
        old = self._fd
        try:
            self._start(self.log_id + 1)
        except BaseException:
            self.failed = True
            raise
        self._unsynced.append(old)

    def sync(self) -> None:
        """Write buffered entries and fsync every file written since the last sync.

        On an error the writer is marked :attr:`failed` (see :meth:`abandon`).
        """
        try:
            self._write_out()
            if self._direct:
                self._write_stage_tail()
            for fd in self._unsynced:
                os.fsync(fd)
            if self._unsynced:
                self._fsync_dir()
            os.fsync(self._fd)
        except BaseException:
            self.failed = True
            raise
        for fd in self._unsynced:
            os.close(fd)
        self._unsynced.clear()
        self._synced_log_id, self._synced_pos = self.log_id, self._pos

    def abandon(self) -> None:
        """Drop everything written or buffered since the last sync and continue in a new log (blocking).

        Logs started since then hold nothing indexed and are deleted; the log that was current at
        the last sync is cut back to its synced size (giving the space back on a full disk). The
        new log gets a fresh id, so a failed offset is never reused. Raises if even the new log
        cannot be created; :attr:`failed` then stays set and the next attempt tries again.
        """
        self.failed = True
        self._parts = []
        self._pending = 0
        for fd in self._unsynced:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._unsynced.clear()
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1
        if self._synced_log_id >= 0:
            with contextlib.suppress(OSError):
                os.truncate(entry_log_path(self.directory, self._synced_log_id), self._synced_pos)
        for log_id in range(self._synced_log_id + 1, self.log_id + 1):
            entry_log_path(self.directory, log_id).unlink(missing_ok=True)
        next_id = max(self.log_id, self._synced_log_id) + 1
        self._start(next_id)
        self._fsync_dir()
        self._synced_log_id, self._synced_pos = self.log_id, self._pos
        self.failed = False
        log.warning("entry log writer continues in log %d after a failed write", self.log_id)

    def _fsync_dir(self) -> None:
        dfd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def close(self) -> None:
        if self._fd >= 0 and not self.failed:
            self.sync()
        for fd in [*self._unsynced, self._fd]:
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._unsynced.clear()
        self._fd = -1
        # Unmapped with the last reference (a view may outlive this in a traceback: no close() here).
        self._stage = self._stage_view = None


class EntryLogReader:
    """Reads entries with ``os.pread``; thread-safe, file descriptors cached and ref-counted.

    Garbage collection may remove a log while a read thread uses it: :meth:`retire` closes the
    descriptor only once no read holds it, so a descriptor number is never reused under a reader.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self._lock = threading.Lock()
        self._fds: dict[int, int] = {}
        self._refs: dict[int, int] = {}
        self._retired: set[int] = set()
        #: Bytes read from entry logs so far (a metric; updated without a lock, so approximate).
        self.bytes_read = 0

    def _acquire(self, log_id: int) -> int:
        with self._lock:
            if log_id in self._retired:
                raise BookieNoSuchEntryError(f"entry log {log_id} was garbage collected")
            fd = self._fds.get(log_id)
            if fd is None:
                try:
                    fd = os.open(entry_log_path(self.directory, log_id), os.O_RDONLY)
                except FileNotFoundError as e:
                    raise BookieNoSuchEntryError(f"entry log {log_id} is missing") from e
                self._fds[log_id] = fd
            self._refs[log_id] = self._refs.get(log_id, 0) + 1
            return fd

    def _release(self, log_id: int) -> None:
        with self._lock:
            n = self._refs[log_id] - 1
            if n:
                self._refs[log_id] = n
                return
            del self._refs[log_id]
            if log_id in self._retired:
                os.close(self._fds.pop(log_id))

    def retire(self, log_id: int) -> None:
        """The log is being deleted: close its descriptor once unused."""
        with self._lock:
            self._retired.add(log_id)
            if log_id not in self._refs and log_id in self._fds:
                os.close(self._fds.pop(log_id))

    def read_many(self, items: list[tuple[int, int, int, int]]) -> list[bytes]:
        """Read ``(log_id, offset, length, crc)`` items (blocking); adjacent ones share one pread."""
        out: list[bytes] = []
        i, n = 0, len(items)
        while i < n:
            log_id, off, length, _ = items[i]
            # Extend the run while the next entry directly follows in the same file.
            j, end = i + 1, off + length
            while j < n and j - i < 4096:
                nlog, noff, nlen, _ = items[j]
                if nlog != log_id or noff != end + ENTRY_HEADER_SIZE:
                    break
                end = noff + nlen
                j += 1
            fd = self._acquire(log_id)
            try:
                buf = os.pread(fd, end - off, off)
            finally:
                self._release(log_id)
            self.bytes_read += len(buf)
            if len(buf) != end - off:
                raise BookieError(f"entry log {log_id}: short read at offset {off}")
            if j == i + 1:
                chunks = [buf]
            else:
                chunks = []
                for k in range(i, j):
                    _, koff, klen, _ = items[k]
                    rel = koff - off
                    chunks.append(buf[rel : rel + klen])
            for k, data in zip(range(i, j), chunks, strict=True):
                if crc32c(data) != items[k][3]:
                    raise BookieError(f"entry log {log_id}: checksum mismatch at offset {items[k][1]}")
                out.append(data)
            i = j
        return out

    def close(self) -> None:
        with self._lock:
            for fd in self._fds.values():
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._fds.clear()
