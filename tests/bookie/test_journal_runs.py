"""Run records (journal format 4): the adds of consecutive small entries of one ledger, queued in one call
(a socket read's worth of non-batched sends), are one record with one CRC; replay gives each entry back."""

from __future__ import annotations

import asyncio
import struct
from functools import partial
from pathlib import Path

import pytest
from crc32c import crc32c
from test_journal import replayed, start_journal

from magnetar.bookie.api import settle
from magnetar.bookie.journal import Journal
from magnetar.bookie.journal_format import (
    CRC,
    FILE_HDR,
    REC_ADD,
    REC_ADD_RUN,
    REC_TAIL,
    crc_seed,
    file_header,
    journal_files,
    run_record,
)


async def append_many(
    j: Journal, ledger_id: int, ids: list[int], datas: list[bytes], crcs: list[int | None] | None = None
) -> None:
    fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    heads = [struct.pack("<q", e) for e in ids]  # as the bookie's digest headers: a small head per entry
    j.append_many(REC_ADD, ledger_id, ids, ids[0] - 1, heads, datas, partial(settle, fut), crcs)
    await asyncio.wait_for(fut, 10)


def record_types(directory: Path) -> list[list[int]]:
    """The type of every record in each journal file that has any, read off the raw bytes (no CRC check)."""
    out = []
    for _, path in journal_files(directory):
        raw, pos, types = path.read_bytes(), FILE_HDR.size, []
        while pos + CRC.size + REC_TAIL.size <= len(raw):
            length, rtype, *_ = REC_TAIL.unpack_from(raw, pos + CRC.size)
            if rtype == 0:
                break
            types.append(rtype)
            pos += CRC.size + REC_TAIL.size + length
        if types:  # (the next file is prepared before it is needed)
            out.append(types)
    return out


def data(eid: int) -> bytes:
    return bytes([eid % 251]) * (20 + eid % 90 if eid < 1000 else 150)


def expected(ledger_id: int, ids: list[int]) -> list[tuple[int, int, int, int, bytes]]:
    return [(REC_ADD, ledger_id, e, ids[0] - 1, struct.pack("<q", e) + data(e)) for e in ids]


async def test_consecutive_small_adds_are_one_record(tmp_path: Path) -> None:
    j = await start_journal(tmp_path, file_size=1 << 20, group_max_bytes=1 << 20)
    ids = list(range(10, 60))
    await append_many(j, 4, ids, [data(e) for e in ids])
    await append_many(j, 4, [60], [data(60)])  # a lone add keeps the one-entry record
    await j.close()
    assert record_types(tmp_path) == [[REC_ADD_RUN, REC_ADD]]
    assert replayed(tmp_path) == [*expected(4, ids), (REC_ADD, 4, 60, 59, struct.pack("<q", 60) + data(60))]


@pytest.mark.parametrize("case", ["gap", "out_of_order", "big_entry", "big_entry_with_crc"])
async def test_adds_that_cannot_share_a_record_get_one_each(tmp_path: Path, case: str) -> None:
    j = await start_journal(tmp_path, file_size=1 << 20, group_max_bytes=1 << 20)
    ids = {"gap": [1, 2, 4], "out_of_order": [1, 3, 2]}.get(case, [1, 2, 3])
    datas = [data(e) for e in ids]
    crcs: list[int | None] | None = None
    if case.startswith("big_entry"):
        datas[1] = b"B" * 8192
        if case == "big_entry_with_crc":
            crcs = [None, crc32c(datas[1], crc32c(struct.pack("<q", 2))), None]
    await append_many(j, 5, ids, datas, crcs)
    await j.close()
    assert record_types(tmp_path) == [
        [REC_ADD] * 3 if case != "big_entry_with_crc" else [REC_ADD, REC_ADD | 0x80, REC_ADD]
    ]
    assert [(r[2], r[4]) for r in replayed(tmp_path)] == [
        (e, struct.pack("<q", e) + d) for e, d in zip(ids, datas, strict=True)
    ]


