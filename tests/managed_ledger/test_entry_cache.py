"""EntryCache: byte budget shared by ledgers, read entries evicted first."""

from __future__ import annotations

import asyncio
import gc
import sys
import time
import tracemalloc

from magnetar.managed_ledger.api import Position as P
from magnetar.managed_ledger.api import make_position
from magnetar.managed_ledger.cache import AGE_OUT_SLICE, ENTRY_OVERHEAD, EntryCache
from magnetar.managed_ledger.factory import ManagedLedgerFactoryImpl
from tests.managed_ledger.conftest import config


def test_evicts_entries_read_by_everyone_first() -> None:
    cache = EntryCache(max_bytes=1000, entry_overhead=0)
    slow = {"a": P(1, 5), "b": P(1, 0)}
    a = cache.for_ledger("a", lambda: slow["a"])
    b = cache.for_ledger("b", lambda: slow["b"])
    for i in range(5):
        b.insert(P(1, i), b"x" * 100)
    for i in range(6):
        a.insert(P(1, i), b"y" * 100)  # 1100 bytes > budget: evict
    assert cache.size <= 850
    # a's entries 0..4 were read by all its cursors: they went first; b (unread) kept all
    assert len(b) == 5 and a.get(P(1, 5)) is not None and a.get(P(1, 0)) is None


def test_oldest_of_biggest_when_nothing_is_read() -> None:
    cache = EntryCache(max_bytes=1000, entry_overhead=0)
    a = cache.for_ledger("a", lambda: P(0, 0))
    b = cache.for_ledger("b", lambda: None)  # no open cursor: nobody will read these
    for i in range(9):
        a.insert(P(1, i), b"y" * 100)
    b.insert(P(1, 0), b"z" * 200)
    assert cache.size <= 850
    # b's entry had no reader left; then the oldest of a made room
    assert len(b) == 0 and a.get(P(1, 0)) is None and a.get(P(1, 1)) is not None
    a.insert(P(1, 9), b"y" * 300)
    assert cache.size <= 850 and a.get(P(1, 3)) is None and a.get(P(1, 4)) is not None
    a.evict_ledger(1)
    assert cache.size == 0
    a.close()
    assert cache.size == 0


def test_closing_a_replaced_slice_keeps_its_successor() -> None:
    cache = EntryCache(max_bytes=1000, entry_overhead=0)
    old = cache.for_ledger("t", lambda: None)
    new = cache.for_ledger("t", lambda: None)  # the ledger was reopened
    old.close()  # the old instance's late close must not detach the new slice
    for i in range(11):
        new.insert(P(1, i), b"x" * 100)
    assert cache.size <= 850  # the new slice is still managed, so eviction reached it


def test_budget_counts_each_entrys_overhead() -> None:
    # 100-byte payloads cost ~330 bytes each in memory: ten of them exceed a 2000-byte budget.
    cache = EntryCache(max_bytes=2000, entry_overhead=230)
    a = cache.for_ledger("a", lambda: None)
    for i in range(4):
        a.insert(P(1, i), b"x" * 100)
    assert cache.size == 4 * 330
    for i in range(4, 10):
        a.insert(P(1, i), b"x" * 100)
    assert cache.size <= 2000
    a.clear()
    assert cache.size == 0


def test_age_out_drops_what_the_previous_call_saw() -> None:
    cache = EntryCache(max_bytes=1 << 20, entry_overhead=0)
    a = cache.for_ledger("a", lambda: P(1, 0))
    b = cache.for_ledger("b", lambda: P(1, 0))
    a.insert(P(1, 0), b"old")
    cache.age_out()  # marks: nothing dropped yet
    assert a.get(P(1, 0)) == b"old"
    a.insert(P(1, 1), b"new")
    b.insert(P(1, 0), b"b0")
    cache.age_out()  # drops a's entries up to the mark; b's first one survives its first call
    assert a.get(P(1, 0)) is None and a.get(P(1, 1)) == b"new" and b.get(P(1, 0)) == b"b0"
    cache.age_out()
    assert len(a) == 0 and len(b) == 0 and cache.size == 0


