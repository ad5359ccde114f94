"""Producer access modes and message deduplication, through the official client."""

from __future__ import annotations

import threading
import time

import pulsar
import pytest

from tests.admin.rest import call
from tests.conftest import StandaloneProcess

E = pulsar.InitialPosition.Earliest
Mode = pulsar.ProducerAccessMode


def _drain(consumer: pulsar.Consumer, timeout_ms: int = 1000) -> list[bytes]:
    out = []
    while True:
        try:
            msg = consumer.receive(timeout_millis=timeout_ms)
        except pulsar.Timeout:
            return out
        out.append(msg.data())
        consumer.acknowledge(msg)


def test_exclusive_producer_refuses_others(client: pulsar.Client, topic_name: str) -> None:
    owner = client.create_producer(topic_name, access_mode=Mode.Exclusive)
    with pytest.raises(pulsar.ProducerFenced):
        client.create_producer(topic_name, access_mode=Mode.Exclusive)
    with pytest.raises(pulsar.ProducerBusy):
        client.create_producer(topic_name)  # Shared
    owner.send(b"mine")
    owner.close()
    client.create_producer(topic_name, access_mode=Mode.Exclusive).close()


def test_exclusive_refused_while_shared_producers_exist(client: pulsar.Client, topic_name: str) -> None:
    shared = client.create_producer(topic_name)
    with pytest.raises(pulsar.ProducerFenced):
        client.create_producer(topic_name, access_mode=Mode.Exclusive)
    shared.close()


def test_exclusive_with_fencing_takes_over(client: pulsar.Client, topic_name: str) -> None:
    old = client.create_producer(topic_name, access_mode=Mode.Exclusive)
    old.send(b"from old")
    new = client.create_producer(topic_name, access_mode=Mode.ExclusiveWithFencing)
    new.send(b"from new")
    with pytest.raises(pulsar.PulsarException):
        old.send(
            b"fenced",
        )  # the old producer is fenced for good
    consumer = client.subscribe(topic_name, "s", initial_position=E)
    assert _drain(consumer) == [b"from old", b"from new"]


def test_wait_for_exclusive_is_queued_until_free(client: pulsar.Client, topic_name: str) -> None:
    owner = client.create_producer(topic_name, access_mode=Mode.Exclusive)
    got: list[pulsar.Producer] = []
    waiter = threading.Thread(
        target=lambda: got.append(client.create_producer(topic_name, access_mode=Mode.WaitForExclusive))
    )
    waiter.start()
    time.sleep(1.0)
    assert not got, "the waiting producer must not be ready while another one is exclusive"
    owner.close()
    waiter.join(15)
    assert got, "the waiting producer becomes ready once the topic is free"
    got[0].send(b"my turn")


@pytest.fixture
def dedup_topic(standalone: StandaloneProcess, topic_name: str) -> str:
    ns = f"public/dedup-{time.monotonic_ns() % 10**9}"
    assert call("PUT", f"{standalone.http_url}/admin/v2/namespaces/{ns}").status == 204
    assert call("POST", f"{standalone.http_url}/admin/v2/namespaces/{ns}/deduplication", True).status == 204
    return f"persistent://{ns}/{topic_name.rsplit('/', 1)[1]}"


def test_deduplication_drops_resent_messages(client: pulsar.Client, dedup_topic: str) -> None:
    consumer = client.subscribe(dedup_topic, "s", initial_position=E)
    producer = client.create_producer(dedup_topic, producer_name="dedup-p", batching_enabled=False)
    for seq in range(5):
        producer.send(f"m{seq}".encode(), sequence_id=seq)
    assert producer.last_sequence_id() == 4
    producer.close()
    # A reconnecting producer learns where it left off...
    again = client.create_producer(dedup_topic, producer_name="dedup-p", batching_enabled=False)
    assert again.last_sequence_id() == 4
    # ...and whatever it re-sends is acknowledged but not stored twice.
    for seq in range(3, 7):
        again.send(f"m{seq}".encode(), sequence_id=seq)
    assert _drain(consumer) == [f"m{i}".encode() for i in range(7)]


