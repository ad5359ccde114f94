"""A local multi-broker cluster (real etcd, bookie processes, several ``magnetar broker`` processes) and a
client workload that records what was acknowledged and what was received, for fail-over tests."""

from __future__ import annotations

import http.client
import itertools
import json
import os
import threading
import time
import urllib.parse
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulsar

from tests.cluster.processes import ClusterBroker, initialize_cluster
from tests.etcd_server import EtcdServer

#: Lease TTL of the test brokers (etcd's minimum is 2 s).
LEASE_MS = 3000

BROKER_SETTINGS = {
    "managedLedgerDefaultEnsembleSize": "2",
    "managedLedgerDefaultWriteQuorum": "2",
    "managedLedgerDefaultAckQuorum": "2",
    "metadataStoreSessionTimeoutMillis": str(LEASE_MS),
    "loadBalancerReportUpdateMinIntervalMillis": "1000",
    "loadBalancerSheddingEnabled": "false",
    "autoRecoveryDaemonEnabled": "false",
}


def http_call(
    url: str, method: str = "GET", body: Any = None, *, follow: bool = True, timeout: float = 20.0
) -> tuple[int, Any, str]:
    """``(status, decoded body, Location)``; 307 redirects followed (any method) when ``follow``."""
    for _ in range(5):
        u = urllib.parse.urlsplit(url)
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if data is not None else {}
        conn.request(method, u.path + (f"?{u.query}" if u.query else ""), body=data, headers=headers)
        resp = conn.getresponse()
        raw = resp.read()
        location = resp.getheader("Location", "")
        conn.close()
        if resp.status == 307 and follow:
            url = location
            continue
        try:
            decoded = json.loads(raw) if raw else None
        except ValueError:
            decoded = raw.decode()
        return resp.status, decoded, location
    raise AssertionError(f"too many redirects for {url}")


class MultiCluster:
    """etcd + bookies + ``n`` brokers, started once per test module."""

    def __init__(self, tmp: Path, brokers: int = 3, bookies: int = 3, settings: dict[str, str] | None = None) -> None:
        from tests.bookie_network.conftest import BookieProcess

        self.etcd = EtcdServer(tmp / "etcd")
        self.bookies = [BookieProcess(tmp / f"bookie{i}", self.etcd.url) for i in range(bookies)]
        self.brokers = [
            ClusterBroker(tmp, self.etcd.url, {**BROKER_SETTINGS, **(settings or {})}, name=f"broker{i}")
            for i in range(brokers)
        ]

    def start(self, brokers: int | None = None) -> None:
        """Start etcd, the bookies and the first ``brokers`` brokers (all by default)."""
        self.etcd.start()
        for b in self.bookies:
            b.start()
        initialize_cluster(self.etcd.url)
        for b in self.brokers[:brokers]:
            b.start()

    def stop(self) -> None:
        for b in self.brokers:
            b.stop()
        for bk in self.bookies:
            bk.stop()
        self.etcd.stop()

    @property
    def service_url(self) -> str:
        """Every broker, so lookups survive any one of them (the C++ client rotates on failure)."""
        return "pulsar://" + ",".join(f"127.0.0.1:{b.port}" for b in self.brokers)

    def live(self) -> list[ClusterBroker]:
        return [b for b in self.brokers if b.running]

    def client(self, **kwargs: Any) -> pulsar.Client:
        return pulsar.Client(
            self.service_url,
            operation_timeout_seconds=kwargs.pop("operation_timeout_seconds", 30),
            connection_timeout_ms=kwargs.pop("connection_timeout_ms", 2000),
            logger=_client_logger(),
            **kwargs,
        )

    def create_namespace(self, ns: str, bundles: int, **policies: Any) -> None:
        status, body, _ = http_call(f"{self.live()[0].http_url}/admin/v2/namespaces/{ns}", "PUT",
                                    {"bundles": {"numBundles": bundles}, **policies})  # fmt: skip
        assert status == 204, body

    def lookup(self, broker: ClusterBroker, topic: str) -> str:
        """``brokerUrl`` of ``topic`` as HTTP lookup on ``broker`` answers (redirects followed)."""
        path = topic.replace("://", "/")
        status, body, _ = http_call(f"{broker.http_url}/lookup/v2/topic/{path}")
        assert status == 200, body
        return str(body["brokerUrl"])

    def broker_by_url(self, url: str) -> ClusterBroker:
        return next(b for b in self.brokers if b.service_url == url)

    def ownership(self, ns: str) -> dict[str, str]:
        status, body, _ = http_call(f"{self.live()[0].http_url}/admin/v2/namespaces/{ns}/ownership")
        assert status == 200, body
        return dict(body)

    def wait_brokers(self, count: int, timeout: float = 20.0) -> None:
        """Until every live broker lists ``count`` brokers."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if all(len(b.get_json("/admin/v2/brokers/test-cluster")) == count for b in self.live()):
                    return
            except OSError:
                pass
            time.sleep(0.3)
        raise AssertionError(f"expected {count} registered brokers")


def _client_logger() -> Any:
    """Errors to the console; with ``CLUSTER_TEST_CLIENT_LOG=<file>``, everything from INFO up to that file
    (the C++ client's reconnects and subscribes, to tell a fail-over bug in the broker from one in the client).
    Not a ``MAGNETAR_`` variable: the brokers the tests start read those as settings. Only in a pytest process of
    its own: the C++ client keeps the logger of the process's first client (a whole-suite run leaves the file empty)."""
    path = os.environ.get("CLUSTER_TEST_CLIENT_LOG")
    if path:
        return pulsar.FileLogger(pulsar.LoggerLevel.Info, path)
    return pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)


