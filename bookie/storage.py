"""Ledger storage: entry logs + index, flushed from the write cache at checkpoints.

Everything here is blocking and runs on the bookie's single checkpoint thread (``load``,
``flush``) or its read threads (``read_many``); the bookie keeps the event loop free.
"""

from __future__ import annotations

import contextlib
import logging
import time
from array import array
from collections.abc import Callable, Iterator
from itertools import islice
from operator import add, lt
from pathlib import Path

from .api import BookieError
from .entry_log import EntryLogReader, EntryLogWriter, entry_log_has_data, entry_log_ids, entry_log_path
from .index import Block, Checkpoint, LedgerIndex, LedgerState
from .journal_format import JournalPosition

log = logging.getLogger(__name__)

#: Memory a write-cache entry takes besides its bytes: the two bytes objects' headers, the entry id and
#: its slots in :class:`CachedEntries`' two dicts (measured with tracemalloc on CPython 3.11,
#: ``tests/bookie/test_write_cache_memory.py``). The cache counts it so that its limit bounds memory as
#: BookKeeper's does (there entries are copied into the cache's buffers): counting bytes only, 100-byte
#: messages held ~2.3x the limit.
CACHED_ENTRY_OVERHEAD = 160

#: Entries at least this big keep, in the write cache, the CRC their journal record was made with: the
#: checkpoint stores it in the entry log instead of reading the entry once more (by then out of the CPU
#: caches) to compute the same value. Below it the CRC costs less than keeping it.
KEEP_CRC_FROM = 4096

#: Entries a checkpoint flushes per pass: the per-entry work of a pass runs in C without releasing
#: the GIL, so this bounds how long the event loop can wait for it (~0.3 ms per 2,048 entries).
GIL_SLICE = 2048


class CachedEntries:
    """One ledger's entries in a bookie's write cache, by entry id: each stored entry is ``head + data``.

    An add keeps its digest header and its data apart (``data`` is the one copy of the entry, shared
    with the broker's cache); entries replayed from the journal or added over the network have an empty
    head. The two parts live in two dicts of bytes, not in a ``(head, data)`` tuple per entry: the cyclic
    GC tracks a tuple until a collection walks it once, and at 20,000 adds/s such tuples filled the young
    generation every ~2.5 s (12-21 ms collections); dicts of ints and bytes are never tracked.
    A third dict holds the ``crc32c(head + data)`` of entries of at least :data:`KEEP_CRC_FROM` bytes.
    """

    __slots__ = ("crcs", "datas", "heads")

    def __init__(self) -> None:
        self.heads: dict[int, bytes] = {}
        self.datas: dict[int, bytes] = {}
        self.crcs: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self.datas)

    def __iter__(self) -> Iterator[int]:
        """Entry ids, in insertion order."""
        return iter(self.datas)

    def __contains__(self, entry_id: object) -> bool:
        return entry_id in self.datas

    def sorted_ids(self) -> list[int]:
        """Entry ids in ascending order, gathered :data:`GIL_SLICE` at a time.

        Adds arrive almost always in ascending order, so the ids are taken in insertion order and
        only checked; a whole-list sort (one C call holding the GIL for milliseconds on a large
        cache) runs only when some add came out of order.
        """
        out: list[int] = []
        ascending = True
        it = iter(self.datas)
        while chunk := list(islice(it, GIL_SLICE)):
            if ascending and ((out and chunk[0] <= out[-1]) or not all(map(lt, chunk, islice(chunk, 1, None)))):
                ascending = False
            out += chunk
        return out if ascending else sorted(out)

    def get(self, entry_id: int) -> tuple[bytes, bytes] | None:
        """``(head, data)`` of an entry, or None."""
        data = self.datas.get(entry_id)
        return None if data is None else (self.heads[entry_id], data)

    def put(self, entry_id: int, head: bytes, data: bytes, crc: int | None = None) -> int:
        """Store an entry (replacing one with the same id), with ``crc32c(head + data)`` if known; returns the
        memory it takes minus what the replaced one took (as :data:`CACHED_ENTRY_OVERHEAD` counts)."""
        datas, heads = self.datas, self.heads
        old = datas.get(entry_id)
        grown = len(head) + len(data)
        if old is None:
            grown += CACHED_ENTRY_OVERHEAD
        else:
            grown -= len(heads[entry_id]) + len(old)
            self.crcs.pop(entry_id, None)
        heads[entry_id] = head
        datas[entry_id] = data
        if crc is not None:
            self.crcs[entry_id] = crc
        return grown

    def crcs_of(self, entry_ids: list[int]) -> list[int | None] | None:
        """The kept CRCs of ``entry_ids`` (None where not kept), or None when no entry here has one."""
        return list(map(self.crcs.get, entry_ids)) if self.crcs else None

    def size(self) -> int:
        """Memory of all its entries, as :meth:`put` counts."""
        return (
            sum(map(len, self.heads.values()))
            + sum(map(len, self.datas.values()))
            + CACHED_ENTRY_OVERHEAD * len(self.datas)
        )


