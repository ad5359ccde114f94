"""A subscription: a cursor on the topic's managed ledger, its consumers and its dispatcher."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from magnetar.broker.consumer import Consumer, SubType
from magnetar.broker.dispatcher import Dispatcher, SharedDispatcher, SingleActiveConsumerDispatcher
from magnetar.broker.errors import ConsumerBusyError, NotAllowedError
from magnetar.broker.protocol.frames import parse_metadata
from magnetar.broker.stats import IDLE_METER, Meter
from magnetar.managed_ledger.api import Entry, ManagedCursor, Position

if TYPE_CHECKING:
    from magnetar.broker.topic import PersistentTopic

log = logging.getLogger(__name__)

SUB_TYPE_NAMES: dict[int, str] = {
    SubType.Exclusive: "Exclusive",
    SubType.Shared: "Shared",
    SubType.Failover: "Failover",
    SubType.Key_Shared: "Key_Shared",
}


class Subscription:
    """Acks, redelivery and seeks for one named subscription of a persistent topic."""

    # Slots: one of these per idle topic, ~60 bytes less each than an instance dict (CPython 3.11).
    __slots__ = (
        "_resetting",
        "_retired",
        "batch_index_acks",
        "consumers",
        "cursor",
        "dispatcher",
        "last_expire",
        "meter_expired",
        "meter_out",
        "name",
        "redelivery_counts",
        "sub_type",
        "topic",
    )

    def __init__(self, topic: PersistentTopic, name: str, cursor: ManagedCursor) -> None:
        self.topic = topic
        self.name = name
        self.cursor = cursor
        self.sub_type: int | None = None
        self.dispatcher: Dispatcher | None = None
        self._retired: asyncio.Task[None] | None = None
        self.consumers: list[Consumer] = []
        #: How often each pending position has been redelivered (sent in MESSAGE.redelivery_count).
        self.redelivery_counts: dict[Position, int] = {}
        self.batch_index_acks = topic.service.config.acknowledgment_at_batch_index_level_enabled
        self.meter_out = Meter()
        self.meter_expired = IDLE_METER  # a Meter of its own from the first expiry on
        self.last_expire = 0.0
        #: Set while a seek disconnects consumers, so a reader's subscription survives until it resubscribes.
        self._resetting = False

    @property
    def durable(self) -> bool:
        return self.cursor.durable

    def _make_dispatcher(self, sub_type: int) -> Dispatcher:
        batch = self.topic.service.config.dispatcher_max_read_batch_size
        if sub_type in (SubType.Exclusive, SubType.Failover):
            return SingleActiveConsumerDispatcher(self, batch, self.topic.name.partition_index)
        if sub_type == SubType.Shared:
            return SharedDispatcher(self, batch)
        if sub_type == SubType.Key_Shared:
            from magnetar.broker.key_shared import KeySharedDispatcher
            from magnetar.broker.key_shared_classic import ClassicKeySharedDispatcher

            if self.topic.service.config.subscription_key_shared_use_classic_persistent_implementation:
                return ClassicKeySharedDispatcher(self, batch)
            return KeySharedDispatcher(self, batch)
        raise NotAllowedError(f"Subscription type {SUB_TYPE_NAMES.get(sub_type, sub_type)} is not supported yet")

    def add_consumer(self, consumer: Consumer) -> None:
        """Attach a consumer; enforces the subscription type's rules (ConsumerBusy as Pulsar reports it)."""
        if self.consumers and self.sub_type != consumer.sub_type:
            raise ConsumerBusyError("Subscription is of different type")
        if consumer.sub_type == SubType.Exclusive and self.consumers:
            raise ConsumerBusyError("Exclusive consumer is already connected")
        eff = self.topic.effective
        limit = eff.max_consumers_per_subscription if eff else self.topic.service.config.max_consumers_per_subscription
        if limit and len(self.consumers) >= limit:
            raise ConsumerBusyError("Subscription reached max consumers limit")
        topic_limit = eff.max_consumers_per_topic if eff else 0
        if topic_limit and sum(len(s.consumers) for s in self.topic.subscriptions.values()) >= topic_limit:
            raise ConsumerBusyError("Topic reached max consumers limit")
        if eff is not None:
            consumer.set_max_unacked(eff.max_unacked_messages_per_consumer)
        self.topic.last_active = time.monotonic()
        if self.dispatcher is None or self.sub_type != consumer.sub_type:
            # No consumers left of the old type (else the type check above refused): retire its dispatcher.
            old = self.dispatcher
            self.dispatcher = self._make_dispatcher(consumer.sub_type)
            self.sub_type = consumer.sub_type
            if old is not None:
                self._retired = self.topic.service.tasks.spawn(old.close(), name=f"retire dispatcher {self.name}")
        self.dispatcher.add_consumer(consumer)  # may refuse (e.g. a Key_Shared range conflict)
        self.consumers.append(consumer)

    async def remove_consumer(self, consumer: Consumer) -> None:
        if consumer not in self.consumers:
            return
        self.consumers.remove(consumer)
        consumer.closed = True
        if self.dispatcher is not None and not self.topic.closed:
            # (a closed topic's cursors are closed: nothing to rewind or redeliver)
            await self.dispatcher.remove_consumer(consumer)
        if not self.consumers and not self.durable and not self._resetting:
            # A reader's (non-durable) subscription lives only as long as its consumer.
            await self.topic.remove_subscription(self.name)

    def wakeup(self) -> None:
        if self.dispatcher is not None:
            self.dispatcher.wakeup()

    # acknowledgements
    def ack_individual(self, consumer: Consumer | None, positions: list[Position]) -> None:
        """Individual acks (from ``consumer``, or from the admin API when None)."""
        for p in positions:
            if consumer is None or not consumer.acked(p):
                for other in self.consumers:
                    if other is not consumer and other.acked(p):
                        break
            self.redelivery_counts.pop(p, None)
        self.cursor.delete(positions)
        if self.dispatcher is not None:
            self.dispatcher.redelivery.difference_update(positions)
            self.dispatcher.wakeup()

    def ack_batch_indexes(self, consumer: Consumer, partial: list[tuple[Position, list[int]]]) -> None:
        """Acks of some messages of batch entries (``ack_set``: bit set = still unacked)."""
        if not self.batch_index_acks:
            return  # without batch-index tracking the entry stays pending until fully acked
        done: list[Position] = []
        for position, words in partial:
            if self.cursor.is_acked(position):
                continue
            current = self.cursor.batch_unacked(position)
            merged = [a & b for a, b in zip(current, words, strict=False)] if current else list(words)
            if any(merged):
                self.cursor.set_batch_unacked(position, merged)
            else:
                done.append(position)
        if done:
            self.ack_individual(consumer, done)

    def ack_cumulative(self, consumer: Consumer, position: Position) -> None:
        if self.sub_type in (SubType.Shared, SubType.Key_Shared):
            raise NotAllowedError("Cumulative ack is not supported for Shared subscription")
        self.ack_up_to(position)

    def count_redelivery(self, position: Position) -> None:
        self.redelivery_counts[position] = self.redelivery_counts.get(position, 0) + 1

    async def redeliver(self, consumer: Consumer, positions: list[Position] | None) -> None:
        """REDELIVER_UNACKNOWLEDGED_MESSAGES: with ids (Shared nacks) or all of the consumer's unacked."""
        dispatcher = self.dispatcher
        if dispatcher is None:
            return
        if isinstance(dispatcher, SharedDispatcher):
            dispatcher.redeliver(consumer.take_pending(positions))
        elif isinstance(dispatcher, SingleActiveConsumerDispatcher):
            await dispatcher.redeliver_all(consumer)

    async def reset(self, position: Position) -> None:
        """Seek: disconnect consumers (they resubscribe), then move the cursor so ``position`` is next."""
        self._resetting = True
        try:
            for consumer in list(self.consumers):
                consumer.disconnect()
                await self.remove_consumer(consumer)
            if self.dispatcher is not None:
                await self.dispatcher.stop()
                self.dispatcher.redelivery.clear()
            self.redelivery_counts.clear()
            await self.cursor.reset(position)
        finally:
            self._resetting = False

    async def unsubscribe(self, consumer: Consumer | None, force: bool = False) -> None:
        """Delete the subscription; refused while other consumers are connected unless forced."""
        others = [c for c in self.consumers if c is not consumer]
        if others and not force:
            raise ConsumerBusyError("Subscription has active connected consumers")
        for c in list(self.consumers):
            if c is not consumer:
                c.disconnect()
            await self.remove_consumer(c)
        await self.topic.delete_subscription(self.name)

    async def close(self) -> None:
        """Detach everything (consumers are told to reconnect) and release the cursor instance."""
        for consumer in list(self.consumers):
            consumer.disconnect()
            await self.remove_consumer(consumer)
        if self.dispatcher is not None:
            await self.dispatcher.close()

    def backlog(self) -> int:
        return self.cursor.backlog_entries()

    def _unacked_positions(self, limit: int) -> list[Position]:
        """Up to ``limit`` unacknowledged positions after the mark-delete position, in order."""
        ml = self.topic.ledger
        last = ml.last_confirmed_entry
        out: list[Position] = []
        pos = ml.next_position(self.cursor.mark_delete_position)
        while len(out) < limit and pos <= last:
            if not self.cursor.is_acked(pos):
                out.append(pos)
            pos = ml.next_position(pos)
        return out

    async def oldest_unacked_age(self) -> float:
        """Seconds since the oldest unacknowledged entry was published (0 when there is none)."""
        positions = self._unacked_positions(1)
        if not positions:
            return 0.0
        try:
            entry = await self.topic.ledger.read_entry(positions[0])
        except Exception:
            return 0.0
        metadata, _ = parse_metadata(entry.data)
        return max(0.0, time.time() - metadata.publish_time / 1000)

    def evict_backlog_to(self, target_bytes: int) -> None:
        """Skip the oldest entries until the estimated backlog is at most ``target_bytes``."""
        ml = self.topic.ledger
        if not ml.number_of_entries:
            return
        average = max(1, ml.total_size // ml.number_of_entries)
        excess = self.backlog() - target_bytes // average
        if excess > 0:
            self.skip_entries(excess)

    def skip_entries(self, count: int) -> None:
        """Acknowledge the next ``count`` unacknowledged entries (admin ``skip``)."""
        positions = self._unacked_positions(count)
        if positions:
            self.ack_individual(None, positions)

    def clear_backlog(self) -> None:
        """Acknowledge everything published so far (admin ``skip_all``)."""
        last = self.topic.ledger.last_confirmed_entry
        if last.entry_id >= 0 and last > self.cursor.mark_delete_position:
            self.ack_up_to(last)

    async def expire_older_than(self, seconds: int) -> None:
        """Acknowledge every entry published more than ``seconds`` ago (TTL, admin ``expireMessages``).

        Pulsar's rule (``MessageImpl.isEntryExpired``: ``now > publish_time + ttl``): an entry exactly
        ``seconds`` old is not expired yet, the same strict boundary as seeks by publish time."""
        cutoff_ms = int(time.time() * 1000) - seconds * 1000
        position = await self.topic.newest_published_before(cutoff_ms)
        if position is not None and position > self.cursor.mark_delete_position:
            before = self.backlog()
            self.ack_up_to(position)
            if self.meter_expired is IDLE_METER:
                self.meter_expired = IDLE_METER.fresh()
            self.meter_expired.add(max(0, before - self.backlog()), 0)
            self.last_expire = time.time()

    async def peek(self, nth: int) -> Entry | None:
        """The ``nth`` (1-based) unacknowledged entry, without consuming it."""
        positions = self._unacked_positions(nth)
        if len(positions) < nth:
            return None
        return await self.topic.ledger.read_entry(positions[nth - 1])

    def ack_up_to(self, position: Position) -> None:
        """Cumulative ack: everything up to ``position`` (consumers' pending entries included)."""
        for consumer in self.consumers:
            consumer.acked_up_to(position)
        if self.redelivery_counts:
            for p in [p for p in self.redelivery_counts if p <= position]:
                del self.redelivery_counts[p]
        if position > self.cursor.mark_delete_position:
            self.cursor.mark_delete(position)
        if self.dispatcher is not None:
            if self.dispatcher.redelivery:
                self.dispatcher.redelivery = {p for p in self.dispatcher.redelivery if p > position}
            self.dispatcher.wakeup()

    def backlog_size(self) -> int:
        """Estimated bytes of the backlog (entries times the topic's average entry size)."""
        ml = self.topic.ledger
        entries = ml.number_of_entries
        return self.backlog() * ml.total_size // entries if entries else 0

    def individually_deleted_text(self) -> str:
        """Acked ranges in Pulsar's internal-stats notation ``[(l:e1..l:e2]]``."""
        ranges = ", ".join(
            f"({first.ledger_id}:{first.entry_id - 1}..{last.ledger_id}:{last.entry_id}]"
            for first, last in self.cursor.acked_ranges()
        )
        return f"[{ranges}]"
