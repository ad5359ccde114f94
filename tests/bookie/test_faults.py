"""Bookie storage under disk faults: a full ledger disk, EIO mid-write, torn vs corrupt index.

The full disk is real: a small tmpfs mounted for the test (needs root; skipped otherwise).
EIO cannot be produced on demand by a real device here, so it is injected through the
``_writev`` seam of :mod:`magnetar.bookie.entry_log` (the only call that writes entry data).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from bookie_helpers import KEY, payload

from magnetar.bookie import entry_log
from magnetar.bookie.api import BookieError, BookieReadOnlyError
from magnetar.bookie.bookie import Bookie


async def add_many(bookie: Bookie, ledger_id: int, count: int, start: int = 0, size: int | None = None) -> None:
    futs = [
        bookie.add_entry_nowait(ledger_id, e, KEY, e - 1, payload(ledger_id, e, size))
        for e in range(start, start + count)
    ]
    await asyncio.wait_for(asyncio.gather(*futs), 10)


async def assert_ledger(bookie: Bookie, ledger_id: int, count: int, start: int = 0, size: int | None = None) -> None:
    got = await bookie.read_entries(ledger_id, start, start + count - 1)
    assert [e for e, _ in got] == list(range(start, start + count))
    for e, data in got:
        assert data == payload(ledger_id, e, size), f"entry {ledger_id}:{e} differs"


@contextlib.contextmanager
def small_disk(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``path`` for the duration (a disk that really fills up)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {r.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False, timeout=30)


def fill(path: Path, leave: int) -> Path:
    """Fill the filesystem of ``path`` until about ``leave`` bytes are free; returns the filler file."""
    filler = path / "filler.bin"
    st = os.statvfs(path)
    free = st.f_bavail * st.f_frsize
    with filler.open("wb") as f:
        f.write(b"\xaa" * max(0, free - leave))
    return filler


async def test_full_ledger_disk_never_indexes_unwritten_bytes(make_bookie, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """ENOSPC in the middle of an entry-log write: nothing unwritten is indexed, the bookie turns
    read-only, and once space is back the next checkpoint writes to a new log and serves every entry."""
    with small_disk(tmp_path / "ledgers", "2m") as ledger_dir:
        b = await make_bookie(
            tmp_path / "data", ledger_dir=ledger_dir, journal_dir=tmp_path / "journal", entry_log_size=8 << 20
        )
        await add_many(b, 1, 20, size=1000)
        await b.checkpoint()  # ledger 1's first entries are on disk in log 1
        first_log = b.storage.writer.log_id
        filler = fill(ledger_dir, 64 * 1024)
        await add_many(b, 1, 300, start=20, size=1000)  # ~300 KB: does not fit
        with pytest.raises(BookieError, match="checkpoint failed"):
            await b.checkpoint()
        assert b.read_only
        with pytest.raises(BookieReadOnlyError):
            b.add_entry_nowait(1, 320, KEY, 319, b"x")
        await assert_ledger(b, 1, 320, size=1000)  # from the write cache and the good part of log 1
        filler.unlink()
        await b.checkpoint()
        assert not b.read_only
        assert b.storage.writer.log_id > first_log  # rolled away from the log that failed
        assert not b._cache
        await assert_ledger(b, 1, 320, size=1000)  # every entry from disk, at its real offset
        await add_many(b, 1, 10, start=320, size=1000)
        await b.close()
        b2 = await make_bookie(
            tmp_path / "data", ledger_dir=ledger_dir, journal_dir=tmp_path / "journal", entry_log_size=8 << 20
        )
        await assert_ledger(b2, 1, 330, size=1000)


async def test_eio_mid_writev_rolls_to_a_new_log(make_bookie, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """EIO after part of a ``writev`` (injected at the ``_writev`` seam): the retry goes to a new log."""
    b = await make_bookie(entry_log_size=1 << 20)
    await add_many(b, 1, 50, size=500)
    await b.checkpoint()
    real = entry_log._writev
    calls = 0

    def failing_writev(fd: int, parts: list[bytes]) -> int:
        nonlocal calls
        calls += 1
        os.write(fd, parts[0][: len(parts[0]) // 2])  # half of the first record reaches the file
        raise OSError(errno.EIO, "injected EIO")

    monkeypatch.setattr(entry_log, "_writev", failing_writev)
    await add_many(b, 1, 50, start=50, size=500)
    with pytest.raises(BookieError, match="checkpoint failed"):
        await b.checkpoint()
    assert calls == 1 and b.read_only
    monkeypatch.setattr(entry_log, "_writev", real)
    await b.checkpoint()
    assert not b.read_only
    await assert_ledger(b, 1, 100, size=500)
    await b.close()
    b2 = await make_bookie()
    await assert_ledger(b2, 1, 100, size=500)


def chunk_offsets(index_file: Path) -> list[int]:
    """Start offsets of the chunks of ``index.dat`` (header: magic, body length, crc)."""
    data = index_file.read_bytes()
    offs, pos = [], 0
    while pos + 12 <= len(data):
        offs.append(pos)
        pos += 12 + int.from_bytes(data[pos + 4 : pos + 8], "little")
    return offs


async def test_failed_index_write_is_cut_back(make_bookie, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """Half an index chunk written, then ENOSPC (injected at the ``_write`` seam of the index):
    the half chunk is cut off, so the next checkpoint's chunk is not hidden behind it."""
    from magnetar.bookie import index

    b = await make_bookie()
    await add_many(b, 1, 50)
    await b.checkpoint()
    real = index._write

    def half_then_enospc(fd: int, data: memoryview) -> int:
        real(fd, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "injected ENOSPC")

    monkeypatch.setattr(index, "_write", half_then_enospc)
    await add_many(b, 1, 50, start=50)
    with pytest.raises(BookieError, match="checkpoint failed"):
        await b.checkpoint()
    monkeypatch.setattr(index, "_write", real)
    await b.checkpoint()  # this one deletes the journals holding entries 50..99
    await add_many(b, 2, 10)
    await b.checkpoint()
    await b.close()
    b2 = await make_bookie()
    await assert_ledger(b2, 1, 100)
    await assert_ledger(b2, 2, 10)


