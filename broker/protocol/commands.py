"""Builders of the frames the broker sends.

The two per-message frames (MESSAGE and SEND_RECEIPT) are encoded by hand: their layout is tiny
and fixed, and building protobuf objects for them would dominate the broker's per-message CPU.
Everything else goes through the generated protobuf classes.
"""

from __future__ import annotations

import struct

from magnetar.broker.protocol import pulsar_api_pb2 as pb
from magnetar.broker.protocol.frames import encode_command

T = pb.BaseCommand
_U32X2 = struct.Struct(">II")
_U64 = 2**64 - 1


def _varint(value: int) -> bytes:
    if value < 0x80:
        return _SMALL[value]
    # Entry ids, sequence ids and sizes mostly fit in two or three bytes: no loop for them.
    if value < 0x4000:
        return bytes(((value & 0x7F) | 0x80, value >> 7))
    if value < 0x200000:
        return bytes(((value & 0x7F) | 0x80, ((value >> 7) & 0x7F) | 0x80, value >> 14))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_SMALL = [bytes((i,)) for i in range(0x80)]


def _message_id(ledger_id: int, entry_id: int, partition: int = -1) -> bytes:
    out = b"\x08" + _varint(ledger_id) + b"\x10" + _varint(entry_id)
    if partition >= 0:
        out += b"\x18" + _varint(partition)
    return out


def message_header(
    consumer_id: int,
    ledger_id: int,
    entry_id: int,
    entry_size: int,
    redelivery_count: int = 0,
    ack_set: list[int] | None = None,
    partition: int = -1,
) -> bytes:
    """Frame header + CommandMessage for an entry of ``entry_size`` bytes that follows it unchanged.

    ``ack_set`` (64-bit words, bit set = not yet acknowledged) tells the client which messages of a
    partly acknowledged batch to deliver; ``partition`` is the index of the partition the entry is
    from (clients' ``message_id().partition()``), -1 on a non-partitioned topic.
    """
    mid = _message_id(ledger_id, entry_id, partition)
    body = b"\x08" + _varint(consumer_id) + b"\x12" + _varint(len(mid)) + mid
    if redelivery_count:
        body += b"\x18" + _varint(redelivery_count)
    if ack_set:
        body += b"".join(b"\x20" + _varint(word & _U64) for word in ack_set)
    cmd = b"\x08\x09\x4a" + _varint(len(body)) + body  # type=MESSAGE, field 9
    return _U32X2.pack(len(cmd) + 4 + entry_size, len(cmd)) + cmd


def send_receipt(producer_id: int, sequence_id: int, ledger_id: int, entry_id: int, highest_sequence_id: int) -> bytes:
    """SEND_RECEIPT frame for a stored entry (``-1, -1`` for a deduplicated one, as Pulsar sends it).

    Encoded by hand (one per published entry): each part once, joined once."""
    if ledger_id < 0 or entry_id < 0:
        ledger_id &= _U64
        entry_id &= _U64
    mid = b"".join((b"\x08", _varint(ledger_id), b"\x10", _varint(entry_id)))
    parts = [b"\x08", _varint(producer_id), b"\x10", _varint(sequence_id), b"\x1a", _varint(len(mid)), mid]
    if highest_sequence_id:
        parts += (b"\x20", _varint(highest_sequence_id))
    body = b"".join(parts)
    n = len(body)
    size = n + 4 + (n >= 0x80)  # type=SEND_RECEIPT, field 7 (3 bytes), the body's length (1 or 2), body
    return b"".join((_U32X2.pack(size + 4, size), b"\x08\x07\x3a", _varint(n), body))


def connected(server_version: str, protocol_version: int, max_message_size: int, topic_watchers: bool) -> bytes:
    cmd = T(type=T.CONNECTED)
    cmd.connected.server_version = server_version
    cmd.connected.protocol_version = protocol_version
    cmd.connected.max_message_size = max_message_size
    cmd.connected.feature_flags.supports_topic_watchers = topic_watchers
    return encode_command(cmd)


def auth_challenge(server_version: str, method: str, data: bytes, protocol_version: int) -> bytes:
    """AUTH_CHALLENGE: ``data`` ``b"refresh"`` asks the client for fresh credentials (Pulsar's
    ``AuthData.REFRESH_AUTH_DATA``)."""
    cmd = T(type=T.AUTH_CHALLENGE)
    cmd.authChallenge.server_version = server_version
    cmd.authChallenge.challenge.auth_method_name = method
    cmd.authChallenge.challenge.auth_data = data
    cmd.authChallenge.protocol_version = protocol_version
    return encode_command(cmd)


