"""Subscription semantics through the official client: Exclusive, Shared, Failover, acks, redelivery, seek."""

from __future__ import annotations

import time

import pulsar
import pytest

E = pulsar.InitialPosition.Earliest


def _drain(consumer: pulsar.Consumer, timeout_ms: int = 500, ack: bool = True) -> list[bytes]:
    out = []
    while True:
        try:
            msg = consumer.receive(timeout_millis=timeout_ms)
        except pulsar.Timeout:
            return out
        out.append(msg.data())
        if ack:
            consumer.acknowledge(msg)


def _send(client: pulsar.Client, topic: str, n: int, prefix: str = "m") -> list[bytes]:
    producer = client.create_producer(topic, batching_enabled=False)
    payloads = [f"{prefix}-{i}".encode() for i in range(n)]
    for p in payloads:
        producer.send(p)
    producer.close()
    return payloads


def test_exclusive_second_consumer_gets_consumer_busy(client: pulsar.Client, topic_name: str) -> None:
    first = client.subscribe(topic_name, "excl", consumer_type=pulsar.ConsumerType.Exclusive)
    with pytest.raises(pulsar.ConsumerBusy):
        client.subscribe(topic_name, "excl", consumer_type=pulsar.ConsumerType.Exclusive)
    first.close()
    again = client.subscribe(topic_name, "excl", consumer_type=pulsar.ConsumerType.Exclusive)
    again.close()


def test_initial_position_earliest_and_latest(client: pulsar.Client, topic_name: str) -> None:
    _send(client, topic_name, 3, "old")
    latest = client.subscribe(topic_name, "latest")
    earliest = client.subscribe(topic_name, "earliest", initial_position=E)
    _send(client, topic_name, 2, "new")
    assert _drain(latest) == [b"new-0", b"new-1"]
    assert _drain(earliest) == [b"old-0", b"old-1", b"old-2", b"new-0", b"new-1"]


def test_durable_subscription_resumes_after_acks(client: pulsar.Client, topic_name: str) -> None:
    payloads = _send(client, topic_name, 10)
    consumer = client.subscribe(topic_name, "resume", initial_position=E)
    for expected in payloads[:4]:
        msg = consumer.receive(timeout_millis=5000)
        assert msg.data() == expected
        consumer.acknowledge(msg)
    consumer.close()  # flushes pending acks
    consumer = client.subscribe(topic_name, "resume", initial_position=E)
    assert _drain(consumer) == payloads[4:]


def test_shared_round_robin_and_redelivery_on_consumer_close(client: pulsar.Client, topic_name: str) -> None:
    c1 = client.subscribe(
        topic_name, "shared", consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=10, initial_position=E
    )
    c2 = client.subscribe(
        topic_name, "shared", consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=10, initial_position=E
    )
    payloads = _send(client, topic_name, 40)
    got1 = _drain(c1, ack=False, timeout_ms=1000)
    got2 = _drain(c2, timeout_ms=1000)
    assert got1 and got2, "both shared consumers receive messages"
    assert sorted(got1 + got2) == sorted(payloads)
    # c1 never acked: closing it hands its messages to c2.
    c1.close()
    redelivered = _drain(c2, timeout_ms=2000)
    assert sorted(redelivered) == sorted(got1)


def test_shared_refuses_cumulative_ack(client: pulsar.Client, topic_name: str) -> None:
    c = client.subscribe(topic_name, "shared-cum", consumer_type=pulsar.ConsumerType.Shared, initial_position=E)
    _send(client, topic_name, 1)
    msg = c.receive(timeout_millis=5000)
    with pytest.raises(pulsar.PulsarException):
        c.acknowledge_cumulative(msg)


def test_cumulative_ack_on_exclusive(client: pulsar.Client, topic_name: str) -> None:
    payloads = _send(client, topic_name, 10)
    c = client.subscribe(topic_name, "cum", initial_position=E)
    msgs = [c.receive(timeout_millis=5000) for _ in range(10)]
    c.acknowledge_cumulative(msgs[6])
    c.close()
    c = client.subscribe(topic_name, "cum", initial_position=E)
    assert _drain(c) == payloads[7:]


def test_failover_active_consumer_and_takeover(client: pulsar.Client, topic_name: str) -> None:
    a = client.subscribe(
        topic_name, "fo", consumer_type=pulsar.ConsumerType.Failover, consumer_name="a", initial_position=E
    )
    b = client.subscribe(
        topic_name, "fo", consumer_type=pulsar.ConsumerType.Failover, consumer_name="b", initial_position=E
    )
    payloads = _send(client, topic_name, 10)
    # One of them is active (chosen by hashing the topic name onto the consumers); the other gets nothing.
    got_a, got_b = _drain(a, timeout_ms=1000), _drain(b, timeout_ms=300)
    active, standby = (a, b) if got_a else (b, a)
    assert (got_a or got_b) == payloads and not (got_a and got_b)
    more = _send(client, topic_name, 5, "more")
    first = active.receive(timeout_millis=5000)
    assert first.data() == more[0]
    active.close()  # the standby takes over, from the first unacknowledged message
    assert _drain(standby, timeout_ms=2000) == more


