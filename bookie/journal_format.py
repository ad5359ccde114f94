"""The journal's on-disk format: files, records, their CRCs, and replay.

File layout: ``<seq:016x>.journal`` of ``file_size`` bytes, all of them allocated before the first
record is written (overwriting allocated blocks makes fdatasync cheaper than appending or fallocate):
a 16-byte header (magic, format version, seq), then records::

    crc32c u32 | length u32 | type u8 | ledger_id i64 | entry_id i64 | lac i64 | data[length]

The CRC covers everything after itself, seeded with the CRC of the file's header. A record whose type
has bit 7 set (format version 3) has a CRC of its header fields followed by ``crc32c(data)`` instead of
the data itself: the bookie computes that value once for a big entry and the checkpoint stores it in the
entry log too, so the entry's bytes are not read once more for a checksum. A ``REC_ADD_RUN`` record
(format version 4) holds the adds of consecutive entries of one ledger, from ``entry_id`` on::

    count u32 | size u32 [count] | entry bytes [count]

one record, one CRC, for a socket read's worth of small non-batched messages (a record and two CRC calls
per entry cost ~0.3 µs each on the event loop). Replay yields each entry as a ``REC_ADD``. Replay stops at the first
record that is zero, truncated or fails its CRC: that is the torn tail of a write that was never
acknowledged.

A reused file still holds the old records after the new ones, so since format version 2 each record's
CRC is seeded with the CRC of its file's header: an old record fails it, and replay stops at the new
records' end as it stops at zeros. Version 1 files (CRC seed 0) and version 2 files (no record has bit 7
of its type set) still replay.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Iterator, Sequence
from operator import add
from pathlib import Path
from typing import NamedTuple

from crc32c import crc32c

log = logging.getLogger(__name__)

#: Record types.
REC_ADD = 1
REC_KEY = 2  # data = master key; written when a ledger is first seen
REC_FENCE = 3
REC_DELETE = 4
REC_ADD_RUN = 5  # format version 4: consecutive adds of one ledger (see the module's docstring)
VALID_TYPES = frozenset((REC_ADD, REC_KEY, REC_FENCE, REC_DELETE, REC_ADD_RUN))
#: Type flag: the record's CRC covers ``crc32c(data)`` in place of the data (format version 3).
DATA_CRC = 0x80

FILE_MAGIC = b"MGJ1"
FILE_HDR = struct.Struct("<4sIQ")  # magic, format version, sequence number
CRC = struct.Struct("<I")
REC_TAIL = struct.Struct("<IBqqq")  # length, type, ledger, entry, lac (the part after the crc)
REC_HEADER_SIZE = CRC.size + REC_TAIL.size
RUN_COUNT = struct.Struct("<I")
SUFFIX = ".journal"
#: An obsolete journal file kept to be reused as a future one (never replayed).
FREE_SUFFIX = ".free"
#: Format version written; version 1 records have CRC seed 0, ``DATA_CRC`` needs version 3 and
#: ``REC_ADD_RUN`` version 4.
VERSION = 4


class JournalPosition(NamedTuple):
    """A point in the journal: file sequence number and byte offset inside it."""

    seq: int
    offset: int


class JournalRecord(NamedTuple):
    """One record found by :func:`replay_file`."""

    type: int
    ledger_id: int
    entry_id: int
    lac: int
    data: bytes


def file_header(seq: int, version: int = VERSION) -> bytes:
    return FILE_HDR.pack(FILE_MAGIC, version, seq)


def run_record(
    ledger_id: int, entry_ids: Sequence[int], lac: int, heads: Sequence[bytes], datas: Sequence[bytes]
) -> bytearray | None:
    """A ``REC_ADD_RUN`` record of the adds ``heads[i] + datas[i]`` without its CRC (from the length field on), or
    None when ``entry_ids`` are not consecutive."""
    n = len(entry_ids)
    first = entry_ids[0]
    if list(entry_ids) != list(range(first, first + n)):
        return None
    sizes = list(map(add, map(len, heads), map(len, datas)))
    head = struct.pack(f"<I{n}I", n, *sizes)
    record = bytearray(REC_TAIL.pack(len(head) + sum(sizes), REC_ADD_RUN, ledger_id, first, lac))
    record += head
    for h, d in zip(heads, datas, strict=True):
        record += h
        record += d
    return record


def _run_entries(body: memoryview) -> list[bytes] | None:
    """The entries of a ``REC_ADD_RUN`` record's data, or None if its sizes do not add up."""
    if len(body) < RUN_COUNT.size:
        return None
    (n,) = RUN_COUNT.unpack_from(body, 0)
    pos = RUN_COUNT.size + 4 * n
    if pos > len(body):
        return None
    entries = []
    for size in struct.unpack_from(f"<{n}I", body, RUN_COUNT.size):
        entries.append(bytes(body[pos : pos + size]))
        pos += size
    return entries if pos == len(body) else None


