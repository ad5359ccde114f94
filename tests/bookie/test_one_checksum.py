"""A big entry's bytes are checksummed once for its journal record and its entry-log record: the bookie
computes ``crc32c(head + data)`` as it caches the add, the journal record's CRC covers that value (a
version 3 record, type bit 7 set) and the checkpoint stores the same value in the entry log."""

from __future__ import annotations

import asyncio
import os
import struct
from pathlib import Path

import pytest
from crc32c import crc32c
from test_journal import replayed, start_journal
from test_one_copy import add_parts, entry

from magnetar.bookie import entry_log
from magnetar.bookie.bookie import Bookie
from magnetar.bookie.journal_format import REC_ADD
from magnetar.bookie.storage import KEEP_CRC_FROM
from magnetar.ledger import digest

#: (test_one_copy's replay test covers records of big entries coming back from the journal.)
SIZES = (10, KEEP_CRC_FROM - 1, KEEP_CRC_FROM, 128 * 1024)


async def test_the_checkpoint_does_not_checksum_a_big_entry_again(
    make_bookie, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    b: Bookie = await make_bookie(entry_log_size=1 << 20)
    datas = [entry(i, size) for i, size in enumerate(SIZES)]
    heads = [digest.frame_header(3, i, len(d), d) for i, d in enumerate(datas)]
    for i, (h, d) in enumerate(zip(heads, datas, strict=True)):
        await add_parts(b, 3, i, h, d)
    summed: list[int] = []

    def counting(data: bytes, value: int = 0) -> int:
        summed.append(len(data))
        return crc32c(data, value)

    monkeypatch.setattr(entry_log, "crc32c", counting)
    await b.checkpoint()
    assert summed and max(summed) < KEEP_CRC_FROM  # only the small entries (and their heads) were summed
    stored = [h + d for h, d in zip(heads, datas, strict=True)]
    summed.clear()
    assert [s for _, s in await b.read_entries(3, 0, len(SIZES) - 1)] == stored  # read from the entry log...
    assert sorted(summed) == sorted(map(len, stored))  # ...and each checked against the CRC stored with it
    await b.close()
    again: Bookie = await make_bookie(tmp_path / "bookie", entry_log_size=1 << 20)
    assert [s for _, s in await again.read_entries(3, 0, len(SIZES) - 1)] == stored


async def test_a_record_checked_through_its_data_crc_still_detects_damage(tmp_path: Path) -> None:
    j = await start_journal(tmp_path, file_size=1 << 20, group_max_bytes=1 << 20)
    head, data = b"h" * 12, entry(1, 8192)
    good = crc32c(data, crc32c(head))
    await asyncio.wait_for(j.append(REC_ADD, 1, 0, -1, data, head, good), 10)
    await asyncio.wait_for(j.append(REC_ADD, 1, 1, 0, data, head, good), 10)
    await asyncio.wait_for(j.append(REC_ADD, 1, 2, 1, data, head, good ^ 1), 10)  # a CRC that is not the data's
    await j.close()
    assert [(r[2], r[4]) for r in replayed(tmp_path)] == [(0, head + data), (1, head + data)]
    path = tmp_path / min(n for n in os.listdir(tmp_path) if n.endswith(".journal"))  # the first file
    raw = bytearray(path.read_bytes())
    second = raw.index(head + data, raw.index(head + data) + 1)
    raw[second + 5000] ^= 0x40  # a flipped bit in the second record's data
    path.write_bytes(bytes(raw))
    assert [r[2] for r in replayed(tmp_path)] == [0]


def test_format_version_2_files_still_replay(tmp_path: Path) -> None:
    """Version 2: records seeded with the file header's CRC, which covers the data itself."""
    header = struct.pack("<4sIQ", b"MGJ1", 2, 7)
    raw = bytearray(header)
    for eid in range(3):
        data = bytes([eid]) * 5000
        tail = struct.pack("<IBqqq", len(data), REC_ADD, 9, eid, eid - 1)
        raw += struct.pack("<I", crc32c(data, crc32c(tail, crc32c(header)))) + tail + data
    raw += bytes(4096)
    (tmp_path / "0000000000000007.journal").write_bytes(bytes(raw))
    assert replayed(tmp_path) == [(REC_ADD, 9, e, e - 1, bytes([e]) * 5000) for e in range(3)]
