"""Key_Shared dispatch: messages with the same key go to the same consumer, in order.

Both of Pulsar 4's implementations, on the base read loop (:class:`~magnetar.broker.dispatcher.Dispatcher`):

- The subscription's mode (auto-split or sticky ranges, see :mod:`magnetar.broker.key_shared_selectors`) and
  its ``allowOutOfOrderDelivery`` come from the first consumer; a consumer asking for another mode is
  refused with ``ConsumerBusy`` as Pulsar does.
- Entries whose consumer cannot take them now are parked in the redelivery set (with their hash) and the
  dispatcher reads on for other keys, up to ``keySharedLookAheadMsgInReplayThresholdPerSubscription``
  parked entries (a memory bound). A key's newer entries are held while an older one of the same hash is
  parked. Parked entries are replayed before new reads, each consumer's oldest first. A departing
  consumer's unacknowledged entries go to the keys' new owners.
- Consumer changes, by default (:class:`KeySharedDispatcher`, PIP-379): a hash whose previous owner still
  has unacknowledged entries of it is *draining* (:mod:`magnetar.broker.draining_hashes`); its messages
  wait until those are acknowledged, nothing else waits. With
  ``subscriptionKeySharedUseClassicPersistentImplementation=true`` the pre-4.0 rule applies instead
  (:mod:`magnetar.broker.key_shared_classic`).
"""

from __future__ import annotations

import logging
from heapq import heapify, heappop, heappush
from typing import TYPE_CHECKING, Any

from magnetar.broker.dispatcher import SharedDispatcher
from magnetar.broker.draining_hashes import DrainingHashesTracker
from magnetar.broker.errors import ConsumerBusyError
from magnetar.broker.key_shared_selectors import (
    ConsistentHashingSelector,
    HashRangeAutoSplitSelector,
    HashRangeExclusiveSelector,
    StickyKeyConsumerSelector,
)
from magnetar.broker.protocol import pulsar_api_pb2 as pb
from magnetar.broker.protocol.frames import entry_meta
from magnetar.managed_ledger.api import Entry, Position

if TYPE_CHECKING:
    from magnetar.broker.consumer import Consumer
    from magnetar.broker.subscription import Subscription

log = logging.getLogger(__name__)

_MODE_NAMES: dict[int, str] = {pb.AUTO_SPLIT: "AUTO_SPLIT", pb.STICKY: "STICKY"}


