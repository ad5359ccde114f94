"""Topic-level behaviour: auto-creation, namespace listing for regex consumers, schemas, liveness."""

from __future__ import annotations

import re
import urllib.request

import pulsar
import pytest
from pulsar.schema import StringSchema

from magnetar.broker.protocol import pulsar_api_pb2 as pb
from tests.conftest import StandaloneProcess
from tests.rawclient import RawClient

T = pb.BaseCommand


def test_regex_consumer_finds_topics(client: pulsar.Client, topic_name: str) -> None:
    base = topic_name.rsplit("/", 1)[1]
    for suffix in ("a", "b"):
        client.create_producer(f"{topic_name}-{suffix}").close()
    consumer = client.subscribe(
        re.compile(f"persistent://public/default/{base}-.*"), "rx", initial_position=pulsar.InitialPosition.Earliest
    )
    for suffix in ("a", "b"):
        client.create_producer(f"{topic_name}-{suffix}").send(suffix.encode())
    got = sorted(consumer.receive(timeout_millis=5000).data() for _ in range(2))
    assert got == [b"a", b"b"]


def test_topics_of_namespace_hash_and_modes(
    standalone: StandaloneProcess, client: pulsar.Client, topic_name: str
) -> None:
    # A namespace of its own, with its one topic kept active by an open producer: the session broker's
    # inactive-topic sweep deletes other tests' topics from public/default at any moment, and the unchanged-hash
    # answer is only right while nothing in the namespace changes.
    namespace = f"public/{topic_name.rsplit('/', 1)[1][-24:]}"
    request = urllib.request.Request(f"{standalone.http_url}/admin/v2/namespaces/{namespace}", method="PUT")
    with urllib.request.urlopen(request, timeout=10) as r:
        assert r.status == 204
    topic = f"persistent://{namespace}/listed"
    producer = client.create_producer(topic)
    raw = RawClient(standalone.port)
    try:
        raw.connect()
        cmd = T(type=T.GET_TOPICS_OF_NAMESPACE)
        cmd.getTopicsOfNamespace.request_id = 3
        cmd.getTopicsOfNamespace.namespace = namespace
        raw.send(cmd)
        first = raw.recv_until(T.GET_TOPICS_OF_NAMESPACE_RESPONSE).getTopicsOfNamespaceResponse
        assert first.request_id == 3 and list(first.topics) == [topic] and first.changed
        cmd.getTopicsOfNamespace.topics_hash = first.topics_hash
        raw.send(cmd)
        second = raw.recv_until(T.GET_TOPICS_OF_NAMESPACE_RESPONSE).getTopicsOfNamespaceResponse
        assert not second.changed and list(second.topics) == []
        cmd.getTopicsOfNamespace.mode = pb.CommandGetTopicsOfNamespace.NON_PERSISTENT
        cmd.getTopicsOfNamespace.ClearField("topics_hash")
        raw.send(cmd)
        third = raw.recv_until(T.GET_TOPICS_OF_NAMESPACE_RESPONSE).getTopicsOfNamespaceResponse
        assert topic not in third.topics
    finally:
        raw.close()
        producer.close()


def test_get_schema_without_schema(standalone: StandaloneProcess, client: pulsar.Client, topic_name: str) -> None:
    client.create_producer(topic_name).close()
    raw = RawClient(standalone.port)
    try:
        raw.connect()
        cmd = T(type=T.GET_SCHEMA)
        cmd.getSchema.request_id = 9
        cmd.getSchema.topic = topic_name
        raw.send(cmd)
        reply = raw.recv_until(T.GET_SCHEMA_RESPONSE).getSchemaResponse
        assert reply.request_id == 9 and reply.error_code == pb.TopicNotFound
    finally:
        raw.close()


def test_string_schema_roundtrip(client: pulsar.Client, topic_name: str) -> None:
    producer = client.create_producer(topic_name, schema=StringSchema())
    consumer = client.subscribe(
        topic_name, "s", schema=StringSchema(), initial_position=pulsar.InitialPosition.Earliest
    )
    producer.send("héllo")
    assert consumer.receive(timeout_millis=5000).value() == "héllo"


def test_auto_creation_disabled(fresh_standalone: StandaloneProcess) -> None:
    fresh_standalone.extra_config["allowAutoTopicCreation"] = "false"
    fresh_standalone.start()
    c = pulsar.Client(
        fresh_standalone.service_url, operation_timeout_seconds=5, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
    )
    try:
        with pytest.raises(pulsar.TopicNotFound):
            c.create_producer("persistent://public/default/not-there")
    finally:
        c.close()