def test_failover_spreads_partitions_over_consumers(client: pulsar.Client, standalone, topic_name: str) -> None:  # type: ignore[no-untyped-def]
    from tests.admin.rest import call

    path = topic_name.replace("persistent://", "persistent/")
    assert call("PUT", f"{standalone.http_url}/admin/v2/{path}/partitions", 4).status == 204
    consumers = {
        name: client.subscribe(
            topic_name, "fo", consumer_type=pulsar.ConsumerType.Failover, consumer_name=name, initial_position=E
        )
        for name in ("c1", "c2")
    }
    producer = client.create_producer(topic_name, batching_enabled=False)
    for i in range(40):
        producer.send(f"m{i}".encode(), partition_key=str(i))
    partitions = {}
    for name, consumer in consumers.items():
        for _ in range(100):
            try:
                msg = consumer.receive(timeout_millis=1000)
            except pulsar.Timeout:
                break
            partitions.setdefault(name, set()).add(msg.topic_name().rsplit("-", 1)[1])
            consumer.acknowledge(msg)
    # Partition i goes to consumer i mod 2 (consumers ranked by name).
    assert partitions == {"c1": {"0", "2"}, "c2": {"1", "3"}}


def test_nack_redelivers_with_count(client: pulsar.Client, topic_name: str) -> None:
    c = client.subscribe(
        topic_name,
        "nack",
        consumer_type=pulsar.ConsumerType.Shared,
        negative_ack_redelivery_delay_ms=100,
        initial_position=E,
    )
    _send(client, topic_name, 1)
    msg = c.receive(timeout_millis=5000)
    assert msg.redelivery_count() == 0
    c.negative_acknowledge(msg)
    again = c.receive(timeout_millis=5000)
    assert again.data() == msg.data()
    assert again.redelivery_count() == 1
    c.negative_acknowledge(again)
    third = c.receive(timeout_millis=5000)
    assert third.redelivery_count() == 2
    c.acknowledge(third)


def test_redeliver_unacknowledged_on_exclusive(client: pulsar.Client, topic_name: str) -> None:
    payloads = _send(client, topic_name, 5)
    c = client.subscribe(topic_name, "redeliver", initial_position=E)
    first = [c.receive(timeout_millis=5000).data() for _ in range(5)]
    assert first == payloads
    c.redeliver_unacknowledged_messages()
    assert _drain(c, timeout_ms=2000) == payloads


def test_unsubscribe_deletes_subscription(client: pulsar.Client, topic_name: str) -> None:
    payloads = _send(client, topic_name, 3)
    c = client.subscribe(topic_name, "gone", initial_position=E)
    assert c.receive(timeout_millis=5000).data() == payloads[0]
    c.unsubscribe()
    # A new subscription of that name starts from scratch (latest by default).
    c = client.subscribe(topic_name, "gone")
    assert _drain(c, timeout_ms=300) == []


def test_seek_by_message_id_earliest_latest(client: pulsar.Client, topic_name: str) -> None:
    producer = client.create_producer(topic_name, batching_enabled=False)
    ids = [producer.send(f"s-{i}".encode()) for i in range(6)]
    c = client.subscribe(topic_name, "seek", initial_position=E)
    assert _drain(c) == [f"s-{i}".encode() for i in range(6)]
    # The broker resumes at the sought entry; the client drops it unless the seek is inclusive.
    c.seek(ids[3])
    assert _drain(c, timeout_ms=2000) == [b"s-4", b"s-5"]
    inclusive = client.subscribe(topic_name, "seek-incl", initial_position=E, start_message_id_inclusive=True)
    assert len(_drain(inclusive)) == 6
    inclusive.seek(ids[3])
    assert _drain(inclusive, timeout_ms=2000) == [b"s-3", b"s-4", b"s-5"]
    c.seek(pulsar.MessageId.earliest)
    assert _drain(c, timeout_ms=2000) == [f"s-{i}".encode() for i in range(6)]
    c.seek(pulsar.MessageId.latest)
    producer.send(b"after-latest")
    assert _drain(c, timeout_ms=2000) == [b"after-latest"]


