"""Non-persistent topics: in-memory, immediate delivery, drops without permits, all subscription types."""

from __future__ import annotations

import pulsar
import pytest

from tests.admin.rest import call
from tests.conftest import StandaloneProcess


@pytest.fixture
def np_topic(topic_name: str) -> str:
    return topic_name.replace("persistent://", "non-persistent://")


@pytest.mark.parametrize(
    "sub_type",
    [
        pulsar.ConsumerType.Exclusive,
        pulsar.ConsumerType.Shared,
        pulsar.ConsumerType.Failover,
        pulsar.ConsumerType.KeyShared,
    ],
)
def test_delivery_to_connected_consumers(client: pulsar.Client, np_topic: str, sub_type: object) -> None:
    consumer = client.subscribe(np_topic, "s", consumer_type=sub_type)
    producer = client.create_producer(np_topic, batching_enabled=False)
    for i in range(5):
        producer.send(f"n{i}".encode(), partition_key=f"k{i}")
    got = [consumer.receive(timeout_millis=5000).data() for _ in range(5)]
    assert sorted(got) == [f"n{i}".encode() for i in range(5)]


def test_messages_without_consumers_are_not_kept(client: pulsar.Client, np_topic: str) -> None:
    producer = client.create_producer(np_topic, batching_enabled=False)
    producer.send(b"nobody listening")
    consumer = client.subscribe(np_topic, "late", initial_position=pulsar.InitialPosition.Earliest)
    producer.send(b"heard")
    assert consumer.receive(timeout_millis=5000).data() == b"heard"
    with pytest.raises(pulsar.Timeout):
        consumer.receive(timeout_millis=300)


def test_shown_in_listings_and_stats(standalone: StandaloneProcess, client: pulsar.Client, np_topic: str) -> None:
    consumer = client.subscribe(np_topic, "st")
    producer = client.create_producer(np_topic)
    producer.send(b"x")
    consumer.receive(timeout_millis=5000)
    listing = call("GET", f"{standalone.http_url}/admin/v2/non-persistent/public/default").json
    assert np_topic in listing
    stats = call(
        "GET", f"{standalone.http_url}/admin/v2/{np_topic.replace('non-persistent://', 'non-persistent/')}/stats"
    ).json
    assert stats["msgInCounter"] == 1 and "st" in stats["subscriptions"] and stats["storageSize"] == 0
    persistent_listing = call("GET", f"{standalone.http_url}/admin/v2/persistent/public/default").json
    assert np_topic not in persistent_listing
