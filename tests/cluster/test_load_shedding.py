"""The leader's load manager moves bundles off an overloaded broker: one broker takes every bundle while
alone, a second one joins, and shedding hands bundles over while producers keep sending."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pulsar
import pytest

from magnetar.broker.broker_registry import BrokerInfo
from magnetar.broker.load_manager import overloaded
from tests.cluster.multi import MultiCluster
from tests.etcd_server import find_etcd_binary


def _info(broker_id: str, topics: int, bundles: int, rate: float = 0.0) -> BrokerInfo:
    load = {"numTopics": topics, "bundles": [f"b{i}" for i in range(bundles)], "msgRateIn": rate}
    return BrokerInfo(broker_id, "http://x", "pulsar://x", load=load)


def test_overloaded_compares_with_the_mean() -> None:
    brokers = [_info("a", 8, 4), _info("b", 0, 0), _info("c", 1, 1)]
    assert [b.broker_id for b in overloaded(brokers, 85)] == ["a"]  # mean 3, limit 5.55
    assert overloaded([_info("a", 8, 1), _info("b", 0, 0)], 85) == []  # one bundle: nothing to give away
    assert overloaded([_info("a", 4, 2), _info("b", 3, 2)], 85) == []
    # Message rates decide once there is traffic.
    busy = [_info("a", 1, 2, rate=1000.0), _info("b", 9, 2, rate=10.0)]
    assert [b.broker_id for b in overloaded(busy, 85)] == ["a"]
    assert overloaded([_info("a", 5, 5)], 85) == []  # a single broker has nobody to shed to


@pytest.mark.skipif(find_etcd_binary() is None and not os.environ.get("CI"), reason="no etcd binary")
def test_shedding_moves_bundles_to_a_new_broker(tmp_path: Path) -> None:
    settings = {"loadBalancerSheddingEnabled": "true", "loadBalancerSheddingIntervalMinutes": "0.03"}
    cluster = MultiCluster(tmp_path, brokers=2, bookies=2, settings=settings)
    first, second = cluster.brokers
    client = None
    try:
        cluster.start(brokers=1)
        cluster.create_namespace("public/shed", 4)
        client = pulsar.Client(first.service_url, operation_timeout_seconds=30,
                               logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))  # fmt: skip
        # One topic per bundle, all owned by the only broker.
        topics, n = [], 0
        while len({o for o in cluster.ownership("public/shed")}) < 4 and n < 200:
            topic = f"persistent://public/shed/t{n}"
            n += 1
            before = set(cluster.ownership("public/shed"))
            producer = client.create_producer(topic, batching_enabled=False)
            if set(cluster.ownership("public/shed")) != before:
                topics.append((topic, producer))
            else:
                producer.close()
        assert set(cluster.ownership("public/shed").values()) == {first.broker_id}
        second.start()
        deadline = time.monotonic() + 40
        moved = False
        while time.monotonic() < deadline and not moved:
            for _topic, producer in topics:
                producer.send(b"x")  # reconnects to the new owner after a shed
            moved = second.broker_id in cluster.ownership("public/shed").values()
            time.sleep(0.3)
        assert moved, f"no bundle moved: {cluster.ownership('public/shed')}"
        assert "overloaded" in first.log_path.read_text()
        for _topic, producer in topics:
            producer.send(b"still fine")
    finally:
        if client is not None:
            client.close()
        cluster.stop()


def test_owner_splits_a_bundle_with_too_many_topics() -> None:
    """``loadBalancerNamespaceBundleMaxTopics``: the owner splits a bundle holding more loaded topics."""
    import asyncio
    from types import SimpleNamespace

    from magnetar.broker.bundles import Bundle
    from magnetar.broker.config import BrokerConfig
    from magnetar.broker.load_manager import LoadManager

    hot, cold = Bundle.parse("a/b", "0x00000000_0x80000000"), Bundle.parse("a/b", "0x80000000_0xffffffff")
    split: list[Bundle] = []

    class Namespaces:
        service = SimpleNamespace(config=BrokerConfig(load_balancer_namespace_bundle_max_topics=3))
        ownership = SimpleNamespace(owned=[hot, cold])
        registry = SimpleNamespace(is_leader=False)

        def topics_of(self, bundle: Bundle) -> list[int]:
            return list(range(5 if bundle == hot else 2))

        async def split_bundle(self, bundle: Bundle, *, unload: bool) -> None:
            split.append(bundle)

    asyncio.run(LoadManager(Namespaces()).run_once())  # type: ignore[arg-type]
    assert split == [hot]