def test_deduplication_with_batches(client: pulsar.Client, dedup_topic: str) -> None:
    consumer = client.subscribe(dedup_topic, "s", initial_position=E)
    producer = client.create_producer(
        dedup_topic, producer_name="batcher", batching_enabled=True, batching_max_publish_delay_ms=50
    )
    for seq in range(10):
        producer.send_async(f"b{seq}".encode(), None, sequence_id=seq)
    producer.flush()
    producer.close()
    again = client.create_producer(
        dedup_topic, producer_name="batcher", batching_enabled=True, batching_max_publish_delay_ms=50
    )
    assert again.last_sequence_id() == 9
    # A resend repeats whole batches (here 5..9), which are dropped; new ones (10..14) are stored.
    for batch in (range(5, 10), range(10, 15)):
        for seq in batch:
            again.send_async(f"b{seq}".encode(), None, sequence_id=seq)
        again.flush()
    assert _drain(consumer) == [f"b{i}".encode() for i in range(15)]


def test_deduplication_survives_kill9(fresh_standalone: StandaloneProcess) -> None:
    node = fresh_standalone
    node.extra_config["brokerDeduplicationEnabled"] = "true"
    node.extra_config["brokerDeduplicationEntriesInterval"] = "7"
    node.start()
    topic = "persistent://public/default/dedup-crash"
    logger = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
    client = pulsar.Client(node.service_url, operation_timeout_seconds=15, logger=logger)
    producer = client.create_producer(topic, producer_name="crashy", batching_enabled=False)
    for seq in range(20):
        producer.send(f"c{seq}".encode(), sequence_id=seq)
    node.kill9()
    client.close()
    node.start()
    client = pulsar.Client(node.service_url, operation_timeout_seconds=15, logger=logger)
    producer = client.create_producer(topic, producer_name="crashy", batching_enabled=False)
    assert producer.last_sequence_id() == 19  # snapshot at 14 + replay of the entries after it
    for seq in range(15, 25):
        producer.send(f"c{seq}".encode(), sequence_id=seq)
    consumer = client.subscribe(topic, "s", initial_position=E)
    assert _drain(consumer) == [f"c{i}".encode() for i in range(25)]
    client.close()


def test_wait_for_exclusive_producer_cannot_publish_before_granted(
    standalone: StandaloneProcess, client: pulsar.Client, topic_name: str
) -> None:
    """A queued WaitForExclusive producer that sends anyway (a confused or hostile client) must not get
    its message stored past the exclusive owner; as Pulsar does, the broker closes the connection."""
    from magnetar.broker.protocol import pulsar_api_pb2 as pb
    from tests.rawclient import RawClient, T

    owner = client.create_producer(topic_name, access_mode=Mode.Exclusive)
    raw = RawClient(standalone.port)
    try:
        raw.connect()
        cmd = T(type=T.PRODUCER)
        cmd.producer.topic, cmd.producer.producer_id, cmd.producer.request_id = topic_name, 7, 1
        cmd.producer.producer_access_mode = pb.WaitForExclusive
        raw.send(cmd)
        queued = raw.recv_until(T.PRODUCER_SUCCESS)
        assert not queued.producer_success.producer_ready
        # The same PRODUCER again (a client retrying) is not told it is ready either (Pulsar: ServiceNotReady).
        cmd.producer.request_id = 2
        raw.send(cmd)
        again = raw.recv_until_any({T.PRODUCER_SUCCESS, T.ERROR})
        assert again.type == T.ERROR and again.error.error == pb.ServiceNotReady, again
        raw.send_message(7, 0, b"sneaked in")
        assert raw.is_closed(), "a SEND of a producer not yet granted must close the connection"
    finally:
        raw.close()
    owner.send(b"owner's")
    consumer = client.subscribe(topic_name, "s", initial_position=E)
    assert _drain(consumer) == [b"owner's"]


def test_stats_report_deduplication_status(
    standalone: StandaloneProcess, client: pulsar.Client, dedup_topic: str, topic_name: str
) -> None:
    """Users check ``deduplicationStatus`` before relying on exactly-once writes: it must say Enabled."""
    for name, want in ((dedup_topic, "Enabled"), (topic_name, "Disabled")):
        client.create_producer(name).close()
        stats = call("GET", f"{standalone.http_url}/admin/v2/persistent/{name[len('persistent://') :]}/stats")
        assert stats.json["deduplicationStatus"] == want, name
