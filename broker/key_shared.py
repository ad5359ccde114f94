"""Key_Shared dispatch: messages with the same key go to the same consumer, in order.

Behaviour follows Apache Pulsar's classic (pre-4.0, "recently joined consumers") Key_Shared dispatcher:

- An entry's *sticky key* is its ordering key, else its partition key, else ``NONE_KEY`` (so keyless
  messages behave as one key, and a key-based batch is routed by the one key it carries). The key is
  hashed with Murmur3 32-bit (seed 0) and the sign bit cleared, as Pulsar's ``Murmur3_32Hash.makeHash``.
- Three selectors map a hash to a consumer: auto-split hash ranges over 65536 slots (the default),
  consistent hashing on a ring (``subscriptionKeySharedUseConsistentHashing=true``), and consumer
  declared ("sticky") ranges. The subscription's mode and its ``allowOutOfOrderDelivery`` come from the
  first consumer; a consumer asking for another mode is refused with ``ConsumerBusy`` as Pulsar does.
- Entries whose consumer cannot take them now are parked in the redelivery set (with their hash) and
  the dispatcher reads on for other keys, up to ``keySharedLookAheadMsgInReplayThresholdPerSubscription``
  parked entries (a memory bound, Pulsar 4's setting). A key's newer entries are held while an older one
  of the same hash is parked (Pulsar holds all of the consumer's entries in that batch; per hash is finer
  and still keeps each key in order). Parked entries are replayed before new reads, each consumer's
  oldest first.
- A consumer that joins while entries are outstanding records the read position: until the mark-delete
  position reaches it, it only receives entries published before it joined (unless out-of-order
  delivery is allowed). A departing consumer's unacknowledged entries go to the keys' new owners.
"""

from __future__ import annotations

import asyncio
import logging
from bisect import bisect_left, bisect_right, insort
from heapq import heapify, heappop, heappush
from itertools import pairwise
from typing import TYPE_CHECKING

import mmh3

from magnetar.broker.dispatcher import SharedDispatcher
from magnetar.broker.errors import BrokerError, ConsumerBusyError
from magnetar.broker.policies import setting
from magnetar.broker.protocol import pulsar_api_pb2 as pb
from magnetar.broker.protocol.frames import entry_meta
from magnetar.managed_ledger.api import Entry, Position

if TYPE_CHECKING:
    from magnetar.broker.consumer import Consumer
    from magnetar.broker.subscription import Subscription

log = logging.getLogger(__name__)

#: Hash slots of the range-based selectors (Pulsar's ``StickyKeyConsumerSelector.DEFAULT_RANGE_SIZE``, 2 << 15).
RANGE_SIZE = 2 << 15
#: Ring points per consumer when consistent hashing is on (Pulsar's default replica points).
DEFAULT_REPLICA_POINTS = 100
#: Entries the dispatcher may park for busy consumers before it stops reading ahead (memory bound; Pulsar 4's
#: ``keySharedLookAheadMsgInReplayThresholdPerSubscription`` default).
DEFAULT_LOOK_AHEAD = 20_000

_MODE_NAMES = {pb.AUTO_SPLIT: "AUTO_SPLIT", pb.STICKY: "STICKY"}


def sticky_key_hash(key: bytes) -> int:
    """Pulsar's sticky-key hash: Murmur3 x86 32-bit, seed 0, sign bit cleared (0 .. 2**31-1)."""
    return mmh3.hash(key, 0, signed=False) & 0x7FFF_FFFF


def _assign_error(message: str) -> BrokerError:
    return BrokerError(message, pb.ConsumerAssignError)


class StickyKeyConsumerSelector:
    """Maps a sticky-key hash to a consumer; ``add_consumer`` raises ``ConsumerAssignError`` to refuse one."""

    def add_consumer(self, consumer: Consumer) -> None:
        raise NotImplementedError

    def remove_consumer(self, consumer: Consumer) -> None:
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

    def __init__(self, points: int = DEFAULT_REPLICA_POINTS) -> None:
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