#: The bookie's write cache: ledger -> its entries.
WriteCache = dict[int, CachedEntries]


@contextlib.contextmanager
def _all_or_nothing(writer: EntryLogWriter) -> Iterator[None]:
    """Write a batch to the entry log and sync it, or on any failure drop all of it (the writer
    starts a new log): nothing of a failed batch may be indexed."""
    if writer.failed:
        writer.abandon()  # an earlier failure could not start a new log yet
    try:
        yield
        writer.sync()
    except BaseException:
        try:
            writer.abandon()
        except OSError as e:
            log.error("entry log writer cannot start a new log yet: %r", e)
        raise


#: A gap of more than this many entry ids between two entries of a ledger starts a new index run.
_MAX_RUN_GAP = 16


class LedgerStorage:
    """Entry logs, the index over them, and garbage collection of deleted ledgers."""

    def __init__(
        self, directory: Path, *, entry_log_size: int, index_compact_bytes: int, direct_io: bool = True
    ) -> None:
        self.directory = Path(directory)
        self.index = LedgerIndex(self.directory, index_compact_bytes)
        self.writer = EntryLogWriter(self.directory, entry_log_size, direct_io=direct_io)
        self.reader = EntryLogReader(self.directory)

    def load(self) -> tuple[dict[int, LedgerState], JournalPosition | None]:
        """Load the index, drop entry logs nothing refers to, open a fresh entry log.

        Returns the ledger states and the journal mark of the last checkpoint. Entry logs are
        deleted only on the word of an index that loaded cleanly: a corrupt index, or a missing one
        next to entry logs holding data, stops the start instead.
        """
        if not self.index.exists():
            data_logs = [i for i in entry_log_ids(self.directory) if entry_log_has_data(self.directory, i)]
            if data_logs:
                raise BookieError(
                    f"{self.directory}: the index file is missing but {len(data_logs)} entry logs hold data; "
                    "refusing to start (restore the index or move the entry logs away)"
                )
        self.index.load()
        for log_id in entry_log_ids(self.directory):
            if not self.index.log_ledgers.get(log_id):
                # Written by a checkpoint that never completed, or left over by GC: its entries
                # (if any) are still in the journal and will be flushed again.
                entry_log_path(self.directory, log_id).unlink(missing_ok=True)
                self.index.forget_log(log_id)
        self.writer.open(self.index.max_log_id + 1)
        return {lid: st.copy() for lid, st in self.index.states.items()}, self.index.mark

    def flush(
        self,
        snapshot: WriteCache,
        states: dict[int, LedgerState],
        deleted: list[int],
        mark: JournalPosition,
        *,
        duty: float = 1.0,
        urgent: Callable[[], bool] | None = None,
    ) -> list[int]:
        """Write ``snapshot`` to the entry log, persist the index chunk; returns removed log ids.

        With ``duty`` below 1, the flush pauses after each slice for as long as that slice's CPU time
        times ``(1 - duty) / duty``, except while ``urgent()`` says something waits for it. A
        CPU-bound thread takes the GIL back whenever the event loop lets go of it (every system
        call), so without pauses the loop ran at a fraction of its speed for the whole flush.

        If writing or syncing the entry log fails, nothing of this flush is indexed: the writer
        drops what it wrote since its last sync and the next flush starts a new log (the caller
        keeps the data in its write cache and the journal).
        """
        rest = (1.0 - duty) / duty if 0.0 < duty < 1.0 else 0.0
        worked = time.thread_time()
        writer = self.writer
        self.index.apply_deletes(deleted)
        blocks: list[Block] = []
        members: list[tuple[int, int]] = []
        with _all_or_nothing(writer):
            for lid in sorted(snapshot):
                entries = snapshot[lid]
                if not entries:
                    continue
                all_eids = entries.sorted_ids()
                # In slices: each C-level pass below holds the GIL for its whole length, and the event
                # loop waits for it meanwhile (a 100,000-entry pass took 10-25 ms).
                for k in range(0, len(all_eids), GIL_SLICE):
                    eids = all_eids[k : k + GIL_SLICE]
                    heads = list(map(entries.heads.__getitem__, eids))
                    datas = list(map(entries.datas.__getitem__, eids))
                    locs, crcs, logs = writer.add_many(lid, eids, datas, heads, entries.crcs_of(eids))
                    members.extend((log_id, lid) for log_id in logs)
                    lens = array("I", map(add, map(len, heads), map(len, datas)))
                    first = eids[0]
                    if eids[-1] - first + 1 == len(eids):
                        # Contiguous (every entry of the ledger is here): no per-entry Python work.
                        blocks.append(Block(lid, first, locs, lens, array("I", crcs)))
                    else:
                        blocks.extend(_runs(lid, eids, locs, lens, crcs))
                    if rest and not (urgent is not None and urgent()):
                        time.sleep((time.thread_time() - worked) * rest)
                        worked = time.thread_time()
        index = self.index
        for b in blocks:
            index.add_block(b)
        for log_id, lid in members:
            index.add_member(log_id, lid)
        index.persist(Checkpoint(mark, deleted, states, blocks, members))
        removed = self._collect_garbage()
        index.maybe_compact()
        return removed

    def _collect_garbage(self) -> list[int]:
        """Delete entry logs holding no live ledger (deleted ledgers, or emptied by :meth:`compact`)."""
        removed = self.index.unreferenced_logs(exclude=self.writer.log_id)
        for log_id in removed:
            self.reader.retire(log_id)
            entry_log_path(self.directory, log_id).unlink(missing_ok=True)
            self.index.forget_log(log_id)
        if removed:
            log.debug("garbage collected entry logs %s", removed)
        return removed

    def compact(self, threshold: float) -> list[int]:
        """Copy the live entries of logs whose live ratio is below ``threshold`` to the current
        log, persist the new locations, then delete the old logs (blocking). Returns their ids.

        The index chunk is durable before anything changes in memory or on disk, so a crash or an
        error at any step leaves the old locations valid (the copies are then dead bytes).
        """
        index, writer = self.index, self.writer
        if index.mark is None:
            return []
        live = index.live_bytes_by_log()
        candidates = []
        for log_id, members in sorted(index.log_ledgers.items()):
            if log_id == writer.log_id or not members:
                continue
            try:
                size = entry_log_path(self.directory, log_id).stat().st_size
            except FileNotFoundError:
                continue
            if size > 0 and live.get(log_id, 0) / size < threshold:
                candidates.append(log_id)
        if not candidates:
            return []
        blocks: list[Block] = []
        members_out: list[tuple[int, int]] = []
        copied = 0
        with _all_or_nothing(writer):
            for log_id in candidates:
                for lid, items in index.entries_in_log(log_id).items():
                    datas = self.reader.read_many([(lg, off, n, crc) for _, lg, off, n, crc in items])
                    eids = [it[0] for it in items]
                    locs, crcs, logs = writer.add_many(lid, eids, datas)
                    members_out.extend((lg, lid) for lg in logs)
                    blocks.extend(_runs(lid, eids, locs, array("I", map(len, datas)), crcs))
                    copied += len(eids)
        index.persist(Checkpoint(index.mark, [], {}, blocks, members_out, candidates))
        for b in blocks:
            index.add_block(b)
        for log_id, lid in members_out:
            index.add_member(log_id, lid)
        for log_id in candidates:
            index.drop_log(log_id)
        removed = self._collect_garbage()
        log.info("compacted entry logs %s: %d live entries copied, %d logs removed", candidates, copied, len(removed))
        return removed

    def read_many(self, items: list[tuple[int, int, int, int]]) -> list[bytes]:
        """Read located entries (blocking)."""
        return self.reader.read_many(items)

    def close(self) -> None:
        self.writer.close()
        self.reader.close()
        self.index.close()


def _runs(lid: int, eids: list[int], locs: array, lens: array, crcs: list[int]) -> list[Block]:
    """Blocks for non-contiguous entry ids (striped ensembles): holes inside, a new block per big gap."""
    blocks: list[Block] = []
    start = 0
    n = len(eids)
    while start < n:
        end = start + 1
        while end < n and eids[end] - eids[end - 1] <= _MAX_RUN_GAP:
            end += 1
        first = eids[start]
        span = eids[end - 1] - first + 1
        b_locs = array("q", [-1]) * span
        b_lens = array("I", [0]) * span
        b_crcs = array("I", [0]) * span
        for k in range(start, end):
            i = eids[k] - first
            b_locs[i] = locs[k]
            b_lens[i] = lens[k]
            b_crcs[i] = crcs[k]
        blocks.append(Block(lid, first, b_locs, b_lens, b_crcs))
        start = end
    return blocks
