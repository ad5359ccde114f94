"""Broker endpoints and HTTP lookup, including the official client in HTTP service-URL mode."""

from __future__ import annotations

import pulsar

from tests.admin.rest import call
from tests.conftest import StandaloneProcess


def test_broker_endpoints(standalone: StandaloneProcess) -> None:
    base = f"{standalone.http_url}/admin/v2/brokers"
    assert call("GET", f"{base}/health").body == b"ok"
    assert call("GET", f"{base}/ready").status == 200
    me = f"127.0.0.1:{standalone.http_port}"
    assert call("GET", f"{base}/standalone").json == [me]
    assert call("GET", f"{base}/no-such-cluster").status == 404
    assert call("GET", f"{base}/leaderBroker").json["brokerId"] == me
    runtime = call("GET", f"{base}/configuration/runtime").json
    assert runtime["brokerServicePort"] == str(standalone.port) and runtime["clusterName"] == "standalone"


def test_http_lookup(standalone: StandaloneProcess, topic_name: str) -> None:
    path = topic_name.replace("persistent://", "persistent/")
    reply = call("GET", f"{standalone.http_url}/lookup/v2/topic/{path}")
    assert reply.status == 200 and reply.json["brokerUrl"] == standalone.service_url
    assert call("GET", f"{standalone.http_url}/lookup/v2/topic/persistent/nope/nope/t").status == 404


def test_client_with_http_service_url(standalone: StandaloneProcess, topic_name: str) -> None:
    client = pulsar.Client(
        standalone.http_url, operation_timeout_seconds=10, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
    )
    try:
        producer = client.create_producer(topic_name)
        consumer = client.subscribe(topic_name, "http-mode", initial_position=pulsar.InitialPosition.Earliest)
        producer.send(b"via http lookup")
        assert consumer.receive(timeout_millis=5000).data() == b"via http lookup"
        partitioned = topic_name + "-p"
        call(
            "PUT", f"{standalone.http_url}/admin/v2/{partitioned.replace('persistent://', 'persistent/')}/partitions", 2
        )
        p2 = client.create_producer(partitioned)
        c2 = client.subscribe(partitioned, "s", initial_position=pulsar.InitialPosition.Earliest)
        p2.send(b"a", partition_key="1")
        p2.send(b"b", partition_key="2")
        assert sorted(c2.receive(timeout_millis=5000).data() for _ in range(2)) == [b"a", b"b"]
    finally:
        client.close()
