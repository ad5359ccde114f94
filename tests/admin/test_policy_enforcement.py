"""Namespace and topic policies enforced on live topics, observed through the official client.

One broker with fast housekeeping intervals serves the whole module.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator

import pulsar
import pytest

from tests.admin.rest import call
from tests.conftest import StandaloneProcess

E = pulsar.InitialPosition.Earliest
_ns_counter = itertools.count()


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneProcess]:
    broker = StandaloneProcess(
        tmp_path_factory.mktemp("enforcement") / "data",
        {
            "messageExpiryCheckIntervalInMinutes": "0.01",
            "backlogQuotaCheckIntervalInSeconds": "0.5",
            "brokerDeleteInactiveTopicsFrequencySeconds": "0.5",
            "subscriptionExpiryCheckIntervalInMinutes": "0.01",
            "managedLedgerMaxEntriesPerLedger": "5",
            "managedLedgerMinLedgerRolloverTimeMinutes": "0",
            "managedLedgerCursorFlushIntervalMs": "20",
        },
    )
    broker.start()
    yield broker
    broker.stop()


@pytest.fixture(scope="module")
def pclient(node: StandaloneProcess) -> Iterator[pulsar.Client]:
    c = pulsar.Client(
        node.service_url, operation_timeout_seconds=5, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
    )
    yield c
    c.close()


@pytest.fixture
def namespace(node: StandaloneProcess) -> str:
    ns = f"public/enforce-{next(_ns_counter)}"
    reply = call("PUT", f"{node.http_url}/admin/v2/namespaces/{ns}")
    assert reply.status == 204, reply.body
    return ns


def _policy(node: StandaloneProcess, ns: str, name: str, body: object, query: str = "") -> None:
    reply = call("POST", f"{node.http_url}/admin/v2/namespaces/{ns}/{name}{query}", body)
    assert reply.status in (200, 204), (reply.status, reply.body)


def _until(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


def _backlog(node: StandaloneProcess, topic: str, sub: str) -> int:
    stats = call("GET", f"{node.http_url}/admin/v2/{topic.replace('persistent://', 'persistent/')}/stats").json
    return stats["subscriptions"][sub]["msgBacklog"]


def test_message_ttl_expires_unacked_messages(node: StandaloneProcess, pclient: pulsar.Client, namespace: str) -> None:
    _policy(node, namespace, "messageTTL", 1)
    topic = f"persistent://{namespace}/ttl"
    consumer = pclient.subscribe(topic, "slow", initial_position=E, receiver_queue_size=1)
    consumer.close()  # nobody consumes: the backlog can only go away by expiry
    producer = pclient.create_producer(topic, batching_enabled=False)
    for i in range(5):
        producer.send(f"old-{i}".encode())
    assert _backlog(node, topic, "slow") == 5
    assert _until(lambda: _backlog(node, topic, "slow") == 0, timeout=15)
    producer.send(b"fresh")
    consumer = pclient.subscribe(topic, "slow", initial_position=E)
    assert consumer.receive(timeout_millis=5000).data() == b"fresh"


def test_backlog_quota_producer_exception(node: StandaloneProcess, pclient: pulsar.Client, namespace: str) -> None:
    _policy(
        node,
        namespace,
        "backlogQuota",
        {"limitSize": 2048, "policy": "producer_exception"},
        "?backlogQuotaType=destination_storage",
    )
    topic = f"persistent://{namespace}/quota-exception"
    pclient.subscribe(topic, "idle", initial_position=E).close()
    producer = pclient.create_producer(topic, batching_enabled=False)
    for _ in range(40):
        producer.send(b"x" * 100)
    time.sleep(1.5)  # the periodic check sees the topic over quota and disconnects producers
    with pytest.raises(pulsar.ProducerBlockedQuotaExceededException):
        pclient.create_producer(topic)
    # Draining the backlog lifts the block.
    assert (
        call(
            "POST",
            f"{node.http_url}/admin/v2/{topic.replace('persistent://', 'persistent/')}/subscription/idle/skip_all",
        ).status
        == 204
    )
    assert _until(lambda: _try_producer(pclient, topic))


def test_backlog_quota_by_message_age(node: StandaloneProcess, pclient: pulsar.Client, namespace: str) -> None:
    """A ``message_age`` quota refuses producers once the oldest unacknowledged message is older than the limit."""
    _policy(
        node,
        namespace,
        "backlogQuota",
        {"limitTime": 1, "policy": "producer_exception"},
        "?backlogQuotaType=message_age",
    )
    topic = f"persistent://{namespace}/quota-age"
    pclient.subscribe(topic, "idle", initial_position=E).close()
    producer = pclient.create_producer(topic, batching_enabled=False)
    producer.send(b"ages")
    producer.close()
    # Older than the 1 s limit, and seen by the 0.5 s check: new producers are refused.
    assert _until(lambda: not _try_producer(pclient, topic), timeout=10)
    with pytest.raises(pulsar.ProducerBlockedQuotaExceededException):
        pclient.create_producer(topic)


def _try_producer(client: pulsar.Client, topic: str) -> bool:
    try:
        client.create_producer(topic).close()
    except pulsar.PulsarException:
        return False
    return True


def test_backlog_quota_request_hold(node: StandaloneProcess, pclient: pulsar.Client, namespace: str) -> None:
    topic = f"persistent://{namespace}/quota-hold"
    pclient.subscribe(topic, "idle", initial_position=E).close()
    producer = pclient.create_producer(topic, batching_enabled=False)
    for _ in range(40):  # 4,000 bytes of backlog before the quota is set: a check cannot hold these sends
        producer.send(b"x" * 100)
    _policy(node, namespace, "backlogQuota", {"limitSize": 2048, "policy": "producer_request_hold"})
    time.sleep(1.5)  # the quota check (every 0.5 s) finds the backlog over the quota
    with pytest.raises(pulsar.PulsarException):  # held until the client's operation timeout
        pclient.create_producer(topic)


def test_backlog_quota_consumer_eviction(node: StandaloneProcess, pclient: pulsar.Client, namespace: str) -> None:
    _policy(node, namespace, "backlogQuota", {"limitSize": 2048, "policy": "consumer_backlog_eviction"})
    topic = f"persistent://{namespace}/quota-evict"
    pclient.subscribe(topic, "idle", initial_position=E).close()
    producer = pclient.create_producer(topic, batching_enabled=False)
    for i in range(100):
        producer.send(f"{i:03d}".encode() * 25)
    # The oldest backlog is evicted down to the quota; the producer keeps working.
    assert _until(lambda: _backlog(node, topic, "idle") < 40, timeout=15)
    producer.send(b"still accepted")
    consumer = pclient.subscribe(topic, "idle")
    first = consumer.receive(timeout_millis=5000).data()
    assert first != f"{0:03d}".encode() * 25  # the oldest messages were dropped


def test_retention_keeps_acked_data_for_readers(
    node: StandaloneProcess, pclient: pulsar.Client, namespace: str
) -> None:
    _policy(node, namespace, "retention", {"retentionTimeInMinutes": -1, "retentionSizeInMB": -1})
    kept, dropped = f"persistent://{namespace}/kept", "persistent://public/default/retention-dropped"
    for topic in (kept, dropped):
        consumer = pclient.subscribe(topic, "all", initial_position=E)
        producer = pclient.create_producer(topic, batching_enabled=False)
        for i in range(20):  # several ledgers (5 entries each)
            producer.send(f"r{i}".encode())
        for _ in range(20):
            consumer.acknowledge(consumer.receive(timeout_millis=5000))
        producer.send(b"tail")  # rolls the ledger list forward so consumed ledgers can be trimmed
        consumer.acknowledge(consumer.receive(timeout_millis=5000))
        consumer.close()
    time.sleep(1.0)
    reader = pclient.create_reader(kept, pulsar.MessageId.earliest)
    assert reader.read_next(5000).data() == b"r0"  # retained although acknowledged
    internal = call(
        "GET", f"{node.http_url}/admin/v2/{dropped.replace('persistent://', 'persistent/')}/internalStats"
    ).json
    assert internal["numberOfEntries"] < 21  # without retention, consumed ledgers were deleted


def test_max_producers_per_topic(node: StandaloneProcess, pclient: pulsar.Client, namespace: str) -> None:
    _policy(node, namespace, "maxProducersPerTopic", 1)
    topic = f"persistent://{namespace}/one-producer"
    first = pclient.create_producer(topic)
    with pytest.raises(pulsar.ProducerBusy):
        pclient.create_producer(topic)
    first.close()
    pclient.create_producer(topic).close()


def test_auto_topic_creation_override(node: StandaloneProcess, pclient: pulsar.Client, namespace: str) -> None:
    _policy(node, namespace, "autoTopicCreation", {"allowAutoTopicCreation": False})
    with pytest.raises(pulsar.TopicNotFound):
        pclient.create_producer(f"persistent://{namespace}/not-allowed")
    _policy(
        node,
        namespace,
        "autoTopicCreation",
        {"allowAutoTopicCreation": True, "topicType": "partitioned", "defaultNumPartitions": 3},
    )
    topic = f"persistent://{namespace}/auto-partitioned"
    pclient.create_producer(topic).close()
    reply = call("GET", f"{node.http_url}/admin/v2/{topic.replace('persistent://', 'persistent/')}/partitions")
    assert reply.json == {"partitions": 3}


def test_inactive_topics_are_deleted(node: StandaloneProcess, pclient: pulsar.Client, namespace: str) -> None:
    _policy(
        node,
        namespace,
        "inactiveTopicPolicies",
        {
            "inactiveTopicDeleteMode": "delete_when_no_subscriptions",
            "maxInactiveDurationSeconds": 2,
            "deleteWhileInactive": True,
        },
    )
    topic = f"persistent://{namespace}/idle-topic"
    pclient.create_producer(topic).close()
    listing = f"{node.http_url}/admin/v2/persistent/{namespace}"
    assert topic in call("GET", listing).json
    assert _until(lambda: topic not in call("GET", listing).json, timeout=15)


def test_inactivity_counts_from_the_last_producer_leaving(
    node: StandaloneProcess, pclient: pulsar.Client, namespace: str
) -> None:
    _policy(
        node,
        namespace,
        "inactiveTopicPolicies",
        {
            "inactiveTopicDeleteMode": "delete_when_no_subscriptions",
            "maxInactiveDurationSeconds": 2,
            "deleteWhileInactive": True,
        },
    )
    topic = f"persistent://{namespace}/busy-then-idle"
    producer = pclient.create_producer(topic)
    for _ in range(30):  # attached (and publishing) for longer than the inactivity limit
        producer.send(b"x")
        time.sleep(0.1)
    producer.close()
    left = time.monotonic()
    listing = f"{node.http_url}/admin/v2/persistent/{namespace}"
    # Inactive only from the producer's departure: not deleted at the next check (every 0.5 s).
    while time.monotonic() - left < 1.2:
        assert topic in call("GET", listing).json
        time.sleep(0.1)
    assert _until(lambda: topic not in call("GET", listing).json, timeout=15)


def test_policy_change_applies_without_restart(node: StandaloneProcess, pclient: pulsar.Client, namespace: str) -> None:
    topic = f"persistent://{namespace}/live"
    producer = pclient.create_producer(topic)
    _policy(node, namespace, "maxConsumersPerTopic", 1)
    first = pclient.subscribe(topic, "a")
    with pytest.raises(pulsar.ConsumerBusy):
        pclient.subscribe(topic, "b")
    first.close()
    producer.close()


def test_topic_level_policy_overrides_namespace(
    node: StandaloneProcess, pclient: pulsar.Client, namespace: str
) -> None:
    _policy(node, namespace, "maxProducersPerTopic", 1)
    topic = f"persistent://{namespace}/override"
    path = f"{node.http_url}/admin/v2/{topic.replace('persistent://', 'persistent/')}"
    pclient.create_producer(topic).close()
    assert call("POST", f"{path}/maxProducers", 2).status in (200, 204)
    assert _until(lambda: _two_producers(pclient, topic))


def _two_producers(client: pulsar.Client, topic: str) -> bool:
    try:
        a = client.create_producer(topic)
        b = client.create_producer(topic)
    except pulsar.PulsarException:
        return False
    a.close()
    b.close()
    return True
