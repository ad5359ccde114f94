"""Advertised listeners: configuration validated as Pulsar does, LOOKUP / HTTP lookup answering with the
named listener's URLs, and ``bindAddresses`` sockets defaulting to their listener."""

from __future__ import annotations

import json
import re
import ssl
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pulsar
import pytest

from magnetar.broker.config import BrokerConfig
from magnetar.broker.listeners import ConfigError, parse_listeners
from magnetar.broker.protocol import pulsar_api_pb2 as pb
from tests.admin.rest import call
from tests.conftest import StandaloneProcess, free_port
from tests.rawclient import RawClient

T = pb.BaseCommand


def _config(**values: str) -> BrokerConfig:
    config = BrokerConfig()
    config.apply(values)
    return config


# ---------------------------------------------------------------------------------------------- validation


def test_no_listeners_means_advertised_address_urls() -> None:
    listeners = parse_listeners(_config(advertisedAddress="broker-0"))
    assert listeners.advertised == {} and listeners.internal is None


def test_internal_listener_defaults_to_the_first() -> None:
    listeners = parse_listeners(
        _config(
            advertisedListeners="in:pulsar://10.0.0.1:6650, out:pulsar://1.2.3.4:30650,out:pulsar+ssl://1.2.3.4:30651"
        )
    )
    assert listeners.internal_name == "in"
    assert listeners.advertised["out"].broker_service_url == "pulsar://1.2.3.4:30650"
    assert listeners.advertised["out"].broker_service_url_tls == "pulsar+ssl://1.2.3.4:30651"
    assert listeners.advertised["in"].broker_service_url_tls is None


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"advertisedListeners": "a:pulsar://h:1", "advertisedAddress": "h"},
            "`advertisedListeners` and `advertisedAddress` must not appear together",
        ),
        (
            {"advertisedListeners": "a:pulsar://h:1,b:pulsar://h:1"},
            "must not specify `h:1` to different listener",
        ),
        (
            {"advertisedListeners": "a:pulsar://h:1", "internalListenerName": "b"},
            "do not contain `internalListenerName`",
        ),
        ({"advertisedListeners": "a:pulsar://h:1,a:pulsar://h:2"}, "there are redundant configure for listener `a`"),
        ({"advertisedListeners": "pulsar://h:1"}, "is invalid"),
        ({"advertisedListeners": "a:pulsar://h"}, "the value pulsar://h in the `advertisedListeners` configure"),
        ({"advertisedListeners": "a:http://h:1"}, "the scheme must be pulsar or pulsar+ssl"),
        ({"advertisedListeners": "a:pulsar://h:1", "bindAddresses": "b:pulsar://0.0.0.0:2"}, "lacks"),
    ],
)
def test_invalid_listener_configuration(values: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_listeners(_config(**values))


def test_invalid_configuration_stops_startup_with_a_clear_message(tmp_path: Path) -> None:
    env = {
        "PATH": "/usr/bin:/bin",
        "MAGNETAR_advertisedListeners": "a:pulsar://127.0.0.1:7001,b:pulsar://127.0.0.1:7001",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "magnetar.cli.main", "standalone", "--data-dir", str(tmp_path / "d"),
         "--port", str(free_port()), "--http-port", str(free_port()), "--bind-address", "127.0.0.1"],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "invalid configuration" in proc.stderr + proc.stdout
    assert "must not specify `127.0.0.1:7001` to different listener" in proc.stderr + proc.stdout


# ---------------------------------------------------------------------------------------------- lookups


class ListenerBroker:
    def __init__(self, node: StandaloneProcess, external_port: int) -> None:
        self.node = node
        self.external_port = external_port
        self.internal_url = f"pulsar://127.0.0.1:{node.port}"
        self.external_url = f"pulsar://127.0.0.1:{external_port}"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ListenerBroker]:
    """Internal listener on the main port; ``external`` on a second socket (``bindAddresses``)."""
    node = StandaloneProcess(tmp_path_factory.mktemp("listeners") / "data", advertised_address=None)
    external_port = free_port()
    node.extra_config = {
        "advertisedListeners": f"internal:pulsar://127.0.0.1:{node.port},external:pulsar://127.0.0.1:{external_port}",
        "internalListenerName": "internal",
        "bindAddresses": f"external:pulsar://127.0.0.1:{external_port}",
    }
    node.start()
    yield ListenerBroker(node, external_port)
    assert node.stop() == 0, node.log()