def test_dead_peer_detection(fresh_standalone: StandaloneProcess) -> None:
    fresh_standalone.extra_config["keepAliveIntervalSeconds"] = "1"
    fresh_standalone.start()
    raw = RawClient(fresh_standalone.port, timeout=10)
    try:
        raw.connect()
        ping, _ = raw.recv_command()
        assert ping.type == T.PING  # the broker probes an idle client
        assert raw.is_closed(timeout=5)  # ...and drops it when no PONG comes back
    finally:
        raw.close()


def test_multi_topic_consumer_across_partitions(
    standalone: StandaloneProcess, client: pulsar.Client, topic_name: str
) -> None:
    from tests.admin.rest import call

    partitioned, plain = f"{topic_name}-parted", f"{topic_name}-plain"
    call("PUT", f"{standalone.http_url}/admin/v2/{partitioned.replace('persistent://', 'persistent/')}/partitions", 3)
    consumer = client.subscribe([partitioned, plain], "multi", initial_position=pulsar.InitialPosition.Earliest)
    p1, p2 = client.create_producer(partitioned), client.create_producer(plain)
    for i in range(6):
        p1.send(f"p{i}".encode(), partition_key=str(i))
    p2.send(b"plain")
    got = sorted(consumer.receive(timeout_millis=5000).data() for _ in range(7))
    assert got == sorted([f"p{i}".encode() for i in range(6)] + [b"plain"])


def test_delivered_message_ids_carry_the_routers_choice(
    standalone: StandaloneProcess, client: pulsar.Client, topic_name: str
) -> None:
    """MESSAGE on a partition carries ``message_id.partition`` as Pulsar's broker sends it: a custom
    router's choice can be read back from ``msg.message_id().partition()``, also for batches."""
    from tests.admin.rest import call

    call("PUT", f"{standalone.http_url}/admin/v2/{topic_name.replace('persistent://', 'persistent/')}/partitions", 3)

    def router(msg: pulsar.Message, num_partitions: int) -> int:
        return int(msg.partition_key()) % num_partitions

    consumer = client.subscribe(topic_name, "routed", initial_position=pulsar.InitialPosition.Earliest)
    for batching in (False, True):
        producer = client.create_producer(topic_name, message_router=router, batching_enabled=batching)
        for i in range(6):
            producer.send_async(f"{batching}-{i}".encode(), None, partition_key=str(i))
        producer.flush()
        producer.close()
    got = {}
    for _ in range(12):
        msg = consumer.receive(timeout_millis=5000)
        got[msg.data()] = msg.message_id().partition()
        assert msg.topic_name().endswith(f"-partition-{got[msg.data()]}")
    assert got == {f"{b}-{i}".encode(): i % 3 for b in (False, True) for i in range(6)}
    # A consumer on a single partition sees the index too, in messages and in its last message id.
    one = client.subscribe(f"{topic_name}-partition-2", "one", initial_position=pulsar.InitialPosition.Earliest)
    assert one.receive(timeout_millis=5000).message_id().partition() == 2
    assert one.get_last_message_id().partition() == 2
    admin = f"{standalone.http_url}/admin/v2/{topic_name.replace('persistent://', 'persistent/')}-partition-2"
    assert call("GET", f"{admin}/lastMessageId").json["partitionIndex"] == 2


@pytest.mark.slow
def test_regex_consumer_discovers_new_topics(client: pulsar.Client, topic_name: str) -> None:
    """The client polls GET_TOPICS_OF_NAMESPACE every 60 s: the Python wrapper of pulsar-client 3.13
    accepts ``pattern_auto_discovery_period`` but never passes it on, so this waits for the default."""
    base = topic_name.rsplit("/", 1)[1]
    client.create_producer(f"{topic_name}-first").close()
    consumer = client.subscribe(
        re.compile(f"persistent://public/default/{base}-.*"), "rx-new", initial_position=pulsar.InitialPosition.Earliest
    )
    late = client.create_producer(f"{topic_name}-late")  # created after the consumer subscribed
    late.send(b"found")
    msg = consumer.receive(timeout_millis=75_000)
    assert msg.data() == b"found" and msg.topic_name().endswith("-late")