def test_seek_by_publish_time(client: pulsar.Client, topic_name: str) -> None:
    producer = client.create_producer(topic_name, batching_enabled=False)
    for i in range(3):
        producer.send(f"before-{i}".encode())
    time.sleep(0.05)
    boundary = int(time.time() * 1000)
    time.sleep(0.05)
    for i in range(3):
        producer.send(f"after-{i}".encode())
    c = client.subscribe(topic_name, "seek-time", initial_position=E)
    assert len(_drain(c)) == 6
    c.seek(boundary)
    assert _drain(c, timeout_ms=2000) == [b"after-0", b"after-1", b"after-2"]


def _publish_with_shared_milliseconds(client: pulsar.Client, topic: str) -> list[tuple[bytes, int]]:
    """Messages (payload, publish time) where several share a millisecond: a batch (one publish time
    for all its messages) and a burst of non-batched sends."""
    single = client.create_producer(topic, batching_enabled=False)
    for i in range(3):
        single.send(f"a-{i}".encode())
    batched = client.create_producer(
        topic, batching_enabled=True, batching_max_messages=4, batching_max_publish_delay_ms=100
    )
    for i in range(4):
        batched.send_async(f"b-{i}".encode(), None)
    batched.flush()
    for i in range(20):
        single.send_async(f"c-{i}".encode(), None)
    single.flush()
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    out = []
    for _ in range(27):
        msg = reader.read_next(5000)
        out.append((msg.data(), msg.publish_timestamp()))
    reader.close()
    return out


def test_seek_by_publish_time_includes_that_millisecond(client: pulsar.Client, topic_name: str) -> None:
    """Pulsar resumes at the first entry published at or after the time: a seek to a message's own
    publish time delivers it again, and every other message of that millisecond with it."""
    published = _publish_with_shared_milliseconds(client, topic_name)
    batch_time = next(t for d, t in published if d == b"b-0")
    assert all(t == batch_time for d, t in published if d.startswith(b"b-"))
    times = [t for _, t in published]
    shared = [t for t in times if times.count(t) > 1 and t != batch_time]
    c = client.subscribe(topic_name, "seek-ms", initial_position=E)
    assert len(_drain(c)) == len(published)
    for t in [batch_time, times[1], *shared[:1]]:
        c.seek(t)
        assert _drain(c, timeout_ms=2000) == [d for d, pt in published if pt >= t], t
    c.seek(times[-1] + 1)  # later than everything: nothing comes back
    assert _drain(c, timeout_ms=500) == []


def test_reader_from_message_id_inclusive_and_exclusive(client: pulsar.Client, topic_name: str) -> None:
    producer = client.create_producer(topic_name, batching_enabled=False)
    ids = [producer.send(f"r-{i}".encode()) for i in range(5)]
    exclusive = client.create_reader(topic_name, ids[1])
    assert [exclusive.read_next(5000).data() for _ in range(3)] == [b"r-2", b"r-3", b"r-4"]
    assert not exclusive.has_message_available()
    inclusive = client.create_reader(topic_name, ids[1], start_message_id_inclusive=True)
    assert [inclusive.read_next(5000).data() for _ in range(4)] == [b"r-1", b"r-2", b"r-3", b"r-4"]
    earliest = client.create_reader(topic_name, pulsar.MessageId.earliest)
    assert earliest.read_next(5000).data() == b"r-0"
    latest = client.create_reader(topic_name, pulsar.MessageId.latest)
    assert not latest.has_message_available()
    producer.send(b"r-5")
    assert latest.read_next(5000).data() == b"r-5"


def test_reader_on_empty_topic(client: pulsar.Client, topic_name: str) -> None:
    client.create_producer(topic_name).close()
    reader = client.create_reader(topic_name, pulsar.MessageId.earliest)
    assert not reader.has_message_available()
    with pytest.raises(pulsar.Timeout):
        reader.read_next(300)


def test_get_last_message_id(client: pulsar.Client, topic_name: str) -> None:
    producer = client.create_producer(topic_name, batching_enabled=False)
    c = client.subscribe(topic_name, "last", initial_position=E)
    last = None
    for i in range(3):
        last = producer.send(f"l-{i}".encode())
    got = c.get_last_message_id()
    assert (got.ledger_id(), got.entry_id()) == (last.ledger_id(), last.entry_id())


def test_non_durable_subscription_via_reader_leaves_no_cursor(
    client: pulsar.Client, topic_name: str, standalone
) -> None:  # type: ignore[no-untyped-def]
    _send(client, topic_name, 2)
    reader = client.create_reader(topic_name, pulsar.MessageId.earliest)
    assert reader.read_next(5000).data() == b"m-0"
    reader.close()
    # A durable subscription created later starts at latest: the reader left no state behind.
    c = client.subscribe(topic_name, "after-reader")
    assert _drain(c, timeout_ms=300) == []
