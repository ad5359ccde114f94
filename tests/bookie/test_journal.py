"""Journal: group commit, replay across files, torn and corrupt tails."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest

from magnetar.bookie.journal import Journal
from magnetar.bookie.journal_format import REC_ADD, REC_FENCE, REC_HEADER_SIZE
from tests.waiting import eventually


async def start_journal(directory: Path, **kw: object) -> Journal:
    settings: dict[str, object] = {"file_size": 64 * 1024, "group_max_bytes": 16 * 1024}
    settings.update(kw)
    j = Journal(directory, **settings)  # type: ignore[arg-type]
    list(j.replay(None))
    await asyncio.to_thread(j.open)
    j.start(asyncio.get_running_loop())
    return j


def replayed(directory: Path) -> list[tuple[int, int, int, int, bytes]]:
    return [tuple(r) for r in Journal(directory, file_size=4096, group_max_bytes=4096).replay(None)]  # type: ignore[misc]


async def test_group_commit_one_wakeup_per_group(tmp_path: Path) -> None:
    j = await start_journal(tmp_path, group_max_bytes=512 * 1024, file_size=8 << 20)
    loop = asyncio.get_running_loop()
    calls = 0
    original = loop.call_soon_threadsafe

    def counting(*args: object, **kw: object) -> object:
        nonlocal calls
        calls += 1
        return original(*args, **kw)  # type: ignore[arg-type]

    loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
    try:
        futs = [j.append(REC_ADD, 1, i, i - 1, b"x" * 100) for i in range(5000)]
        await asyncio.wait_for(asyncio.gather(*futs), 10)
    finally:
        loop.call_soon_threadsafe = original  # type: ignore[method-assign]
    # 5000 records went out in a handful of write+fdatasync groups, one loop wakeup each.
    assert j.groups_written <= 500
    assert calls == j.groups_written
    await j.close()
    recs = replayed(tmp_path)
    assert [r[2] for r in recs] == list(range(5000))
    assert all(r[4] == b"x" * 100 for r in recs)


async def test_group_size_is_bounded(tmp_path: Path) -> None:
    j = await start_journal(tmp_path, group_max_bytes=4096)
    data = b"y" * 200
    futs = [j.append(REC_ADD, 1, i, -1, data) for i in range(2000)]
    await asyncio.wait_for(asyncio.gather(*futs), 10)
    await j.close()
    assert j.max_group_bytes <= 4096 + REC_HEADER_SIZE + len(data)
    assert j.groups_written >= 2000 * (REC_HEADER_SIZE + 200) // (4096 + 233)


async def test_rotation_and_replay_across_files(tmp_path: Path) -> None:
    j = await start_journal(tmp_path, file_size=8192, group_max_bytes=2048)
    for i in range(300):
        await j.append(REC_ADD, 7, i, i - 1, os.urandom(0) + bytes([i % 256]) * 50)
    big = b"B" * 20000  # bigger than a whole journal file: the file is extended
    await j.append(REC_ADD, 7, 300, 299, big)
    await j.append(REC_FENCE, 7, -1, 300, b"")
    await j.close()
    assert j.groups_written > 3 and j.synced_position.seq > 3
    recs = replayed(tmp_path)
    assert [r[2] for r in recs[:301]] == list(range(301))
    assert recs[300][4] == big
    assert recs[-1][0] == REC_FENCE


def _last_file(directory: Path) -> Path:
    # The newest file that holds records (a pre-allocated next file may exist after it).
    files = sorted(directory.glob("*.journal"))
    for f in reversed(files):
        if f.read_bytes()[16:20] != b"\0\0\0\0":
            return f
    raise AssertionError("no journal records")


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage_header"])
async def test_torn_or_corrupt_tail_is_ignored(tmp_path: Path, damage: str) -> None:
    j = await start_journal(tmp_path)
    for i in range(10):
        await j.append(REC_ADD, 3, i, i - 1, bytes([65 + i]) * 100)
    await j.close()
    f = _last_file(tmp_path)
    raw = bytearray(f.read_bytes())
    rec = REC_HEADER_SIZE + 100
    last_start = 16 + 9 * rec
    if damage == "truncate":
        # A torn write: the last record's second half never reached the disk.
        raw[last_start + rec // 2 : last_start + rec] = bytes(rec - rec // 2)
    elif damage == "flip":
        raw[last_start + REC_HEADER_SIZE + 50] ^= 0xFF
    else:
        raw[last_start + 4 : last_start + 8] = (10**6).to_bytes(4, "little")
    f.write_bytes(bytes(raw))
    recs = replayed(tmp_path)
    assert [r[2] for r in recs] == list(range(9))
    assert [r[4] for r in recs] == [bytes([65 + i]) * 100 for i in range(9)]


async def test_replay_from_mark(tmp_path: Path) -> None:
    j = await start_journal(tmp_path, file_size=8192, group_max_bytes=1024)
    for i in range(150):
        await j.append(REC_ADD, 1, i, -1, b"z" * 100)
    mark = j.synced_position
    for i in range(150, 220):
        await j.append(REC_ADD, 1, i, -1, b"z" * 100)
    deleted = j.delete_before(mark.seq)
    await j.close()
    assert deleted >= 1
    again = Journal(tmp_path, file_size=8192, group_max_bytes=1024)
    assert [r.entry_id for r in again.replay(mark)] == list(range(150, 220))


async def test_append_after_close_fails(tmp_path: Path) -> None:
    from magnetar.bookie.api import BookieUnavailableError

    j = await start_journal(tmp_path)
    await j.close()
    with pytest.raises(BookieUnavailableError):
        j.append(REC_ADD, 1, 0, -1, b"late")


async def test_callback_appends_hear_once_on_the_loop(tmp_path: Path) -> None:
    """append_cb (the publish hot path) tells each waiter exactly once, on the event loop, after the sync."""
    j = await start_journal(tmp_path)
    heard: list[tuple[int, BaseException | None]] = []
    for i in range(50):
        j.append_cb(REC_ADD, 1, i, -1, b"z" * 10, lambda exc, i=i: heard.append((i, exc)))
    assert heard == []  # never from inside append_cb
    async with asyncio.timeout(10):
        while len(heard) < 50:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    assert heard == [(i, None) for i in range(50)]
    await asyncio.sleep(0.05)
    assert len(heard) == 50
    await j.close()
    assert [r[2] for r in replayed(tmp_path)] == list(range(50))


async def test_a_stalled_group_fails_its_waiters_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The watchdog fails waiters behind a stalled fdatasync; when the write finally ends they hear nothing more."""
    j = await start_journal(tmp_path, add_timeout_s=0.2)
    release = asyncio.Event()
    loop = asyncio.get_running_loop()
    real_fdatasync = os.fdatasync

    def slow_fdatasync(fd: int) -> None:
        asyncio.run_coroutine_threadsafe(release.wait(), loop).result(10)
        real_fdatasync(fd)

    monkeypatch.setattr(os, "fdatasync", slow_fdatasync)
    heard: list[BaseException | None] = []
    j.append_cb(REC_ADD, 1, 0, -1, b"s", heard.append)
    async with asyncio.timeout(10):
        while not heard:  # noqa: ASYNC110
            await asyncio.sleep(0.02)
    assert len(heard) == 1 and heard[0] is not None  # timed out
    release.set()
    await asyncio.sleep(0.3)
    assert len(heard) == 1
    await j.close()


