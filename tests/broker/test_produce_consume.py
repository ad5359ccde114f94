"""Publishing and consuming through the official client: bytes, keys, properties, batches, compression."""

from __future__ import annotations

import pulsar
import pytest


def test_produce_consume_roundtrip(client: pulsar.Client, topic_name: str) -> None:
    consumer = client.subscribe(topic_name, "sub", initial_position=pulsar.InitialPosition.Earliest)
    producer = client.create_producer(topic_name, batching_enabled=False)
    sent = {}
    for i in range(20):
        payload = f"message-{i}".encode()
        msg_id = producer.send(payload, properties={"i": str(i)}, partition_key=f"k{i % 3}", event_timestamp=1000 + i)
        sent[payload] = msg_id
    for i in range(20):
        msg = consumer.receive(timeout_millis=5000)
        payload = f"message-{i}".encode()
        assert msg.data() == payload
        assert msg.properties() == {"i": str(i)}
        assert msg.partition_key() == f"k{i % 3}"
        assert msg.event_timestamp() == 1000 + i
        assert msg.message_id() == sent[payload]
        consumer.acknowledge(msg)
    with pytest.raises(pulsar.Timeout):
        consumer.receive(timeout_millis=300)


@pytest.mark.parametrize(
    "compression",
    [
        pulsar.CompressionType.NONE,
        pulsar.CompressionType.LZ4,
        pulsar.CompressionType.ZLib,
        pulsar.CompressionType.ZSTD,
        pulsar.CompressionType.SNAPPY,
    ],
)
def test_batches_pass_through_whole(client: pulsar.Client, topic_name: str, compression: object) -> None:
    consumer = client.subscribe(topic_name, "sub", initial_position=pulsar.InitialPosition.Earliest)
    producer = client.create_producer(
        topic_name,
        batching_enabled=True,
        batching_max_messages=50,
        batching_max_publish_delay_ms=50,
        compression_type=compression,
    )
    for i in range(200):
        producer.send_async(f"batched-{i}".encode() * 10, None)
    producer.flush()
    received = []
    entries = set()
    for _ in range(200):
        msg = consumer.receive(timeout_millis=5000)
        received.append(msg.data())
        mid = msg.message_id()
        entries.add((mid.ledger_id(), mid.entry_id()))
        consumer.acknowledge(msg)
    assert received == [f"batched-{i}".encode() * 10 for i in range(200)]
    # Batches were stored as single entries: far fewer entries than messages.
    assert len(entries) <= 20


def test_short_topic_names(client: pulsar.Client, topic_name: str) -> None:
    short = topic_name.rsplit("/", 1)[1]
    producer = client.create_producer(short)
    consumer = client.subscribe(f"public/default/{short}", "s", initial_position=pulsar.InitialPosition.Earliest)
    producer.send(b"hello")
    assert consumer.receive(timeout_millis=5000).data() == b"hello"


def test_large_message_near_limit(client: pulsar.Client, topic_name: str) -> None:
    producer = client.create_producer(topic_name, batching_enabled=False)
    consumer = client.subscribe(topic_name, "s", initial_position=pulsar.InitialPosition.Earliest)
    big = bytes(range(256)) * (4 * 1024 * 1024 // 256)
    producer.send(big)
    assert consumer.receive(timeout_millis=10000).data() == big


def test_oversize_message_rejected_by_client_limit(client: pulsar.Client, topic_name: str) -> None:
    # The broker advertises max_message_size in CONNECTED; the client refuses bigger messages.
    producer = client.create_producer(topic_name, batching_enabled=False, chunking_enabled=False)
    with pytest.raises(pulsar.MessageTooBig):
        producer.send(b"x" * (6 * 1024 * 1024))
    producer.send(b"still fine")
