"""A persistent topic: producers append entries to its managed ledger; subscriptions read them."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING

from magnetar.broker.dedup import Deduplication, Verdict
from magnetar.broker.errors import (
    BrokerError,
    NotAllowedError,
    ProducerBusyError,
    ServiceNotReadyError,
    SubscriptionNotFoundError,
    TopicTerminatedError,
)
from magnetar.broker.policies import EffectivePolicies
from magnetar.broker.producer import Producer, PublishSlot, Send
from magnetar.broker.protocol import pulsar_api_pb2 as pb
from magnetar.broker.protocol.frames import entry_num_messages, parse_metadata
from magnetar.broker.stats import Meter
from magnetar.broker.subscription import Subscription
from magnetar.broker.topic_name import TopicName
from magnetar.managed_ledger.api import (
    EARLIEST,
    LATEST,
    Entry,
    InitialPosition,
    ManagedLedger,
    ManagedLedgerError,
    ManagedLedgerFencedError,
    Position,
)

if TYPE_CHECKING:
    from magnetar.broker.service import BrokerService

log = logging.getLogger(__name__)

#: Managed-ledger property marking a terminated topic (value: position of its last entry).
TERMINATED_PROPERTY = "magnetar.terminated"
#: Managed-ledger property holding the topic epoch of exclusive producers.
TOPIC_EPOCH_PROPERTY = "magnetar.topicEpoch"
#: Cursors of the broker's own bookkeeping (e.g. deduplication), not subscriptions.
INTERNAL_CURSOR_PREFIX = "pulsar."
#: The message id Pulsar returns for a deduplicated send.
DUPLICATE_POSITION = Position(-1, -1)


class PersistentTopic:
    """Producers, subscriptions and the managed ledger of one (partition of a) topic."""

    # Slots: one of these per idle topic, ~60 bytes less each than an instance dict (CPython 3.11).
    __slots__ = (
        "_exclusive_waiters",
        "_loop",
        "closed",
        "dedup",
        "effective",
        "entries_added",
        "exclusive_producer",
        "last_active",
        "ledger",
        "meter_in",
        "name",
        "producers",
        "quota_blocked",
        "service",
        "subscriptions",
        "terminated",
        "topic_epoch",
    )

    def __init__(self, service: BrokerService, name: TopicName, ledger: ManagedLedger) -> None:
        self.service = service
        self.name = name
        self.ledger = ledger
        self.producers: dict[str, Producer] = {}
        self.subscriptions: dict[str, Subscription] = {}
        self.meter_in = Meter()
        self.entries_added = 0
        self.terminated = TERMINATED_PROPERTY in ledger.properties
        self.effective: EffectivePolicies | None = None
        #: The backlog-quota policy currently refusing producers (``producer_request_hold`` / ``_exception``).
        self.quota_blocked: str | None = None
        self.last_active = time.monotonic()
        self.dedup = Deduplication(self)
        # Producer access modes: the exclusive owner, its epoch, and producers waiting for exclusivity.
        self.exclusive_producer: Producer | None = None
        epoch = ledger.properties.get(TOPIC_EPOCH_PROPERTY)
        self.topic_epoch: int | None = int(epoch) if epoch is not None else None
        # A list, not a deque: rarely used, and an empty deque costs 760 bytes on every topic.
        self._exclusive_waiters: list[tuple[Producer, asyncio.Future[None]]] = []
        self.closed = False
        self._loop = asyncio.get_running_loop()

    async def initialize(self) -> None:
        """Attach a subscription to every durable cursor recovered by the managed ledger (internal
        ``pulsar.*`` cursors excluded), and bring deduplication to the configured state."""
        for name, cursor in self.ledger.cursors.items():
            if cursor.durable and name not in self.subscriptions and not name.startswith(INTERNAL_CURSOR_PREFIX):
                self.subscriptions[name] = Subscription(self, name, cursor)
        await self.sync_deduplication()

    async def sync_deduplication(self) -> None:
        want = bool(self.effective and self.effective.deduplication_enabled)
        if want and not self.dedup.enabled:
            await self.dedup.enable()
        elif not want and self.dedup.enabled:
            await self.dedup.disable()

    def apply_policies(self, eff: EffectivePolicies) -> None:
        """Take new effective policies into use (at load, and whenever they change)."""
        self.effective = eff
        config = self.ledger.config
        # -1 means unlimited in both Pulsar's policy and the managed-ledger config.
        minutes, megabytes = eff.retention_time_minutes, eff.retention_size_mb
        config.retention_time_seconds = minutes * 60 if minutes >= 0 else -1
        config.retention_size_bytes = megabytes * 1024 * 1024 if megabytes >= 0 else -1
        config.ensemble_size = eff.ensemble_size
        config.write_quorum = eff.write_quorum
        config.ack_quorum = eff.ack_quorum
        for sub in self.subscriptions.values():
            for consumer in sub.consumers:
                consumer.set_max_unacked(eff.max_unacked_messages_per_consumer)

    async def check_new_producer(self) -> None:
        """Refuse a producer while the topic is over a blocking backlog quota (Pulsar's errors)."""
        from magnetar.broker.housekeeping import enforce_backlog_quota

        if self.effective is not None:
            await enforce_backlog_quota(self, self.effective)
        if self.quota_blocked == "producer_request_hold":
            raise BrokerError(
                "Cannot create producer on topic with backlog quota exceeded", pb.ProducerBlockedQuotaExceededError
            )
        if self.quota_blocked == "producer_exception":
            raise BrokerError(
                "Cannot create producer on topic with backlog quota exceeded", pb.ProducerBlockedQuotaExceededException
            )

    def disconnect_producers(self) -> None:
        for producer in list(self.producers.values()):
            producer.disconnect()
        self.producers.clear()

    def has_connected_clients(self) -> bool:
        return bool(self.producers) or any(sub.consumers for sub in self.subscriptions.values())

    # producers
    def _check_can_add(self, producer: Producer) -> None:
        if self.closed:
            raise ServiceNotReadyError("Topic is being closed")
        if self.terminated:
            raise TopicTerminatedError("Topic was already terminated")
        existing = self.producers.get(producer.name)
        if existing is not None and not existing.closed:
            raise ProducerBusyError(f"Producer with name '{producer.name}' is already connected to topic")
        eff = self.effective
        limit = eff.max_producers_per_topic if eff else self.service.config.max_producers_per_topic
        if limit and len(self.producers) >= limit:
            raise ProducerBusyError("Topic reached max producers limit")

    async def add_producer(
        self,
        producer: Producer,
        mode: int = pb.Shared,
        client_epoch: int | None = None,
        on_queued: Callable[[], None] | None = None,
    ) -> int | None:
        """Attach a producer under its access mode; returns the topic epoch for exclusive modes.

        Shared fails with ProducerBusy while an exclusive producer exists; Exclusive fails with
        ProducerFenced when any producer exists; ExclusiveWithFencing disconnects (fences) the
        current producers; WaitForExclusive queues (``on_queued`` is called) until the topic is free.
        """
        self._check_can_add(producer)
        if mode == pb.Shared:
            if self.exclusive_producer is not None:
                raise ProducerBusyError("Topic has an existing exclusive producer")
            self._attach(producer)
            return None
        if mode == pb.Exclusive:
            if self.exclusive_producer is not None or self.producers:
                raise BrokerError("Topic has existing producers", pb.ProducerFenced)
        elif mode == pb.ExclusiveWithFencing:
            self.disconnect_producers()
        elif mode == pb.WaitForExclusive:
            if self.exclusive_producer is not None or self.producers or self._exclusive_waiters:
                waiter = self._loop.create_future()
                self._exclusive_waiters.append((producer, waiter))
                if on_queued is not None:
                    on_queued()
                await waiter
                self._check_can_add(producer)
        else:
            raise NotAllowedError(f"Unknown producer access mode {mode}")
        if client_epoch is not None and self.topic_epoch is not None and client_epoch < self.topic_epoch:
            # Another exclusive producer took over meanwhile: this one stays fenced.
            self._grant_next_waiter()
            raise BrokerError("Topic epoch has moved on: the producer was fenced", pb.ProducerFenced)
        if client_epoch is None or client_epoch != self.topic_epoch:
            self.topic_epoch = (self.topic_epoch or 0) + 1
            await self.ledger.set_properties({TOPIC_EPOCH_PROPERTY: str(self.topic_epoch)})
        self.exclusive_producer = producer
        self._attach(producer)
        return self.topic_epoch

    def _attach(self, producer: Producer) -> None:
        self.producers[producer.name] = producer
        if self.dedup.enabled:
            self.dedup.producer_connected(producer.name)

    def remove_producer(self, producer: Producer) -> None:
        if self.producers.get(producer.name) is producer:
            del self.producers[producer.name]
            # Inactivity counts from here (as Pulsar's handleProducerRemoved), not from each publish:
            # while a producer is attached the topic is active anyway, and the hot path reads no clock.
            self.last_active = time.monotonic()
            if self.dedup.enabled:
                self.dedup.producer_disconnected(producer.name)
        if self.exclusive_producer is producer:
            self.exclusive_producer = None
            self._grant_next_waiter()

    def _grant_next_waiter(self) -> None:
        while self._exclusive_waiters and not self.producers and self.exclusive_producer is None:
            producer, waiter = self._exclusive_waiters.pop(0)
            if not producer.closed and not waiter.done():
                waiter.set_result(None)
                return

    def publish(self, producer: Producer, sends: Sequence[Send]) -> None:
        """Append ``producer``'s SENDs in order, one entry each (a message or a whole batch); each receipt is
        sent once its entry is durable, in SEND order. The connection hands over a socket read's worth at once:
        the managed ledger stores them with one callback per run of stored entries."""
        slots = producer.enqueue(sends)
        error = None
        if self.terminated:
            error = (pb.TopicTerminatedError, "Topic was already terminated")
        elif not self.service.may_write():  # lost the ownership lease: never write again
            error = (pb.PersistenceError, "This broker no longer owns the topic")
        if error is not None:
            for slot in slots:
                producer.complete(slot, None, error)
            return
        if self.dedup.enabled:
            slots, sends = self._new_sends(producer, slots, sends)
            if not slots:
                return
        datas = [send[3] for send in sends]
        messages = sum(send[2] for send in sends)
        size = sum(map(len, datas))
        producer.meter.add(messages, size)
        self.meter_in.add(messages, size)
        # No task per publish: the managed ledger calls back once entries are durable (or failed).
        self.ledger.add_entries_async(datas, partial(self._persisted, producer, slots))

    def _new_sends(
        self, producer: Producer, slots: list[PublishSlot], sends: Sequence[Send]
    ) -> tuple[list[PublishSlot], list[Send]]:
        """Deduplication: answer duplicates (and sends whose first copy is still being stored) at once; returns
        the slots and sends left to store."""
        dedup = self.dedup
        kept_slots: list[PublishSlot] = []
        kept: list[Send] = []
        for slot, send in zip(slots, sends, strict=True):
            verdict = dedup.check(producer.name, slot.sequence_id, slot.highest_sequence_id)
            if verdict is Verdict.DUPLICATE:
                producer.complete(slot, DUPLICATE_POSITION)
            elif verdict is Verdict.UNKNOWN:
                producer.complete(slot, None, (pb.PersistenceError, "Duplicate message still being persisted"))
            else:
                kept_slots.append(slot)
                kept.append(send)
        return kept_slots, kept

    def _persisted(
        self,
        producer: Producer,
        slots: list[PublishSlot],
        index: int,
        position: Position | None,
        count: int,
        exc: BaseException | None,
    ) -> None:
        """``count`` sends from ``slots[index]`` were stored from ``position`` on (or that one failed)."""
        if exc is not None:
            # Every SEND ends in a receipt or an error: receipts leave in order, so one slot left
            # open would strand every later send of this producer.
            slot = slots[index]
            self._publish_failed(producer)
            if isinstance(exc, ManagedLedgerFencedError):
                producer.complete(slot, None, (pb.PersistenceError, "Topic is fenced: another broker owns it"))
                self.service.tasks.spawn(self.service.unload_topic(self), name=f"unload {self.name}")
            else:  # storage failure: the client retries after the error
                log.warning("publish failed on %s: %r", self.name, exc)
                producer.complete(slot, None, (pb.PersistenceError, f"Failed to persist message: {exc!r}"))
            return
        assert position is not None
        self.entries_added += count
        stored = slots[index : index + count]
        if self.dedup.enabled:
            ledger_id, entry_id = position
            for k, slot in enumerate(stored):
                self.dedup.on_persisted(
                    producer.name, slot.sequence_id, slot.highest_sequence_id, Position(ledger_id, entry_id + k)
                )
        producer.complete_run(stored, position)
        if self.subscriptions:  # most published-to topics of a benchmark or a new app have none
            for sub in self.subscriptions.values():
                sub.wakeup()

    def _publish_failed(self, producer: Producer) -> None:
        if self.dedup.enabled:
            self.dedup.on_failed(producer.name)

    # subscriptions
    async def subscribe(
        self,
        name: str,
        durable: bool,
        initial_position: int,
        start_message_id: pb.MessageIdData | None,
    ) -> Subscription:
        """Get or create the subscription ``name``."""
        sub = self.subscriptions.get(name)
        if sub is not None:
            # As Pulsar does: a non-durable consumer joins an existing subscription of that name; a durable
            # one cannot take over a reader's in-memory subscription.
            if durable and not sub.durable:
                raise NotAllowedError(f"Subscription {name} exists as a non-durable subscription")
            return sub
        if durable:
            allowed = (
                self.effective.allow_auto_subscription_creation
                if self.effective
                else self.service.config.allow_auto_subscription_creation
            )
            if not allowed and name not in self.ledger.cursors:
                raise SubscriptionNotFoundError(f"Subscription {name} does not exist")
            start = (
                InitialPosition.EARLIEST if initial_position == pb.CommandSubscribe.Earliest else InitialPosition.LATEST
            )
            cursor = await self.ledger.open_cursor(name, start)
        else:
            cursor = self.ledger.new_non_durable_cursor(name, self._reader_start(start_message_id, initial_position))
        sub = self.subscriptions.get(name)  # a concurrent subscribe may have won while we awaited
        if sub is None:
            sub = Subscription(self, name, cursor)
            self.subscriptions[name] = sub
        return sub

    def _reader_start(self, start: pb.MessageIdData | None, initial_position: int) -> Position:
        if start is None:
            return EARLIEST if initial_position == pb.CommandSubscribe.Earliest else LATEST
        return wire_position(start)

    async def remove_subscription(self, name: str) -> None:
        """Drop a non-durable subscription whose last consumer left."""
        sub = self.subscriptions.pop(name, None)
        if sub is not None:
            await sub.close()
            await sub.cursor.close()

    async def delete_subscription(self, name: str) -> None:
        """Unsubscribe: remove the subscription and its stored cursor."""
        sub = self.subscriptions.pop(name, None)
        if sub is not None:
            await sub.close()
            if sub.durable:
                await self.ledger.delete_cursor(name)
            else:
                await sub.cursor.close()

    async def terminate(self) -> Position:
        """Seal the topic: no more publishing; consumers are told when they reach its end."""
        last = self.ledger.last_confirmed_entry
        if not self.terminated:
            await self.ledger.set_properties({TERMINATED_PROPERTY: str(last)})
            self.terminated = True
            self.disconnect_producers()
            for sub in self.subscriptions.values():
                sub.wakeup()
        return last

    # queries
    async def last_message_id(self) -> tuple[Position, int]:
        """Position of the last entry and the index of its last message (-1 when not a batch)."""
        last = self.ledger.last_confirmed_entry
        if last.entry_id < 0:
            return last, -1
        try:
            entry = await self.ledger.read_entry(last)
        except ManagedLedgerError:
            return last, -1  # trimmed already (fully consumed, no retention): the batch size is unknown
        count = entry_num_messages(entry.data)
        metadata, _ = parse_metadata(entry.data)
        return last, (count - 1) if metadata.HasField("num_messages_in_batch") else -1

    async def newest_published_before(self, publish_time_ms: int) -> Position | None:
        """The newest entry published strictly before ``publish_time_ms`` (None if none is that old).

        Pulsar's finder rule (``MessageImpl.isEntryPublishedEarlierThan``: ``entry < timestamp``), shared by
        seeks, resets and expiry so an entry of that very millisecond is never passed over."""

        def published_before(entry: Entry) -> bool:
            metadata, _ = parse_metadata(entry.data)
            return metadata.publish_time < publish_time_ms

        if self.ledger.last_confirmed_entry.entry_id < 0 and self.ledger.number_of_entries == 0:
            return None
        return await self.ledger.find_newest_matching(published_before)

    async def find_position_by_publish_time(self, publish_time_ms: int) -> Position:
        """Where a seek or reset to ``publish_time_ms`` resumes: the first entry published at or after it
        (after the newest one published earlier, as Pulsar's resetCursor(timestamp) does)."""
        newest_before = await self.newest_published_before(publish_time_ms)
        if newest_before is None:
            return self.ledger.first_position
        return self.ledger.next_position(newest_before)

    async def close(self) -> None:
        """Disconnect clients (they reconnect and reload the topic) and close the managed ledger."""
        if self.closed:
            return
        self.closed = True
        self.disconnect_producers()
        for _producer, waiter in self._exclusive_waiters:
            if not waiter.done():
                waiter.set_exception(ServiceNotReadyError("Topic is being closed"))
        self._exclusive_waiters.clear()
        for sub in list(self.subscriptions.values()):
            await sub.close()
        with contextlib.suppress(Exception):
            await self.dedup.close()
        await self.ledger.close()  # publishes still in flight end with it (a receipt or an error each)


def wire_position(message_id: pb.MessageIdData) -> Position:
    """Map a client's MessageIdData to a position; the earliest/latest sentinels map to EARLIEST/LATEST."""
    ledger, entry = message_id.ledgerId, message_id.entryId
    if ledger >= 2**63 or entry >= 2**63:  # unsigned -1: MessageId.earliest
        return EARLIEST
    if ledger == 2**63 - 1 and entry == 2**63 - 1:
        return LATEST
    return Position(ledger, entry)