async def test_big_records_are_written_from_their_own_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Records of batches (>= 4 KiB) go out by pwritev from their own bytes, mixed with small ones and
    in groups of more parts than one pwritev takes; replay returns every record intact, in order."""
    datas = [bytes([i % 251]) * (5000 if i % 3 else 10) for i in range(1500)]
    # The writer thread takes whatever is queued when it wakes, so a loaded machine may cut a burst into
    # small groups. Hold the writer in the fdatasync of a first one-record group while the burst is
    # queued: the burst then goes out as one group of 2,500 parts, more than one pwritev takes (IOV_MAX).
    armed, syncing, queued = threading.Event(), threading.Event(), threading.Event()
    real_fdatasync = os.fdatasync

    def held_fdatasync(fd: int) -> None:
        if armed.is_set():
            syncing.set()
            queued.wait(20)
        real_fdatasync(fd)

    monkeypatch.setattr(os, "fdatasync", held_fdatasync)
    j = await start_journal(tmp_path, file_size=16 << 20, group_max_bytes=8 << 20)
    armed.set()
    first = j.append(REC_ADD, 3, 0, -1, b"first")
    assert await asyncio.to_thread(syncing.wait, 10)
    futs = [j.append(REC_ADD, 3, i + 1, i, d) for i, d in enumerate(datas)]
    queued.set()
    await asyncio.wait_for(asyncio.gather(first, *futs), 20)
    await j.close()
    recs = replayed(tmp_path)
    assert [r[2] for r in recs] == list(range(1501))
    assert [r[4] for r in recs] == [b"first", *datas]
    assert j.max_group_bytes >= sum(map(len, datas))


async def test_journal_sync_data_false_writes_without_fdatasync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """journalSyncData=false: records are written (and replay) but never fdatasync'ed."""
    syncs = 0
    real_fdatasync = os.fdatasync

    def counting(fd: int) -> None:
        nonlocal syncs
        syncs += 1
        real_fdatasync(fd)

    monkeypatch.setattr(os, "fdatasync", counting)
    j = await start_journal(tmp_path, sync_data=False)
    futs = [j.append(REC_ADD, 1, i, -1, b"n" * 50) for i in range(200)]
    await asyncio.wait_for(asyncio.gather(*futs), 10)
    assert j.groups_written >= 1 and syncs == 0
    await j.close()
    assert [r[2] for r in replayed(tmp_path)] == list(range(200))
    on = await start_journal(tmp_path / "on")
    await asyncio.wait_for(on.append(REC_ADD, 1, 0, -1, b"s"), 10)
    assert syncs >= 1  # the default still syncs
    await on.close()


