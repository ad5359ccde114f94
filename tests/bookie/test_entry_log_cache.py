"""Entry-log pages leave the page cache once they are on disk (``drop_entry_log_cache``).

Every byte of a checkpoint is written to a new page of an entry log; left in the page cache, those pages
make the cache grow by the whole write rate, and on this VM each new page costs ~8 µs of kernel time (the
host backs it on first touch): about 230 µs per 128 KiB entry, the largest single cost of batched publish.
Dropped once synced, the pages are freed and the next chunk reuses them. Residency is read with
``mincore(2)`` over a mapping of the file, so the test sees what the kernel holds, not what we think.
"""

from __future__ import annotations

import asyncio
import ctypes
import mmap
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
async def test_checkpointed_entry_log_pages_leave_the_page_cache(make_bookie, drop: bool) -> None:  # type: ignore[no-untyped-def]
    bookie = await make_bookie(entry_log_size=64 << 20, drop_entry_log_cache=drop)
    await fill_and_checkpoint(bookie)
    fractions = [resident_fraction(p) for p in entry_logs(bookie)]
    biggest = max(entry_logs(bookie), key=lambda p: p.stat().st_size)
    assert biggest.stat().st_size >= COUNT * ENTRY
    if drop:
        assert max(fractions) < 0.1, fractions
    else:  # the control: without dropping, what was just written is still cached
        assert resident_fraction(biggest) > 0.9, fractions
    # Either way every entry reads back intact (from the disk when it was dropped).
    got = await bookie.read_entries(1, 0, COUNT - 1)
    assert [e for e, _ in got] == list(range(COUNT))
    assert all(data == bytes([e % 251]) * ENTRY for e, data in got)


async def test_rolled_entry_logs_are_dropped_too(make_bookie) -> None:  # type: ignore[no-untyped-def]
    """Logs closed by rotation during a checkpoint are synced and dropped as well."""
    bookie = await make_bookie(entry_log_size=3 << 20, drop_entry_log_cache=True)
    await fill_and_checkpoint(bookie)
    logs = entry_logs(bookie)
    assert len(logs) >= 4
    assert all(resident_fraction(p) < 0.1 for p in logs), [resident_fraction(p) for p in logs]


async def test_without_o_direct_written_chunks_are_dropped(make_bookie, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """Where O_DIRECT is refused, each chunk goes through the page cache and is dropped once synced."""
    monkeypatch.setattr(entry_log, "_O_DIRECT", 0)
    bookie = await make_bookie(entry_log_size=64 << 20, drop_entry_log_cache=True)
    await fill_and_checkpoint(bookie)
    assert all(resident_fraction(p) < 0.1 for p in entry_logs(bookie))
    got = await bookie.read_entries(1, 0, COUNT - 1)
    assert all(data == bytes([e % 251]) * ENTRY for e, data in got)


async def test_odd_sized_syncs_read_back_after_restart(make_bookie, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """O_DIRECT writes whole blocks: a sync pads the partial last block, the next one rewrites it. Entries
    of odd sizes over many small checkpoints and a log rotation read back intact, also after a restart."""
    data_dir = tmp_path / "odd"
    bookie = await make_bookie(data_dir, entry_log_size=1 << 20, drop_entry_log_cache=True)
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
    again = await make_bookie(data_dir, entry_log_size=1 << 20, drop_entry_log_cache=True)
    got = await again.read_entries(1, 0, e - 1)
    assert dict(got) == expected
