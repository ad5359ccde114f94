"""A connection's consumer commands: SUBSCRIBE, FLOW, ACK, REDELIVER, UNSUBSCRIBE, CLOSE_CONSUMER,
SEEK, GET_LAST_MESSAGE_ID, CONSUMER_STATS.

Each handler takes the :class:`~magnetar.broker.connection.ServerConnection` the command came in on
and answers on it; the connection's dispatch table maps command types to them."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from magnetar.broker.auth.authorization import TopicOperation
from magnetar.broker.consumer import Consumer
from magnetar.broker.errors import (
    BrokerError,
    ConsumerBusyError,
    InvalidTopicNameError,
    NotAllowedError,
)
from magnetar.broker.protocol import commands
from magnetar.broker.protocol import pulsar_api_pb2 as pb
from magnetar.broker.protocol.frames import Frame
from magnetar.broker.topic import wire_position
from magnetar.broker.topic_name import TopicName
from magnetar.managed_ledger.api import (
    EARLIEST,
    LATEST,
    Position,
)

if TYPE_CHECKING:
    from magnetar.broker.connection import ServerConnection

log = logging.getLogger(__name__)

T = pb.BaseCommand


def on_subscribe(conn: ServerConnection, cmd: T, frame: Frame) -> None:
    r = cmd.subscribe
    in_creation = conn.consumers_in_creation
    creating = conn.begin_create(in_creation, r.consumer_id in conn.consumers, r.consumer_id, r.request_id, "Consumer")
    if creating is None:
        return

    async def work() -> None:
        try:
            existing = conn.consumers.get(r.consumer_id)
            if existing is not None:
                if existing.subscription.name == r.subscription:
                    conn.write(commands.success(r.request_id))
                    return
                raise ConsumerBusyError("Consumer id is already used on this connection")
            await create()
        finally:
            if creating:
                in_creation.pop(r.consumer_id, None)

    async def create() -> None:
        if not r.subscription:
            raise InvalidTopicNameError("Empty subscription name")
        name = TopicName.parse(r.topic)
        await conn.service.authorization.check_topic(
            name, conn.role, TopicOperation.SUBSCRIBE, r.subscription, message="Client is not authorized to subscribe"
        )
        topic = await conn.service.get_topic(name, create=r.force_topic_creation)
        await conn.service.schemas.for_consumer(name, r.schema if r.HasField("schema") else None)
        if r.read_compacted:
            await conn.service.compaction.prepare_read(topic, r.subType)
        start = r.start_message_id if r.HasField("start_message_id") else None
        sub = await topic.subscribe(r.subscription, r.durable, r.initialPosition, start)
        if r.start_message_rollback_duration_sec > 0 and name.persistent:
            # As Pulsar does on every such subscribe: reset to that long ago, by publish time.
            since_ms = int(time.time() * 1000) - r.start_message_rollback_duration_sec * 1000
            await sub.reset(await topic.find_position_by_publish_time(since_ms))
        consumer = Consumer(
            sub,
            conn,
            r.consumer_id,
            r.consumer_name,
            r.subType,
            r.priority_level,
            conn.config.max_unacked_messages_per_consumer,
            {kv.key: kv.value for kv in r.metadata},
        )
        if r.HasField("keySharedMeta"):
            consumer.key_shared_meta = r.keySharedMeta
        if conn.closed:
            return
        if in_creation.get(r.consumer_id):
            # CLOSE_CONSUMER came while it was being created (a client that gave up waiting): never registered.
            raise BrokerError("Consumer was closed while it was being created", pb.ServiceNotReady)
        sub.add_consumer(consumer)
        conn.consumers[r.consumer_id] = consumer
        if r.read_compacted:
            await conn.service.compaction.attach(sub)
        conn.write(commands.success(r.request_id))

    conn.spawn_request(r.request_id, work())


def _consumer(conn: ServerConnection, consumer_id: int) -> Consumer:
    consumer = conn.consumers.get(consumer_id)
    if consumer is None:
        raise BrokerError(f"Consumer {consumer_id} not found", pb.ConsumerNotFound)
    return consumer


async def _check_consumer(conn: ServerConnection, consumer: Consumer, operation: TopicOperation) -> None:
    """A consumer's rights are re-checked for the commands that change its subscription."""
    sub = consumer.subscription
    await conn.service.authorization.check_topic(
        sub.topic.name, conn.role, operation, sub.name, message=f"Client is not authorized to {operation.lower()}"
    )


def on_flow(conn: ServerConnection, cmd: T, frame: Frame) -> None:
    f = cmd.flow
    consumer = conn.consumers.get(f.consumer_id)
    if consumer is not None:
        consumer.flow(f.messagePermits)
        consumer.subscription.wakeup()


