"""Entry logs are written with O_DIRECT (``entry_log_direct_io``): their pages stay out of the page cache.

Every byte of a checkpoint is written to a new page of an entry log; cached, those pages make the cache grow
by the whole write rate, and on this VM each new page can cost ~8 µs of kernel time (the host backs it on
first touch): up to ~230 µs per 128 KiB entry, the largest single cost of batched publish. Where the
filesystem refuses O_DIRECT the log is written through the page cache. Residency is read with ``mincore(2)``
over a mapping of the file, so the test sees what the kernel holds, not what we think.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import fcntl
import mmap
import os
import tempfile
from pathlib import Path

import pytest
from bookie_helpers import KEY

from magnetar.bookie import entry_log
from magnetar.bookie.bookie import Bookie

ENTRY = 128 * 1024
COUNT = 96  # 12 MiB: several of the writer's 4 MiB chunks


def resident_fraction(path: Path) -> float:
    """Share of ``path``'s pages in the page cache (``mincore`` over a private read mapping)."""
    libc = ctypes.CDLL(None, use_errno=True)
    size = path.stat().st_size
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    vec = (ctypes.c_ubyte * pages)()
    with open(path, "rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY) as m:
        anchor = ctypes.c_char.from_buffer(m)
        try:
            rc = libc.mincore(ctypes.c_void_p(ctypes.addressof(anchor)), ctypes.c_size_t(size), vec)
            if rc != 0:
                raise OSError(ctypes.get_errno(), "mincore failed")
        finally:
            del anchor  # release the buffer export before the mapping closes
    return sum(b & 1 for b in vec) / pages


async def fill_and_checkpoint(bookie: Bookie) -> None:
    futs = [bookie.add_entry_nowait(1, e, KEY, e - 1, bytes([e % 251]) * ENTRY) for e in range(COUNT)]
    await asyncio.wait_for(asyncio.gather(*futs), 30)
    await bookie.checkpoint()


def entry_logs(bookie: Bookie) -> list[Path]:
    logs = sorted(Path(bookie.config.ledger_dir).glob("*.log"))  # type: ignore[arg-type]
    assert logs, "the checkpoint wrote no entry log"
    return logs


@pytest.mark.parametrize("drop", [True, False])
async def test_checkpointed_entry_log_pages_stay_out_of_the_page_cache(make_bookie, drop: bool) -> None:  # type: ignore[no-untyped-def]
    bookie = await make_bookie(entry_log_size=64 << 20, entry_log_direct_io=drop)
    await fill_and_checkpoint(bookie)
    fractions = [resident_fraction(p) for p in entry_logs(bookie)]
    biggest = max(entry_logs(bookie), key=lambda p: p.stat().st_size)
    assert biggest.stat().st_size >= COUNT * ENTRY
    if drop:
        assert max(fractions) < 0.1, fractions
    else:  # the control: through the page cache, what was just written is still cached
        assert resident_fraction(biggest) > 0.9, fractions
    # Either way every entry reads back intact (from the disk when it was dropped).
    got = await bookie.read_entries(1, 0, COUNT - 1)
    assert [e for e, _ in got] == list(range(COUNT))
    assert all(data == bytes([e % 251]) * ENTRY for e, data in got)


async def test_rolled_entry_logs_stay_out_too(make_bookie) -> None:  # type: ignore[no-untyped-def]
    """Logs closed by rotation during a checkpoint (their tail block written at the roll) as well."""
    bookie = await make_bookie(entry_log_size=3 << 20, entry_log_direct_io=True)
    await fill_and_checkpoint(bookie)
    logs = entry_logs(bookie)
    assert len(logs) >= 4
    assert all(resident_fraction(p) < 0.1 for p in logs), [resident_fraction(p) for p in logs]


async def test_odd_sized_syncs_read_back_after_restart(make_bookie, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """O_DIRECT writes whole blocks: a sync pads the partial last block, the next one rewrites it. Entries
    of odd sizes over many small checkpoints and a log rotation read back intact, also after a restart."""
    data_dir = tmp_path / "odd"
    bookie = await make_bookie(data_dir, entry_log_size=1 << 20, entry_log_direct_io=True)
    sizes = [1, 4095, 4096, 4097, 333, 70_000, 12, 200_000, 5]
    expected: dict[int, bytes] = {}
    e = 0
    for round_ in range(12):
        futs = []
        for size in sizes[round_ % 3 :: 2]:
            expected[e] = bytes([(e * 7 + round_) % 256]) * size
            futs.append(bookie.add_entry_nowait(1, e, KEY, e - 1, expected[e]))
            e += 1
        await asyncio.wait_for(asyncio.gather(*futs), 30)
        await bookie.checkpoint()
    assert len(entry_logs(bookie)) >= 2
    got = await bookie.read_entries(1, 0, e - 1)
    assert dict(got) == expected
    await bookie.close()
    again = await make_bookie(data_dir, entry_log_size=1 << 20, entry_log_direct_io=True)
    got = await again.read_entries(1, 0, e - 1)
    assert dict(got) == expected


def refuse_o_direct_open(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``open(O_DIRECT)`` fail with EINVAL, as tmpfs before Linux 6.6 and some FUSE filesystems do."""
    real_open = os.open

    def fake_open(path, flags, *args, **kwargs):  # type: ignore[no-untyped-def]
        if flags & entry_log.O_DIRECT:
            raise OSError(errno.EINVAL, "O_DIRECT not supported", str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", fake_open)


def refuse_o_direct_writes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Make writes to ``O_DIRECT`` descriptors fail with EINVAL (a filesystem that opens but cannot do
    them); returns the list of refused descriptors."""
    refused: list[int] = []

    def refusing(real):  # type: ignore[no-untyped-def]
        def write(fd: int, *args):  # type: ignore[no-untyped-def]
            if fcntl.fcntl(fd, fcntl.F_GETFL) & entry_log.O_DIRECT:
                refused.append(fd)
                raise OSError(errno.EINVAL, "Invalid argument")
            return real(fd, *args)

        return write

    monkeypatch.setattr(os, "pwrite", refusing(os.pwrite))
    monkeypatch.setattr(entry_log, "_writev", refusing(entry_log._writev))
    return refused


async def check_fallback(make_bookie, data_dir: Path) -> None:  # type: ignore[no-untyped-def]
    """Entries checkpointed through the page cache (they stay cached) read back, also after a restart."""
    bookie = await make_bookie(data_dir, entry_log_size=64 << 20, entry_log_direct_io=True)
    await fill_and_checkpoint(bookie)
    assert max(resident_fraction(p) for p in entry_logs(bookie)) > 0.9
    got = await bookie.read_entries(1, 0, COUNT - 1)
    assert all(data == bytes([e % 251]) * ENTRY for e, data in got)
    await bookie.close()
    again = await make_bookie(data_dir, entry_log_size=64 << 20, entry_log_direct_io=True)
    got = await again.read_entries(1, 0, COUNT - 1)
    assert [e for e, _ in got] == list(range(COUNT))
    assert all(data == bytes([e % 251]) * ENTRY for e, data in got)


async def test_o_direct_refused_at_open_falls_back(  # type: ignore[no-untyped-def]
    make_bookie, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    refuse_o_direct_open(monkeypatch)
    await check_fallback(make_bookie, tmp_path / "b")


async def test_o_direct_refused_at_write_falls_back(  # type: ignore[no-untyped-def]
    make_bookie, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A filesystem may accept ``open(O_DIRECT)`` and refuse the writes: each new log tries one block
    right away and goes buffered on EINVAL, instead of failing every checkpoint."""
    refused = refuse_o_direct_writes(monkeypatch)
    await check_fallback(make_bookie, tmp_path / "b")
    assert refused, "O_DIRECT was never tried"


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="no tmpfs at /dev/shm")
async def test_entry_logs_on_tmpfs(make_bookie) -> None:  # type: ignore[no-untyped-def]
    """On a real tmpfs (which refuses O_DIRECT before Linux 6.6 and takes it since): written, read back,
    restarted."""
    with tempfile.TemporaryDirectory(dir="/dev/shm", prefix="magnetar-test-") as d:
        bookie = await make_bookie(Path(d), entry_log_size=64 << 20, entry_log_direct_io=True)
        await fill_and_checkpoint(bookie)
        got = await bookie.read_entries(1, 0, COUNT - 1)
        assert all(data == bytes([e % 251]) * ENTRY for e, data in got)
        await bookie.close()
        again = await make_bookie(Path(d), entry_log_size=64 << 20, entry_log_direct_io=True)
        got = await again.read_entries(1, 0, COUNT - 1)
        assert [e for e, _ in got] == list(range(COUNT))
        await again.close()


@pytest.mark.parametrize("drop", [True, False])
def test_a_synced_log_without_entries_holds_no_data(tmp_path: Path, drop: bool) -> None:
    """O_DIRECT writes whole blocks, so a log holding only its header is one block of mostly zeros: it must
    still count as empty (a bookie without an index refuses to start next to logs holding data)."""
    writer = entry_log.EntryLogWriter(tmp_path, 1 << 20, direct_io=drop)
    writer.open()
    writer.sync()
    assert not entry_log.entry_log_has_data(tmp_path, writer.log_id)
    writer.add_many(1, [0], [b"x"])
    writer.sync()
    assert entry_log.entry_log_has_data(tmp_path, writer.log_id)
    writer.close()