class KeySharedDispatcher(SharedDispatcher):
    """Key_Shared: each key's entries go, in order, to the consumer its hash selects."""

    def __init__(self, subscription: Subscription, max_read_batch: int) -> None:
        super().__init__(subscription, max_read_batch)
        config = subscription.topic.service.config
        self.use_consistent_hashing = bool(setting(config, "subscriptionKeySharedUseConsistentHashing", False))
        self.replica_points = int(
            setting(config, "subscriptionKeySharedConsistentHashingReplicaPoints", DEFAULT_REPLICA_POINTS)
        )
        self.look_ahead = int(
            setting(config, "keySharedLookAheadMsgInReplayThresholdPerSubscription", DEFAULT_LOOK_AHEAD)
        )
        self.mode: int = pb.AUTO_SPLIT
        self.allow_out_of_order = False
        self.selector: StickyKeyConsumerSelector = self._new_selector()
        #: Consumers that joined while entries were outstanding -> read position when they joined, ascending.
        self.recently_joined: dict[Consumer, Position] = {}
        #: Sticky-key hash of entries sent and not yet known to be acked, and of parked (redelivery) entries.
        self._hashes: dict[Position, int] = {}
        self._hashes_cap = 4096
        # Parked positions are indexed twice, as min-heaps: by hash (to hold a key's newer entries) and by
        # the hash's current owner (to replay each consumer's oldest first). Both drop entries lazily once
        # they leave ``redelivery`` (acked, or taken for replay): ``redelivery`` is the authority.
        self._held: dict[int, list[Position]] = {}
        self._queues: dict[Consumer | None, list[Position]] = {}
        self._queues_version = 0
        self._selector_version = 0
        self._held_adds = 0
        #: Parked positions whose hash is not known: read (replayed) before anything else to learn it.
        self._unknown: set[Position] = set()

    def _new_selector(self) -> StickyKeyConsumerSelector:
        if self.mode == pb.STICKY:
            return HashRangeExclusiveSelector()
        if self.use_consistent_hashing:
            return ConsistentHashingSelector(self.replica_points)
        return HashRangeAutoSplitSelector()

    # consumers
    def add_consumer(self, consumer: Consumer) -> None:
        meta = consumer.key_shared_meta
        mode = meta.keySharedMode if meta is not None else pb.AUTO_SPLIT
        out_of_order = bool(meta.allowOutOfOrderDelivery) if meta is not None else False
        if not self.consumers:
            if mode != self.mode or out_of_order != self.allow_out_of_order:
                # The first consumer decides the subscription's policy (Pulsar builds a new dispatcher).
                self.mode, self.allow_out_of_order = mode, out_of_order
                self.selector = self._new_selector()
                self._selector_version += 1
            self.recently_joined.clear()
        elif mode != self.mode:
            raise ConsumerBusyError(
                "Subscription is of different type. Active subscription key_shared mode of "
                f"'{_MODE_NAMES.get(self.mode)}' is different than the connecting consumer's key_shared mode "
                f"'{_MODE_NAMES.get(mode)}'."
            )
        elif out_of_order != self.allow_out_of_order:
            raise ConsumerBusyError(
                "Subscription is of different type. "
                + (
                    "Active subscription allows out of order delivery while the connecting consumer does not allow it."
                    if self.allow_out_of_order
                    else "Active subscription does not allow out of order delivery while the connecting consumer "
                    "allows it."
                )
            )
        self.selector.add_consumer(consumer)  # raises ConsumerAssignError to refuse
        self._selector_version += 1
        self.consumers.append(consumer)
        if not self.allow_out_of_order and len(self.consumers) > 1:
            # Entries were read but not all acknowledged: keys this consumer takes over may have older
            # messages in flight elsewhere, so it gets only entries before this point until they are acked.
            read = self.cursor.read_position
            if read > self.subscription.topic.ledger.next_position(self.cursor.mark_delete_position):
                joined = self.recently_joined
                joined[consumer] = read
                if len(joined) > 1 and read < max(joined.values()):
                    self.recently_joined = dict(sorted(joined.items(), key=lambda kv: kv[1]))
        self.start()
        self.wakeup()

    async def remove_consumer(self, consumer: Consumer) -> None:
        if consumer not in self.consumers:
            return
        # Out of the selector first, so its unacked entries are routed to the keys' new owners.
        self.selector.remove_consumer(consumer)
        self._selector_version += 1
        self.consumers.remove(consumer)
        self.recently_joined.pop(consumer, None)
        if len(self.consumers) <= 1:
            self.recently_joined.clear()
        self.redeliver(consumer.take_pending())

    def redeliver(self, positions: list[Position]) -> None:
        """Park ``positions`` (a consumer's unacked entries) for their keys' current owners."""
        for p in positions:
            self.subscription.count_redelivery(p)
        self.redelivery.update(positions)
        self._index_parked(positions)
        self.wakeup()

    def consumer_key_hash_ranges(self) -> dict[Consumer, list[tuple[int, int]]]:
        """Each consumer's hash ranges (for stats)."""
        return self.selector.key_hash_ranges()

    # the loop
    def _permits(self, consumer: Consumer) -> int:
        """Messages ``consumer`` may receive now (flow permits, capped by its unacked-messages limit)."""
        if not consumer.available:
            return 0
        permits = consumer.permits
        if consumer.max_unacked:
            permits = min(permits, consumer.max_unacked - consumer.unacked_messages)
        return permits

    def _budget(self) -> int:
        total = sum(self._permits(c) for c in self.consumers)
        return min(total, self.max_read_batch)

    def _release_recently_joined(self) -> None:
        """Drop recently joined consumers whose join position the mark-delete position has reached."""
        joined = self.recently_joined
        if not joined:
            return
        limit = self.subscription.topic.ledger.next_position(self.cursor.mark_delete_position)
        for c in [c for c, p in joined.items() if p <= limit]:
            del joined[c]

    def _limit(self, consumer: Consumer, replay: bool) -> Position | None:
        """Entries at or after this position may not go to ``consumer`` yet (None: no restriction)."""
        joined = self.recently_joined
        limit = joined.get(consumer)
        if limit is not None and replay:
            # Replayed entries are older than any read position, so they must also be older than the
            # earliest join: they may belong to a key an earlier newcomer is still waiting on.
            limit = min(limit, next(iter(joined.values())))
        return limit

    def _replay_candidates(self, budget: int) -> list[Position]:
        """Parked positions to replay now: unknown hashes first; else for each consumer that can receive, its
        oldest parked entries (at most ``max_read_batch``), so one busy consumer's backlog starves nobody."""
        redelivery = self.redelivery
        if not redelivery:
            return []
        if self._unknown:
            # Only these this round: an older entry of some key may be among them.
            self._unknown.intersection_update(redelivery)
            out = sorted(self._unknown)[:budget]
            self._unknown.difference_update(out)
            if out:
                return out
        if self._queues_version != self._selector_version:
            self._rebuild_queues()
        out = []
        queues = self._queues
        for consumer in self.consumers:
            queue = queues.get(consumer)
            if not queue:
                continue
            quota = min(self._permits(consumer), self.max_read_batch)
            limit = self._limit(consumer, True)
            last = None
            while queue and quota > 0:
                p = queue[0]
                if p not in redelivery or p == last:  # acked or taken meanwhile, or pushed twice
                    heappop(queue)
                    continue
                if limit is not None and p >= limit:
                    break
                last = heappop(queue)
                out.append(last)
                quota -= 1
        return out

    def _rebuild_queues(self) -> None:
        """Regroup parked positions by their hash's owner (after consumers joined or left)."""
        select, redelivery = self.selector.select, self.redelivery
        queues: dict[Consumer | None, list[Position]] = {}
        for h, heap in self._held.items():
            queues.setdefault(select(h), []).extend(p for p in heap if p in redelivery)
        for queue in queues.values():
            heapify(queue)
        self._queues = queues
        self._queues_version = self._selector_version

    def _may_read(self) -> bool:
        """Whether to read new entries: someone not restricted can take them, within the look-ahead bound."""
        if len(self.redelivery) >= self.look_ahead:
            return False
        if self._unknown:
            self._unknown.intersection_update(self.redelivery)
            if self._unknown:
                return False
        joined = self.recently_joined
        return any(c not in joined and self._permits(c) > 0 for c in self.consumers)

    async def _run(self) -> None:
        cursor = self.cursor
        while True:
            self._release_recently_joined()
            budget = self._budget()
            if budget <= 0:
                await self._wakeup.wait()
                self._wakeup.clear()
                continue
            positions = self._replay_candidates(budget)
            try:
                if positions:
                    self.redelivery.difference_update(positions)
                    try:
                        entries = await cursor.replay_entries(positions)
                    except BaseException:
                        # Not lost on failure or cancellation.
                        self.redelivery.update(positions)
                        self._index_parked(positions)
                        raise
                    replay = True
                elif self._may_read() and cursor.has_more_entries():
                    entries = await cursor.read_entries(budget)
                    replay = False
                else:
                    if self.subscription.topic.terminated and not self.redelivery and not cursor.has_more_entries():
                        for consumer in self.consumers:
                            consumer.notify_end_of_topic()
                    await self._wakeup.wait()
                    self._wakeup.clear()
                    continue
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("read failed on subscription %s; retrying", self.subscription.name)
                await asyncio.sleep(0.5)
                continue
            if entries:
                self._route(entries, replay)
            # Let other tasks (publishers, acks) run between batches.
            await asyncio.sleep(0)

    def _route(self, entries: list[Entry], replay: bool) -> None:
        """Send each entry to its key's consumer if allowed now; park the rest (in order, per key)."""
        select = self.selector.select
        metas = [entry_meta(e.data) for e in entries]
        entries, metas = self.delayed.hold(entries, metas)  # not yet due: kept by the tracker
        groups: dict[Consumer, list[int]] = {}
        for i, meta in enumerate(metas):
            h = sticky_key_hash(meta.sticky_key)
            consumer = select(h)
            if consumer is None:
                self._park(entries[i].position, h, None)
            else:
                groups.setdefault(consumer, []).append(i)
                self._hashes[entries[i].position] = h
        # Per-key order: hold an entry while an older one of its hash is parked (Pulsar skips this check
        # when out-of-order delivery is allowed).
        ordered = not self.allow_out_of_order
        parked = bool(self.redelivery)
        counts = self.subscription.redelivery_counts
        hashes = self._hashes
        first_held: dict[int, Position | None] = {}
        for consumer, indexes in groups.items():
            permits = self._permits(consumer)
            limit = self._limit(consumer, replay)
            out: list[Entry] = []
            out_metas = []
            for i in indexes:
                entry = entries[i]
                position = entry.position
                h = hashes[position]
                # Permits only shrink and the join limit is a position: once a key's entry is parked
                # here, its later ones in this batch are parked too.
                hold = permits <= 0 or (limit is not None and position >= limit)
                if not hold and ordered and parked:
                    if h not in first_held:
                        first_held[h] = self._first_parked(h)
                    earlier = first_held[h]
                    hold = earlier is not None and earlier < position
                if hold:
                    self._park(position, h, consumer)
                    continue
                out.append(entry)
                out_metas.append(metas[i])
                permits -= metas[i].num_messages
            if out:
                consumer.send(out, counts, out_metas)
        if len(hashes) > self._hashes_cap or self._held_adds > self._hashes_cap:
            self._compact()

    def release_delayed(self, positions: list[Position]) -> None:
        """Delayed entries that became due: replay them like parked ones (hashes are learnt on replay)."""
        self.redelivery.update(positions)
        self._index_parked(positions)
        self.wakeup()

    def _park(self, position: Position, h: int, owner: Consumer | None) -> None:
        """Keep an entry for later delivery (ahead of new reads)."""
        self.redelivery.add(position)
        self._hashes[position] = h
        self._index(position, h, owner)

    def _index(self, position: Position, h: int, owner: Consumer | None) -> None:
        heap = self._held.get(h)
        if heap is None:
            self._held[h] = [position]
        else:
            heappush(heap, position)
        if self._queues_version == self._selector_version:  # else the next scan regroups everything
            queue = self._queues.get(owner)
            if queue is None:
                self._queues[owner] = [position]
            else:
                heappush(queue, position)
        self._held_adds += 1

    def _index_parked(self, positions: list[Position]) -> None:
        """Index positions just added to ``redelivery`` by hash (or as unknown)."""
        hashes, select = self._hashes, self.selector.select
        for p in positions:
            h = hashes.get(p)
            if h is None:
                self._unknown.add(p)
            else:
                self._index(p, h, select(h))

    def _first_parked(self, h: int) -> Position | None:
        """The oldest parked position of hash ``h``."""
        heap = self._held.get(h)
        if heap is None:
            return None
        redelivery = self.redelivery
        while heap and heap[0] not in redelivery:
            heappop(heap)
        if not heap:
            del self._held[h]
            return None
        return heap[0]

    def _compact(self) -> None:
        """Forget hashes of acknowledged entries (amortised: runs when the maps doubled)."""
        redelivery = self.redelivery
        pending = [c.pending_acks for c in self.consumers]
        self._hashes = {p: h for p, h in self._hashes.items() if p in redelivery or any(p in q for q in pending)}
        held: dict[int, list[Position]] = {}
        for p in redelivery:
            h = self._hashes.get(p)
            if h is not None:
                held.setdefault(h, []).append(p)
        for heap in held.values():
            heapify(heap)
        self._held = held
        self._queues_version = -1  # regrouped from ``_held`` by the next scan
        self._unknown.intersection_update(redelivery)
        self._held_adds = 0
        self._hashes_cap = 2 * len(self._hashes) + 4096
