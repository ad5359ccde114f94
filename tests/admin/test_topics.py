"""Topic endpoints of the admin API over real HTTP against a running standalone broker."""

from __future__ import annotations

import time

import pulsar
import pytest

from tests.admin.rest import call
from tests.conftest import StandaloneProcess

E = pulsar.InitialPosition.Earliest


@pytest.fixture
def base(standalone: StandaloneProcess) -> str:
    return f"{standalone.http_url}/admin/v2"


def _path(topic_name: str) -> str:
    return topic_name.replace("persistent://", "persistent/")


def test_create_list_delete_topic(base: str, topic_name: str) -> None:
    url = f"{base}/{_path(topic_name)}"
    assert call("PUT", url).status == 204
    again = call("PUT", url)
    assert again.status == 409 and again.reason == "This topic already exists"
    assert topic_name in call("GET", f"{base}/persistent/public/default").json
    assert call("GET", f"{url}/partitions").json == {"partitions": 0}
    assert call("DELETE", url).status == 204
    assert topic_name not in call("GET", f"{base}/persistent/public/default").json
    missing = call("DELETE", url)
    assert missing.status == 404 and "reason" in missing.json


def test_delete_refused_while_clients_connected(base: str, client: pulsar.Client, topic_name: str) -> None:
    producer = client.create_producer(topic_name)
    url = f"{base}/{_path(topic_name)}"
    busy = call("DELETE", url)
    assert busy.status == 412 and busy.reason == "Topic has active producers/subscriptions"
    assert call("DELETE", f"{url}?force=true").status == 204
    del producer


def test_partitioned_topic_lifecycle(base: str, client: pulsar.Client, topic_name: str) -> None:
    url = f"{base}/{_path(topic_name)}"
    assert call("PUT", f"{url}/partitions", 3).status == 204
    assert call("PUT", f"{url}/partitions", 3).status == 409
    assert call("GET", f"{url}/partitions").json == {"partitions": 3}
    assert topic_name in call("GET", f"{base}/persistent/public/default/partitioned").json
    producer = client.create_producer(topic_name)
    consumer = client.subscribe(topic_name, "sub", initial_position=E)
    for i in range(9):
        producer.send(f"p{i}".encode(), partition_key=str(i))
    got = sorted(consumer.receive(timeout_millis=5000).data() for _ in range(9))
    assert got == sorted(f"p{i}".encode() for i in range(9))
    shrink = call("POST", f"{url}/partitions", 2)
    assert shrink.status == 422
    assert call("POST", f"{url}/partitions", 5).status == 204
    assert call("GET", f"{url}/partitions").json == {"partitions": 5}
    # The existing subscription was created on the new partitions too.
    stats = call("GET", f"{base}/{_path(topic_name)}-partition-4/stats").json
    assert "sub" in stats["subscriptions"]
    pstats = call("GET", f"{url}/partitioned-stats").json
    assert pstats["metadata"] == {"partitions": 5} and pstats["msgInCounter"] == 9
    producer.close()
    consumer.close()
    assert call("DELETE", f"{url}/partitions").status == 204
    assert call("GET", f"{url}/partitions").json == {"partitions": 0}


@pytest.mark.parametrize("body", [0, -1, "3", None, 1.5])
def test_invalid_partition_counts(base: str, topic_name: str, body: object) -> None:
    reply = call(
        "PUT",
        f"{base}/{_path(topic_name)}/partitions",
        raw=b"" if body is None else str(body).encode() if not isinstance(body, str) else b'"3"',
    )
    assert 400 <= reply.status < 500 and reply.json["reason"]


def test_stats_and_internal_stats(base: str, client: pulsar.Client, topic_name: str) -> None:
    producer = client.create_producer(topic_name, producer_name="stats-producer", batching_enabled=False)
    consumer = client.subscribe(topic_name, "stats-sub", consumer_name="c1", initial_position=E)
    for i in range(10):
        producer.send(f"s{i}".encode())
    for _ in range(4):
        consumer.acknowledge(consumer.receive(timeout_millis=5000))
    deadline = time.time() + 5
    while True:
        stats = call("GET", f"{base}/{_path(topic_name)}/stats").json
        sub = stats["subscriptions"]["stats-sub"]
        if sub["msgBacklog"] == 6 or time.time() > deadline:
            break
        time.sleep(0.1)
    assert stats["msgInCounter"] == 10 and stats["storageSize"] > 0
    assert [p["producerName"] for p in stats["publishers"]] == ["stats-producer"]
    assert sub["msgBacklog"] == 6 and sub["type"] == "Exclusive" and sub["consumers"][0]["consumerName"] == "c1"
    internal = call("GET", f"{base}/{_path(topic_name)}/internalStats").json
    assert internal["numberOfEntries"] == 10 and internal["ledgers"]
    assert internal["cursors"]["stats-sub"]["markDeletePosition"].endswith(":3")
    last = call("GET", f"{base}/{_path(topic_name)}/lastMessageId").json
    assert last["entryId"] == 9


def test_stats_of_unknown_topic_is_404(base: str) -> None:
    reply = call("GET", f"{base}/persistent/public/default/never-created-xyz/stats")
    assert reply.status == 404 and reply.json["reason"]


def test_terminate(base: str, client: pulsar.Client, topic_name: str) -> None:
    producer = client.create_producer(topic_name, batching_enabled=False)
    consumer = client.subscribe(topic_name, "t", initial_position=E)
    last = producer.send(b"last one")
    reply = call("POST", f"{base}/{_path(topic_name)}/terminate")
    assert reply.status == 200 and reply.json["entryId"] == last.entry_id()
    with pytest.raises(pulsar.PulsarException):
        producer.send(b"after terminate")
    assert consumer.receive(timeout_millis=5000).data() == b"last one"
    with pytest.raises(pulsar.PulsarException):
        client.create_producer(topic_name)


def test_unload_keeps_clients_working(base: str, client: pulsar.Client, topic_name: str) -> None:
    producer = client.create_producer(topic_name, batching_enabled=False)
    consumer = client.subscribe(topic_name, "u", initial_position=E)
    producer.send(b"before")
    assert call("PUT", f"{base}/{_path(topic_name)}/unload").status == 204
    producer.send(b"after")  # the client reconnects and the topic reloads
    assert [consumer.receive(timeout_millis=10000).data() for _ in range(2)] == [b"before", b"after"]


def test_invalid_topic_name_is_412(base: str) -> None:
    reply = call("PUT", f"{base}/persistent/pub%20lic/default/t")
    assert reply.status == 412 and reply.json["reason"]


def test_openapi_document_lists_operations(base: str) -> None:
    doc = call("GET", f"{base}/openapi.json").json
    assert doc["openapi"].startswith("3.")
    assert "/admin/v2/{domain}/{tenant}/{namespace}/{topic}/stats" in doc["paths"]


@pytest.mark.parametrize("count", [2147483647, 949007048661, 100_001])
def test_partition_count_ceiling(base: str, topic_name: str, count: int) -> None:
    url = f"{base}/{_path(topic_name)}/partitions"
    reply = call("PUT", url, count)
    assert reply.status == 412 and "less than or equal" in reply.reason
    assert call("PUT", url, 2).status == 204
    grow = call("POST", url, count)
    assert grow.status == 412
    assert call("GET", f"{url.rsplit('/', 1)[0]}/partitioned-stats").status == 200
