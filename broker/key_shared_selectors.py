"""Key_Shared selectors: which consumer a sticky-key hash belongs to.

An entry's *sticky key* is its ordering key, else its partition key, else ``NONE_KEY`` (so keyless messages
behave as one key, and a key-based batch is routed by the one key it carries). The key is hashed with
Murmur3 32-bit (seed 0) and the sign bit cleared, as Pulsar's ``Murmur3_32Hash.makeHash``. Three selectors
map a hash to a consumer: auto-split hash ranges over 65536 slots (the default), consistent hashing on a
ring (``subscriptionKeySharedUseConsistentHashing=true``), and consumer declared ("sticky") ranges.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from itertools import pairwise
from typing import TYPE_CHECKING

import mmh3

from magnetar.broker.errors import BrokerError
from magnetar.broker.protocol import pulsar_api_pb2 as pb

if TYPE_CHECKING:
    from magnetar.broker.consumer import Consumer

#: Hash slots of the range-based selectors (Pulsar's ``StickyKeyConsumerSelector.DEFAULT_RANGE_SIZE``, 2 << 15).
RANGE_SIZE = 2 << 15


def sticky_key_hash(key: bytes) -> int:
    """Pulsar's sticky-key hash: Murmur3 x86 32-bit, seed 0, sign bit cleared (0 .. 2**31-1)."""
    return mmh3.hash(key, 0, signed=False) & 0x7FFF_FFFF


def slot_hash(key: bytes, range_size: int) -> int:
    """A key's slot in ``range_size`` hash slots, 0 mapped to 1 as Pulsar 4 does (0 means "no hash" there)."""
    return sticky_key_hash(key) % range_size or 1


def _assign_error(message: str) -> BrokerError:
    return BrokerError(message, pb.ConsumerAssignError)


class StickyKeyConsumerSelector:
    """Maps a sticky-key hash to a consumer; ``add_consumer`` raises ``ConsumerAssignError`` to refuse one."""

    def add_consumer(self, consumer: Consumer) -> None:
        raise NotImplementedError

    def remove_consumer(self, consumer: Consumer) -> None:
        raise NotImplementedError

    def key_hash(self, key: bytes) -> int:
        """The hash ``key`` is routed by (Pulsar 4's ``makeStickyKeyHash``; also what the stats report)."""
        raise NotImplementedError

    def select(self, key_hash: int) -> Consumer | None:
        """The consumer for ``key_hash`` (a :func:`sticky_key_hash` value), or None when nobody owns it."""
        raise NotImplementedError

    def key_hash_ranges(self) -> dict[Consumer, list[tuple[int, int]]]:
        """Inclusive hash ranges per consumer, in Pulsar's ``getConsumerKeyHashRanges`` notation."""
        raise NotImplementedError