def ping() -> bytes:
    return encode_command(T(type=T.PING, ping=pb.CommandPing()))


def pong() -> bytes:
    return encode_command(T(type=T.PONG, pong=pb.CommandPong()))


def success(request_id: int, schema: pb.Schema | None = None) -> bytes:
    cmd = T(type=T.SUCCESS)
    cmd.success.request_id = request_id
    if schema is not None:
        cmd.success.schema.CopyFrom(schema)
    return encode_command(cmd)


def error(request_id: int, code: pb.ServerError, message: str) -> bytes:
    cmd = T(type=T.ERROR)
    cmd.error.request_id = request_id
    cmd.error.error = code
    cmd.error.message = message
    return encode_command(cmd)


def send_error(producer_id: int, sequence_id: int, code: pb.ServerError, message: str) -> bytes:
    cmd = T(type=T.SEND_ERROR)
    cmd.send_error.producer_id = producer_id
    cmd.send_error.sequence_id = sequence_id
    cmd.send_error.error = code
    cmd.send_error.message = message
    return encode_command(cmd)


def producer_success(
    request_id: int,
    producer_name: str,
    last_sequence_id: int,
    schema_version: bytes | None = None,
    topic_epoch: int | None = None,
    ready: bool = True,
) -> bytes:
    cmd = T(type=T.PRODUCER_SUCCESS)
    ps = cmd.producer_success
    ps.request_id = request_id
    ps.producer_name = producer_name
    ps.last_sequence_id = last_sequence_id
    if schema_version is not None:
        ps.schema_version = schema_version
    if topic_epoch is not None:
        ps.topic_epoch = topic_epoch
    ps.producer_ready = ready
    return encode_command(cmd)


def partitioned_metadata(request_id: int, partitions: int) -> bytes:
    cmd = T(type=T.PARTITIONED_METADATA_RESPONSE)
    r = cmd.partitionMetadataResponse
    r.request_id = request_id
    r.partitions = partitions
    r.response = pb.CommandPartitionedTopicMetadataResponse.Success
    return encode_command(cmd)


def partitioned_metadata_error(request_id: int, code: pb.ServerError, message: str) -> bytes:
    cmd = T(type=T.PARTITIONED_METADATA_RESPONSE)
    r = cmd.partitionMetadataResponse
    r.request_id = request_id
    r.response = pb.CommandPartitionedTopicMetadataResponse.Failed
    r.error = code
    r.message = message
    return encode_command(cmd)


def lookup_connect(request_id: int, broker_url: str, broker_url_tls: str | None = None) -> bytes:
    cmd = T(type=T.LOOKUP_RESPONSE)
    r = cmd.lookupTopicResponse
    r.request_id = request_id
    r.response = pb.CommandLookupTopicResponse.Connect
    if broker_url:  # a TLS-only listener has no plain URL
        r.brokerServiceUrl = broker_url
    if broker_url_tls:
        r.brokerServiceUrlTls = broker_url_tls
    r.authoritative = True
    return encode_command(cmd)


def lookup_redirect(request_id: int, broker_url: str, broker_url_tls: str | None, authoritative: bool) -> bytes:
    """Ask the client to look the topic up again at another broker (``authoritative``: that broker was
    chosen to own it and must not redirect again)."""
    cmd = T(type=T.LOOKUP_RESPONSE)
    r = cmd.lookupTopicResponse
    r.request_id = request_id
    r.response = pb.CommandLookupTopicResponse.Redirect
    if broker_url:
        r.brokerServiceUrl = broker_url
    if broker_url_tls:
        r.brokerServiceUrlTls = broker_url_tls
    r.authoritative = authoritative
    r.proxy_through_service_url = False
    return encode_command(cmd)


def lookup_error(request_id: int, code: pb.ServerError, message: str) -> bytes:
    cmd = T(type=T.LOOKUP_RESPONSE)
    r = cmd.lookupTopicResponse
    r.request_id = request_id
    r.response = pb.CommandLookupTopicResponse.Failed
    r.error = code
    r.message = message
    return encode_command(cmd)


def close_producer(producer_id: int, request_id: int) -> bytes:
    cmd = T(type=T.CLOSE_PRODUCER)
    cmd.close_producer.producer_id = producer_id
    cmd.close_producer.request_id = request_id
    return encode_command(cmd)


def close_consumer(consumer_id: int, request_id: int) -> bytes:
    cmd = T(type=T.CLOSE_CONSUMER)
    cmd.close_consumer.consumer_id = consumer_id
    cmd.close_consumer.request_id = request_id
    return encode_command(cmd)


