"""Delayed delivery, chunked messages, dead-letter topics, priorities and compression through the official client."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pulsar
import pytest

from tests.conftest import StandaloneProcess

E = pulsar.InitialPosition.Earliest
Shared = pulsar.ConsumerType.Shared


def _receive_all(consumer: pulsar.Consumer, timeout_ms: int = 1500, ack: bool = True) -> list[pulsar.Message]:
    out = []
    while True:
        try:
            msg = consumer.receive(timeout_millis=timeout_ms)
        except pulsar.Timeout:
            return out
        out.append(msg)
        if ack:
            consumer.acknowledge(msg)


def test_delayed_delivery_on_shared(client: pulsar.Client, topic_name: str) -> None:
    consumer = client.subscribe(topic_name, "d", consumer_type=Shared, initial_position=E)
    producer = client.create_producer(topic_name, batching_enabled=False)
    sent = time.time()
    producer.send(b"later", deliver_after=timedelta(seconds=3))
    producer.send(b"now")
    first = consumer.receive(timeout_millis=2000)
    assert first.data() == b"now"
    consumer.acknowledge(first)
    later = consumer.receive(timeout_millis=6000)
    assert later.data() == b"later" and time.time() - sent >= 1.9  # non-strict: up to one tick early
    consumer.acknowledge(later)


def test_delayed_is_immediate_on_exclusive(client: pulsar.Client, topic_name: str) -> None:
    from datetime import timedelta

    consumer = client.subscribe(topic_name, "x", initial_position=E)
    producer = client.create_producer(topic_name, batching_enabled=False)
    producer.send(b"delayed but exclusive", deliver_after=timedelta(seconds=30))
    assert consumer.receive(timeout_millis=3000).data() == b"delayed but exclusive"


def test_delayed_messages_survive_restart(fresh_standalone: StandaloneProcess) -> None:
    from datetime import timedelta

    node = fresh_standalone
    node.start()
    topic = "persistent://public/default/delayed-restart"
    logger = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
    client = pulsar.Client(node.service_url, operation_timeout_seconds=10, logger=logger)
    consumer = client.subscribe(topic, "d", consumer_type=Shared, initial_position=E)
    producer = client.create_producer(topic, batching_enabled=False)
    producer.send(b"after restart", deliver_after=timedelta(seconds=4))
    with pytest.raises(pulsar.Timeout):
        consumer.receive(timeout_millis=1000)
    client.close()
    node.kill9()
    node.start()
    client = pulsar.Client(node.service_url, operation_timeout_seconds=10, logger=logger)
    consumer = client.subscribe(topic, "d", consumer_type=Shared)
    msg = consumer.receive(timeout_millis=10000)
    assert msg.data() == b"after restart"
    client.close()


def test_chunked_messages_from_two_interleaved_producers(client: pulsar.Client, topic_name: str) -> None:
    consumer = client.subscribe(topic_name, "c", initial_position=E, max_pending_chunked_message=10)
    payloads = {name: bytes([i]) * (10 * 1024 * 1024) for i, name in enumerate(("p1", "p2"), start=1)}
    producers = [
        client.create_producer(topic_name, producer_name=name, batching_enabled=False, chunking_enabled=True)
        for name in payloads
    ]
    threads = [
        threading.Thread(target=p.send, args=(payloads[name],)) for p, name in zip(producers, payloads, strict=True)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    got = sorted(consumer.receive(timeout_millis=20000).data() for _ in range(2))
    assert got == sorted(payloads.values())


def test_chunks_of_one_message_go_to_one_shared_consumer(client: pulsar.Client, topic_name: str) -> None:
    consumers = [
        client.subscribe(topic_name, "cs", consumer_type=Shared, initial_position=E, receiver_queue_size=5)
        for _ in range(2)
    ]
    producer = client.create_producer(topic_name, batching_enabled=False, chunking_enabled=True)
    big = [bytes([i]) * (6 * 1024 * 1024) for i in range(1, 4)]
    for payload in big:
        producer.send_async(payload, None)
    producer.flush()
    got = []
    for c in consumers:
        got += [m.data() for m in _receive_all(c, timeout_ms=5000)]
    assert sorted(got) == sorted(big)  # every message reassembled: no chunk went astray


def test_dead_letter_topic_after_max_redeliveries(client: pulsar.Client, topic_name: str) -> None:
    dlq = f"{topic_name}-s-DLQ"
    dlq_consumer = client.subscribe(dlq, "inspect", initial_position=E)
    consumer = client.subscribe(
        topic_name,
        "s",
        consumer_type=Shared,
        initial_position=E,
        negative_ack_redelivery_delay_ms=100,
        dead_letter_policy=pulsar.ConsumerDeadLetterPolicy(max_redeliver_count=2, dead_letter_topic=dlq),
    )
    client.create_producer(topic_name, batching_enabled=False).send(b"poison")
    counts = []
    for _ in range(3):
        msg = consumer.receive(timeout_millis=5000)
        counts.append(msg.redelivery_count())
        consumer.negative_acknowledge(msg)
    assert counts == [0, 1, 2]
    dead = dlq_consumer.receive(timeout_millis=10000)
    assert dead.data() == b"poison"
    with pytest.raises(pulsar.Timeout):
        consumer.receive(timeout_millis=1000)


def test_shared_priority_levels_prefer_higher_priority(standalone: StandaloneProcess, topic_name: str) -> None:
    # The Python client does not expose priority levels: subscribe over the raw protocol.
    from magnetar.broker.protocol import pulsar_api_pb2 as pb
    from tests.rawclient import RawClient

    T = pb.BaseCommand
    high, low = RawClient(standalone.port), RawClient(standalone.port)
    try:
        for raw, prio, cid in ((high, 0, 1), (low, 5, 2)):
            raw.connect()
            cmd = T(type=T.SUBSCRIBE)
            s = cmd.subscribe
            s.topic, s.subscription, s.subType = topic_name, "prio", pb.CommandSubscribe.Shared
            s.consumer_id, s.request_id, s.priority_level = cid, 1, prio
            s.initialPosition = pb.CommandSubscribe.Earliest
            raw.send(cmd)
            assert raw.recv_until_response(1).type == T.SUCCESS
            raw.flow(cid, 100)
        logger = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
        c = pulsar.Client(standalone.service_url, logger=logger)
        producer = c.create_producer(topic_name, batching_enabled=False)
        for i in range(10):
            producer.send(f"p{i}".encode())
        c.close()
        received = [high.recv_until(T.MESSAGE) for _ in range(10)]
        assert len(received) == 10  # the priority-0 consumer had permits: it got everything
        low.sock.settimeout(1.0)
        with pytest.raises(TimeoutError):
            low.recv_until(T.MESSAGE)
    finally:
        high.close()
        low.close()


@pytest.mark.parametrize(
    "codec",
    [
        pulsar.CompressionType.LZ4,
        pulsar.CompressionType.ZLib,
        pulsar.CompressionType.ZSTD,
        pulsar.CompressionType.SNAPPY,
    ],
)
def test_compressed_non_batched_messages(client: pulsar.Client, topic_name: str, codec: object) -> None:
    consumer = client.subscribe(topic_name, "z", initial_position=E)
    producer = client.create_producer(topic_name, batching_enabled=False, compression_type=codec)
    payload = b"compress me " * 500
    producer.send(payload, partition_key="k")
    msg = consumer.receive(timeout_millis=5000)
    assert msg.data() == payload and msg.partition_key() == "k"


@pytest.mark.slow
def test_ack_timeout_redelivers(client: pulsar.Client, topic_name: str) -> None:
    slow = client.subscribe(
        topic_name, "t", consumer_type=Shared, initial_position=E, unacked_messages_timeout_ms=11_000
    )
    client.create_producer(topic_name, batching_enabled=False).send(b"take your time")
    first = slow.receive(timeout_millis=5000)
    assert first.redelivery_count() == 0
    # Not acknowledged within the timeout: the client asks for redelivery, the broker counts it.
    again = slow.receive(timeout_millis=25_000)
    assert again.data() == b"take your time" and again.redelivery_count() >= 1
    slow.acknowledge(again)


def test_batch_stats_count_entries_and_messages(
    standalone: StandaloneProcess, client: pulsar.Client, topic_name: str
) -> None:
    from tests.admin.rest import call

    client.subscribe(topic_name, "b", initial_position=E).close()
    producer = client.create_producer(topic_name, batching_enabled=True, batching_max_publish_delay_ms=100)
    for i in range(20):
        producer.send_async(f"{i}".encode(), None)
    producer.flush()
    path = topic_name.replace("persistent://", "persistent/")
    stats = call("GET", f"{standalone.http_url}/admin/v2/{path}/stats").json
    internal = call("GET", f"{standalone.http_url}/admin/v2/{path}/internalStats").json
    assert stats["msgInCounter"] == 20  # messages
    assert internal["numberOfEntries"] < 20  # entries (batches)
    assert stats["subscriptions"]["b"]["msgBacklog"] == internal["numberOfEntries"]


def test_delayed_delivery_on_key_shared(client: pulsar.Client, topic_name: str) -> None:
    consumer = client.subscribe(topic_name, "ks", consumer_type=pulsar.ConsumerType.KeyShared, initial_position=E)
    producer = client.create_producer(topic_name, batching_enabled=False)
    sent = time.time()
    producer.send(b"later", partition_key="a", deliver_after=timedelta(seconds=3))
    producer.send(b"now", partition_key="b")
    assert consumer.receive(timeout_millis=2000).data() == b"now"
    later = consumer.receive(timeout_millis=6000)
    assert later.data() == b"later" and time.time() - sent >= 1.9


def test_retry_letter_topic_flow(client: pulsar.Client, topic_name: str) -> None:
    """What a client's ``reconsumeLater`` does (the Python client has no such call): republish to
    ``<topic>-<sub>-RETRY`` with a delay and the retry properties, consumed by the same multi-topic
    Shared consumer once due."""
    retry_topic = f"{topic_name}-s-RETRY"
    consumer = client.subscribe([topic_name, retry_topic], "s", consumer_type=Shared, initial_position=E)
    client.create_producer(topic_name, batching_enabled=False).send(b"try again")
    first = consumer.receive(timeout_millis=5000)
    retry = client.create_producer(retry_topic, batching_enabled=False)
    retry.send(
        first.data(),
        properties={"RECONSUMETIMES": "1", "REAL_TOPIC": topic_name, "ORIGIN_MESSAGE_ID": str(first.message_id())},
        deliver_after=timedelta(seconds=2),
    )
    consumer.acknowledge(first)
    started = time.time()
    again = consumer.receive(timeout_millis=8000)
    assert again.data() == b"try again" and again.properties()["RECONSUMETIMES"] == "1"
    assert again.topic_name() == retry_topic and time.time() - started >= 0.9
