"""Bad input on the binary port: a clear Pulsar error, no crash, other clients and stored data unaffected."""

from __future__ import annotations

import struct

import pulsar
import pytest

from magnetar.broker.protocol import pulsar_api_pb2 as pb
from tests.conftest import StandaloneProcess
from tests.rawclient import RawClient

T = pb.BaseCommand


@pytest.fixture
def raw(standalone: StandaloneProcess):  # type: ignore[no-untyped-def]
    c = RawClient(standalone.port)
    yield c
    c.close()


def _still_serving(client: pulsar.Client, topic: str) -> None:
    producer = client.create_producer(topic)
    consumer = client.subscribe(topic, "check", initial_position=pulsar.InitialPosition.Earliest)
    producer.send(b"alive")
    assert consumer.receive(timeout_millis=5000).data() == b"alive"


def test_command_before_connect_is_refused(raw: RawClient, client: pulsar.Client, topic_name: str) -> None:
    cmd = T(type=T.LOOKUP)
    cmd.lookupTopic.topic = topic_name
    cmd.lookupTopic.request_id = 7
    raw.send(cmd)
    reply, _ = raw.recv_command()
    assert reply.type == T.ERROR and reply.error.request_id == 7 and reply.error.error == pb.NotAllowedError
    assert raw.is_closed()
    _still_serving(client, topic_name)


def test_oversized_frame_closes_only_that_connection(raw: RawClient, client: pulsar.Client, topic_name: str) -> None:
    raw.connect()
    raw.send_raw(struct.pack(">II", 64 * 1024 * 1024, 10) + b"\x00" * 16)
    reply, _ = raw.recv_command()
    assert reply.type == T.ERROR and "Invalid frame" in reply.error.message
    assert raw.is_closed()
    _still_serving(client, topic_name)


@pytest.mark.parametrize(
    "frame",
    [
        struct.pack(">II", 8, 100) + b"\x00" * 4,  # command size larger than the frame
        struct.pack(">II", 4, 0),  # empty command
        struct.pack(">II", 9, 5) + b"\xff\xff\xff\xff\xff",  # undecodable protobuf
    ],
    ids=["bad-command-size", "empty-command", "garbage-protobuf"],
)
def test_malformed_frames(raw: RawClient, client: pulsar.Client, topic_name: str, frame: bytes) -> None:
    raw.connect()
    raw.send_raw(frame)
    reply, _ = raw.recv_command()
    assert reply.type == T.ERROR
    assert raw.is_closed()
    _still_serving(client, topic_name)


def test_truncated_frame_then_disconnect_is_harmless(
    standalone: StandaloneProcess, client: pulsar.Client, topic_name: str
) -> None:
    raw = RawClient(standalone.port)
    raw.connect()
    raw.send_raw(struct.pack(">II", 1000, 20) + b"\x08")  # promises 1000 bytes, sends 5
    raw.close()
    _still_serving(client, topic_name)


def test_unknown_command_type_keeps_connection(raw: RawClient) -> None:
    raw.connect()
    raw.send_raw(struct.pack(">II", 6, 2) + b"\x08\x63")  # type = 99
    reply, _ = raw.recv_command()
    assert reply.type == T.ERROR and reply.error.error == pb.NotAllowedError
    ping = T(type=T.PING, ping=pb.CommandPing())
    raw.send(ping)
    assert raw.recv_until(T.PONG).type == T.PONG