def crc_seed(seq: int, version: int = VERSION) -> int:
    """The CRC every record of file ``seq`` starts from: stale records of a reused file fail it."""
    return 0 if version == 1 else crc32c(file_header(seq, version))


def journal_files(directory: Path) -> list[tuple[int, Path]]:
    """``(seq, path)`` of the journal files in ``directory``, oldest first."""
    files = []
    for p in directory.iterdir():
        if p.suffix == SUFFIX:
            try:
                files.append((int(p.stem, 16), p))
            except ValueError:
                log.warning("ignoring stray file %s in journal directory", p)
    files.sort()
    return files


def replay_file(path: Path, seq: int, start: JournalPosition | None) -> Iterator[JournalRecord]:
    """Yield the intact records of journal file ``seq`` (from ``start``'s offset when it is in this file), up to
    the first zero, truncated or failing one (blocking)."""
    data = path.read_bytes()
    if len(data) < FILE_HDR.size:
        return
    magic, version, hdr_seq = FILE_HDR.unpack_from(data, 0)
    if magic != FILE_MAGIC or hdr_seq != seq or version not in (1, 2, 3, VERSION):
        log.warning("journal file %s has a bad header; skipped", path)
        return
    seed = crc_seed(seq, version)
    pos = max(start.offset, FILE_HDR.size) if start is not None and seq == start.seq else FILE_HDR.size
    mv = memoryview(data)
    end = len(data)
    count = 0
    while pos + REC_HEADER_SIZE <= end:
        (crc,) = CRC.unpack_from(data, pos)
        length, rtype, ledger_id, entry_id, lac = REC_TAIL.unpack_from(data, pos + 4)
        stop = pos + REC_HEADER_SIZE + length
        data_crc = rtype & DATA_CRC and version >= 3
        if data_crc:
            rtype &= ~DATA_CRC
        if rtype not in VALID_TYPES or stop > end or (rtype == REC_ADD_RUN and version < 4):
            break
        if data_crc:
            body = crc32c(mv[pos + REC_HEADER_SIZE : stop])
            valid = crc32c(CRC.pack(body), crc32c(mv[pos + 4 : pos + REC_HEADER_SIZE], seed)) == crc
        else:
            valid = crc32c(mv[pos + 4 : stop], seed) == crc
        if not valid:
            log.info("journal %s: torn or corrupt record at offset %d ignored", path.name, pos)
            break
        if rtype == REC_ADD_RUN:
            entries = _run_entries(mv[pos + REC_HEADER_SIZE : stop])
            if entries is None:  # its CRC is right: written so by a bug, not torn
                log.error("journal %s: run record at offset %d has inconsistent sizes; replay stops", path.name, pos)
                break
            for i, entry in enumerate(entries):
                yield JournalRecord(REC_ADD, ledger_id, entry_id + i, lac, entry)
        else:
            yield JournalRecord(rtype, ledger_id, entry_id, lac, bytes(mv[pos + REC_HEADER_SIZE : stop]))
        count += 1
        pos = stop
    log.debug("journal %s: replayed %d records", path.name, count)
