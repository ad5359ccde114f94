"""An add's stored entry is kept and written as two parts, its digest header and its data: the data is
the entry's one copy (shared with the broker's cache), and the journal, the entry log and reads see
exactly the bytes of the joined entry."""

from __future__ import annotations

import asyncio
from pathlib import Path

from bookie_helpers import KEY
from test_bookie import crash_copy
from test_journal import replayed, start_journal

from magnetar.bookie.bookie import Bookie
from magnetar.bookie.journal_format import REC_ADD
from magnetar.ledger import digest

SIZES = (10, 5000, 128 * 1024)  # inline in the group buffer, and written from their own bytes


def entry(i: int, size: int) -> bytes:
    return bytes((i + k) % 251 for k in range(size))


async def test_journal_of_parts_is_byte_identical_to_joined(tmp_path: Path) -> None:
    joined = await start_journal(tmp_path / "joined", file_size=1 << 20, group_max_bytes=1 << 20)
    parts = await start_journal(tmp_path / "parts", file_size=1 << 20, group_max_bytes=1 << 20)
    for i, size in enumerate(SIZES):
        data = entry(i, size)
        head = digest.frame_header(1, i, size, data)
        await asyncio.wait_for(joined.append(REC_ADD, 1, i, i - 1, head + data), 10)
        await asyncio.wait_for(parts.append(REC_ADD, 1, i, i - 1, data, head), 10)
    await joined.close()
    await parts.close()
    files = sorted(p.name for p in (tmp_path / "joined").iterdir())
    assert files == sorted(p.name for p in (tmp_path / "parts").iterdir())
    for name in files:
        assert (tmp_path / "joined" / name).read_bytes() == (tmp_path / "parts" / name).read_bytes()
    assert [r[4] for r in replayed(tmp_path / "parts")] == [
        digest.frame(1, i, size, entry(i, size)) for i, size in enumerate(SIZES)
    ]


async def add_parts(bookie: Bookie, ledger_id: int, eid: int, head: bytes, data: bytes) -> None:
    fut = asyncio.get_running_loop().create_future()
    bookie.add_parts_async(ledger_id, eid, KEY, eid - 1, head, data, False, fut.set_result)
    assert await asyncio.wait_for(fut, 10) is None


async def test_bookie_keeps_the_added_data_itself_and_stores_the_joined_entry(make_bookie, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    b: Bookie = await make_bookie(entry_log_size=1 << 20)
    datas = [entry(i, size) for i, size in enumerate(SIZES)]
    heads = [digest.frame_header(5, i, len(d), d) for i, d in enumerate(datas)]
    for i, (h, d) in enumerate(zip(heads, datas, strict=True)):
        await add_parts(b, 5, i, h, d)
        assert b._cache[5].datas[i] is d  # not copied (nor joined with its header) on the way in
    stored = [h + d for h, d in zip(heads, datas, strict=True)]
    assert [s for _, s in await b.read_entries(5, 0, 2)] == stored  # from the write cache
    await b.checkpoint()
    assert not b._cache
    assert [s for _, s in await b.read_entries(5, 0, 2)] == stored  # from the entry log
    await b.close()
    again: Bookie = await make_bookie(tmp_path / "bookie", entry_log_size=1 << 20)
    assert [s for _, s in await again.read_entries(5, 0, 2)] == stored


async def test_replayed_parts_read_back_joined(make_bookie, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Adds not yet checkpointed come back from the journal as the joined entry (crash recovery)."""
    b: Bookie = await make_bookie()
    datas = [entry(i, size) for i, size in enumerate(SIZES)]
    for i, d in enumerate(datas):
        await add_parts(b, 6, i, digest.frame_header(6, i, len(d), d), d)
    again: Bookie = await make_bookie(crash_copy(b, tmp_path / "crashed"))  # the files as a kill -9 leaves them
    got = [s for _, s in await again.read_entries(6, 0, 2)]
    assert got == [digest.frame(6, i, len(d), d) for i, d in enumerate(datas)]