@dataclass
class TopicLoad:
    """One topic's producer and consumer threads and what they saw."""

    topic: str
    sub_type: pulsar.ConsumerType
    dedup: bool
    acked: list[int] = field(default_factory=list)
    #: Message id of each acknowledged send as the receipt gave it (a duplicate's is -1:-1), for failure reports.
    acked_ids: dict[int, str] = field(default_factory=dict)
    ack_times: list[float] = field(default_factory=list)
    received: list[tuple[str, int]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class Workload:
    """Producers sending numbered keyed messages one at a time (each acknowledged before the next) and
    consumers acknowledging everything, on many topics at once, until :meth:`stop`."""

    KEYS = 4

    def __init__(self, cluster: MultiCluster, topics: list[tuple[str, pulsar.ConsumerType, bool]]) -> None:
        self.client = cluster.client()
        self.loads = [TopicLoad(t, s, d) for t, s, d in topics]
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._consumers: list[Any] = []
        for load in self.loads:
            consumer = self.client.subscribe(load.topic, "sub", consumer_type=load.sub_type,
                                             initial_position=pulsar.InitialPosition.Earliest)  # fmt: skip
            self._consumers.append(consumer)
            if load.dedup:  # a durable cursor keeps everything for the audit (retention 0 trims acked data)
                self.client.subscribe(load.topic, "audit", initial_position=pulsar.InitialPosition.Earliest).close()
            self._threads.append(threading.Thread(target=self._consume, args=(load, consumer), daemon=True))
            self._threads.append(threading.Thread(target=self._produce, args=(load,), daemon=True))

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def _produce(self, load: TopicLoad) -> None:
        producer = self.client.create_producer(
            load.topic, producer_name=f"p-{abs(hash(load.topic))}", batching_enabled=False,
            send_timeout_millis=60_000, block_if_queue_full=True,
        )  # fmt: skip
        i = 0
        while not self._stop.is_set():
            try:
                msg_id = producer.send(str(i).encode(), partition_key=f"k{i % self.KEYS}", sequence_id=i)
            except Exception as e:  # a send error: the message may or may not be stored; send the next
                load.errors.append(f"{i}: {e}")
            else:
                load.acked.append(i)
                load.acked_ids[i] = str(msg_id)
                load.ack_times.append(time.monotonic())
            i += 1
            time.sleep(0.01)
        producer.close()

    def _consume(self, load: TopicLoad, consumer: Any) -> None:
        quiet_since = None
        while True:
            try:
                msg = consumer.receive(timeout_millis=500)
            except pulsar.Timeout:
                if self._stop.is_set():
                    quiet_since = quiet_since or time.monotonic()
                    if time.monotonic() - quiet_since > 4:
                        return
                continue
            except Exception:
                if self._stop.is_set() and quiet_since and time.monotonic() - quiet_since > 4:
                    return
                time.sleep(0.1)
                continue
            quiet_since = None
            load.received.append((msg.partition_key(), int(msg.data())))
            consumer.acknowledge(msg)

    def stop(self, timeout: float = 90.0) -> None:
        self._stop.set()
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.1, deadline - time.monotonic()))
        assert not any(t.is_alive() for t in self._threads), "workload threads did not finish"
        self.client.close()

    def max_gap_after(self, since: float) -> float:
        """Longest time any producer went without an acknowledgement after ``since`` (the pause clients saw)."""
        worst = 0.0
        for load in self.loads:
            times = [since] + [t for t in load.ack_times if t >= since]
            worst = max(worst, max(b - a for a, b in itertools.pairwise(times)) if len(times) > 1 else 0.0)
        return worst

    def check(self, cluster: MultiCluster) -> None:
        """No acknowledged message lost; nothing stored twice with dedup (a redelivery to the consumer is
        not a duplicate: read the topic again from the start); per-key order on ordered subscriptions."""
        reader_client = cluster.client()
        try:
            for load in self.loads:
                got = [i for _, i in load.received]
                missing = sorted(set(load.acked) - set(got))
                stored = _read_all(reader_client, load.topic) if load.dedup else []
                # Stored but never delivered is a dispatch bug; not stored at all is a storage/dedup bug.
                where = f"{len(set(missing) & set(stored))} of them stored, " if load.dedup else ""
                ids = [load.acked_ids.get(i) for i in missing[:10]]
                assert not missing, (
                    f"{load.topic}: {len(missing)} acknowledged messages lost ({where}ids {ids}), e.g. {missing[:10]}"
                )
                if load.dedup:
                    dupes = [i for i, n in _counts(stored).items() if n > 1]
                    assert not dupes, f"{load.topic}: stored twice with dedup on: {dupes[:10]}"
                    assert set(load.acked) <= set(stored)
                self._check_order(load)
        finally:
            reader_client.close()

    @staticmethod
    def _check_order(load: TopicLoad) -> None:
        if load.sub_type != pulsar.ConsumerType.Shared:
            per_key: dict[str, list[int]] = defaultdict(list)
            seen: set[int] = set()
            for key, i in load.received:
                if i not in seen:  # a redelivery repeats earlier messages; first deliveries keep order
                    seen.add(i)
                    per_key[key].append(i)
            for key, seq in per_key.items():
                assert seq == sorted(seq), f"{load.topic}: key {key} out of order"


def _read_all(client: pulsar.Client, topic: str) -> list[int]:
    """Every message stored on ``topic`` (through the ``audit`` subscription made before producing)."""
    consumer = client.subscribe(topic, "audit", initial_position=pulsar.InitialPosition.Earliest)
    out = []
    try:
        while True:
            try:
                out.append(int(consumer.receive(timeout_millis=1500).data()))
            except pulsar.Timeout:
                return out
    finally:
        consumer.unsubscribe()


def _counts(values: list[int]) -> dict[int, int]:
    out: dict[int, int] = defaultdict(int)
    for v in values:
        out[v] += 1
    return out