class StickyKeyDispatcher(SharedDispatcher):
    """What both Key_Shared implementations share: the selector and subscription policy, parking entries whose
    consumer cannot take them now (indexed by hash and by owner) and replaying them fairly, on the base read
    loop. Subclasses add their rule for consumer changes through the hooks ``_consumer_added``,
    ``_consumer_removed``, ``_limit`` and ``_blocked``."""

    def __init__(self, subscription: Subscription, max_read_batch: int) -> None:
        super().__init__(subscription, max_read_batch)
        config = subscription.topic.service.config
        self.use_consistent_hashing = config.subscription_key_shared_use_consistent_hashing
        self.replica_points = config.subscription_key_shared_consistent_hashing_replica_points
        #: Entries parked for busy consumers before reading ahead stops (a memory bound).
        self.look_ahead = config.key_shared_look_ahead_msg_in_replay_threshold_per_subscription
        self.mode: int = pb.AUTO_SPLIT
        self.allow_out_of_order = False
        self.selector: StickyKeyConsumerSelector = self._new_selector()
        #: Key hash of every entry in flight (sent and unacked, or parked); forgotten once acknowledged.
        self._hashes: dict[Position, int] = {}
        self._hashes_cap = 4096
        #: Parked positions by hash (min-heaps; may hold stale positions, dropped when met).
        self._held: dict[int, list[Position]] = {}
        #: Parked positions by the consumer their hash maps to (None: no owner), rebuilt when consumers change.
        self._queues: dict[Consumer | None, list[Position]] = {}
        self._queues_version = -1
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
                self._forget_hashes()
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
        self._consumer_added(consumer)
        self.start()
        self.wakeup()

    async def remove_consumer(self, consumer: Consumer) -> None:
        if consumer not in self.consumers:
            return
        # Out of the selector first, so its unacked entries are routed to the keys' new owners.
        self.selector.remove_consumer(consumer)
        self._selector_version += 1
        self.consumers.remove(consumer)
        self.redeliver(consumer.take_pending())
        self._consumer_removed(consumer)

    def redeliver(self, positions: list[Position]) -> None:
        """Park ``positions`` (a consumer's unacked entries) for their keys' current owners."""
        for p in positions:
            self.subscription.count_redelivery(p)
        self.redelivery.update(positions)
        self._index_parked(positions)
        self.wakeup()

    def release_delayed(self, positions: list[Position]) -> None:
        """Delayed entries that became due: replay them like parked ones (hashes are learnt on replay)."""
        self.redelivery.update(positions)
        self._index_parked(positions)
        self.wakeup()

    def stats(self, consumers: list[tuple[Consumer, dict[str, Any]]]) -> dict[str, Any]:
        """Key_Shared fields of the subscription's stats; adds each consumer's to its stats in ``consumers``."""
        ranges = self.selector.key_hash_ranges()
        for c, out in consumers:
            out.update(self._consumer_stats(c, ranges.get(c, [])))
        return {
            "allowOutOfOrderDelivery": self.allow_out_of_order,
            "keySharedMode": _MODE_NAMES.get(self.mode, "AUTO_SPLIT"),
        }

    def _consumer_stats(self, consumer: Consumer, ranges: list[tuple[int, int]]) -> dict[str, Any]:
        """Key_Shared fields of one consumer's stats (``ranges``: its hash ranges)."""
        return {"keyHashRanges": [f"[{start}, {end}]" for start, end in ranges]}  # the classic form

    # hooks of the two implementations
    def _consumer_added(self, consumer: Consumer) -> None:
        """``consumer`` was added to the selector and the consumer list."""

    def _consumer_removed(self, consumer: Consumer) -> None:
        """``consumer`` left; its unacknowledged entries were parked for their keys' new owners."""

    def _limit(self, consumer: Consumer, replay: bool) -> Position | None:
        """Entries at or after this position may not go to ``consumer`` yet (None: no restriction)."""
        return None

    def _blocked(self, consumer: Consumer, key_hash: int) -> bool:
        """Whether entries of ``key_hash`` must wait although ``consumer`` could take them."""
        return False

    def _keep_order(self, replay: bool) -> bool:
        """Whether an entry waits while an older entry of its hash is parked."""
        return not self.allow_out_of_order

    # the read loop's hooks
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

    def _replay_failed(self, positions: list[Position]) -> None:
        self.redelivery.update(positions)
        self._index_parked(positions)

    def _may_read(self) -> bool:
        """Read new entries only within the look-ahead bound and once every parked entry's hash is known."""
        if len(self.redelivery) >= self.look_ahead:
            return False
        if self._unknown:
            self._unknown.intersection_update(self.redelivery)
            if self._unknown:
                return False
        return True

    def _replay_positions(self, budget: int) -> list[Position]:
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
        queues, hashes = self._queues, self._hashes
        for consumer in self.consumers:
            queue = queues.get(consumer)
            if not queue:
                continue
            quota = min(self._permits(consumer), self.max_read_batch)
            limit = self._limit(consumer, True)
            last = None
            blocked: set[int] = set()
            while queue and quota > 0:
                p = queue[0]
                if p not in redelivery or p == last:  # acked or taken meanwhile, or pushed twice
                    heappop(queue)
                    continue
                if limit is not None and p >= limit:
                    break
                last = heappop(queue)
                h = hashes.get(p)
                if h is not None and (h in blocked or self._blocked(consumer, h)):
                    # Stays parked, out of this queue until the hash is unblocked (then queues are rebuilt).
                    blocked.add(h)
                    continue
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

    def _requeue(self) -> None:
        """Regroup the parked positions on the next scan (hashes were unblocked)."""
        self._queues_version = -1

    def _dispatch(self, entries: list[Entry], replay: bool) -> None:
        """Send each entry to its key's consumer if allowed now; park the rest (in order, per key)."""
        select, key_hash = self.selector.select, self.selector.key_hash
        metas = [entry_meta(e.data) for e in entries]
        entries, metas = self.delayed.hold(entries, metas)  # not yet due: kept by the tracker
        groups: dict[Consumer, list[int]] = {}
        hashes = self._hashes
        for i, meta in enumerate(metas):
            h = key_hash(meta.sticky_key)
            consumer = select(h)
            if consumer is None:
                self._park(entries[i].position, h, None)
            else:
                groups.setdefault(consumer, []).append(i)
                hashes[entries[i].position] = h
        ordered = self._keep_order(replay)
        parked = bool(self.redelivery)
        counts = self.subscription.redelivery_counts
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
                # Permits only shrink, limits are positions and blocks last the batch: once a key's entry is
                # parked here, its later ones in this batch are parked too.
                hold = permits <= 0 or (limit is not None and position >= limit)
                if not hold and ordered and parked:
                    if h not in first_held:
                        first_held[h] = self._first_parked(h)
                    earlier = first_held[h]
                    hold = earlier is not None and earlier < position
                if hold or self._blocked(consumer, h):
                    self._park(position, h, consumer)
                    continue
                out.append(entry)
                out_metas.append(metas[i])
                permits -= metas[i].num_messages
            if out:
                consumer.send(out, counts, out_metas)
        if len(hashes) > self._hashes_cap or self._held_adds > self._hashes_cap:
            self._compact()

    # parked entries
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

    def _forget_hashes(self) -> None:
        """The selector (and so the hash function) changed: parked entries are read again to learn their hash."""
        self._hashes.clear()
        self._held.clear()
        self._unknown.update(self.redelivery)
        self._queues_version = -1

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


