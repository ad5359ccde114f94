"""A cluster with TLS everywhere: etcd (client certificates required), two bookies (TLS port, client
certificates required), two brokers talking TLS to both and serving ``pulsar+ssl://``. The official client
produces and consumes through one broker with lookups redirected to the owners' TLS URLs; both brokers answer
a lookup with the owner's ``brokerServiceUrlTls``."""

from __future__ import annotations

import json
import ssl
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pulsar
import pytest

from magnetar.broker.protocol import pulsar_api_pb2 as pb
from tests.cluster.multi import BROKER_SETTINGS
from tests.cluster.processes import ClusterBroker, initialize_cluster
from tests.etcd_server import EtcdServer, find_etcd_binary, free_port
from tests.rawclient import RawClient
from tests.tlsutil import Pki, make_pki

pytestmark = pytest.mark.timeout(180)


@dataclass
class TlsCluster:
    pki: Pki
    etcd: EtcdServer
    bookies: list
    brokers: list[ClusterBroker]
    tls_ports: list[int]
    https_ports: list[int]

    def tls_url(self, i: int) -> str:
        return f"pulsar+ssl://127.0.0.1:{self.tls_ports[i]}"

    def client_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.pki.ca_cert))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsCluster]:
    from tests.bookie_network.conftest import BookieProcess

    if find_etcd_binary() is None:
        pytest.skip("no etcd binary")
    tmp: Path = tmp_path_factory.mktemp("tls-cluster")
    pki = make_pki(tmp / "pki", client_cn="magnetar-node")
    etcd = EtcdServer(
        tmp / "etcd",
        tls={
            "cert": pki.server.cert,
            "key": pki.server.key,
            "ca": pki.ca_cert,
            "client_cert": pki.client.cert,
            "client_key": pki.client.key,
        },
    )
    url = (
        f"{etcd.url}?tlsTrustCertsFilePath={pki.ca_cert}"
        f"&tlsCertificateFilePath={pki.client.cert}&tlsKeyFilePath={pki.client.key}"
    )
    bookie_tls = ["--tlsCertificatePath", str(pki.server.cert), "--tlsKeyStore", str(pki.server.key),
                  "--tlsTrustStore", str(pki.ca_cert), "--tlsClientAuthentication"]  # fmt: skip
    bookies = [BookieProcess(tmp / f"bookie{i}", url, extra_args=bookie_tls) for i in range(2)]
    tls_ports = [free_port(), free_port()]
    https_ports = [free_port(), free_port()]
    brokers = [
        ClusterBroker(
            tmp,
            url,
            {
                **BROKER_SETTINGS,
                "brokerServicePortTls": str(tls_ports[i]),
                "webServicePortTls": str(https_ports[i]),
                "tlsCertificateFilePath": str(pki.server.cert),
                "tlsKeyFilePath": str(pki.server.key),
                "tlsTrustCertsFilePath": str(pki.ca_cert),
                "bookkeeperTLSClientAuthentication": "true",
                "bookkeeperTLSTrustCertsFilePath": str(pki.ca_cert),
                "bookkeeperTLSCertificateFilePath": str(pki.client.cert),
                "bookkeeperTLSKeyFilePath": str(pki.client.key),
            },
            name=f"broker{i}",
        )
        for i in range(2)
    ]
    started: list = []
    try:
        etcd.start()
        started.append(etcd)
        for b in bookies:
            b.start()
            started.append(b)
        initialize_cluster(url)
        for broker in brokers:
            broker.start()
            started.append(broker)
        yield TlsCluster(pki, etcd, bookies, brokers, tls_ports, https_ports)
    finally:
        for proc in reversed(started):
            proc.stop()


def test_produce_consume_through_tls_redirects(cluster: TlsCluster) -> None:
    client = pulsar.Client(
        cluster.tls_url(0),
        tls_trust_certs_file_path=str(cluster.pki.ca_cert),
        operation_timeout_seconds=30,
        logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
    )
    try:
        for n in range(4):  # several topics: some are owned by the other broker (redirects)
            topic = f"persistent://public/default/tls-cluster-{n}"
            consumer = client.subscribe(topic, "sub")
            producer = client.create_producer(topic)
            for i in range(10):
                producer.send(f"{n}-{i}".encode())
            assert [consumer.receive(15_000).data() for _ in range(10)] == [f"{n}-{i}".encode() for i in range(10)]
    finally:
        client.close()


def test_lookups_answer_with_the_owners_tls_url(cluster: TlsCluster) -> None:
    topic = "persistent://public/default/tls-cluster-lookup"
    answers = []
    for i in range(2):
        raw = RawClient(cluster.tls_ports[i], ssl_context=cluster.client_context())
        try:
            raw.connect()
            answer = raw.lookup(topic).lookupTopicResponse
            for _ in range(3):  # a redirect to the chosen broker: ask it (authoritative)
                if answer.response != pb.CommandLookupTopicResponse.Redirect:
                    break
                target = cluster.tls_ports.index(int(answer.brokerServiceUrlTls.rsplit(":", 1)[1]))
                raw.close()
                raw = RawClient(cluster.tls_ports[target], ssl_context=cluster.client_context())
                raw.connect()
                cmd = pb.BaseCommand(type=pb.BaseCommand.LOOKUP)
                cmd.lookupTopic.topic, cmd.lookupTopic.request_id = topic, 2
                cmd.lookupTopic.authoritative = answer.authoritative
                raw.send(cmd)
                answer = raw.recv_until(pb.BaseCommand.LOOKUP_RESPONSE).lookupTopicResponse
        finally:
            raw.close()
        assert answer.response == pb.CommandLookupTopicResponse.Connect
        answers.append((answer.brokerServiceUrl, answer.brokerServiceUrlTls))
    assert answers[0] == answers[1]  # one owner
    owner = [cluster.tls_url(i) for i in range(2)].index(answers[0][1])
    assert answers[0][0] == cluster.brokers[owner].service_url
    url = f"https://127.0.0.1:{cluster.https_ports[1 - owner]}/lookup/v2/topic/{topic.replace('://', '/')}"
    with urllib.request.urlopen(url, timeout=20, context=cluster.client_context()) as r:  # 307s followed
        body = json.loads(r.read())
    assert body["brokerUrlTls"] == cluster.tls_url(owner)
    assert body["httpUrlTls"] == f"https://127.0.0.1:{cluster.https_ports[owner]}"