def lookup_raw(
    port: int, topic: str, listener: str | None, request_id: int = 1, ssl_context: ssl.SSLContext | None = None
) -> pb.CommandLookupTopicResponse:
    """A LOOKUP of ``topic`` for ``listener`` on a fresh raw connection (TLS with ``ssl_context``)."""
    raw = RawClient(port, ssl_context=ssl_context)
    try:
        raw.connect()
        return raw.lookup(topic, request_id, listener).lookupTopicResponse
    finally:
        raw.close()


def test_lookup_answers_with_the_named_listener(broker: ListenerBroker, topic_name: str) -> None:
    port = broker.node.port
    external = lookup_raw(port, topic_name, "external", request_id=7)
    assert external.request_id == 7 and external.response == pb.CommandLookupTopicResponse.Connect
    assert external.brokerServiceUrl == broker.external_url
    internal = lookup_raw(port, topic_name, "internal")
    assert internal.brokerServiceUrl == broker.internal_url
    assert lookup_raw(port, topic_name, None).brokerServiceUrl == broker.internal_url


def test_lookup_with_an_unknown_listener_fails_service_not_ready(broker: ListenerBroker, topic_name: str) -> None:
    reply = lookup_raw(broker.node.port, topic_name, "nope", request_id=4)
    assert reply.request_id == 4 and reply.response == pb.CommandLookupTopicResponse.Failed
    assert reply.error == pb.ServiceNotReady
    assert reply.message == "the broker do not have nope listener"


def test_bind_address_socket_defaults_to_its_listener(broker: ListenerBroker, topic_name: str) -> None:
    assert lookup_raw(broker.external_port, topic_name, None).brokerServiceUrl == broker.external_url
    assert lookup_raw(broker.external_port, topic_name, "internal").brokerServiceUrl == broker.internal_url


def test_partitioned_metadata_ignores_listeners(broker: ListenerBroker, topic_name: str) -> None:
    """CommandPartitionedTopicMetadata carries no listener name: it answers the same on every socket."""
    for port in (broker.node.port, broker.external_port):
        raw = RawClient(port)
        try:
            raw.connect()
            cmd = T(type=T.PARTITIONED_METADATA)
            cmd.partitionMetadata.topic = topic_name
            cmd.partitionMetadata.request_id = 3
            raw.send(cmd)
            reply = raw.recv_until(T.PARTITIONED_METADATA_RESPONSE).partitionMetadataResponse
            assert reply.request_id == 3 and reply.response == pb.CommandPartitionedTopicMetadataResponse.Success
        finally:
            raw.close()


def test_http_lookup_honours_the_listener_name(broker: ListenerBroker, topic_name: str) -> None:
    url = f"{broker.node.http_url}/lookup/v2/topic/{topic_name.replace('persistent://', 'persistent/')}"
    assert call("GET", url).json["brokerUrl"] == broker.internal_url
    by_query = call("GET", f"{url}?listenerName=external").json
    assert by_query["brokerUrl"] == broker.external_url and by_query["nativeUrl"] == broker.external_url
    request = urllib.request.Request(url, headers={"X-Pulsar-ListenerName": "external"})
    with urllib.request.urlopen(request, timeout=10) as resp:
        assert json.loads(resp.read())["brokerUrl"] == broker.external_url
    unknown = call("GET", f"{url}?listenerName=nope")
    assert unknown.status == 400 and unknown.reason == "the broker do not have nope listener"


def test_official_client_uses_the_named_listener(broker: ListenerBroker, topic_name: str) -> None:
    """The client looks up through the internal port and produces / consumes through the external socket."""
    client = pulsar.Client(
        broker.node.service_url,
        listener_name="external",
        operation_timeout_seconds=10,
        logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
    )
    try:
        producer = client.create_producer(topic_name)
        consumer = client.subscribe(topic_name, "s", initial_position=pulsar.InitialPosition.Earliest)
        producer.send(b"through the external listener")
        assert consumer.receive(timeout_millis=10_000).data() == b"through the external listener"
    finally:
        client.close()
    stranger = pulsar.Client(
        broker.node.service_url,
        listener_name="nope",
        operation_timeout_seconds=3,
        logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
    )
    try:
        with pytest.raises(pulsar.PulsarException):
            stranger.create_producer(topic_name)
    finally:
        stranger.close()