class HashRangeAutoSplitSelector(StickyKeyConsumerSelector):
    """Auto-split hash ranges (Pulsar's ``HashRangeAutoSplitStickyKeyConsumerSelector``).

    Each consumer owns the slots up to and including its *upper bound*; a hash goes to the owner of the
    smallest bound >= ``hash % range_size``. The first consumer takes bound ``range_size``. A new consumer
    splits the largest range (the lowest one among equals) and takes its lower half. A leaving consumer's
    slots go to its right neighbour (the next bound up) -- except the top range, which the left neighbour
    extends into, so ``range_size`` stays a bound and every slot has an owner.
    """

    def __init__(self, range_size: int = RANGE_SIZE) -> None:
        if range_size < 2 or range_size & (range_size - 1):
            raise ValueError("range size must be a power of 2, at least 2")
        self.range_size = range_size
        self._bounds: list[int] = []  # sorted upper bounds
        self._owner: dict[int, Consumer] = {}
        self._bound_of: dict[Consumer, int] = {}

    def add_consumer(self, consumer: Consumer) -> None:
        if not self._bounds:
            self._put(self.range_size, consumer)
            return
        # Largest range, measured as ``bound - previous bound`` (0 below the first), first one wins ties.
        best, best_size, lower = self.range_size, 0, 0
        for bound in self._bounds:
            if bound - lower > best_size:
                best, best_size = bound, bound - lower
            lower = bound
        i = bisect_left(self._bounds, best)
        lower = self._bounds[i - 1] if i else 0
        if best - lower <= 1:
            raise _assign_error(f"No more range can assigned to new consumer, assigned consumers {len(self._bounds)}")
        self._put(best - ((best - lower) >> 1), consumer)

    def remove_consumer(self, consumer: Consumer) -> None:
        bound = self._bound_of.pop(consumer, None)
        if bound is None:
            return
        bounds = self._bounds
        if bound == self.range_size and len(bounds) > 1:
            # The top range merges into its left neighbour, whose bound moves up to range_size.
            left = bounds[-2]
            heir = self._owner.pop(left)
            del bounds[-2]
            self._owner[bound] = heir
            self._bound_of[heir] = bound
        else:
            # Removing the bound hands these slots to the next bound up (the right neighbour).
            del bounds[bisect_left(bounds, bound)]
            del self._owner[bound]

    def key_hash(self, key: bytes) -> int:
        return slot_hash(key, self.range_size)

    def select(self, key_hash: int) -> Consumer | None:
        bounds = self._bounds
        if not bounds:
            return None
        return self._owner[bounds[bisect_left(bounds, key_hash % self.range_size)]]

    def key_hash_ranges(self) -> dict[Consumer, list[tuple[int, int]]]:
        out: dict[Consumer, list[tuple[int, int]]] = {}
        start = 0
        for bound in self._bounds:
            out.setdefault(self._owner[bound], []).append((start, bound))
            start = bound + 1
        return out

    def _put(self, bound: int, consumer: Consumer) -> None:
        insort(self._bounds, bound)
        self._owner[bound] = consumer
        self._bound_of[consumer] = bound


class ConsistentHashingSelector(StickyKeyConsumerSelector):
    """Consistent hashing (Pulsar 3.x ``ConsistentHashingStickyKeyConsumerSelector``).

    Every consumer puts ``points`` points on a ring of 31-bit hashes; point ``i`` of a consumer named
    ``name`` is the sticky-key hash of ``name + "\\0" + name_index + "\\0" + i``, where ``name_index`` is
    the lowest index not used by another connected consumer of the same name (so same-named consumers get
    distinct points). A hash goes to the first point at or after it, wrapping around. On a point
    collision the later consumer takes the point; a consumer's points are removed only where it still
    owns them.
    """

    def __init__(self, points: int) -> None:
        if points < 1:
            raise ValueError("at least one ring point per consumer")
        self.points = points
        self._keys: list[int] = []  # sorted ring points
        self._ring: dict[int, Consumer] = {}
        #: consumer -> [name index, number of ring points it owns]
        self._members: dict[Consumer, list[int]] = {}
        self._used_indexes: dict[str, set[int]] = {}

    @staticmethod
    def point(name: str, name_index: int, i: int) -> int:
        """Ring position of point ``i`` of a consumer (Pulsar's ``calculateHashForConsumerAndIndex``)."""
        return sticky_key_hash(f"{name}\0{name_index}\0{i}".encode())

    def add_consumer(self, consumer: Consumer) -> None:
        member = self._members.get(consumer)
        if member is None:
            used = self._used_indexes.setdefault(consumer.name, set())
            index = 0
            while index in used:
                index += 1
            used.add(index)
            member = self._members[consumer] = [index, 0]
        ring = self._ring
        for i in range(self.points):
            member[1] += 1
            key = self.point(consumer.name, member[0], i)
            previous = ring.get(key)
            ring[key] = consumer
            if previous is None:
                insort(self._keys, key)
            else:
                self._release(previous)

    def remove_consumer(self, consumer: Consumer) -> None:
        member = self._members.get(consumer)
        if member is None:
            return
        ring, keys = self._ring, self._keys
        for i in range(self.points):
            key = self.point(consumer.name, member[0], i)
            if ring.get(key) is consumer:
                del ring[key]
                del keys[bisect_left(keys, key)]
                self._release(consumer)

    def _release(self, consumer: Consumer) -> None:
        """One ring point fewer for ``consumer``; its name index is freed with its last point."""
        member = self._members[consumer]
        member[1] -= 1
        if member[1] == 0:
            del self._members[consumer]
            used = self._used_indexes[consumer.name]
            used.discard(member[0])
            if not used:
                del self._used_indexes[consumer.name]

    def key_hash(self, key: bytes) -> int:
        return sticky_key_hash(key)  # the whole 31-bit ring, as Pulsar 3.x

    def select(self, key_hash: int) -> Consumer | None:
        keys = self._keys
        if not keys:
            return None
        i = bisect_left(keys, key_hash)
        return self._ring[keys[i if i < len(keys) else 0]]

    def key_hash_ranges(self) -> dict[Consumer, list[tuple[int, int]]]:
        out: dict[Consumer, list[tuple[int, int]]] = {}
        start = 0
        for key in self._keys:
            out.setdefault(self._ring[key], []).append((start, key))
            start = key + 1
        if self._keys and start <= 0x7FFF_FFFF:
            # Past the last point the ring wraps to the first one.
            out[self._ring[self._keys[0]]].append((start, 0x7FFF_FFFF))
        return out


