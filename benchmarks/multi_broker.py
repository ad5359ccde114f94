"""Multi-broker benchmark: aggregate publish throughput with 1, 2 and 3 brokers on the same bookies, and
the hand-over time after a broker is killed (kill -9 to the first successful send on the new owner).

    python -m benchmarks.multi_broker --brokers 1 2 3 --seconds 10

Each row starts a fresh loopback cluster (etcd, ``--bookies`` bookies, N brokers, E=Qw=Qa=2), creates a
namespace with 12 bundles and publishes 100-byte messages (batched, asynchronous) to ``--topics`` topics
from ``--clients`` client processes through a service URL listing every broker; the brokers' lookups
spread the bundles. The hand-over row kills the owner of a topic while a producer sends synchronously, with the
brokers' lease at ``--lease-ms``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from benchmarks.local_cluster import etcd_binary, free_port, wait_http

MAGNETAR = [sys.executable, "-m", "magnetar.cli.main"]


class Cluster:
    """etcd + bookies + brokers on loopback, in a temporary directory."""

    def __init__(self, bookies: int, brokers: int, lease_ms: int) -> None:
        self.work = Path(tempfile.mkdtemp(prefix="magnetar-multi-"))
        self.procs: list[subprocess.Popen[bytes]] = []
        self.env = dict(os.environ, MAGNETAR_LOG_LEVEL="WARNING")
        self.n_bookies, self.n_brokers, self.lease_ms = bookies, brokers, lease_ms
        self.brokers: list[tuple[subprocess.Popen[bytes], int, int]] = []  # (process, port, http port)

    def spawn(self, cmd: list[str], name: str, extra: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        log = open(self.work / f"{name}.log", "wb")  # noqa: SIM115 - the child owns it
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**self.env, **(extra or {})},
                                start_new_session=True)  # fmt: skip
        self.procs.append(proc)
        return proc

    def start(self) -> None:
        client_port, peer_port = free_port(), free_port()
        etcd = self.spawn([etcd_binary(), "--name", "b", "--data-dir", str(self.work / "etcd"),
                           "--listen-client-urls", f"http://127.0.0.1:{client_port}",
                           "--advertise-client-urls", f"http://127.0.0.1:{client_port}",
                           "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
                           "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}",
                           "--initial-cluster", f"b=http://127.0.0.1:{peer_port}",
                           "--auto-compaction-retention", "1"], "etcd")  # fmt: skip
        wait_http(f"http://127.0.0.1:{client_port}/health", etcd)
        url = f"etcd://127.0.0.1:{client_port}"
        for i in range(self.n_bookies):
            http_port = free_port()
            cmd = [*MAGNETAR, "bookie", "--metadata-url", url, "--data-dir", str(self.work / f"bk{i}"),
                   "--port", str(free_port()), "--http-port", str(http_port),
                   "--bind-address", "127.0.0.1", "--advertised-address", "127.0.0.1"]  # fmt: skip
            bookie = self.spawn(cmd, f"bookie{i}")
            wait_http(f"http://127.0.0.1:{http_port}/health", bookie)
        subprocess.run([*MAGNETAR, "initialize-cluster-metadata", "--cluster", "bench", "--metadata-url", url,
                        "--web-service-url", "http://127.0.0.1:8080", "--broker-service-url", "pulsar://127.0.0.1:6650"],
                       check=True, env=self.env, capture_output=True)  # fmt: skip
        settings = {"MAGNETAR_managedLedgerDefaultEnsembleSize": "2", "MAGNETAR_managedLedgerDefaultWriteQuorum": "2",
                    "MAGNETAR_managedLedgerDefaultAckQuorum": "2", "MAGNETAR_autoRecoveryDaemonEnabled": "false",
                    "MAGNETAR_loadBalancerSheddingEnabled": "false",
                    "MAGNETAR_metadataStoreSessionTimeoutMillis": str(self.lease_ms)}  # fmt: skip
        for i in range(self.n_brokers):
            port, http_port = free_port(), free_port()
            proc = self.spawn([*MAGNETAR, "broker", "--metadata-url", url, "--cluster", "bench", "--port", str(port),
                               "--http-port", str(http_port), "--bind-address", "127.0.0.1",
                               "--advertised-address", "127.0.0.1"], f"broker{i}", settings)  # fmt: skip
            wait_http(f"http://127.0.0.1:{http_port}/admin/v2/brokers/health", proc)
            self.brokers.append((proc, port, http_port))

    @property
    def service_url(self) -> str:
        return "pulsar://" + ",".join(f"127.0.0.1:{port}" for _, port, _ in self.brokers)

    def admin(self, method: str, path: str, body: object = None) -> object:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"http://127.0.0.1:{self.brokers[0][2]}{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(req, timeout=30) as r:
            raw = r.read()
        return json.loads(raw) if raw else None

    def stop(self) -> None:
        for proc in reversed(self.procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        shutil.rmtree(self.work, ignore_errors=True)


def publish_rate(service_url: str, topics: list[str], seconds: float) -> float:
    """Acknowledged messages per second over ``seconds`` (after a 2 s warm-up)."""
    import pulsar

    client = pulsar.Client(
        service_url, operation_timeout_seconds=30, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
    )
    acked = [0]
    lock = threading.Lock()

    def done(res: object, _msg_id: object) -> None:
        if res == pulsar.Result.Ok:
            with lock:
                acked[0] += 1

    try:
        producers = [client.create_producer(t, block_if_queue_full=True, max_pending_messages=2000,
                                            batching_max_publish_delay_ms=5) for t in topics]  # fmt: skip
        payload = b"x" * 100
        start = time.monotonic()
        measured_from, base = start + 2, None
        while time.monotonic() < measured_from + seconds:
            for p in producers:
                for _ in range(50):
                    p.send_async(payload, done)
            if base is None and time.monotonic() >= measured_from:
                with lock:
                    base = acked[0]
        for p in producers:
            p.flush()
        with lock:
            total = acked[0] - (base or 0)
        return total / (time.monotonic() - measured_from)
    finally:
        client.close()


def handover_time(cluster: Cluster, topic: str) -> float:
    """Seconds from kill -9 of the topic's owner to the first successful send (on the new owner)."""
    import pulsar

    client = pulsar.Client(cluster.service_url, operation_timeout_seconds=30, connection_timeout_ms=2000,
                           logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))  # fmt: skip
    try:
        producer = client.create_producer(topic, batching_enabled=False, send_timeout_millis=60_000)
        producer.send(b"warm-up")
        lookup = cluster.admin("GET", f"/lookup/v2/topic/{topic.replace('://', '/')}")
        owner_url = lookup["brokerUrl"]  # type: ignore[index]
        victim = next(p for p, port, _ in cluster.brokers if owner_url.endswith(f":{port}"))
        if victim is cluster.brokers[0][0]:
            cluster.brokers.append(cluster.brokers.pop(0))  # keep the admin calls on a live broker
        victim.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        producer.send(b"after")
        return time.monotonic() - killed
    finally:
        client.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--brokers", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--bookies", type=int, default=3)
    parser.add_argument("--topics", type=int, default=12)
    parser.add_argument("--clients", type=int, default=2, help="client processes sharing the topics")
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--lease-ms", type=int, default=5000, help="brokers' metadataStoreSessionTimeoutMillis")
    parser.add_argument("--handover-runs", type=int, default=3)
    args = parser.parse_args()
    print("| brokers | bookies | topics | client processes | aggregate publish (msg/s, 100 B, batched) |\n"
          "|---|---|---|---|---|", flush=True)  # fmt: skip
    for n in args.brokers:
        cluster = Cluster(args.bookies, n, args.lease_ms)
        try:
            cluster.start()
            cluster.admin("PUT", "/admin/v2/namespaces/public/bench", {"bundles": {"numBundles": 12}})
            topics = [f"persistent://public/bench/t{i}" for i in range(args.topics)]
            shares = [(cluster.service_url, topics[i :: args.clients], args.seconds) for i in range(args.clients)]
            with multiprocessing.get_context("spawn").Pool(args.clients) as pool:
                rate = sum(pool.starmap(publish_rate, shares))
            print(f"| {n} | {args.bookies} | {args.topics} | {args.clients} | {rate:,.0f} |", flush=True)
        finally:
            cluster.stop()
    times = []
    for run in range(args.handover_runs):
        cluster = Cluster(args.bookies, 3, args.lease_ms)
        try:
            cluster.start()
            cluster.admin("PUT", "/admin/v2/namespaces/public/ho", {"bundles": {"numBundles": 4}})
            times.append(handover_time(cluster, f"persistent://public/ho/t{run}"))
        finally:
            cluster.stop()
    print(f"\nhand-over (kill -9 of the owner -> first successful send), lease {args.lease_ms} ms: "
          + ", ".join(f"{t:.2f} s" for t in times))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
