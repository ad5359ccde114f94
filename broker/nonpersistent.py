"""Non-persistent topics: messages live only in memory and go straight to connected consumers.

Nothing is stored: a SEND is acknowledged at once and delivered to every subscription's consumer
that has permits; a subscription without an available consumer drops the message (counted in
``msgDropRate``), as Pulsar's non-persistent topics do. All four subscription types work.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import mmh3

from magnetar.broker.consumer import Consumer, SubType
from magnetar.broker.errors import (
    ConsumerBusyError,
    NotAllowedError,
    ProducerBusyError,
    ServiceNotReadyError,
)
from magnetar.broker.protocol import pulsar_api_pb2 as pb
from magnetar.broker.protocol.frames import entry_meta
from magnetar.broker.stats import Meter
from magnetar.broker.topic_name import TopicName
from magnetar.managed_ledger.api import EARLIEST, Entry, Position

if TYPE_CHECKING:
    from magnetar.broker.policies import EffectivePolicies
    from magnetar.broker.producer import Producer, Send
    from magnetar.broker.service import BrokerService

#: Non-persistent messages are numbered in this "ledger" (ids are unique per topic instance).
_LEDGER = 0


class _NoCursor:
    """Stands in for a cursor: nothing is stored, so nothing is acknowledged or backlogged."""

    durable = False
    mark_delete_position = EARLIEST
    properties: dict[str, str] = {}

    async def flush(self) -> None:
        pass

    def backlog_entries(self) -> int:
        return 0

    def acked_ranges(self) -> list[tuple[Position, Position]]:
        return []

    def batch_unacked(self, position: Position) -> None:
        return None

    @property
    def read_position(self) -> Position:
        return EARLIEST


class _NoLedger:
    """Storage view of a non-persistent topic for stats: empty."""

    total_size = 0
    number_of_entries = 0
    properties: dict[str, str] = {}

    def __init__(self, topic: NonPersistentTopic) -> None:
        self._topic = topic

    @property
    def last_confirmed_entry(self) -> Position:
        return Position(_LEDGER, self._topic.sequence - 1)

    @property
    def first_position(self) -> Position:
        return Position(_LEDGER, 0)

    def next_position(self, position: Position) -> Position:
        return Position(position.ledger_id, position.entry_id + 1)

    def ledgers_info(self) -> list[dict[str, int]]:
        return []


class _NoDedup:
    enabled = False

    def last_sequence_id(self, producer_name: str) -> int:
        return -1


class NonPersistentSubscription:
    """A subscription of a non-persistent topic: consumers and in-memory dispatch only."""

    def __init__(self, topic: NonPersistentTopic, name: str) -> None:
        self.topic = topic
        self.name = name
        self.cursor = _NoCursor()
        self.sub_type: int | None = None
        self.consumers: list[Consumer] = []
        self.dispatcher = None
        self.redelivery_counts: dict[Position, int] = {}
        self.batch_index_acks = False
        self.meter_out = Meter()
        self.meter_expired = Meter()
        self.meter_dropped = Meter()
        self.last_expire = 0.0
        self._next = 0

    durable = False

    def add_consumer(self, consumer: Consumer) -> None:
        if self.consumers and self.sub_type != consumer.sub_type:
            raise ConsumerBusyError("Subscription is of different type")
        if consumer.sub_type == SubType.Exclusive and self.consumers:
            raise ConsumerBusyError("Exclusive consumer is already connected")
        self.sub_type = consumer.sub_type
        self.consumers.append(consumer)
        if consumer.sub_type == SubType.Failover:
            active = self._active()
            for c in self.consumers:
                c.notify_active(c is active)

    async def remove_consumer(self, consumer: Consumer) -> None:
        if consumer in self.consumers:
            self.consumers.remove(consumer)
            consumer.closed = True
            if self.sub_type == SubType.Failover and self.consumers:
                active = self._active()
                for c in self.consumers:
                    c.notify_active(c is active)
        if not self.consumers:
            self.topic.subscriptions.pop(self.name, None)

    def _active(self) -> Consumer | None:
        ranked = sorted(self.consumers, key=lambda c: (c.priority, c.name))
        if not ranked:
            return None
        index = self.topic.name.partition_index
        return ranked[index % len(ranked)] if index >= 0 else ranked[0]

    def deliver(self, entry: Entry) -> None:
        """Hand one message to a consumer with permits now, or drop it."""
        consumers = self.consumers
        target: Consumer | None = None
        if self.sub_type in (SubType.Exclusive, SubType.Failover):
            target = self._active()
        elif self.sub_type == SubType.Key_Shared and consumers:
            ranked = sorted(consumers, key=lambda c: c.name)
            key_hash = mmh3.hash(entry_meta(entry.data).sticky_key, signed=False)
            target = ranked[key_hash % len(ranked)]
        elif consumers:
            for _ in range(len(consumers)):
                self._next = (self._next + 1) % len(consumers)
                if consumers[self._next].available:
                    target = consumers[self._next]
                    break
        if target is None or not target.available:
            self.meter_dropped.add(1, len(entry.data))
            return
        target.send([entry], self.redelivery_counts)
        target.acked(entry.position)  # nothing to acknowledge: the message is gone once sent

    def wakeup(self) -> None:
        pass  # nothing is queued

    def ack_individual(self, consumer: Consumer | None, positions: list[Position]) -> None:
        pass

    def ack_batch_indexes(self, consumer: Consumer, partial: list[tuple[Position, list[int]]]) -> None:
        pass

    def ack_cumulative(self, consumer: Consumer, position: Position) -> None:
        if self.sub_type in (SubType.Shared, SubType.Key_Shared):
            raise NotAllowedError("Cumulative ack is not supported for Shared subscription")

    async def redeliver(self, consumer: Consumer, positions: list[Position] | None) -> None:
        pass  # nothing is kept to redeliver

    async def reset(self, position: Position) -> None:
        raise NotAllowedError("Seek is not supported on non-persistent topics")

    async def unsubscribe(self, consumer: Consumer | None, force: bool = False) -> None:
        others = [c for c in self.consumers if c is not consumer]
        if others and not force:
            raise ConsumerBusyError("Subscription has active connected consumers")
        for c in list(self.consumers):
            if c is not consumer:
                c.disconnect()
            await self.remove_consumer(c)
        self.topic.subscriptions.pop(self.name, None)

    async def close(self) -> None:
        for consumer in list(self.consumers):
            consumer.disconnect()
            await self.remove_consumer(consumer)

    def backlog(self) -> int:
        return 0

    def backlog_size(self) -> int:
        return 0

    def individually_deleted_text(self) -> str:
        return "[]"

    def count_redelivery(self, position: Position) -> None:
        pass

    async def expire_older_than(self, seconds: int) -> None:
        pass  # nothing is retained

    async def oldest_unacked_age(self) -> float:
        return 0.0


class NonPersistentTopic:
    """Producers and subscriptions of one non-persistent topic (or partition)."""

    def __init__(self, service: BrokerService, name: TopicName) -> None:
        self.service = service
        self.name = name
        self.producers: dict[str, Producer] = {}
        self.subscriptions: dict[str, NonPersistentSubscription] = {}
        self.meter_in = Meter()
        self.entries_added = 0
        self.sequence = 0
        self.terminated = False
        self.effective: EffectivePolicies | None = None
        self.quota_blocked: str | None = None
        self.topic_epoch: int | None = None
        self.exclusive_producer: Producer | None = None
        self.dedup = _NoDedup()
        self.ledger = _NoLedger(self)
        self.last_active = time.monotonic()
        self.closed = False

    async def initialize(self) -> None:
        pass

    def apply_policies(self, eff: EffectivePolicies) -> None:
        self.effective = eff

    async def sync_deduplication(self) -> None:
        pass

    async def check_new_producer(self) -> None:
        pass

    def has_connected_clients(self) -> bool:
        return bool(self.producers) or any(s.consumers for s in self.subscriptions.values())

    async def add_producer(
        self, producer: Producer, mode: int = pb.Shared, client_epoch: int | None = None, on_queued: object = None
    ) -> int | None:
        if self.closed:
            raise ServiceNotReadyError("Topic is being closed")
        if mode != pb.Shared:
            raise NotAllowedError("Exclusive producer access modes are not supported on non-persistent topics")
        existing = self.producers.get(producer.name)
        if existing is not None and not existing.closed:
            raise ProducerBusyError(f"Producer with name '{producer.name}' is already connected to topic")
        eff = self.effective
        limit = eff.max_producers_per_topic if eff else self.service.config.max_producers_per_topic
        if limit and len(self.producers) >= limit:
            raise ProducerBusyError("Topic reached max producers limit")
        self.producers[producer.name] = producer
        return None

    def remove_producer(self, producer: Producer) -> None:
        if self.producers.get(producer.name) is producer:
            del self.producers[producer.name]
            self.last_active = time.monotonic()  # as PersistentTopic: inactivity counts from here

    def disconnect_producers(self) -> None:
        for producer in list(self.producers.values()):
            producer.disconnect()
        self.producers.clear()

    def publish(self, producer: Producer, sends: Sequence[Send]) -> None:
        """Acknowledge at once and deliver to the subscriptions' available consumers."""
        slots = producer.enqueue(sends)
        first = Position(_LEDGER, self.sequence)
        self.sequence += len(sends)
        self.entries_added += len(sends)
        datas = [send[3] for send in sends]
        messages = sum(send[2] for send in sends)
        size = sum(map(len, datas))
        producer.meter.add(messages, size)
        self.meter_in.add(messages, size)
        producer.complete_run(slots, first)
        subscriptions = list(self.subscriptions.values())
        for k, data in enumerate(datas):
            entry = Entry(Position(_LEDGER, first.entry_id + k), data)
            for sub in subscriptions:
                sub.deliver(entry)

    async def subscribe(
        self, name: str, durable: bool, initial_position: int, start_message_id: pb.MessageIdData | None
    ) -> NonPersistentSubscription:
        sub = self.subscriptions.get(name)
        if sub is None:
            sub = NonPersistentSubscription(self, name)
            self.subscriptions[name] = sub
        return sub

    async def remove_subscription(self, name: str) -> None:
        sub = self.subscriptions.pop(name, None)
        if sub is not None:
            await sub.close()

    async def delete_subscription(self, name: str) -> None:
        await self.remove_subscription(name)

    async def last_message_id(self) -> tuple[Position, int]:
        return Position(_LEDGER, self.sequence - 1), -1

    async def find_position_by_publish_time(self, publish_time_ms: int) -> Position:
        raise NotAllowedError("Seek is not supported on non-persistent topics")

    async def terminate(self) -> Position:
        raise NotAllowedError("Termination of a non-persistent topic is not allowed")

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.disconnect_producers()
        for sub in list(self.subscriptions.values()):
            await sub.close()
        await asyncio.sleep(0)