class HashRangeExclusiveSelector(StickyKeyConsumerSelector):
    """Consumer-declared ("sticky") ranges (Pulsar's ``HashRangeExclusiveStickyKeyConsumerSelector``).

    Ranges are inclusive over ``hash % range_size``. A consumer is refused (``ConsumerAssignError``) when
    it declares no range, a range with start > end or outside [0, 65536] (the Java client's bound), ranges
    that overlap each other, or a range overlapping another consumer's. Lookup follows Pulsar: the owners
    of the nearest range endpoints at or below and at or above the slot must be the same consumer -- so a
    gap between two ranges of one consumer also goes to it, and other gaps belong to nobody (their
    entries wait until a consumer covering them subscribes).
    """

    def __init__(self, range_size: int = RANGE_SIZE) -> None:
        self.range_size = range_size
        self._points: list[int] = []  # sorted range endpoints
        self._owner: dict[int, Consumer] = {}
        self._ranges: dict[Consumer, list[tuple[int, int]]] = {}

    def add_consumer(self, consumer: Consumer) -> None:
        ranges = self._validate(consumer)
        for start, end in ranges:
            for point in (start, end):
                if point not in self._owner:
                    insort(self._points, point)
                self._owner[point] = consumer
        self._ranges[consumer] = ranges

    def _validate(self, consumer: Consumer) -> list[tuple[int, int]]:
        meta = consumer.key_shared_meta
        if meta is None:
            raise _assign_error("Must specify key shared meta for consumer.")
        ranges = [(r.start, r.end) for r in meta.hashRanges]
        if not ranges:
            raise _assign_error("Ranges for KeyShared policy must not be empty.")
        for start, end in ranges:
            if start > end:
                raise _assign_error("Fixed hash range start > end")
            if start < 0 or end > self.range_size:
                raise _assign_error(f"Ranges must be [0, {self.range_size - 1}] but provided range is [{start}, {end}]")
            for other, taken in self._ranges.items():
                if any(max(start, s) <= min(end, e) for s, e in taken):
                    raise _assign_error(f"Range conflict with consumer {other.name}")
        for (s1, e1), (s2, e2) in pairwise(sorted(ranges)):
            if s2 <= e1:
                raise _assign_error(f"Key hash ranges with overlap between [{s1}, {e1}] and [{s2}, {e2}]")
        return ranges

    def remove_consumer(self, consumer: Consumer) -> None:
        if self._ranges.pop(consumer, None) is None:
            return
        gone = [p for p, c in self._owner.items() if c is consumer]
        for point in gone:
            del self._owner[point]
            del self._points[bisect_left(self._points, point)]

    def key_hash(self, key: bytes) -> int:
        return slot_hash(key, self.range_size)

    def select(self, key_hash: int) -> Consumer | None:
        points = self._points
        if not points:
            return None
        slot = key_hash % self.range_size
        i = bisect_right(points, slot)  # points[i-1] <= slot < points[i]
        if i == 0:
            return None
        floor = self._owner[points[i - 1]]
        if points[i - 1] == slot:
            return floor
        if i == len(points):
            return None
        return floor if self._owner[points[i]] is floor else None

    def key_hash_ranges(self) -> dict[Consumer, list[tuple[int, int]]]:
        return {c: sorted(r) for c, r in self._ranges.items()}
