"""Topic compaction with the official client: keyed streams with (compressed) batches and tombstones
read back through ``read_compacted`` consumers, readers and a TableView; the admin trigger and
status over HTTP; the automatic ``compactionThreshold``; a broker killed with -9 mid-compaction."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pulsar
import pytest

from magnetar.broker.protocol import pulsar_api_pb2 as pb
from magnetar.broker.protocol.frames import build_entry
from tests.admin.rest import call
from tests.conftest import StandaloneProcess, _quiet_logger
from tests.rawclient import RawClient

T = pb.BaseCommand


@pytest.fixture
def topic(standalone: StandaloneProcess) -> str:
    return f"persistent://public/default/compact-{uuid.uuid4().hex[:8]}"


def _admin(node: StandaloneProcess, topic: str) -> str:
    return f"{node.http_url}/admin/v2/persistent/{topic.removeprefix('persistent://')}/compaction"


def compact(node: StandaloneProcess, topic: str, timeout: float = 60.0) -> dict:
    """Trigger compaction over HTTP and wait (bounded) until it is no longer RUNNING."""
    url = _admin(node, topic)
    assert call("PUT", url).status == 204
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = call("GET", url).json
        if status["status"] != "RUNNING":
            return status
        time.sleep(0.05)
    raise AssertionError("compaction did not finish in time")


def drain(consumer: pulsar.Consumer, timeout_ms: int = 1500, limit: int = 10_000) -> list[tuple[str, bytes]]:
    out = []
    for _ in range(limit):
        try:
            msg = consumer.receive(timeout_millis=timeout_ms)
        except pulsar.Timeout:
            break
        out.append((msg.partition_key(), msg.data()))
        consumer.acknowledge(msg)
    return out


def read_all(reader: pulsar.Reader, limit: int = 10_000) -> list[tuple[str, bytes]]:
    out = []
    for _ in range(limit):
        if not reader.has_message_available():
            break
        msg = reader.read_next(timeout_millis=5000)
        out.append((msg.partition_key(), msg.data()))
    return out


def publish_keyed_stream(client: pulsar.Client, topic: str) -> dict[str, bytes]:
    """Batched LZ4 rounds, a ZLib producer, tombstones and a keyless message; returns the expected table."""
    batched = client.create_producer(
        topic,
        batching_enabled=True,
        batching_max_messages=5,
        batching_max_publish_delay_ms=1000,
        compression_type=pulsar.CompressionType.LZ4,
    )
    plain = client.create_producer(topic)
    # (not for the tombstone: the C++ client cannot decompress an empty ZLib payload it compressed itself)
    zlib = client.create_producer(topic, compression_type=pulsar.CompressionType.ZLib)
    expected: dict[str, bytes] = {}
    for rnd in range(3):
        for k in range(10):
            value = f"k{k}-r{rnd}".encode()
            batched.send_async(value, None, partition_key=f"k{k}")
            expected[f"k{k}"] = value
        batched.flush()
    plain.send(b"", partition_key="k3")  # tombstone: an empty payload deletes the key
    del expected["k3"]
    batched.send_async(b"", None, partition_key="k4")  # tombstone inside a batch
    batched.send_async(b"k5-last", None, partition_key="k5")
    batched.flush()
    del expected["k4"]
    expected["k5"] = b"k5-last"
    plain.send(b"no key")  # dropped from the compacted view (topicCompactionRetainNullKey=false)
    zlib.send(b"k9-zlib", partition_key="k9")
    expected["k9"] = b"k9-zlib"
    for producer in (batched, plain, zlib):
        producer.close()
    return expected


def test_compaction_status_and_errors_over_http(standalone: StandaloneProcess, client: pulsar.Client, topic) -> None:
    client.create_producer(topic).close()
    assert call("GET", _admin(standalone, topic)).json == {"status": "NOT_RUN", "lastError": ""}
    missing = _admin(standalone, topic + "-missing")
    assert call("PUT", missing).status == 404
    assert call("GET", missing).status == 404
    assert compact(standalone, topic) == {"status": "SUCCESS", "lastError": ""}  # empty topic: nothing to do


def test_compacted_view_through_consumers_readers_and_table_view(
    standalone: StandaloneProcess, client: pulsar.Client, topic: str
) -> None:
    expected = publish_keyed_stream(client, topic)
    everything = client.create_reader(topic, pulsar.MessageId.earliest)
    original = read_all(everything)
    everything.close()
    assert len(original) == 30 + 5
    assert compact(standalone, topic) == {"status": "SUCCESS", "lastError": ""}

    after = client.create_producer(topic)
    after.send(b"k1-after", partition_key="k1")  # above the horizon: read from the live topic
    expected_view = sorted(expected.items())

    consumer = client.subscribe(
        topic, "compacted", is_read_compacted=True, initial_position=pulsar.InitialPosition.Earliest
    )
    got = drain(consumer)
    assert sorted(got[:-1]) == expected_view and got[-1] == ("k1", b"k1-after")
    consumer.close()

    reader = client.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True)
    got = read_all(reader)
    assert sorted(got[:-1]) == expected_view and got[-1] == ("k1", b"k1-after")
    reader.close()

    # The topic itself is untouched.
    plain = client.create_reader(topic, pulsar.MessageId.earliest)
    assert read_all(plain) == [*original, ("k1", b"k1-after")]
    plain.close()

    table = client.create_table_view(topic)
    try:
        seen: dict[str, bytes] = {}
        table.for_each(lambda key, value: seen.__setitem__(key, value))
        assert seen == {**expected, "k1": b"k1-after"}
    finally:
        table.close()


def test_second_compaction_builds_on_the_first(standalone: StandaloneProcess, client: pulsar.Client, topic) -> None:
    producer = client.create_producer(topic)
    for i in range(5):
        producer.send(f"a{i}".encode(), partition_key=f"k{i}")
    assert compact(standalone, topic)["status"] == "SUCCESS"
    producer.send(b"", partition_key="k0")
    producer.send(b"b1", partition_key="k1")
    producer.send(b"b9", partition_key="k9")
    assert compact(standalone, topic)["status"] == "SUCCESS"
    reader = client.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True)
    assert read_all(reader) == [("k2", b"a2"), ("k3", b"a3"), ("k4", b"a4"), ("k1", b"b1"), ("k9", b"b9")]
    reader.close()
    stats = call("GET", f"{standalone.http_url}/admin/v2/persistent/{topic[13:]}/stats").json
    assert "__compaction" in stats["subscriptions"]
    internal = call("GET", f"{standalone.http_url}/admin/v2/persistent/{topic[13:]}/internalStats").json
    compacted = internal["compactedLedger"]
    assert compacted["ledgerId"] >= 0 and compacted["entries"] == 5 and compacted["size"] > 0
    assert internal["cursors"]["__compaction"]["markDeletePosition"] == internal["lastConfirmedEntry"]


def test_read_compacted_only_on_exclusive_or_failover(
    standalone: StandaloneProcess, client: pulsar.Client, topic: str
) -> None:
    client.create_producer(topic).close()
    with pytest.raises(pulsar.InvalidConfiguration):  # the C++ client refuses it itself...
        client.subscribe(topic, "shared", consumer_type=pulsar.ConsumerType.Shared, is_read_compacted=True)
    raw = RawClient(standalone.port)  # ...so the broker's refusal is seen on the wire
    try:
        raw.connect()
        cmd = T(type=T.SUBSCRIBE)
        s = cmd.subscribe
        s.topic, s.subscription, s.subType = topic, "shared", pb.CommandSubscribe.Shared
        s.consumer_id, s.request_id, s.read_compacted = 1, 3, True
        raw.send(cmd)
        reply = raw.recv_until_response(3)
        assert reply.type == T.ERROR and reply.error.error == pb.NotAllowedError
        # (the C++ client refuses read_compacted on non-persistent topics; the broker just reads them)
        s.topic = topic.replace("persistent://", "non-persistent://")
        s.subType, s.request_id = pb.CommandSubscribe.Exclusive, 4
        raw.send(cmd)
        assert raw.recv_until_response(4).type == T.SUCCESS
    finally:
        raw.close()
    client.subscribe(topic, "failover", consumer_type=pulsar.ConsumerType.Failover, is_read_compacted=True).close()


# ------------------------------------------------------------------ brokers of their own
@pytest.fixture
def threshold_broker(tmp_path) -> Iterator[StandaloneProcess]:
    node = StandaloneProcess(tmp_path / "data", {"brokerServiceCompactionMonitorIntervalInSeconds": "1"})
    node.start()
    yield node
    node.stop()


def test_threshold_triggers_compaction(threshold_broker: StandaloneProcess) -> None:
    node = threshold_broker
    url = f"{node.http_url}/admin/v2/namespaces/public/default/compactionThreshold"
    assert call("GET", url).status == 204
    assert call("PUT", url, 1000).status == 204
    assert call("GET", url).json == 1000
    topic = f"persistent://public/default/auto-{uuid.uuid4().hex[:8]}"
    client = pulsar.Client(node.service_url, operation_timeout_seconds=10, logger=_quiet_logger())
    try:
        producer = client.create_producer(topic)
        for i in range(50):
            producer.send(b"x" * 100 + str(i).encode(), partition_key=f"k{i % 3}")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and call("GET", _admin(node, topic)).json["status"] != "SUCCESS":
            time.sleep(0.2)
        assert call("GET", _admin(node, topic)).json["status"] == "SUCCESS"
        reader = client.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True)
        assert sorted(read_all(reader)) == [("k0", b"x" * 100 + b"48"), ("k1", b"x" * 100 + b"49"),
                                            ("k2", b"x" * 100 + b"47")]  # fmt: skip
        # A topic-level threshold overrides the namespace's: a huge one stops automatic compaction.
        other = f"persistent://public/default/auto-topic-{uuid.uuid4().hex[:8]}"
        producer = client.create_producer(other)
        topic_url = f"{node.http_url}/admin/v2/persistent/{other.removeprefix('persistent://')}/compactionThreshold"
        assert call("POST", topic_url, 10**12).status == 204
        assert call("GET", topic_url).json == 10**12
        assert call("POST", topic_url, -1).status == 412
        for i in range(50):
            producer.send(b"y" * 100, partition_key=f"k{i % 3}")
        time.sleep(2.5)  # two monitor rounds
        assert call("GET", _admin(node, other)).json["status"] == "NOT_RUN"
    finally:
        client.close()


def test_kill9_during_compaction_then_compaction_completes(fresh_standalone: StandaloneProcess) -> None:
    node = fresh_standalone
    node.start()
    topic = f"persistent://public/default/kill-{uuid.uuid4().hex[:8]}"
    client = pulsar.Client(node.service_url, operation_timeout_seconds=10, logger=_quiet_logger())
    keys = 15_000  # big enough that the two passes take well over the 0.2 s before the kill
    try:
        producer = client.create_producer(topic, block_if_queue_full=True)  # one entry per message
        for rnd in range(2):
            for k in range(keys):
                producer.send_async(f"{k}-{rnd}".encode(), None, partition_key=f"k{k}")
            producer.flush()
    finally:
        client.close()
    url = _admin(node, topic)
    assert call("PUT", url).status == 204
    time.sleep(0.2)  # well into the two passes over 2 x keys entries
    assert call("GET", url).json["status"] == "RUNNING"
    node.kill9()
    node.start()
    client = pulsar.Client(node.service_url, operation_timeout_seconds=10, logger=_quiet_logger())
    try:
        # Whatever the crash left, the compacted view is consistent: the full topic or the finished result.
        reader = client.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True)
        seen = dict(read_all(reader, limit=3 * keys))
        reader.close()
        assert seen == {f"k{k}": f"{k}-1".encode() for k in range(keys)}
        assert compact(node, topic)["status"] == "SUCCESS"
        reader = client.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True)
        got = read_all(reader, limit=3 * keys)
        assert len(got) == keys and dict(got) == {f"k{k}": f"{k}-1".encode() for k in range(keys)}
    finally:
        client.close()


def test_partitioned_topic_compaction_and_delete(standalone: StandaloneProcess, client: pulsar.Client) -> None:
    topic = f"persistent://public/default/compact-parts-{uuid.uuid4().hex[:8]}"
    base = f"{standalone.http_url}/admin/v2/persistent/{topic.removeprefix('persistent://')}"
    assert call("PUT", f"{base}/partitions", 2).status == 204
    producer = client.create_producer(topic)
    for rnd in range(3):
        for k in range(6):
            producer.send(f"{k}-{rnd}".encode(), partition_key=f"k{k}")
    producer.close()
    assert compact(standalone, topic) == {"status": "SUCCESS", "lastError": ""}  # every partition
    consumer = client.subscribe(
        topic, "table", is_read_compacted=True, initial_position=pulsar.InitialPosition.Earliest
    )
    assert sorted(drain(consumer)) == [(f"k{k}", f"{k}-2".encode()) for k in range(6)]
    consumer.close()
    assert call("DELETE", f"{base}/partitions?force=true").status == 204
    assert call("GET", f"{base}/compaction").status == 404


def test_unreadable_batch_is_left_out(standalone: StandaloneProcess, client: pulsar.Client, topic: str) -> None:
    good = client.create_producer(topic)
    good.send(b"v1", partition_key="k1")
    raw = RawClient(standalone.port)
    try:
        raw.connect()
        raw.create_producer(topic, producer_id=1, request_id=1)
        meta = pb.MessageMetadata(producer_name="raw", sequence_id=0, publish_time=1, num_messages_in_batch=2,
                                  compression=pb.LZ4, uncompressed_size=64)  # fmt: skip
        raw.send_message(1, 0, b"", entry=build_entry(meta, b"not lz4 at all"))
        assert raw.recv_until(T.SEND_RECEIPT).send_receipt.sequence_id == 0
    finally:
        raw.close()
    good.send(b"v2", partition_key="k2")
    assert compact(standalone, topic) == {"status": "SUCCESS", "lastError": ""}
    reader = client.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True)
    assert read_all(reader) == [("k1", b"v1"), ("k2", b"v2")]