def on_ack(conn: ServerConnection, cmd: T, frame: Frame) -> None:
    a = cmd.ack
    has_request = a.HasField("request_id")
    consumer = conn.consumers.get(a.consumer_id)
    if consumer is None:
        if has_request:
            conn.write(commands.ack_response(a.consumer_id, a.request_id, pb.ConsumerNotFound, "Consumer not found"))
        return
    sub = consumer.subscription
    try:
        if a.ack_type == pb.CommandAck.Cumulative:
            if a.message_id:
                sub.ack_cumulative(consumer, Position(a.message_id[0].ledgerId, a.message_id[0].entryId))
        else:
            positions = []
            partial = []
            for m in a.message_id:
                if any(m.ack_set):  # some messages of this batch are still unacked
                    partial.append((Position(m.ledgerId, m.entryId), list(m.ack_set)))
                else:
                    positions.append(Position(m.ledgerId, m.entryId))
            if positions:
                sub.ack_individual(consumer, positions)
            if partial:
                sub.ack_batch_indexes(consumer, partial)
    except BrokerError as exc:
        if has_request:
            conn.write(commands.ack_response(a.consumer_id, a.request_id, exc.code, exc.message))
        else:
            log.info("ack refused on %s/%s: %s", sub.topic.name, sub.name, exc)
        return
    if has_request:

        async def work() -> None:
            await sub.cursor.flush()  # the receipt promises the ack is stored
            conn.write(commands.ack_response(a.consumer_id, a.request_id))

        conn.spawn_request(
            a.request_id, work(), lambda rid, code, msg: commands.ack_response(a.consumer_id, rid, code, msg)
        )


def on_redeliver(conn: ServerConnection, cmd: T, frame: Frame) -> None:
    r = cmd.redeliverUnacknowledgedMessages
    consumer = conn.consumers.get(r.consumer_id)
    if consumer is None:
        return
    ids = [Position(m.ledgerId, m.entryId) for m in r.message_ids] or None
    conn.spawn_request(0, consumer.subscription.redeliver(consumer, ids))


def on_unsubscribe(conn: ServerConnection, cmd: T, frame: Frame) -> None:
    r = cmd.unsubscribe

    async def work() -> None:
        consumer = _consumer(conn, r.consumer_id)
        await _check_consumer(conn, consumer, TopicOperation.UNSUBSCRIBE)
        await consumer.subscription.unsubscribe(consumer, r.force)
        conn.consumers.pop(r.consumer_id, None)
        conn.write(commands.success(r.request_id))

    conn.spawn_request(r.request_id, work())


def on_close_consumer(conn: ServerConnection, cmd: T, frame: Frame) -> None:
    r = cmd.close_consumer

    async def work() -> None:
        consumer = conn.consumers.pop(r.consumer_id, None)
        if consumer is not None:
            await consumer.subscription.remove_consumer(consumer)
        elif r.consumer_id in conn.consumers_in_creation:
            conn.consumers_in_creation[r.consumer_id] = True  # its SUBSCRIBE, when done, does not register it
        conn.write(commands.success(r.request_id))

    conn.spawn_request(r.request_id, work())


def on_seek(conn: ServerConnection, cmd: T, frame: Frame) -> None:
    r = cmd.seek

    async def work() -> None:
        consumer = _consumer(conn, r.consumer_id)
        await _check_consumer(conn, consumer, TopicOperation.RESET_CURSOR)
        sub = consumer.subscription
        topic = sub.topic
        if not topic.name.persistent:
            raise NotAllowedError("Seek is not supported on non-persistent topics")
        if r.HasField("message_publish_time"):
            position = await topic.find_position_by_publish_time(r.message_publish_time)
        elif r.HasField("message_id"):
            position = wire_position(r.message_id)
            if position == EARLIEST:
                position = topic.ledger.first_position
            elif position == LATEST:
                position = topic.ledger.next_position(topic.ledger.last_confirmed_entry)
        else:
            raise BrokerError("Seek needs a message id or a publish time", pb.UnknownError)
        await sub.reset(position)
        conn.write(commands.success(r.request_id))

    conn.spawn_request(r.request_id, work())


def on_get_last_message_id(conn: ServerConnection, cmd: T, frame: Frame) -> None:
    r = cmd.getLastMessageId

    async def work() -> None:
        consumer = _consumer(conn, r.consumer_id)
        topic = consumer.subscription.topic
        position, batch_index = await conn.service.compaction.last_message_id(consumer.subscription)
        md = consumer.subscription.cursor.mark_delete_position
        conn.write(
            commands.last_message_id(
                r.request_id,
                position.ledger_id,
                position.entry_id,
                topic.name.partition_index,
                batch_index,
                (md.ledger_id, md.entry_id) if md.ledger_id >= 0 else None,
            )
        )

    conn.spawn_request(r.request_id, work())


def on_consumer_stats(conn: ServerConnection, cmd: T, frame: Frame) -> None:
    r = cmd.consumerStats
    consumer = _consumer(conn, r.consumer_id)
    conn.write(
        commands.consumer_stats_response(
            r.request_id,
            consumerName=consumer.name,
            availablePermits=max(consumer.permits, 0),
            unackedMessages=consumer.unacked_messages,
            blockedConsumerOnUnackedMsgs=consumer.blocked,
            address=conn.peer,
            connectedSince=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(consumer.connected_since)),
            type=pb.CommandSubscribe.SubType.Name(consumer.sub_type),
            msgBacklog=consumer.subscription.backlog(),
        )
    )
