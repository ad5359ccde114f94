"""A connection's producer commands: PRODUCER (with access modes), SEND (the publish hot path),
CLOSE_PRODUCER.

Each handler takes the :class:`~magnetar.broker.connection.ServerConnection` the command came in on
and answers on it; the connection's dispatch table maps command types to them."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from magnetar.broker.auth.authorization import TopicOperation
from magnetar.broker.errors import (
    BrokerError,
    ProducerBusyError,
    ServiceNotReadyError,
)
from magnetar.broker.producer import Producer
from magnetar.broker.protocol import commands
from magnetar.broker.protocol import pulsar_api_pb2 as pb
from magnetar.broker.protocol.frames import ChecksumMismatchError, Frame, FrameError, SendFields, verify_entry
from magnetar.broker.protocol.validate import InvalidMetadataError, check_message_metadata
from magnetar.broker.topic_name import TopicName

if TYPE_CHECKING:
    from magnetar.broker.connection import ServerConnection

log = logging.getLogger(__name__)

T = pb.BaseCommand


def on_producer(conn: ServerConnection, cmd: T, frame: Frame) -> None:
    r = cmd.producer
    in_creation = conn.producers_in_creation
    creating = conn.begin_create(in_creation, r.producer_id in conn.producers, r.producer_id, r.request_id, "Producer")
    if creating is None:
        return

    async def work() -> None:
        try:
            await request()
        finally:
            if creating:
                in_creation.pop(r.producer_id, None)

    async def request() -> None:
        existing = conn.producers.get(r.producer_id)
        if existing is not None:
            if not existing.ready:  # still queued (WaitForExclusive): as Pulsar, not a second grant
                raise BrokerError("Producer is already present on the connection", pb.ServiceNotReady)
            if str(existing.topic.name) == str(TopicName.parse(r.topic)):
                conn.write(
                    commands.producer_success(
                        r.request_id,
                        existing.name,
                        existing.topic.dedup.last_sequence_id(existing.name),
                        topic_epoch=existing.topic.topic_epoch if existing.access_mode else None,
                    )
                )
                return
            raise ProducerBusyError("Producer id is already used on this connection")
        name = TopicName.parse(r.topic)
        await conn.service.authorization.check_topic(
            name, conn.role, TopicOperation.PRODUCE, message="Client is not authorized to Produce"
        )
        topic = await conn.service.get_topic(name, create=True)
        schema_version = await conn.service.schemas.for_producer(name, r.schema if r.HasField("schema") else None)
        user_named = r.HasField("producer_name") and bool(r.producer_name)
        producer_name = r.producer_name if user_named else conn.service.new_producer_name()
        await topic.check_new_producer()
        producer = Producer(
            topic, conn, r.producer_id, producer_name, user_named, {kv.key: kv.value for kv in r.metadata}
        )
        producer.access_mode = r.producer_access_mode
        if in_creation.get(r.producer_id):
            # CLOSE_PRODUCER came while it was being created (a client that gave up waiting): never registered.
            raise ServiceNotReadyError("Producer was closed while it was being created")
        # Registered before a WaitForExclusive producer is granted, so it can be closed while queued.
        conn.producers[r.producer_id] = producer

        def queued() -> None:
            conn.write(commands.producer_success(r.request_id, producer_name, -1, schema_version, ready=False))

        try:
            epoch = await topic.add_producer(
                producer,
                r.producer_access_mode,
                r.topic_epoch if r.HasField("topic_epoch") else None,
                queued,
            )
        except BaseException:
            if conn.producers.get(r.producer_id) is producer:
                del conn.producers[r.producer_id]
            producer.closed = True
            raise
        if conn.closed or producer.closed:
            topic.remove_producer(producer)
            # Closed (CLOSE_PRODUCER) while being created: the request is still answered.
            raise ServiceNotReadyError("Producer was closed while it was being created")
        producer.ready = True
        last_sequence_id = topic.dedup.last_sequence_id(producer_name)
        conn.write(commands.producer_success(r.request_id, producer_name, last_sequence_id, schema_version, epoch))

    conn.spawn_request(r.request_id, work())


def on_send(conn: ServerConnection, cmd: T, frame: Frame) -> None:
    s = frame.send
    if s is None:  # a SEND the decoder left to protobuf (see plain_send): each field read is a C call, once
        c = cmd.send
        s = SendFields(c.producer_id, c.sequence_id, c.num_messages, c.highest_sequence_id, c.is_chunk)
    producer = conn.producers.get(s.producer_id)
    if producer is None or not producer.ready:
        # As Pulsar does: a SEND for an unknown producer, or one not granted yet (a queued
        # WaitForExclusive one), means the client is confused; make it reconnect.
        log.warning("closing connection from %s: SEND for producer %d, not ready", conn.peer, s.producer_id)
        conn.close()
        return
    entry = frame.entry
    if entry is None:
        conn.write(commands.send_error(s.producer_id, s.sequence_id, pb.UnknownError, "Message has no payload"))
        return
    try:
        data = verify_entry(entry)
    except ChecksumMismatchError as exc:
        log.warning("checksum error from %s on %s: %s", conn.peer, producer.topic.name, exc)
        conn.write(commands.send_error(s.producer_id, s.sequence_id, pb.ChecksumError, str(exc)))
        return
    except FrameError as exc:
        conn.write(commands.send_error(s.producer_id, s.sequence_id, pb.UnknownError, f"Invalid message: {exc}"))
        return
    try:
        # As the entry will be dispatched and read back: it must decode (one parse per entry).
        check_message_metadata(data)
    except InvalidMetadataError as exc:
        log.info("refused a message from %s on %s: %s", conn.peer, producer.topic.name, exc)
        conn.write(commands.send_error(s.producer_id, s.sequence_id, pb.NotAllowedError, str(exc)))
        return
    if len(data) - 6 > conn.config.max_message_size and not s.is_chunk:
        conn.write(commands.send_error(s.producer_id, s.sequence_id, pb.NotAllowedError, "Exceed maximum message size"))
        return
    sequence_id, highest, num_messages = s.sequence_id, s.highest_sequence_id, s.num_messages
    if not highest and num_messages > 1:
        # Clients that batch without highest_sequence_id (the C++ client) number a batch's messages
        # upwards from sequence_id; first + n - 1 never exceeds the true highest, so it is a safe
        # bound for deduplication and for the last_sequence_id a reconnecting producer resumes after.
        highest = sequence_id + num_messages - 1
    conn.queue_send(producer, (sequence_id, highest, num_messages, data))


def on_close_producer(conn: ServerConnection, cmd: T, frame: Frame) -> None:
    r = cmd.close_producer
    producer = conn.producers.pop(r.producer_id, None)
    if producer is not None:
        producer.closed = True
        producer.topic.remove_producer(producer)
    elif r.producer_id in conn.producers_in_creation:
        conn.producers_in_creation[r.producer_id] = True  # its PRODUCER, when done, does not register it
    conn.write(commands.success(r.request_id))