def _inodes(directory: Path, suffix: str, below: int | None = None) -> dict[int, Path]:
    """Inode -> file of the journal directory's files ending in ``suffix`` (with a seq below ``below``)."""
    files = directory.glob(f"*{suffix}")
    return {f.stat().st_ino: f for f in files if below is None or int(f.stem, 16) < below}


def _seq_file(directory: Path, seq: int) -> Path:
    return directory / f"{seq:016x}.journal"


async def _fill_until_reused(j: Journal, tmp_path: Path, first: int, freed: set[int]) -> tuple[int, Path]:
    """Append 100-byte records from entry ``first`` on until the journal writes a few into a file whose inode
    is one of ``freed``; returns the last entry id and that file."""
    eid = first
    while eid < first + 2000:
        await j.append(REC_ADD, 1, eid, -1, b"n" * 100)
        now = _seq_file(tmp_path, j.synced_position.seq)
        by_inode = {f: i for i, f in _inodes(tmp_path, ".journal").items()}
        if by_inode.get(now) in freed and j.synced_position.offset > 16 + 3 * (REC_HEADER_SIZE + 100):
            return eid, now
        eid += 1
    raise AssertionError("no obsolete journal file was reused")


@pytest.mark.parametrize("damage", [None, "flip"])
async def test_a_reused_file_replays_its_new_records_and_not_its_old_ones(tmp_path: Path, damage: str | None) -> None:
    """An obsolete file is renamed and written again from the start: its old records (same sizes, so at the
    same offsets, with intact CRCs of their own) follow the new ones and must not come back on replay."""
    j = await start_journal(tmp_path, file_size=8192, group_max_bytes=1024)
    for i in range(300):
        await j.append(REC_ADD, 1, i, -1, b"o" * 100)
    mark = j.synced_position
    old = set(_inodes(tmp_path, ".journal", below=mark.seq))
    zeroed = j.files_zeroed
    assert j.delete_before(mark.seq) == len(old) >= 2
    assert set(_inodes(tmp_path, ".free")) == old
    last, reused = await _fill_until_reused(j, tmp_path, 300, old)
    await j.close()
    assert j.files_reused >= 1 and j.files_zeroed == zeroed  # no file was pre-written with zeros meanwhile
    end = j.synced_position.offset
    assert reused.read_bytes()[end : end + REC_HEADER_SIZE + 100].endswith(b"o" * 100)  # an old record follows
    if damage:  # a torn last write: replay ends before it, not in the old records after it
        raw = bytearray(reused.read_bytes())
        raw[end - 50] ^= 0xFF
        reused.write_bytes(bytes(raw))
        last -= 1
    again = Journal(tmp_path, file_size=8192, group_max_bytes=1024)
    recs = list(again.replay(mark))
    assert [r.entry_id for r in recs] == list(range(300, last + 1))
    assert {r.data for r in recs} == {b"n" * 100}


async def test_obsolete_files_are_deleted_beyond_reuse_files(tmp_path: Path) -> None:
    j = await start_journal(tmp_path, file_size=8192, group_max_bytes=1024, reuse_files=1)
    for i in range(300):
        await j.append(REC_ADD, 1, i, -1, b"o" * 100)
    mark = j.synced_position
    assert j.delete_before(mark.seq) >= 2
    assert len(_inodes(tmp_path, ".free")) == 1
    await j.close()
    off = await start_journal(tmp_path / "off", file_size=8192, group_max_bytes=1024, reuse_files=0)
    for i in range(300):
        await off.append(REC_ADD, 1, i, -1, b"o" * 100)
    assert off.delete_before(off.synced_position.seq) >= 2
    for i in range(300, 500):
        await off.append(REC_ADD, 1, i, -1, b"o" * 100)
    await off.close()
    assert not _inodes(tmp_path / "off", ".free") and off.files_reused == 0