@pytest.mark.parametrize("damage", ["flip_data", "flip_size", "torn"])
async def test_a_damaged_run_record_gives_back_none_of_its_entries(tmp_path: Path, damage: str) -> None:
    j = await start_journal(tmp_path, file_size=1 << 20, group_max_bytes=1 << 20)
    await append_many(j, 6, [0], [data(0)])
    ids = list(range(1, 21))
    await append_many(j, 6, ids, [data(e) for e in ids])
    await j.close()
    path = journal_files(tmp_path)[0][1]
    raw = bytearray(path.read_bytes())
    run_at = FILE_HDR.size + CRC.size + REC_TAIL.size + 8 + len(data(0))
    length = REC_TAIL.unpack_from(raw, run_at + CRC.size)[0]
    body = run_at + CRC.size + REC_TAIL.size
    if damage == "flip_data":
        raw[body + length - 5] ^= 0x01
    elif damage == "flip_size":  # the sizes no longer add up (and the CRC fails)
        raw[body + 4] ^= 0x01
    else:  # the record's second half never reached the disk
        raw[body + length // 2 : body + length] = bytes(length - length // 2)
    path.write_bytes(bytes(raw))
    assert [r[2] for r in replayed(tmp_path)] == [0]


async def test_a_run_too_big_for_the_rest_of_the_file_goes_whole_into_the_next(tmp_path: Path) -> None:
    j = await start_journal(tmp_path, file_size=8192, group_max_bytes=1 << 20)
    first, second = list(range(1000, 1030)), list(range(1030, 1060))  # ~4.9 KB each: the second does not fit
    await append_many(j, 7, first, [data(e) for e in first])
    await append_many(j, 7, second, [data(e) for e in second])
    await j.close()
    assert record_types(tmp_path) == [[REC_ADD_RUN], [REC_ADD_RUN]]
    assert replayed(tmp_path) == expected(7, first) + expected(7, second)


async def test_a_run_bigger_than_a_file_is_written_one_record_per_entry(tmp_path: Path) -> None:
    j = await start_journal(tmp_path, file_size=8192, group_max_bytes=1 << 20)
    ids = list(range(1000, 1060))  # ~9.7 KB of entries: more than a file holds
    await append_many(j, 8, ids, [data(e) for e in ids])
    await j.close()
    assert {t for types in record_types(tmp_path) for t in types} == {REC_ADD}
    assert replayed(tmp_path) == expected(8, ids)


def test_a_run_record_in_a_version_3_file_ends_replay(tmp_path: Path) -> None:
    """Run records came with format 4: in an older file the type is not valid, as any unknown type."""
    seq, raw = 3, bytearray(file_header(3, 3))
    seed = crc_seed(seq, 3)
    tail = REC_TAIL.pack(len(data(0)), REC_ADD, 9, 0, -1)
    raw += CRC.pack(crc32c(data(0), crc32c(tail, seed))) + tail + data(0)
    run = run_record(9, [1, 2], 0, [b"", b""], [data(1), data(2)])
    assert run is not None
    raw += CRC.pack(crc32c(run, seed)) + run
    raw += bytes(4096)
    (tmp_path / f"{seq:016x}.journal").write_bytes(bytes(raw))
    assert replayed(tmp_path) == [(REC_ADD, 9, 0, -1, data(0))]


def test_a_run_record_whose_sizes_do_not_add_up_ends_replay(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Written so by a bug (its CRC is right): replay stops there rather than make up entries."""
    seq, raw = 2, bytearray(file_header(2))
    run = run_record(9, [0, 1], -1, [b"", b""], [data(0), data(1)])
    assert run is not None
    struct.pack_into("<I", run, REC_TAIL.size + 4, len(data(0)) + 1)  # the first entry's size, one too big
    raw += CRC.pack(crc32c(run, crc_seed(seq))) + run
    good = run_record(9, [2, 3], 1, [b"", b""], [data(2), data(3)])
    assert good is not None
    raw += CRC.pack(crc32c(good, crc_seed(seq))) + good + bytes(4096)
    (tmp_path / f"{seq:016x}.journal").write_bytes(bytes(raw))
    assert replayed(tmp_path) == []
    assert "inconsistent sizes" in caplog.text