def active_consumer_change(consumer_id: int, is_active: bool) -> bytes:
    cmd = T(type=T.ACTIVE_CONSUMER_CHANGE)
    cmd.active_consumer_change.consumer_id = consumer_id
    cmd.active_consumer_change.is_active = is_active
    return encode_command(cmd)


def reached_end_of_topic(consumer_id: int) -> bytes:
    cmd = T(type=T.REACHED_END_OF_TOPIC)
    cmd.reachedEndOfTopic.consumer_id = consumer_id
    return encode_command(cmd)


def ack_response(consumer_id: int, request_id: int, code: pb.ServerError | None = None, message: str = "") -> bytes:
    cmd = T(type=T.ACK_RESPONSE)
    r = cmd.ackResponse
    r.consumer_id = consumer_id
    r.request_id = request_id
    if code is not None:
        r.error = code
        r.message = message
    return encode_command(cmd)


def last_message_id(
    request_id: int,
    ledger_id: int,
    entry_id: int,
    partition: int = -1,
    batch_index: int = -1,
    mark_delete: tuple[int, int] | None = None,
) -> bytes:
    cmd = T(type=T.GET_LAST_MESSAGE_ID_RESPONSE)
    r = cmd.getLastMessageIdResponse
    r.request_id = request_id
    # Java longs on uint64 fields: -1 (no entry yet) travels as 2**64 - 1, as Pulsar sends it.
    r.last_message_id.ledgerId = ledger_id & _U64
    r.last_message_id.entryId = entry_id & _U64
    if partition >= 0:
        r.last_message_id.partition = partition
    if batch_index >= 0:
        r.last_message_id.batch_index = batch_index
    if mark_delete is not None:
        r.consumer_mark_delete_position.ledgerId = mark_delete[0] & _U64
        r.consumer_mark_delete_position.entryId = mark_delete[1] & _U64
    return encode_command(cmd)


def topics_of_namespace(request_id: int, topics: list[str], topics_hash: str, changed: bool, filtered: bool) -> bytes:
    cmd = T(type=T.GET_TOPICS_OF_NAMESPACE_RESPONSE)
    r = cmd.getTopicsOfNamespaceResponse
    r.request_id = request_id
    if changed:
        r.topics.extend(topics)
    r.topics_hash = topics_hash
    r.changed = changed
    r.filtered = filtered
    return encode_command(cmd)


def watch_topic_list_success(request_id: int, watcher_id: int, topics: list[str], topics_hash: str) -> bytes:
    cmd = T(type=T.WATCH_TOPIC_LIST_SUCCESS)
    r = cmd.watchTopicListSuccess
    r.request_id = request_id
    r.watcher_id = watcher_id
    r.topic.extend(topics)
    r.topics_hash = topics_hash
    return encode_command(cmd)


def watch_topic_update(watcher_id: int, new_topics: list[str], deleted_topics: list[str], topics_hash: str) -> bytes:
    cmd = T(type=T.WATCH_TOPIC_UPDATE)
    r = cmd.watchTopicUpdate
    r.watcher_id = watcher_id
    r.new_topics.extend(new_topics)
    r.deleted_topics.extend(deleted_topics)
    r.topics_hash = topics_hash
    return encode_command(cmd)


def get_schema_response(
    request_id: int,
    schema: pb.Schema | None,
    version: bytes | None,
    code: pb.ServerError | None = None,
    message: str = "",
) -> bytes:
    cmd = T(type=T.GET_SCHEMA_RESPONSE)
    r = cmd.getSchemaResponse
    r.request_id = request_id
    if code is not None:
        r.error_code = code
        r.error_message = message
    else:
        assert schema is not None
        r.schema.CopyFrom(schema)
        if version is not None:
            r.schema_version = version
    return encode_command(cmd)


def get_or_create_schema_response(
    request_id: int, version: bytes | None, code: pb.ServerError | None = None, message: str = ""
) -> bytes:
    cmd = T(type=T.GET_OR_CREATE_SCHEMA_RESPONSE)
    r = cmd.getOrCreateSchemaResponse
    r.request_id = request_id
    if code is not None:
        r.error_code = code
        r.error_message = message
    elif version is not None:
        r.schema_version = version
    return encode_command(cmd)


def consumer_stats_response(request_id: int, **fields: object) -> bytes:
    cmd = T(type=T.CONSUMER_STATS_RESPONSE)
    r = cmd.consumerStatsResponse
    r.request_id = request_id
    for key, value in fields.items():
        setattr(r, key, value)
    return encode_command(cmd)