def test_age_out_with_a_limit_drops_in_slices() -> None:
    """Dropping a second's worth of entries (20,000 at 20,000 msg/s) in one call stalled the loop
    13-30 ms: with ``limit`` a call drops at most that many, and :meth:`drop_aged` goes on."""
    cache = EntryCache(max_bytes=1 << 20, entry_overhead=0)
    a = cache.for_ledger("a", lambda: P(1, 0))
    for i in range(10):
        a.insert(P(1, i), b"x")
    assert cache.age_out(limit=4)  # marks only: nothing to drop yet
    a.insert(P(1, 10), b"new")
    assert not cache.age_out(limit=4) and len(a) == 7
    assert not cache.drop_aged(4) and len(a) == 3
    assert cache.drop_aged(4) and len(a) == 1 and a.get(P(1, 10)) == b"new" and cache.size == 3
    assert cache.drop_aged(4) and len(a) == 1  # nothing left to drop
    # A slice that ends exactly on the mark says it is done.
    a.insert(P(1, 11), b"y")
    cache.age_out()
    assert len(a) == 1 and a.get(P(1, 11)) == b"y"
    assert cache.age_out(limit=1) and len(a) == 0


async def test_the_factory_lets_the_loop_run_between_age_out_slices(store, memory_client) -> None:  # type: ignore[no-untyped-def]
    factory = ManagedLedgerFactoryImpl(store, memory_client, cache_eviction_seconds=0.05)
    try:
        await factory.open("public/default/persistent/age", config())  # arms the age-out timer
        x = factory.cache.for_ledger("x", lambda: None)
        n = 5 * AGE_OUT_SLICE
        for i in range(n):
            x.insert(P(1, i), b"e")
        seen: set[int] = set()
        deadline = time.monotonic() + 10
        while len(x) and time.monotonic() < deadline:  # bounded: aged out within ~0.1 s
            seen.add(len(x))
            await asyncio.sleep(0)
        assert len(x) == 0
        assert any(0 < s < n for s in seen), "the loop never ran while entries aged out"
    finally:
        await factory.close()


def _cached(n: int) -> tuple[EntryCache, list[bytes]]:
    cache = EntryCache(max_bytes=1 << 40)
    payloads = [bytes(100) + i.to_bytes(4, "little") for i in range(n)]
    return cache, payloads


def test_cached_entries_are_not_tracked_by_the_cyclic_gc() -> None:
    """A Position is a tuple subclass, which the collector tracks for as long as it lives: as keys, the
    cached entries of the last second filled the young generation at 20,000 msg/s and were walked by every
    collection. The cache keeps no tracked object per entry."""
    cache, payloads = _cached(5000)
    a = cache.for_ledger("a", lambda: None)
    gc.collect()
    before = len(gc.get_objects())
    for i, data in enumerate(payloads):
        a.insert(make_position((7, i)), data)
    assert len(gc.get_objects()) - before < 10
    assert a.get(P(7, 4999)) == payloads[4999] and a.get_at(7, 0) == payloads[0] and a.get(P(7, 5000)) is None


def test_entry_overhead_is_what_an_entry_costs() -> None:
    """ENTRY_OVERHEAD (counted per entry against the budget) is the memory an entry takes besides its
    payload: the bytes object's header, the key and the ordered dict's node (measured with tracemalloc)."""
    n = 20_000
    cache, payloads = _cached(n)
    a = cache.for_ledger("a", lambda: None)
    header = sys.getsizeof(payloads[0]) - len(payloads[0])
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i, data in enumerate(payloads):
            a.insert(make_position((123_456, i)), data)
        per_entry = (tracemalloc.get_traced_memory()[0] - before) / n + header
    finally:
        tracemalloc.stop()
    assert 0.85 * ENTRY_OVERHEAD <= per_entry <= ENTRY_OVERHEAD, per_entry


def test_keys_keep_position_order_across_ledgers_and_the_before_first_marker() -> None:
    cache = EntryCache(max_bytes=1 << 20, entry_overhead=0)
    a = cache.for_ledger("a", lambda: None)
    for pos in (P(3, 0), P(3, 2**40), P(4, 0), P(4, 1)):
        a.insert(pos, b"e")
    a.evict_before(P(4, -1))  # "before ledger 4's first entry": ledger 3 goes, all of it
    assert a.get(P(3, 2**40)) is None and a.get(P(4, 0)) == b"e"
    a.insert(P(5, 0), b"f")
    a.evict_ledger(4)
    assert len(a) == 1 and a.get(P(5, 0)) == b"f"
