"""Entry cache of recently added entries, bounded by bytes and shared by a factory's ledgers.

Tailing consumers read what producers just wrote; keeping those bytes avoids a ledger read per
dispatch. Each managed ledger gets a :class:`LedgerCache` (an ordered map: appends arrive in
position order, so its head is its oldest entry). When the shared budget is exceeded, entries
every open cursor has already read are dropped first, then the oldest entries of the largest
caches, down to a low-water mark so eviction is amortised over many inserts. Entries also age
out (Pulsar's ``managedLedgerCacheEvictionTimeThresholdMillis``): :meth:`EntryCache.age_out`, called
once per threshold by the factory, drops what was already cached at its previous call, a slice of
:data:`AGE_OUT_SLICE` entries per event-loop callback (:meth:`EntryCache.drop_aged`).

The budget is memory, not payload: each entry also counts :data:`ENTRY_OVERHEAD` bytes for its
Python objects, which outweigh a small message's payload.

Entries are keyed by an int made of the position (``(ledger_id << 64) + entry_id``), not by the :class:`Position`
itself: a Position is a tuple subclass, which the cyclic garbage collector tracks for as long as it lives
(it untracks only exact tuples of untracked items), so at 20,000 msg/s the ~20,000-40,000 cached keys
filled the young generation, were walked by every young collection, promoted, and walked again by the
older ones (11-16 ms and ~40 ms pauses). An int is never tracked.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Sequence

from magnetar.managed_ledger.api import Position

log = logging.getLogger(__name__)

#: Evict down to this fraction of the budget so eviction does not run on every insert.
LOW_WATER = 0.85
#: Bytes a cached entry costs besides its payload: the bytes object's header, the int key and the
#: ordered-dict node (measured with tracemalloc on CPython 3.11, ``tests/managed_ledger/test_entry_cache.py``).
ENTRY_OVERHEAD = 150
#: Entries time-based eviction drops per event-loop callback: at 20,000 msg/s one threshold's worth
#: (20,000-40,000 entries) took 13-30 ms in one go, and the loop stood still meanwhile.
AGE_OUT_SLICE = 2048


def _key(pos: Position) -> int:
    """The cache's key of a position: ordered as positions are (entry ids from -1 up to 2**63 - 1)."""
    return (pos[0] << 64) + pos[1]


class LedgerCache:
    """One managed ledger's slice of an :class:`EntryCache`."""

    __slots__ = ("_aged", "_entries", "_manager", "_mark", "name", "size", "slowest_reader")

    def __init__(self, manager: EntryCache, name: str, slowest_reader: Callable[[], Position | None]) -> None:
        self._manager = manager
        self.name = name
        #: Returns the smallest read position of open cursors (``None``: nobody will read).
        self.slowest_reader = slowest_reader
        self._entries: OrderedDict[int, bytes] = OrderedDict()  # _key(position) -> entry
        self.size = 0
        #: Key of the newest entry at the previous :meth:`age_out`: it and everything before it go at the next.
        self._mark: int | None = None
        #: The key :meth:`drop_aged` is dropping entries up to (inclusive), or ``None``.
        self._aged: int | None = None

    def __len__(self) -> int:
        return len(self._entries)

    def insert(self, pos: Position, data: bytes) -> None:
        """Cache a just-added entry (positions must arrive in increasing order)."""
        self.insert_run(pos[0], pos[1], (data,))

    def insert_run(self, ledger_id: int, first_entry_id: int, datas: Sequence[bytes]) -> None:
        """Cache just-added consecutive entries of one ledger (positions must arrive in increasing order)."""
        entries = self._entries
        key = (ledger_id << 64) + first_entry_id  # _key, inlined: every cached add passes here
        grown = 0
        overhead = self._manager.entry_overhead
        for data in datas:
            if key not in entries:
                entries[key] = data
                grown += len(data) + overhead
            key += 1
        m = self._manager
        self.size += grown
        m.size += grown
        if m.size > m.max_bytes:
            m.evict()

    def get(self, pos: Position) -> bytes | None:
        """The cached bytes of ``pos`` or ``None``."""
        return self._entries.get(_key(pos))

    def get_at(self, ledger_id: int, entry_id: int) -> bytes | None:
        """:meth:`get` for a reader walking entry ids (no Position built per entry)."""
        return self._entries.get((ledger_id << 64) + entry_id)

    def evict_before(self, pos: Position, *, inclusive: bool = False) -> int:
        """Drop entries before ``pos`` (and ``pos`` itself when ``inclusive``); returns bytes freed."""
        return self._drop_head(_key(pos), inclusive, -1)[0]

    def _drop_head(self, pos: int, inclusive: bool, limit: int) -> tuple[int, bool]:
        """Drop up to ``limit`` (``-1``: any number of) entries before the key ``pos`` (or up to it when
        ``inclusive``); returns the bytes freed and whether no such entry is left."""
        entries = self._entries
        overhead = self._manager.entry_overhead
        popitem = entries.popitem
        freed = 0
        done = True
        # Every cached entry passes here once: pop first and put back the one entry that stays (no
        # iterator per entry, one comparison for an entry before ``pos``).
        while entries:
            if limit == 0:
                first = next(iter(entries))
                done = first > pos or (first == pos and not inclusive)
                break
            key, data = popitem(False)
            if key >= pos and (key > pos or not inclusive):
                entries[key] = data
                entries.move_to_end(key, last=False)
                break
            limit -= 1
            freed += len(data) + overhead
        self._account(freed)
        return freed, done

    def age_out(self) -> None:
        """Mark what was cached at the previous call for :meth:`drop_aged`; remember the newest entry
        for the next call."""
        if self._mark is not None:
            self._aged = self._mark  # later than an earlier mark still being dropped: covers it
        self._mark = next(reversed(self._entries)) if self._entries else None

    def drop_aged(self, limit: int) -> tuple[int, bool]:
        """Drop up to ``limit`` of the entries :meth:`age_out` marked; returns how many were dropped
        and whether all of them are gone."""
        if self._aged is None:
            return 0, True
        before = len(self._entries)
        done = self._drop_head(self._aged, True, limit)[1]
        if done:
            self._aged = None
        return before - len(self._entries), done

    def evict_oldest(self, max_bytes: int) -> int:
        """Drop oldest entries until at least ``max_bytes`` are freed (or the cache is empty)."""
        entries = self._entries
        overhead = self._manager.entry_overhead
        freed = 0
        while entries and freed < max_bytes:
            freed += len(entries.popitem(last=False)[1]) + overhead
        self._account(freed)
        return freed

    def evict_ledger(self, ledger_id: int) -> None:
        """Drop every entry of one ledger (it was trimmed)."""
        doomed = [k for k in self._entries if k >> 64 == ledger_id]
        freed = sum(len(self._entries.pop(p)) + self._manager.entry_overhead for p in doomed)
        self._account(freed)

    def clear(self) -> None:
        """Drop everything."""
        freed = self.size
        self._entries.clear()
        self._account(freed)

    def close(self) -> None:
        """Drop everything and detach from the shared budget."""
        self.clear()
        self._manager.detach(self)

    def _account(self, freed: int) -> None:
        self.size -= freed
        self._manager.size -= freed