def test_bad_checksum_rejects_message_connection_survives(
    raw: RawClient, client: pulsar.Client, topic_name: str
) -> None:
    raw.connect()
    assert raw.create_producer(topic_name).type == T.PRODUCER_SUCCESS
    meta = pb.MessageMetadata(producer_name="raw", sequence_id=0, publish_time=1)
    from magnetar.broker.protocol.frames import build_entry

    good = build_entry(meta, b"good payload")
    corrupt = bytearray(good)
    corrupt[-1] ^= 0xFF
    raw.send_message(1, 0, b"", entry=bytes(corrupt))
    reply, _ = raw.recv_command()
    assert reply.type == T.SEND_ERROR and reply.send_error.error == pb.ChecksumError
    raw.send_message(1, 1, b"", entry=good)
    receipt = raw.recv_until(T.SEND_RECEIPT)
    assert receipt.send_receipt.sequence_id == 1
    consumer = client.subscribe(topic_name, "s", initial_position=pulsar.InitialPosition.Earliest)
    msg = consumer.receive(timeout_millis=5000)
    assert msg.data() == b"good payload"  # only the intact message was stored
    with pytest.raises(pulsar.Timeout):
        consumer.receive(timeout_millis=300)


def test_oversize_message_gets_send_error(standalone: StandaloneProcess, topic_name: str) -> None:
    raw = RawClient(standalone.port)
    try:
        connected = raw.connect()
        limit = connected.connected.max_message_size
        assert limit == 5 * 1024 * 1024
        assert raw.create_producer(topic_name).type == T.PRODUCER_SUCCESS
        raw.send_message(1, 0, b"x" * (limit + 100))
        reply, _ = raw.recv_command()
        assert reply.type == T.SEND_ERROR and reply.send_error.error == pb.NotAllowedError
        raw.send_message(1, 1, b"small")
        assert raw.recv_until(T.SEND_RECEIPT).send_receipt.sequence_id == 1
    finally:
        raw.close()


def test_send_for_unknown_producer_closes_connection(raw: RawClient) -> None:
    raw.connect()
    raw.send_message(42, 0, b"orphan")
    assert raw.is_closed()


@pytest.mark.parametrize(
    "name",
    [
        "persistent://",
        "persistent://public/default/",
        "bogus://public/default/t",
        "a/b",
        "persistent://pub lic/default/t",
    ],
)
def test_illegal_topic_names(raw: RawClient, name: str) -> None:
    raw.connect()
    reply = raw.create_producer(name)
    assert reply.type == T.ERROR and reply.error.error == pb.InvalidTopicName
    assert reply.error.request_id == 1


def test_unknown_namespace_is_topic_not_found(client: pulsar.Client) -> None:
    with pytest.raises(pulsar.TopicNotFound):
        client.create_producer("persistent://no-such-tenant/no-such-ns/t")
    with pytest.raises(pulsar.TopicNotFound):
        client.subscribe("persistent://public/no-such-ns/t", "s")


def test_request_ids_are_echoed_per_kind(raw: RawClient, topic_name: str) -> None:
    # The client's request-id counters are per kind; the same id may arrive twice.
    raw.connect()
    lookup = T(type=T.LOOKUP)
    lookup.lookupTopic.topic = topic_name
    lookup.lookupTopic.request_id = 5
    meta = T(type=T.PARTITIONED_METADATA)
    meta.partitionMetadata.topic = topic_name
    meta.partitionMetadata.request_id = 5
    raw.send(lookup)
    raw.send(meta)
    replies = {raw.recv_command()[0].type for _ in range(2)}
    assert replies == {T.LOOKUP_RESPONSE, T.PARTITIONED_METADATA_RESPONSE}


def test_unknown_command_type_is_refused_and_the_connection_kept(raw: RawClient) -> None:
    """A command type from a newer protocol decodes with ``type`` unset (reading as CONNECT, the enum's
    first value): it is refused with an error, not taken for a second CONNECT, and the connection stays."""
    raw.connect()
    body = b"\x08\xe7\x07"  # BaseCommand.type = 999
    raw.send_raw(struct.pack(">II", len(body) + 4, len(body)) + body)
    reply, _ = raw.recv_command()
    assert reply.type == T.ERROR and reply.error.error == pb.NotAllowedError
    assert "Unknown command type" in reply.error.message
    assert raw.create_producer("persistent://public/default/after-unknown-type", request_id=3).type == (
        T.PRODUCER_SUCCESS
    )
