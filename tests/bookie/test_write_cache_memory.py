"""The write cache's limit (``dbStorage_writeCacheMaxSizeMb``) bounds the memory it holds, as BookKeeper's
does (there the entries are copied into the cache's own buffers): each cached entry counts the Python
objects that keep it (header bytes, key, dict slots) besides its bytes. Counting payload only, small
entries held ~2.3x the limit (a 16 MiB cache kept ~40 MiB of 100-byte messages until the checkpoint)."""

from __future__ import annotations

import asyncio
import gc
import tracemalloc
from pathlib import Path

from bookie_helpers import KEY

from magnetar.bookie import bookie as bookie_module
from magnetar.bookie import storage as storage_module
from magnetar.bookie.bookie import Bookie
from magnetar.ledger import digest

LIMIT = 1 << 20
# Where a cached entry's objects are allocated: its data and id (here), its header (digest), its dict slots
# (the bookie's write cache). Other threads' and other tests' allocations in the meantime are left out.
_CACHE_FILES = [
    tracemalloc.Filter(True, f) for f in (__file__, digest.__file__, bookie_module.__file__, storage_module.__file__)
]


def _cache_memory() -> int:
    return sum(t.size for t in tracemalloc.take_snapshot().filter_traces(_CACHE_FILES).traces)


async def test_small_entries_fill_the_write_cache_to_its_limit_in_memory(make_bookie, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    b: Bookie = await make_bookie(write_cache_max_bytes=LIMIT, journal_group_max_bytes=256 * 1024)
    done, sent = 0, 0
    all_done = asyncio.Event()

    def acked(error: BaseException | None) -> None:
        nonlocal done
        assert error is None
        done += 1
        if done == sent:
            all_done.set()

    size = 150  # a 100-byte message with its metadata: what a non-batched publish stores per entry
    sample = bytes(size)
    step = len(digest.frame_header(7, 0, size, sample)) + size
    tracemalloc.start()
    try:
        before = _cache_memory()
        n = 0
        all_done.set()  # nothing outstanding yet
        # Stop short of the limit, where the bookie would checkpoint (and empty the cache).
        while b.cache_bytes + 2 * step < LIMIT and n < 20_000:
            data = bytes([n % 251]) * size
            b.add_parts_async(7, n, KEY, n - 1, digest.frame_header(7, n, size, data), data, False, acked)
            n += 1
            sent = n
            all_done.clear()
        await asyncio.wait_for(all_done.wait(), 10)
        assert done == n
        held = _cache_memory() - before
    finally:
        tracemalloc.stop()
    assert n > 1000
    # What the cache holds in memory is what it counts, so the limit bounds it (within a few %).
    assert held <= 1.1 * LIMIT, f"{n} entries of {step} bytes hold {held / LIMIT:.2f}x the {LIMIT}-byte limit"
    assert b.cache_bytes >= 0.9 * held


async def test_cached_entries_are_not_tracked_by_the_cyclic_gc(make_bookie) -> None:  # type: ignore[no-untyped-def]
    """A ``(head, data)`` tuple per cached entry was tracked by the collector until a collection walked it:
    at 20,000 adds/s those filled the young generation every ~2.5 s. The cache keeps none."""
    b: Bookie = await make_bookie(write_cache_max_bytes=64 << 20)
    n = 5000
    datas = [bytes([i % 251]) * 100 for i in range(n)]
    heads = [digest.frame_header(9, i, 100, d) for i, d in enumerate(datas)]
    acks: list[BaseException | None] = []
    acked = acks.append  # one waiter for all: a bound method per add would be a tracked object per add
    gc.collect()
    before = len(gc.get_objects())
    for i in range(n):
        b.add_parts_async(9, i, KEY, i - 1, heads[i], datas[i], False, acked)
    tracked = len(gc.get_objects()) - before
    async with asyncio.timeout(10):
        while len(acks) < n:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    assert acks == [None] * n
    assert tracked < 0.05 * n, tracked