async def test_a_free_file_of_another_size_is_dropped_not_reused(tmp_path: Path) -> None:
    (tmp_path / "0000000000000001.free").write_bytes(bytes(4096))  # from a run with another journal_file_size
    j = await start_journal(tmp_path, file_size=8192, group_max_bytes=1024)
    for i in range(100):
        await j.append(REC_ADD, 1, i, -1, b"o" * 100)
    await j.close()
    assert j.files_reused == 0 and not _inodes(tmp_path, ".free")
    assert [r[2] for r in replayed(tmp_path)] == list(range(100))


def test_format_version_1_files_still_replay(tmp_path: Path) -> None:
    """Files written before records were seeded with their file's header CRC (version 1: seed 0)."""
    import struct

    from crc32c import crc32c

    raw = bytearray(struct.pack("<4sIQ", b"MGJ1", 1, 5))
    for eid in range(3):
        data = bytes([eid]) * 40
        tail = struct.pack("<IBqqq", len(data), REC_ADD, 9, eid, eid - 1)
        raw += struct.pack("<I", crc32c(data, crc32c(tail))) + tail + data
    raw += bytes(4096)
    (tmp_path / "0000000000000005.journal").write_bytes(bytes(raw))
    assert replayed(tmp_path) == [(REC_ADD, 9, e, e - 1, bytes([e]) * 40) for e in range(3)]


@pytest.mark.parametrize("failing", ["fstat", "posix_fadvise"])
async def test_a_free_file_that_cannot_be_reused_falls_back_to_a_new_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    """A reuse failing makes a new file instead; the read-ahead advice failing changes nothing."""

    def refuse(*args: object) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, failing, refuse)  # only a reuse calls these
    j = await start_journal(tmp_path, file_size=8192, group_max_bytes=1024)
    for i in range(300):
        await j.append(REC_ADD, 1, i, -1, b"o" * 100)
    mark = j.synced_position
    zeroed = j.files_zeroed
    assert j.delete_before(mark.seq) >= 2
    for i in range(300, 600):
        await j.append(REC_ADD, 1, i, -1, b"n" * 100)
    await j.close()
    if failing == "fstat":
        assert j.files_reused == 0 and j.files_zeroed > zeroed
    else:
        assert j.files_reused >= 2  # as many as the checkpoint freed
    assert [r.entry_id for r in Journal(tmp_path, file_size=8192, group_max_bytes=1024).replay(mark)] == list(
        range(300, 600)
    )


