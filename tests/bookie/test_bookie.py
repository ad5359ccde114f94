"""Bookie: adds, reads, fencing, checkpoints, restart recovery and garbage collection."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest
from bookie_helpers import KEY, payload

from magnetar.bookie.api import (
    BookieFencedError,
    BookieNoSuchEntryError,
    BookieReadOnlyError,
    BookieUnauthorizedError,
    BookieUnavailableError,
)
from magnetar.bookie.bookie import Bookie
from magnetar.bookie.local import LocalBookieClient
from tests.waiting import eventually


async def add_many(bookie: Bookie, ledger_id: int, count: int, start: int = 0, **kw: object) -> None:
    futs = [
        bookie.add_entry_nowait(ledger_id, e, KEY, e - 1, payload(ledger_id, e, **kw))  # type: ignore[arg-type]
        for e in range(start, start + count)
    ]
    await asyncio.wait_for(asyncio.gather(*futs), 10)


async def assert_ledger(bookie: Bookie, ledger_id: int, count: int, start: int = 0, **kw: object) -> None:
    got = await bookie.read_entries(ledger_id, start, start + count - 1)
    assert [e for e, _ in got] == list(range(start, start + count))
    for e, data in got:
        assert data == payload(ledger_id, e, **kw), f"entry {ledger_id}:{e} differs"


def crash_copy(bookie: Bookie, dest: Path) -> Path:
    """Copy a running bookie's files: what a crash at this instant would leave on disk.

    The journal's preallocation thread may rename a ``.tmp`` file between the copy's listing and its
    read of that file; then the copy is taken again (bounded), as it would not be a consistent instant."""
    for _attempt in range(5):
        try:
            shutil.copytree(bookie.config.data_dir, dest)
            return dest
        except (shutil.Error, FileNotFoundError):
            shutil.rmtree(dest, ignore_errors=True)
    raise AssertionError(f"no consistent copy of {bookie.config.data_dir} in 5 attempts")


async def test_add_and_read_from_cache_and_disk(make_bookie) -> None:  # type: ignore[no-untyped-def]
    b = await make_bookie()
    await add_many(b, 1, 200)
    await assert_ledger(b, 1, 200)  # write cache
    await b.checkpoint()
    assert not b._cache and b.storage.index.ledgers[1].lookup(0) is not None
    await assert_ledger(b, 1, 200)  # entry logs, via the read threads
    await add_many(b, 1, 50, start=200)
    await assert_ledger(b, 1, 250)  # a range spanning disk and cache
    assert await b.read_last_add_confirmed(1) == (248, 249)
    # Reads stop at the first missing entry; a missing first entry is an error.
    assert [e for e, _ in await b.read_entries(1, 245, 10**9)] == list(range(245, 250))
    with pytest.raises(BookieNoSuchEntryError):
        await b.read_entries(1, 250, 260)
    with pytest.raises(BookieNoSuchEntryError):
        await b.read_entries(99, 0, 0)


async def test_bad_requests_do_not_corrupt(make_bookie) -> None:  # type: ignore[no-untyped-def]
    b = await make_bookie()
    await add_many(b, 5, 3)
    with pytest.raises(BookieUnauthorizedError):
        b.add_entry_nowait(5, 3, b"wrong", 2, b"evil")
    with pytest.raises(BookieUnauthorizedError):
        await b.fence(5, b"wrong")
    assert await b.fence(5, KEY) == (1, 2)
    with pytest.raises(BookieFencedError):
        b.add_entry_nowait(5, 3, KEY, 2, b"late writer")
    # The recovery flag gets through a fence (a recovering client re-replicates entries).
    await b.add_entry(5, 3, KEY, 2, payload(5, 3), recovery=True)
    await assert_ledger(b, 5, 4)
    b.set_read_only(True)
    with pytest.raises(BookieReadOnlyError):
        b.add_entry_nowait(6, 0, KEY, -1, b"x")
    b.set_read_only(False)
    await b.close()
    with pytest.raises(BookieUnavailableError):
        await b.read_entries(5, 0, 0)
    with pytest.raises(BookieUnavailableError):
        b.add_entry_nowait(5, 4, KEY, 3, b"x")


async def test_clean_restart_recovers_everything(make_bookie, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    b = await make_bookie()
    await add_many(b, 1, 300)
    await b.checkpoint()
    await add_many(b, 1, 100, start=300)
    await add_many(b, 2, 40)
    await b.fence(2, KEY)
    await b.close()
    # A clean shutdown checkpoints: nothing left to replay but the (empty) last journal.
    b2 = await make_bookie()
    assert len(b2._cache) == 0
    await assert_ledger(b2, 1, 400)
    await assert_ledger(b2, 2, 40)
    assert b2.ledger_state(2).fenced  # type: ignore[union-attr]
    assert not b2.ledger_state(1).fenced  # type: ignore[union-attr]
    assert await b2.read_last_add_confirmed(1) == (398, 399)
    with pytest.raises(BookieFencedError):
        b2.add_entry_nowait(2, 40, KEY, 39, b"x")
    with pytest.raises(BookieUnauthorizedError):
        b2.add_entry_nowait(1, 400, b"bad", 399, b"x")


async def test_crash_recovers_acknowledged_entries_and_fence(make_bookie, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    b = await make_bookie()
    await add_many(b, 1, 300)
    await b.checkpoint()  # part of the data is in entry logs + index ...
    await add_many(b, 1, 200, start=300)  # ... the rest only in the journal
    await add_many(b, 3, 10)
    await b.fence(3, KEY)
    copy = crash_copy(b, tmp_path / "crashed")
    b2 = await make_bookie(copy)
    await assert_ledger(b2, 1, 500)
    await assert_ledger(b2, 3, 10)
    assert b2.ledger_state(3).fenced  # type: ignore[union-attr]
    # Replayed entries are checkpointed again and still readable after another restart.
    await b2.checkpoint()
    await b2.close()
    b3 = await make_bookie(copy)
    await assert_ledger(b3, 1, 500)
    assert b3.ledger_state(3).fenced  # type: ignore[union-attr]


async def test_checkpoint_deletes_old_journals(make_bookie) -> None:  # type: ignore[no-untyped-def]
    b = await make_bookie()
    journal_dir = b.config.journal_dir
    await add_many(b, 1, 2000, size=100)  # ~270 KiB of journal in 64 KiB files
    before = sorted(journal_dir.glob("*.journal"))
    assert len(before) >= 4
    await b.checkpoint()
    after = sorted(journal_dir.glob("*.journal"))
    current = b.journal.synced_position.seq
    assert all(int(p.stem, 16) >= current for p in after)
    assert len(after) <= 2  # the current file and the pre-allocated next one
    await assert_ledger(b, 1, 2000, size=100)


async def test_gc_removes_logs_of_deleted_ledgers(make_bookie, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    b = await make_bookie()
    ledger_dir = b.config.ledger_dir
    await add_many(b, 1, 400, size=200)  # ~90 KiB: three 32 KiB entry logs
    await b.checkpoint()
    await add_many(b, 2, 400, size=200)
    await b.checkpoint()
    logs_1 = set(b.storage.index.ledger_logs[1])
    logs_2 = set(b.storage.index.ledger_logs[2])
    assert len(logs_1) >= 2
    await b.delete_ledger(1)
    with pytest.raises(BookieNoSuchEntryError):
        await b.read_entries(1, 0, 0)
    await b.checkpoint()
    present = {int(p.stem, 16) for p in ledger_dir.glob("*.log")}
    # Logs holding only ledger 1 are gone; a log shared with ledger 2 stays (no compaction yet).
    assert not (logs_1 - logs_2) & present
    assert logs_2 <= present
    assert 1 not in b.storage.index.ledgers
    await assert_ledger(b, 2, 400, size=200)
    await b.close()
    b2 = await make_bookie()
    assert b2.ledger_ids() == [2]
    assert b2.storage.writer.log_id > max(logs_1 | logs_2)  # entry log ids are never reused
    await assert_ledger(b2, 2, 400, size=200)
    with pytest.raises(BookieNoSuchEntryError):
        await b2.read_entries(1, 0, 0)


async def test_delete_survives_crash_before_checkpoint(make_bookie, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    b = await make_bookie()
    await add_many(b, 1, 50)
    await add_many(b, 2, 50)
    await b.checkpoint()
    await b.delete_ledger(1)  # only in the journal so far
    b2 = await make_bookie(crash_copy(b, tmp_path / "crashed"))
    assert b2.ledger_ids() == [2]
    await b2.checkpoint()
    assert 1 not in b2.storage.index.ledgers


async def test_large_entries_and_byte_equality_after_restart(make_bookie) -> None:  # type: ignore[no-untyped-def]
    b = await make_bookie()
    sizes = [0, 1, 100, 70_000, 5, 200_000, 33, 64 * 1024]  # some bigger than a journal file / entry log
    for e, n in enumerate(sizes):
        await b.add_entry(9, e, KEY, e - 1, payload(9, e, n))
    await b.checkpoint()
    await b.close()
    b2 = await make_bookie()
    got = await b2.read_entries(9, 0, len(sizes) - 1)
    assert [len(d) for _, d in got] == sizes
    assert all(d == payload(9, e, sizes[e]) for e, d in got)


async def test_index_compaction_and_torn_index_tail(make_bookie, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    b = await make_bookie(index_compact_bytes=4096)
    for round_ in range(12):
        await add_many(b, 1, 50, start=round_ * 50, size=64)
        await add_many(b, 100 + round_, 50, size=64)  # short-lived ledgers leave dead chunks
        await b.checkpoint()
        await b.delete_ledger(100 + round_)
    await b.checkpoint()
    index_file = b.config.ledger_dir / "index.dat"
    assert b.storage.index.compactions >= 1
    assert index_file.stat().st_size < 2 * 600 * 16 + 4096
    await b.close()
    with index_file.open("ab") as f:
        f.write(b"MGI1\x10\x00\x00\x00garbage")  # a torn chunk
    b2 = await make_bookie()
    await assert_ledger(b2, 1, 600, size=64)
    await b2.close()


async def test_out_of_order_and_overwritten_entries(make_bookie) -> None:  # type: ignore[no-untyped-def]
    b = await make_bookie()
    for e in (3, 1, 0, 2, 40):
        await b.add_entry(4, e, KEY, -1, payload(4, e))
    await b.checkpoint()
    await b.add_entry(4, 5, KEY, -1, payload(4, 5))
    await b.add_entry(4, 3, KEY, -1, payload(4, 3), recovery=True)  # same bytes again
    await b.checkpoint()
    assert b.entry_ids(4) == [0, 1, 2, 3, 5, 40]
    await b.close()
    b2 = await make_bookie()
    await assert_ledger(b2, 4, 4)
    assert b2.entry_ids(4) == [0, 1, 2, 3, 5, 40]
    assert (await b2.read_entries(4, 40, 41))[0][1] == payload(4, 40)


async def test_local_client_wraps_bookie(make_bookie) -> None:  # type: ignore[no-untyped-def]
    b = await make_bookie()
    c = LocalBookieClient(b)
    assert c.address == b.address
    await c.add_entry(1, 0, KEY, -1, b"hello")
    await c.add_entry_nowait(1, 1, KEY, 0, memoryview(b"world"))
    assert await c.read_entries(1, 0, 1) == [(0, b"hello"), (1, b"world")]
    assert await c.read_last_add_confirmed(1) == (0, 1)
    assert await c.fence(1, KEY) == (0, 1)
    await c.delete_ledger(1)
    await c.close()
    with pytest.raises(BookieUnavailableError):
        await c.read_last_add_confirmed(1)


async def test_periodic_checkpoint_runs(make_bookie) -> None:  # type: ignore[no-untyped-def]
    b = await make_bookie(checkpoint_interval_s=0.2)
    await add_many(b, 1, 100)
    for _ in range(40):
        await asyncio.sleep(0.1)
        if not b._cache and b._flushing is None:
            break
    assert 1 in b.storage.index.ledgers
    await assert_ledger(b, 1, 100)


@pytest.mark.parametrize("on_rotation", [True, False])
async def test_a_journal_rotation_checkpoints_so_the_next_file_is_reused(make_bookie, on_rotation: bool) -> None:  # type: ignore[no-untyped-def]
    """With no periodic checkpoint due, the checkpoint a rotation starts frees the journal's first file in time
    for its third to reuse it; without it the third file is pre-written with zeros."""
    b = await make_bookie(checkpoint_on_journal_rotation=on_rotation)  # 64 KiB journal files
    journal = b.journal
    eid = 0
    for seq in (2, 3):
        while journal.synced_position.seq < seq:
            await b.add_entry(1, eid, KEY, eid - 1, payload(1, eid, 500))
            eid += 1
        if seq == 2 and on_rotation:
            await eventually(lambda: 1 in b.storage.index.ledgers)  # checkpointed without a call
    assert (1 in b.storage.index.ledgers) == on_rotation
    assert journal.files_zeroed == (2 if on_rotation else 3)
    assert journal.files_reused == (1 if on_rotation else 0)
    await assert_ledger(b, 1, eid, size=500)


async def test_close_stops_threads_and_tasks(make_bookie) -> None:  # type: ignore[no-untyped-def]
    import threading

    prefixes = ("journal-writer", "journal-prealloc", "bookie-checkpoint", "bookie-read")

    def ours() -> list[str]:
        return [t.name for t in threading.enumerate() if t.name.startswith(prefixes)]

    b = await make_bookie(checkpoint_interval_s=0.1)
    await add_many(b, 1, 100)
    await b.checkpoint()
    await b.read_entries(1, 0, 99)
    assert ours()
    await b.close()
    assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("bookie-checkpoint") and not t.done()]
    for _ in range(100):
        if not ours():
            break
        await asyncio.sleep(0.01)
    assert ours() == []


async def test_second_bookie_on_same_directories_is_refused(make_bookie, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from magnetar.bookie.api import BookieError

    b = await make_bookie()
    await add_many(b, 1, 10)
    with pytest.raises(BookieError, match="in use"):
        await make_bookie()
    await assert_ledger(b, 1, 10)
    await b.close()
    b2 = await make_bookie()  # the lock went with the first bookie
    await assert_ledger(b2, 1, 10)


async def test_failed_checkpoint_keeps_data_and_is_retried(make_bookie, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import os

    from magnetar.bookie.api import BookieError

    b = await make_bookie()
    await add_many(b, 1, 100)
    # Fault injection at the OS level: the entry log's descriptor goes bad under the writer.
    writer = b.storage.writer
    os.close(writer._fd)
    writer._fd = os.open(os.devnull, os.O_RDONLY)
    with pytest.raises(BookieError, match="checkpoint failed"):
        await b.checkpoint()
    await assert_ledger(b, 1, 100)  # served from the write cache again
    assert len(list((b.config.journal_dir).glob("*.journal"))) >= 1
    # Crash now: the journal still has everything.
    b2 = await make_bookie(crash_copy(b, tmp_path / "crashed"))
    await assert_ledger(b2, 1, 100)
    # Read-only until a checkpoint succeeds; the writer has already moved on to a new log.
    assert b.read_only
    with pytest.raises(BookieReadOnlyError):
        await add_many(b, 1, 10, start=100)
    await b.checkpoint()
    assert not b.read_only
    await add_many(b, 1, 10, start=100)
    await b.checkpoint()
    assert not b._cache
    await assert_ledger(b, 1, 110)