async def test_corrupt_index_chunk_refuses_to_start_and_keeps_data(make_bookie, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A bad chunk followed by good ones is corruption, not a torn tail: the bookie refuses to
    start and deletes nothing (neither index chunks nor entry logs)."""
    b = await make_bookie()
    for i in range(3):
        await add_many(b, 1 + i, 100, size=300)  # ~30 KiB a ledger: several entry logs
        await b.checkpoint()
    await b.close()
    index_file = b.config.ledger_dir / "index.dat"
    offs = chunk_offsets(index_file)
    assert len(offs) >= 3
    raw = bytearray(index_file.read_bytes())
    raw[offs[1] + 20] ^= 0xFF  # one flipped byte in the body of the middle chunk
    index_file.write_bytes(bytes(raw))
    logs_before = sorted(p.name for p in b.config.ledger_dir.glob("*.log"))
    with pytest.raises(BookieError, match="corrupt"):
        await make_bookie()
    assert sorted(p.name for p in b.config.ledger_dir.glob("*.log")) == logs_before
    assert index_file.read_bytes() == bytes(raw)


@pytest.mark.parametrize("tail", ["truncated", "zeros", "bad-crc"])
async def test_torn_index_tail_is_dropped(make_bookie, tail: str) -> None:  # type: ignore[no-untyped-def]
    """A damaged last chunk is a checkpoint that never completed: dropped, journal replayed."""
    b = await make_bookie()
    await add_many(b, 1, 100)
    await b.checkpoint()
    await add_many(b, 1, 100, start=100)
    await b.checkpoint()
    await b.close()
    index_file = b.config.ledger_dir / "index.dat"
    last = chunk_offsets(index_file)[-1]
    raw = bytearray(index_file.read_bytes())
    if tail == "truncated":
        raw = raw[: last + (len(raw) - last) // 2]
    elif tail == "zeros":
        raw[last:] = bytes(len(raw) - last)
    else:
        raw[-1] ^= 0xFF
    index_file.write_bytes(bytes(raw))
    b2 = await make_bookie()
    # The first chunk's entries from the entry log, the rest from the journal (still there: its
    # deletion would have followed the lost chunk).
    assert b2.storage.index.mark is not None
    await assert_ledger(b2, 1, 200)


async def test_missing_index_with_entry_logs_refuses_to_start(make_bookie) -> None:  # type: ignore[no-untyped-def]
    """``index.dat`` gone while entry logs hold data: refuse to start instead of deleting the logs."""
    b = await make_bookie()
    await add_many(b, 1, 100, size=300)
    await b.checkpoint()
    await b.close()
    (b.config.ledger_dir / "index.dat").unlink()
    logs_before = sorted(p.name for p in b.config.ledger_dir.glob("*.log"))
    with pytest.raises(BookieError, match="index"):
        await make_bookie()
    assert sorted(p.name for p in b.config.ledger_dir.glob("*.log")) == logs_before


async def test_slow_ledger_disk_throttles_then_rejects_adds(make_bookie, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """Ingest faster than the ledger disk (each entry-log write made slow at the ``_writev`` seam):
    the write cache stays bounded; adds wait up to ``max_throttle_time_s`` for room and are then
    rejected with a retryable error (BookKeeper: dbStorage_maxThrottleTimeMs, TOO_MANY_REQUESTS)."""
    from magnetar.bookie import protocol
    from magnetar.bookie.api import BookieTooManyRequestsError

    cache_max = 64 * 1024
    b = await make_bookie(write_cache_max_bytes=cache_max, max_throttle_time_s=0.3, entry_log_size=8 << 20)
    real = entry_log._writev

    def slow_writev(fd: int, parts: list[bytes]) -> int:
        time.sleep(1.0)  # the checkpoint thread: the event loop keeps running
        return real(fd, parts)

    monkeypatch.setattr(entry_log, "_writev", slow_writev)
    entry = b"s" * 1024
    futs = []
    peak = 0
    for e in range(400):  # 400 KiB offered in well under a second
        futs.append(b.add_entry_nowait(1, e, KEY, e - 1, entry))
        peak = max(peak, b.cache_bytes)
        if e % 20 == 0:
            await asyncio.sleep(0.01)
    results = await asyncio.wait_for(asyncio.gather(*futs, return_exceptions=True), 20)
    accepted = sum(r is None for r in results)
    rejected = [r for r in results if isinstance(r, BaseException)]
    assert peak <= cache_max + len(entry)
    assert rejected and all(isinstance(r, BookieTooManyRequestsError) for r in rejected)
    assert accepted >= cache_max // len(entry)
    assert protocol.code_of(rejected[0]) == protocol.E_TOO_MANY_REQUESTS
    assert isinstance(protocol.error_of(protocol.E_TOO_MANY_REQUESTS, "x"), BookieTooManyRequestsError)
    # Everything acknowledged is readable; once the disk keeps up, adds are accepted again.
    monkeypatch.setattr(entry_log, "_writev", real)
    await b.checkpoint()  # waits for the slow one still running
    ok = [e for e, r in enumerate(results) if r is None]
    assert ok[: cache_max // len(entry)] == list(range(cache_max // len(entry)))  # arrival order kept
    got = await b.read_entries(1, 0, ok[-1])
    assert all(data == entry for _, data in got)
    assert b.rejected_adds == len(rejected) and b.throttled_adds >= len(rejected)
    await add_many(b, 2, 50)
    await assert_ledger(b, 2, 50)


async def test_new_index_and_first_entry_log_are_made_durable_in_their_directory(
    make_bookie, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """Creating ``index.dat`` and the first entry log is followed by an fsync of the ledger
    directory (a power cut must not lose the names). Observed by wrapping ``os.fsync``."""
    import stat

    ledger_dir = tmp_path / "bookie" / "ledgers"
    seen: list[list[str]] = []
    real = os.fsync

    def spy(fd: int) -> None:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode) and ledger_dir.exists() and st.st_ino == ledger_dir.stat().st_ino:
            seen.append(sorted(os.listdir(ledger_dir)))
        real(fd)

    monkeypatch.setattr(os, "fsync", spy)
    await make_bookie()
    assert any("index.dat" in names for names in seen)
    assert any(any(n.endswith(".log") for n in names) for names in seen)


async def test_held_back_adds_fail_at_once_when_the_checkpoint_fails(
    make_bookie, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """Adds waiting for room in a full write cache learn at once that the checkpoint failed
    (read-only) instead of waiting out ``max_throttle_time_s`` (EIO injected at ``_writev``)."""

    def eio(fd: int, parts: list[bytes]) -> int:
        time.sleep(0.2)
        raise OSError(errno.EIO, "injected EIO")

    b = await make_bookie(write_cache_max_bytes=16 * 1024, max_throttle_time_s=30.0)
    monkeypatch.setattr(entry_log, "_writev", eio)
    futs = [b.add_entry_nowait(1, e, KEY, e - 1, b"e" * 1024) for e in range(16)]
    await asyncio.sleep(0)  # the full cache wakes the checkpoint, which swaps it out and fails
    held = [b.add_entry_nowait(1, e, KEY, e - 1, b"e" * 1024) for e in range(16, 48)]
    t0 = time.monotonic()
    results = await asyncio.wait_for(asyncio.gather(*held, return_exceptions=True), 10)
    assert time.monotonic() - t0 < 5
    assert any(isinstance(r, BookieReadOnlyError) for r in results)
    assert b.read_only
    await asyncio.wait_for(asyncio.gather(*futs), 10)  # journaled before the failure: acknowledged