async def test_adds_arriving_apart_wait_for_each_other(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Adds ~0.3 ms apart (a paced producer): each would be its own group commit; the group wait gathers
    them. fdatasync is a no-op here so that only the wait, not a slow disk, can group them."""
    monkeypatch.setattr(os, "fdatasync", lambda fd: None)

    async def paced(**kw: object) -> Journal:
        j = await start_journal(tmp_path / str(kw), **kw)
        futs = []
        for i in range(300):
            futs.append(j.append(REC_ADD, 1, i, -1, b"p" * 100))
            await asyncio.sleep(0.0003)
        await asyncio.wait_for(asyncio.gather(*futs), 20)
        await j.close()
        return j

    waited = await paced(max_wait_s=0.005)  # several arrivals per wait even when the loop's sleeps run long
    assert waited.waits >= 10 and waited.waits_joined >= waited.waits // 2
    alone = await paced(max_wait_s=0.0)
    assert alone.waits == 0
    assert waited.groups_written * 2 <= alone.groups_written, (waited.groups_written, alone.groups_written)


async def test_a_producer_waiting_for_each_receipt_is_not_held_by_the_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Request/response: the next add comes only after the previous one is durable, so a wait gathers
    nothing. The adaptive wait stops after its first fruitless try; an unconditional one (BookKeeper's)
    would hold every add for the whole wait."""
    monkeypatch.setattr(os, "fdatasync", lambda fd: None)
    loop = asyncio.get_running_loop()

    async def sequential(n: int, **kw: object) -> tuple[Journal, float]:
        j = await start_journal(tmp_path / str(kw), **kw)
        start = loop.time()
        for i in range(n):
            await asyncio.wait_for(j.append(REC_ADD, 1, i, -1, b"s" * 100), 10)
        elapsed = loop.time() - start
        await j.close()
        return j, elapsed

    adaptive, elapsed = await sequential(200, max_wait_s=0.005)
    assert adaptive.waits <= 2 and elapsed < 0.5, (adaptive.waits, elapsed)
    always, elapsed = await sequential(50, max_wait_s=0.005, adaptive_wait=False)
    # An add waits when it finds the writer idle: nearly every one, but on a loaded machine the writer is
    # sometimes not back from the previous group yet (a CI run: 43 of 50), and takes the add at once.
    assert always.waits >= 25 and elapsed >= always.waits * 0.005, (always.waits, elapsed)


async def _into_second_file(j: Journal, first: int = 0) -> int:
    """Append 100-byte records until some are in the journal's second file (well below its half); returns
    the next entry id."""
    eid = first
    while j.synced_position.seq < 2 or j.synced_position.offset < 1000:
        await j.append(REC_ADD, 1, eid, -1, b"o" * 100)
        eid += 1
    return eid


async def test_later_files_are_zeroed_only_once_the_open_one_is_half_full(tmp_path: Path) -> None:
    """Preparing a file at once zeroed one that the next checkpoint would have freed for reuse."""
    j = await start_journal(tmp_path, file_size=8192, group_max_bytes=1024)
    await eventually(lambda: j.files_zeroed == 2)  # at start-up: the open file and the next one
    eid = await _into_second_file(j)
    await asyncio.sleep(0.3)
    assert j.files_zeroed == 2
    while j.synced_position.offset < 4200:  # past half of the second file
        await j.append(REC_ADD, 1, eid, -1, b"o" * 100)
        eid += 1
    await eventually(lambda: j.files_zeroed == 3)
    await j.close()
    assert [r[2] for r in replayed(tmp_path)] == list(range(eid))


async def test_a_file_freed_while_the_next_one_waits_is_reused(tmp_path: Path) -> None:
    j = await start_journal(tmp_path, file_size=8192, group_max_bytes=1024)
    eid = await _into_second_file(j)
    assert j.files_zeroed == 2 and j.files_reused == 0
    assert j.delete_before(2) == 1  # a checkpoint frees the first file
    await eventually(lambda: j.files_reused == 1)
    while j.synced_position.seq < 3:
        await j.append(REC_ADD, 1, eid, -1, b"n" * 100)
        eid += 1
    await j.close()
    assert j.files_zeroed == 2
    ids = [r.entry_id for r in Journal(tmp_path, file_size=8192, group_max_bytes=1024).replay(None)]
    assert ids[0] > 0 and ids == list(range(ids[0], eid))  # the first file's records went with it


async def test_close_ends_a_preparation_waiting_for_a_free_file(tmp_path: Path) -> None:
    j = await start_journal(tmp_path, file_size=8192, group_max_bytes=1024)
    eid = await _into_second_file(j)
    started = asyncio.get_running_loop().time()
    await j.close()
    assert asyncio.get_running_loop().time() - started < 2.0
    assert j.files_zeroed == 2 and not any(f.name.endswith(".tmp") for f in os.scandir(tmp_path))
    assert [r[2] for r in replayed(tmp_path)] == list(range(eid))


async def test_records_queued_at_close_get_their_file_when_the_preparation_was_abandoned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """close() ends the preparation waiting for a free file; the writer still has records queued past the
    open file's end, and makes their file itself."""
    j = await start_journal(tmp_path, file_size=8192, group_max_bytes=1024)
    first = await _into_second_file(j)
    release = threading.Event()
    real_pwritev = os.pwritev

    def held_pwritev(fd: int, buffers: list[bytes], offset: int) -> int:
        release.wait(10)  # the writer stays below half of the file until close() has been called
        return real_pwritev(fd, buffers, offset)

    monkeypatch.setattr(os, "pwritev", held_pwritev)
    waiters = [j.append(REC_ADD, 1, i, -1, b"q" * 3000) for i in range(first, first + 6)]  # ~18 KB: 2 rotations
    closing = asyncio.ensure_future(j.close())
    await asyncio.sleep(0.3)  # the preparation sees the close and gives up
    release.set()
    await asyncio.wait_for(closing, 10)
    await asyncio.wait_for(asyncio.gather(*waiters), 5)
    assert j.files_zeroed == 4
    assert [r[2] for r in replayed(tmp_path)] == list(range(first + 6))