class EntryCache:
    """Byte-bounded cache shared by all managed ledgers of one factory."""

    def __init__(self, max_bytes: int, entry_overhead: int = ENTRY_OVERHEAD) -> None:
        self.max_bytes = max_bytes
        self.entry_overhead = entry_overhead
        self.size = 0
        self.evictions = 0
        self._caches: dict[str, LedgerCache] = {}

    def for_ledger(self, name: str, slowest_reader: Callable[[], Position | None]) -> LedgerCache:
        """Create (or replace) the slice for the managed ledger ``name``."""
        old = self._caches.pop(name, None)
        if old is not None:
            old.clear()
        cache = LedgerCache(self, name, slowest_reader)
        self._caches[name] = cache
        return cache

    def detach(self, cache: LedgerCache) -> None:
        """Stop managing ``cache`` (its ledger closed); a slice that replaced it stays."""
        if self._caches.get(cache.name) is cache:
            del self._caches[cache.name]

    def age_out(self, limit: int | None = None) -> bool:
        """Time-based eviction: every ledger's slice drops what it held at the previous call.

        With ``limit``, at most that many entries are dropped now; returns whether all are gone
        (if not, :meth:`drop_aged` goes on)."""
        for cache in self._caches.values():
            if len(cache):
                cache.age_out()
        return self.drop_aged(limit)

    def drop_aged(self, limit: int | None = None) -> bool:
        """Drop up to ``limit`` (``None``: all) of the entries the last :meth:`age_out` marked;
        returns whether all of them are gone."""
        left = -1 if limit is None else limit
        for cache in list(self._caches.values()):
            dropped, done = cache.drop_aged(left)
            if not done:
                return False
            if left >= 0:
                left -= dropped
        return True

    def evict(self) -> None:
        """Bring the total size below the low-water mark."""
        self.evictions += 1
        target = int(self.max_bytes * LOW_WATER)
        # 1. Entries already read by every open cursor of their ledger.
        for cache in list(self._caches.values()):
            if self.size <= target:
                return
            slowest = cache.slowest_reader()
            if slowest is None:
                cache.clear()
            else:
                cache.evict_before(slowest)
        # 2. Still too big: oldest entries first, biggest caches first.
        for cache in sorted(self._caches.values(), key=lambda c: c.size, reverse=True):
            if self.size <= target:
                return
            cache.evict_oldest(self.size - target)
