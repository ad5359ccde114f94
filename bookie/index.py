"""Entry index and per-ledger state, persisted as an append-only index file.

In memory each ledger has three arrays indexed by ``entry_id - base``: location (``log_id << 32 |
offset``, -1 for "not here"), length and crc32c. Dense arrays cost 16 bytes per entry and no
Python object per entry; ledgers are rolled over by the managed ledger, so they stay bounded.

On disk, ``index.dat`` is a sequence of chunks, one per checkpoint::

    magic 'MGI1' | body length u32 | crc32c(body) u32 | body

holding the journal mark of that checkpoint, deleted ledgers, changed ledger states, the new
entry locations (as runs) and which entry logs hold which ledgers. Loading applies the chunks in
order; a torn last chunk is ignored (its checkpoint never happened: the journal is replayed from
the previous mark). A torn tail is a damaged chunk with nothing but zeros after it (a crash during
its write); a damaged chunk followed by data is corruption, and loading refuses it
(:class:`IndexCorruptError`) instead of dropping every later checkpoint. A failed append is cut
back before anything else is written. When the file grows well past its live content it is
rewritten in one chunk.
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
from array import array
from dataclasses import dataclass, field
from pathlib import Path

from crc32c import crc32c

from .api import BookieError
from .journal_format import JournalPosition

log = logging.getLogger(__name__)

#: The one call that appends index chunks (a seam for fault-injection tests).
_write = os.write


class IndexCorruptError(BookieError):
    """``index.dat`` is damaged somewhere other than its tail: the bookie must not start on it."""


_CHUNK_MAGIC = b"MGI1"
_CHUNK_HDR = struct.Struct("<4sII")
_MARK = struct.Struct("<qq")
_COUNT = struct.Struct("<I")
_LID = struct.Struct("<q")
_STATE = struct.Struct("<qBqqH")  # ledger, fenced, lac, last entry, key length
_BLOCK = struct.Struct("<qqI")  # ledger, first entry, count
_MEMBER = struct.Struct("<Iq")  # log id, ledger
_INDEX_FILE = "index.dat"
#: A checkpoint chunk is joined and written in pieces of about this size (bounds each GIL hold).
_PIECE_BYTES = 256 << 10
_ENTRY_HEADER_SIZE = 24  # entry_log.ENTRY_HEADER_SIZE (length, crc32c, ledger, entry)


class LedgerState:
    """What a bookie knows about one ledger besides its entries (owned by the event loop)."""

    __slots__ = ("fenced", "lac", "last_entry", "master_key")

    def __init__(self, master_key: bytes, fenced: bool = False, lac: int = -1, last_entry: int = -1) -> None:
        self.master_key = master_key
        self.fenced = fenced
        self.lac = lac
        self.last_entry = last_entry

    def copy(self) -> LedgerState:
        return LedgerState(self.master_key, self.fenced, self.lac, self.last_entry)

    def __repr__(self) -> str:
        return f"LedgerState(fenced={self.fenced}, lac={self.lac}, last_entry={self.last_entry})"


@dataclass(slots=True)
class Block:
    """Locations of a run of entries ``first .. first+len(locs)-1`` of one ledger (-1 = hole)."""

    ledger_id: int
    first: int
    locs: array
    lens: array
    crcs: array


class LedgerLocations:
    """Where the entries of one ledger are stored.

    Written by the checkpoint thread while the event loop reads, without a lock: ``view`` holds
    ``(base, locs, lens, crcs)`` in one attribute, so a reader always takes one consistent
    version. Entries are only ever appended in place (length and crc before the location, which
    is what makes a slot visible); a re-base or an overwrite builds new arrays and swaps the view.
    """

    __slots__ = ("view",)

    def __init__(self) -> None:
        self.view: tuple[int, array, array, array] = (0, array("q"), array("I"), array("I"))

    @property
    def base(self) -> int:
        return self.view[0]

    @property
    def locs(self) -> array:
        return self.view[1]

    def lookup(self, entry_id: int) -> tuple[int, int, int, int] | None:
        """``(log_id, offset, length, crc)`` or None."""
        base, locs, lens, crcs = self.view
        i = entry_id - base
        if 0 <= i < len(locs):
            loc = locs[i]
            if loc >= 0:
                return loc >> 32, loc & 0xFFFFFFFF, lens[i], crcs[i]
        return None

    def merge(self, b: Block) -> None:
        """Add a run of locations; holes in ``b`` keep what was already known."""
        n = len(b.locs)
        if n == 0:
            return
        base, locs, lens, crcs = self.view
        if not locs:
            self.view = (b.first, b.locs[:], b.lens[:], b.crcs[:])
            return
        start = b.first - base
        end = start + n
        if start < 0 or max(locs[max(start, 0) : end], default=-1) >= 0:
            self._merge_copy(b)
            return
        # Only new slots: fill them in place, the location last (readers skip slots still -1).
        grow = end - len(locs)
        if grow > 0:
            lens.extend(array("I", [0]) * grow)
            crcs.extend(array("I", [0]) * grow)
            locs.extend(array("q", [-1]) * grow)
        lens[start:end] = b.lens
        crcs[start:end] = b.crcs
        locs[start:end] = b.locs

    def _merge_copy(self, b: Block) -> None:
        """Re-base and/or overwrite known entries on copies, then publish them in one swap."""
        base, locs, lens, crcs = self.view
        new_base = min(base, b.first)
        pad = base - new_base
        locs = array("q", [-1]) * pad + locs
        lens = array("I", [0]) * pad + lens
        crcs = array("I", [0]) * pad + crcs
        start = b.first - new_base
        grow = start + len(b.locs) - len(locs)
        if grow > 0:
            locs.extend(array("q", [-1]) * grow)
            lens.extend(array("I", [0]) * grow)
            crcs.extend(array("I", [0]) * grow)
        for i, loc in enumerate(b.locs):
            if loc >= 0:
                locs[start + i] = loc
                lens[start + i] = b.lens[i]
                crcs[start + i] = b.crcs[i]
        self.view = (new_base, locs, lens, crcs)

    def as_block(self, ledger_id: int) -> Block:
        base, locs, lens, crcs = self.view
        return Block(ledger_id, base, locs, lens, crcs)

    def entry_ids(self) -> list[int]:
        base, locs, _, _ = self.view
        return [base + i for i, loc in enumerate(locs) if loc >= 0]


@dataclass(slots=True)
class Checkpoint:
    """What one checkpoint adds to the index log."""

    mark: JournalPosition
    deleted: list[int]
    states: dict[int, LedgerState]
    blocks: list[Block]
    members: list[tuple[int, int]]  # (log id, ledger id)
    #: Entry logs emptied by compaction: they hold no ledger from here on (optional trailing section).
    dropped_logs: list[int] = field(default_factory=list)


class LedgerIndex:
    """In-memory locations of flushed entries plus the index log that persists them.

    Mutated only by the checkpoint thread (and at load, before the bookie serves); lookups come
    from the event loop. Single operations on arrays and dicts are atomic under the GIL, and the
    bookie keeps serving flushed entries from its write cache until the index has them.
    """

    def __init__(self, directory: Path, compact_bytes: int) -> None:
        self.directory = Path(directory)
        self.compact_bytes = compact_bytes
        self.ledgers: dict[int, LedgerLocations] = {}
        #: Last persisted state of every live ledger (what compaction writes).
        self.states: dict[int, LedgerState] = {}
        self.log_ledgers: dict[int, set[int]] = {}
        self.ledger_logs: dict[int, set[int]] = {}
        self.mark: JournalPosition | None = None
        self._path = self.directory / _INDEX_FILE
        self._fd = -1
        self._size = 0
        #: An append failed and could not be cut back yet.
        self._cut_pending = False
        self.compactions = 0
        #: Highest entry log id the index ever referred to (ids are never reused).
        self.max_log_id = 0

    # ---------------------------------------------------------------- lookups (event loop)

    def lookup(self, ledger_id: int, entry_id: int) -> tuple[int, int, int, int] | None:
        locs = self.ledgers.get(ledger_id)
        return None if locs is None else locs.lookup(entry_id)

    # ---------------------------------------------------------------- load

    def exists(self) -> bool:
        """Whether ``index.dat`` is on disk (before :meth:`load` creates it)."""
        return self._path.exists()

    def load(self) -> None:
        """Read ``index.dat`` (blocking), dropping a torn tail, and open it for appending.

        Raises :class:`IndexCorruptError` (and changes nothing on disk) if a damaged chunk is
        followed by anything but zeros.
        """
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = self._path.with_suffix(".tmp")
        tmp.unlink(missing_ok=True)
        existed = self._path.exists()
        data = self._path.read_bytes() if existed else b""
        pos, chunks = 0, 0
        while pos + _CHUNK_HDR.size <= len(data):
            magic, length, crc = _CHUNK_HDR.unpack_from(data, pos)
            body_end = pos + _CHUNK_HDR.size + length
            if magic != _CHUNK_MAGIC or body_end > len(data):
                break
            body = memoryview(data)[pos + _CHUNK_HDR.size : body_end]
            if crc32c(body) != crc:
                break
            self._apply(_decode(body))
            chunks += 1
            pos = body_end
        if pos != len(data):
            if not _is_torn_tail(data, pos):
                raise IndexCorruptError(
                    f"{self._path} is corrupt at offset {pos} (chunk {chunks + 1} of a longer file); "
                    "refusing to start: restore the file or rebuild the bookie from its replicas"
                )
            log.warning("index log: ignoring %d bytes of torn tail", len(data) - pos)
        self._fd = os.open(self._path, os.O_WRONLY | os.O_CREAT, 0o644)
        os.ftruncate(self._fd, pos)
        os.lseek(self._fd, pos, os.SEEK_SET)
        self._size = pos
        if not existed:
            _fsync_dir(self.directory)  # the new file's name must survive a power cut
        log.debug("index: %d chunks, %d ledgers, mark %s", chunks, len(self.states), self.mark)

    def _apply(self, cp: Checkpoint) -> None:
        self.apply_deletes(cp.deleted)
        self.states.update(cp.states)
        for b in cp.blocks:
            self.add_block(b)
        for log_id, ledger_id in cp.members:
            self.add_member(log_id, ledger_id)
        for log_id in cp.dropped_logs:
            self.drop_log(log_id)
        self.mark = cp.mark

    # ---------------------------------------------------------------- updates (checkpoint thread)

    def apply_deletes(self, deleted: list[int]) -> None:
        for lid in deleted:
            self.ledgers.pop(lid, None)
            self.states.pop(lid, None)
            for log_id in self.ledger_logs.pop(lid, ()):
                members = self.log_ledgers.get(log_id)
                if members is not None:
                    members.discard(lid)

    def add_block(self, b: Block) -> None:
        locs = self.ledgers.get(b.ledger_id)
        if locs is None:
            locs = self.ledgers[b.ledger_id] = LedgerLocations()
        locs.merge(b)

    def add_member(self, log_id: int, ledger_id: int) -> None:
        if log_id > self.max_log_id:
            self.max_log_id = log_id
        self.log_ledgers.setdefault(log_id, set()).add(ledger_id)
        self.ledger_logs.setdefault(ledger_id, set()).add(log_id)

    def drop_log(self, log_id: int) -> None:
        """The log's live entries were copied elsewhere: it holds no ledger any more."""
        for lid in self.log_ledgers.get(log_id, ()):
            logs = self.ledger_logs.get(lid)
            if logs is not None:
                logs.discard(log_id)
        if log_id in self.log_ledgers:
            self.log_ledgers[log_id] = set()

    def live_bytes_by_log(self) -> dict[int, int]:
        """Bytes of live records (entry header included) per entry log (blocking: one pass over the index)."""
        live: dict[int, int] = {}
        for locations in list(self.ledgers.values()):
            _, locs, lens, _ = locations.view
            for loc, n in zip(locs, lens, strict=True):
                if loc >= 0:
                    log_id = loc >> 32
                    live[log_id] = live.get(log_id, 0) + n + _ENTRY_HEADER_SIZE
        return live

    def entries_in_log(self, log_id: int) -> dict[int, list[tuple[int, int, int, int, int]]]:
        """``ledger -> [(entry, log, offset, length, crc)]`` of the live entries stored in ``log_id``."""
        out: dict[int, list[tuple[int, int, int, int, int]]] = {}
        for lid in sorted(self.log_ledgers.get(log_id, ())):
            locations = self.ledgers.get(lid)
            if locations is None:
                continue
            base, locs, lens, crcs = locations.view
            items = [
                (base + i, log_id, loc & 0xFFFFFFFF, lens[i], crcs[i])
                for i, loc in enumerate(locs)
                if loc >= 0 and loc >> 32 == log_id
            ]
            if items:
                out[lid] = items
        return out

    def unreferenced_logs(self, exclude: int) -> list[int]:
        """Entry logs that hold no live ledger any more (candidates for deletion)."""
        return [lid for lid, members in self.log_ledgers.items() if not members and lid != exclude]

    def forget_log(self, log_id: int) -> None:
        self.log_ledgers.pop(log_id, None)

    def persist(self, cp: Checkpoint) -> None:
        """Append one checkpoint chunk and fsync (blocking).

        A failed write or fsync is cut back to the previous chunk boundary, so a half chunk never
        sits in front of later ones (which loading would then take for corruption).
        """
        if self._cut_pending:
            self._cut_back()
        pieces, size = _encode(cp)
        try:
            _write_pieces(self._fd, pieces)
            os.fsync(self._fd)
        except BaseException:
            self._cut_pending = True
            try:
                self._cut_back()
            except OSError as e:
                log.error("cannot cut back a failed index write (retried before the next one): %r", e)
            raise
        self._size += size
        self.mark = cp.mark
        self.states.update(cp.states)

    def _cut_back(self) -> None:
        os.ftruncate(self._fd, self._size)
        os.lseek(self._fd, self._size, os.SEEK_SET)
        os.fsync(self._fd)
        self._cut_pending = False

    def maybe_compact(self) -> bool:
        """Rewrite the index log as one chunk when it has grown well past its live size (blocking)."""
        live = 64 + sum(16 * len(x.locs) + 16 for x in self.ledgers.values()) + 64 * len(self.states)
        if self._size < self.compact_bytes or self._size < 2 * live or self.mark is None:
            return False
        members = [(lg, ld) for lg, lds in self.log_ledgers.items() for ld in lds]
        cp = Checkpoint(self.mark, [], dict(self.states), [x.as_block(lid) for lid, x in self.ledgers.items()], members)
        pieces, size = _encode(cp)
        tmp = self._path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _write_pieces(fd, pieces)
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            raise
        os.rename(tmp, self._path)
        _fsync_dir(self.directory)
        os.close(self._fd)
        self._fd = fd
        log.debug("index log compacted from %d to %d bytes", self._size, size)
        self._size = size
        self.compactions += 1
        return True

    def close(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1


def _is_torn_tail(data: bytes, pos: int) -> bool:
    """Whether the bytes from ``pos`` on are what a crash while appending one chunk leaves.

    That is an incomplete header, a chunk whose body runs past the end of the file, or a damaged
    chunk (or zeros) with nothing but zeros after it. Anything else is corruption.
    """
    rest = memoryview(data)[pos:]
    if len(rest) < _CHUNK_HDR.size:
        return True
    magic, length, _ = _CHUNK_HDR.unpack_from(rest)
    end = _CHUNK_HDR.size + length if magic == _CHUNK_MAGIC else 0
    if end >= len(rest):
        return True
    return not any(rest[end:])


def _fsync_dir(directory: Path) -> None:
    dfd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def _encode(cp: Checkpoint) -> tuple[list[bytes], int]:
    """A checkpoint as chunk pieces (header first) and their total length."""
    parts: list[bytes] = [_MARK.pack(cp.mark.seq, cp.mark.offset), _COUNT.pack(len(cp.deleted))]
    parts.extend(_LID.pack(lid) for lid in cp.deleted)
    parts.append(_COUNT.pack(len(cp.states)))
    for lid, st in cp.states.items():
        parts.append(_STATE.pack(lid, st.fenced, st.lac, st.last_entry, len(st.master_key)))
        parts.append(st.master_key)
    parts.append(_COUNT.pack(len(cp.blocks)))
    for b in cp.blocks:
        parts.append(_BLOCK.pack(b.ledger_id, b.first, len(b.locs)))
        parts.append(b.locs.tobytes())
        parts.append(b.lens.tobytes())
        parts.append(b.crcs.tobytes())
    parts.append(_COUNT.pack(len(cp.members)))
    parts.extend(_MEMBER.pack(log_id, lid) for log_id, lid in cp.members)
    if cp.dropped_logs:
        parts.append(_COUNT.pack(len(cp.dropped_logs)))
        parts.extend(_COUNT.pack(log_id) for log_id in cp.dropped_logs)
    # Joined and checksummed a piece at a time: one join of a large checkpoint's body (megabytes)
    # held the GIL for milliseconds, and the event loop waits for every such C-level call.
    pieces: list[bytes] = []
    group: list[bytes] = []
    grouped = length = crc = 0
    for part in parts:
        group.append(part)
        grouped += len(part)
        if grouped >= _PIECE_BYTES:
            pieces.append(piece := b"".join(group))
            crc = crc32c(piece, crc)
            length += grouped
            group, grouped = [], 0
    if group:
        pieces.append(piece := b"".join(group))
        crc = crc32c(piece, crc)
        length += grouped
    pieces.insert(0, _CHUNK_HDR.pack(_CHUNK_MAGIC, length, crc))
    return pieces, _CHUNK_HDR.size + length


def _write_pieces(fd: int, pieces: list[bytes]) -> None:
    """Write ``pieces`` in order through the ``_write`` seam (blocking; GIL released per write)."""
    for piece in pieces:
        mv = memoryview(piece)
        while mv:
            mv = mv[_write(fd, mv) :]


def _decode(body: memoryview) -> Checkpoint:
    pos = 0

    def take(s: struct.Struct) -> tuple:
        nonlocal pos
        v = s.unpack_from(body, pos)
        pos += s.size
        return v

    seq, off = take(_MARK)
    (n,) = take(_COUNT)
    deleted = [take(_LID)[0] for _ in range(n)]
    (n,) = take(_COUNT)
    states: dict[int, LedgerState] = {}
    for _ in range(n):
        lid, fenced, lac, last, klen = take(_STATE)
        states[lid] = LedgerState(bytes(body[pos : pos + klen]), bool(fenced), lac, last)
        pos += klen
    (n,) = take(_COUNT)
    blocks = []
    for _ in range(n):
        lid, first, count = take(_BLOCK)
        arrs = []
        for code, size in (("q", 8), ("I", 4), ("I", 4)):
            a = array(code)
            a.frombytes(body[pos : pos + size * count])
            pos += size * count
            arrs.append(a)
        blocks.append(Block(lid, first, *arrs))
    (n,) = take(_COUNT)
    members = [take(_MEMBER) for _ in range(n)]
    dropped: list[int] = []
    if pos < len(body):  # written by compaction only
        (n,) = take(_COUNT)
        dropped = [take(_COUNT)[0] for _ in range(n)]
    return Checkpoint(JournalPosition(seq, off), deleted, states, blocks, members, dropped)