class KeySharedDispatcher(StickyKeyDispatcher):
    """Pulsar 4's Key_Shared (PIP-379): a hash that changes owner while its previous owner still has unacked
    entries of it drains first; nothing else waits for the consumer change (AUTO_SPLIT without out-of-order
    delivery; STICKY ranges and out-of-order subscriptions need no draining, as in Pulsar)."""

    def __init__(self, subscription: Subscription, max_read_batch: int) -> None:
        super().__init__(subscription, max_read_batch)
        self.draining = DrainingHashesTracker(self._unblocked)

    @property
    def draining_required(self) -> bool:
        return self.mode == pb.AUTO_SPLIT and not self.allow_out_of_order

    def _unblocked(self) -> None:
        self._requeue()
        self.wakeup()

    def _pending_removed(self, consumer: Consumer, position: Position) -> None:
        """An entry left ``consumer``'s pending acks: one fewer holding its hash if that hash drains."""
        if self.draining:
            h = self._hashes.get(position)
            if h is not None:
                self.draining.release(consumer, h)

    def _consumer_added(self, consumer: Consumer) -> None:
        if self.draining_required:
            consumer.on_pending_removed = self._pending_removed
            self._update_draining(consumer)

    def _consumer_removed(self, consumer: Consumer) -> None:
        consumer.on_pending_removed = None
        if not self.consumers:
            self.draining.clear()
        elif self.draining_required:
            self._update_draining(consumer)
            self.draining.consumer_removed(consumer)

    def _update_draining(self, changed: Consumer) -> None:
        """After the hash ranges changed: a hash that left a consumer holding unacked entries of it starts
        draining from that consumer; a draining hash that came back to its draining consumer stops."""
        tracker, select, hashes = self.draining, self.selector.select, self._hashes
        for c in self.consumers:
            if c is changed or not c.pending_acks:
                continue
            counts: dict[int, int] = {}
            for p in c.pending_acks:
                h = hashes.get(p)
                if h is not None:
                    counts[h] = counts.get(h, 0) + 1
            for h, n in counts.items():
                entry = tracker.get(h)
                if entry is None:
                    # Not draining, so ``c`` owned ``h`` until now (nobody else may hold its entries).
                    if select(h) is not c:
                        tracker.add(c, h, n)
                elif entry.consumer is c and select(h) is c:
                    tracker.reassigned(c, h)

    def _blocked(self, consumer: Consumer, key_hash: int) -> bool:
        return bool(self.draining) and self.draining.should_block(consumer, key_hash)

    def _keep_order(self, replay: bool) -> bool:
        # New reads always wait behind parked entries of their hash; replays may overtake when allowed.
        return not replay or not self.allow_out_of_order

    def _may_read(self) -> bool:
        return super()._may_read() and any(self._permits(c) > 0 for c in self.consumers)

    def stats(self, consumers: list[tuple[Consumer, dict[str, Any]]]) -> dict[str, Any]:
        out = super().stats(consumers)
        for key in ("drainingHashesCount", "drainingHashesClearedTotal", "drainingHashesUnackedMessages"):
            out[key] = sum(stats[key] for _, stats in consumers)
        return out

    def _consumer_stats(self, consumer: Consumer, ranges: list[tuple[int, int]]) -> dict[str, Any]:
        # PIP-379's form: ranges as [start, end] arrays, and the hashes draining from this consumer.
        return {"keyHashRangeArrays": [[start, end] for start, end in ranges], **self.draining.consumer_stats(consumer)}
