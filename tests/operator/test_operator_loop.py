"""Operator in the loop: the real ``magnetar operator`` (kopf) process against an emulated Kubernetes API
(:mod:`tests.operator.kubeemu`, kmock plus a thin layer), ``kubectl`` 1.32 applying the CRDs and the sample
resources, a real ``magnetar standalone`` broker as the admin target and the official ``pulsar-client``.

The tests share one broker, one emulator and one operator process and run in file order (each step
builds on the previous state). The operator runs with a 1.5 s drift interval and a 2 s backoff cap so the
module stays well under a minute.

The emulator admits like an API server (:mod:`tests.operator.admission`: schema, CEL rules, pruning,
OpenAPI v3 for kubectl's validation), so ``kubectl apply`` runs without ``--validate=false`` and an
invalid change such as a partition decrease is refused with the server's message. What it does not do,
so these tests do not cover it: authentication/RBAC (a 403 on a Secret is injected by the test),
ownerReference garbage collection, namespace deletion cascades, watch bookmarks and history compaction
(410 Gone), Table output for ``kubectl get``.
``clusterRef`` resolves through ``MAGNETAR_OPERATOR_CLUSTER_URL_TEMPLATE`` (pointed at the broker).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import StandaloneProcess
from tests.operator.kubeemu import EmulatorThread

ROOT = Path(__file__).resolve().parents[2]
KUBECTL = "/usr/bin/kubectl"
NS = "default"

pytestmark = pytest.mark.skipif(not Path(KUBECTL).exists(), reason="kubectl not installed")


PAUSED_CLUSTER = {
    "apiVersion": "magnetar.io/v1alpha1",
    "kind": "MagnetarCluster",
    "metadata": {"name": "magnetar", "namespace": NS, "annotations": {"magnetar.io/paused": "true"}},
    "spec": {"image": "localhost/magnetar:dev", "metadataStore": {"external": {"endpoints": ["etcd:2379"]}},
             "bookies": {"replicas": 3}, "brokers": {"replicas": 1}},
}  # fmt: skip


class Cluster:
    """Handles on the emulator, the broker, kubectl and the operator process."""

    def __init__(self, emu: EmulatorThread, broker: StandaloneProcess, env: dict[str, str], log: Path) -> None:
        self.emu = emu
        self.broker = broker
        self.env = env
        self.log = log

    def stand_in_magnetar_cluster(self) -> None:
        """The MagnetarCluster the samples' clusterRef names: paused (no pods run in these modules) and marked
        Ready by hand; clusterRef still resolves through MAGNETAR_OPERATOR_CLUSTER_URL_TEMPLATE to the broker."""
        self.kubectl("apply", "-f", "-", input=json.dumps(PAUSED_CLUSTER))
        self.kubectl("patch", "magnetarcluster", "magnetar", "--subresource=status", "--type=merge",
                     "-p", json.dumps({"status": {"conditions": [{"type": "Ready", "status": "True"}]}}))  # fmt: skip

    def kubectl(self, *args: str, check: bool = True, stderr: bool = False, input: str | None = None) -> str:
        """kubectl's output (with ``stderr``: stdout and stderr, for refusals)."""
        result = subprocess.run([KUBECTL, *args], env=self.env, capture_output=True, text=True, timeout=60,
                                input=input)  # fmt: skip
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {result.stderr}")
        return result.stdout + (result.stderr if stderr else "")

    def obj(self, plural: str, name: str) -> dict[str, Any] | None:
        assert self.emu.emulator is not None
        return self.emu.call(self.emu.emulator.get, plural, NS, name)

    def condition(self, plural: str, name: str, ctype: str = "Ready") -> dict[str, Any]:
        obj = self.obj(plural, name) or {}
        return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == ctype), {})

    def events(self, name: str) -> list[tuple[str, str]]:
        assert self.emu.emulator is not None
        found = self.emu.call(self.emu.emulator.objects, "events", NS)
        return [(e.get("reason", ""), e.get("message", "")) for e in found if e["involvedObject"]["name"] == name]

    def admin(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"{self.broker.http_url}/admin/v2/{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(req, timeout=10) as resp:
            text = resp.read()
        return json.loads(text) if text else None

    def admin_or_none(self, path: str) -> Any:
        try:
            return self.admin("GET", path)
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise

    def wait(self, check: Callable[[], Any], what: str, timeout: float = 25.0, about: str | None = None) -> Any:
        """Poll ``check`` until truthy; on timeout fail with the operator's log (``about``: the lines naming
        that object, then the object as stored, so a stalled handler shows where it stopped)."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            try:
                last = check()
            except (urllib.error.URLError, KeyError, TypeError) as exc:
                last = exc
            else:
                if last:
                    return last
            time.sleep(0.2)
        detail = ""
        if about is not None:
            plural, _, name = about.partition("/")
            lines = [ln for ln in self.log.read_text(errors="replace").splitlines() if name in ln]
            detail = "\n".join(["", f"log lines naming {name}:", *lines[-40:], f"stored: {self.obj(plural, name)!r}"])
        raise AssertionError(f"timed out waiting for {what} (last: {last!r})\noperator log:\n{self.log_tail()}{detail}")

    def wait_ready(self, plural: str, name: str, status: str = "True", reason: str | None = None) -> None:
        def check() -> bool:
            c = self.condition(plural, name)
            return c.get("status") == status and (reason is None or c.get("reason") == reason)

        self.wait(check, f"{plural}/{name} Ready={status} {reason or ''}")

    def log_tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-6000:]
        except OSError:
            return ""


def start_operator(env: dict[str, str], log: Path, *args: str) -> subprocess.Popen[bytes]:
    """``magnetar operator --standalone`` (no liveness server) with ``env``, its output in ``log``."""
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "magnetar.cli.main", "operator", "--standalone", "--liveness", "", *args],
            env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip


def stop_operator(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL if it has not exited within 15 s."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("operator")
    broker = StandaloneProcess(tmp / "broker")
    broker.start()
    emu = EmulatorThread().start()
    env = {
        **os.environ,
        "KUBECONFIG": emu.kubeconfig(str(tmp / "kubeconfig")),
        "KUBECACHEDIR": str(tmp / "kubecache"),
        "MAGNETAR_OPERATOR_CLUSTER_URL_TEMPLATE": broker.http_url,
        "MAGNETAR_OPERATOR_DRIFT_INTERVAL": "1.5",
        "MAGNETAR_OPERATOR_BACKOFF_BASE": "0.5",
        "MAGNETAR_OPERATOR_BACKOFF_CAP": "2",
    }
    log = tmp / "operator.log"
    cluster = Cluster(emu, broker, env, log)
    # CRDs first, through the API: kopf discovers resources once, at start.
    cluster.kubectl("apply", "-f", str(ROOT / "crds"))
    cluster.stand_in_magnetar_cluster()
    proc = start_operator(env, log)
    try:
        yield cluster
    finally:
        stop_operator(proc)
        emu.stop()
        broker.stop()


def test_samples_are_applied_and_the_topic_takes_messages(cluster: Cluster) -> None:
    # Not the MagnetarCluster sample: it would replace the paused stand-in (no pods run in this module).
    samples = sorted(p for p in (ROOT / "manifests" / "samples").glob("*.yaml") if p.name != "magnetarcluster.yaml")
    out = cluster.kubectl("apply", *(a for p in samples for a in ("-f", str(p))))
    assert "topic.magnetar.io/orders-events created" in out
    cluster.wait_ready("tenants", "acme")
    cluster.wait_ready("topicnamespaces", "acme-orders")
    cluster.wait_ready("topics", "orders-events")
    cluster.wait_ready("topics", "orders-audit")
    cluster.wait_ready("retentionpolicies", "standard")

    assert cluster.admin("GET", "tenants/acme") == {"adminRoles": ["acme-admin"], "allowedClusters": ["standalone"]}
    ns = cluster.admin("GET", "namespaces/acme/orders")
    assert ns["retention_policies"] == {"retentionTimeInMinutes": 1440, "retentionSizeInMB": 1024}
    assert ns["message_ttl_in_seconds"] == 3600
    assert ns["backlog_quota_map"]["destination_storage"]["limitSize"] == 536870912
    assert ns["deduplicationEnabled"] is True and ns["max_producers_per_topic"] == 10
    assert ns["persistence"]["bookkeeperEnsemble"] == 1 and ns["schema_compatibility_strategy"] == "BACKWARD"
    assert ns["bundles"]["numBundles"] == 4
    assert ns["autoTopicCreationOverride"] == {"allowAutoTopicCreation": False}
    assert cluster.admin("GET", "persistent/acme/orders/events/partitions") == {"partitions": 3}
    assert cluster.admin("GET", "persistent/acme/orders/events/maxConsumers") == 20
    assert cluster.admin("GET", "persistent/acme/orders/audit/messageTTL") == 3600

    topic = cluster.obj("topics", "orders-events")
    assert topic is not None
    assert topic["status"]["observedGeneration"] == topic["metadata"]["generation"]
    assert topic["status"]["pulsarName"] == "persistent://acme/orders/events"
    assert topic["status"]["partitions"] == 3
    assert topic["metadata"]["finalizers"] == ["magnetar.io/finalizer"]

    import pulsar

    client = pulsar.Client(cluster.broker.service_url, operation_timeout_seconds=10,
                           logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))  # fmt: skip
    try:
        consumer = client.subscribe("persistent://acme/orders/events", "it",
                                    initial_position=pulsar.InitialPosition.Earliest)  # fmt: skip
        producer = client.create_producer("persistent://acme/orders/events")
        for i in range(6):
            producer.send(f"order-{i}".encode(), partition_key=str(i))
        got = sorted(consumer.receive(timeout_millis=10_000).data().decode() for _ in range(6))
        assert got == [f"order-{i}" for i in range(6)]
    finally:
        client.close()


def test_unreachable_cluster_is_reported_not_crash_looped(cluster: Cluster) -> None:
    # manifests/samples/tenant-connection.yaml points at a host that does not resolve here.
    cluster.wait_ready("tenants", "external", "False", "ClusterUnreachable")
    assert cluster.condition("tenants", "external", "Reconciling")["status"] == "True"
    assert any(reason == "ClusterUnreachable" for reason, _ in cluster.events("external"))


def test_drift_is_corrected(cluster: Cluster) -> None:
    cluster.admin("DELETE", "persistent/acme/orders/events/partitions?force=true")
    cluster.admin("POST", "namespaces/acme/orders/maxProducersPerTopic", 77)
    cluster.admin("POST", "tenants/acme", {"adminRoles": ["intruder"], "allowedClusters": ["standalone"]})
    cluster.wait(lambda: cluster.admin_or_none("persistent/acme/orders/events/partitions") == {"partitions": 3},
                 "the deleted topic to come back")  # fmt: skip
    cluster.wait(lambda: cluster.admin("GET", "persistent/acme/orders/events/maxConsumers") == 20,
                 "the recreated topic's policies")  # fmt: skip
    cluster.wait(lambda: cluster.admin("GET", "namespaces/acme/orders")["max_producers_per_topic"] == 10,
                 "the namespace policy to be reverted")  # fmt: skip
    cluster.wait(lambda: cluster.admin("GET", "tenants/acme")["adminRoles"] == ["acme-admin"], "tenant roles")
    cluster.admin("POST", "persistent/acme/orders/events/maxConsumers", 99)
    cluster.wait(lambda: cluster.admin("GET", "persistent/acme/orders/events/maxConsumers") == 20,
                 "the topic policy to be reverted")  # fmt: skip
    cluster.wait(lambda: any(r == "DriftCorrected" for r, _ in cluster.events("orders-events")), "a drift Event")
    assert any(r == "DriftCorrected" and "maxProducers: 77 -> 10" in m for r, m in cluster.events("acme-orders"))


def test_retention_policy_change_reaches_every_user(cluster: Cluster) -> None:
    cluster.kubectl("patch", "retentionpolicy", "standard", "--type", "merge", "-p",
                    json.dumps({"spec": {"messageTTLSeconds": 600,
                                         "retention": {"timeInMinutes": 2880, "sizeInMB": 2048}}}))  # fmt: skip
    cluster.wait(lambda: cluster.admin("GET", "namespaces/acme/orders")["message_ttl_in_seconds"] == 600, "ns TTL")
    cluster.wait(lambda: cluster.admin("GET", "persistent/acme/orders/audit/messageTTL") == 600, "topic TTL")
    assert cluster.admin("GET", "persistent/acme/orders/audit/retention")["retentionTimeInMinutes"] == 2880
    assert cluster.admin("GET", "namespaces/acme/orders")["retention_policies"]["retentionSizeInMB"] == 2048
    cluster.wait(lambda: (cluster.obj("retentionpolicies", "standard") or {}).get("status", {}).get("appliedTo") == 2,
                 "the policy's status")  # fmt: skip


def test_pause_annotation_stops_reconciliation(cluster: Cluster) -> None:
    cluster.kubectl("annotate", "topic", "orders-events", "magnetar.io/paused=true")
    cluster.wait(lambda: cluster.condition("topics", "orders-events", "Reconciling").get("reason")
                 == "ReconciliationPaused", "the paused condition")  # fmt: skip
    cluster.admin("POST", "persistent/acme/orders/events/maxConsumers", 55)
    time.sleep(4)  # more than two drift intervals
    assert cluster.admin("GET", "persistent/acme/orders/events/maxConsumers") == 55
    cluster.kubectl("annotate", "topic", "orders-events", "magnetar.io/paused-")
    cluster.wait(lambda: cluster.admin("GET", "persistent/acme/orders/events/maxConsumers") == 20, "resumed")
    cluster.wait_ready("topics", "orders-events")


def test_partitions_grow_but_never_shrink(cluster: Cluster) -> None:
    cluster.kubectl("patch", "topic", "orders-events", "--type", "merge", "-p", '{"spec":{"partitions":4}}')
    cluster.wait(lambda: cluster.admin("GET", "persistent/acme/orders/events/partitions") == {"partitions": 4}, "4")
    # A decrease is refused at admission (the CRD's CEL transition rule), with the server's message.
    out = cluster.kubectl("patch", "topic", "orders-events", "--type", "merge", "-p", '{"spec":{"partitions":2}}',
                          check=False, stderr=True)  # fmt: skip
    assert 'The Topic "orders-events" is invalid' in out and "partitions may only grow" in out, out
    assert (cluster.obj("topics", "orders-events") or {})["spec"]["partitions"] == 4
    # Grown in Pulsar behind the operator's back: the spec is now smaller, which the operator cannot apply.
    cluster.admin("POST", "persistent/acme/orders/events/partitions", 6)
    cluster.wait_ready("topics", "orders-events", "False", "NotSupported")
    assert cluster.condition("topics", "orders-events", "Stalled")["status"] == "True"
    assert cluster.admin("GET", "persistent/acme/orders/events/partitions") == {"partitions": 6}
    cluster.kubectl("patch", "topic", "orders-events", "--type", "merge", "-p", '{"spec":{"partitions":6}}')
    cluster.wait_ready("topics", "orders-events")


def test_two_resources_claiming_one_topic(cluster: Cluster) -> None:
    dup = {
        "apiVersion": "magnetar.io/v1alpha1",
        "kind": "Topic",
        "metadata": {"name": "orders-events-copy"},
        "spec": {"namespace": "acme/orders", "name": "events", "partitions": 4, "clusterRef": {"name": "magnetar"},
                 "policies": {"maxConsumers": 1}},
    }  # fmt: skip
    path = Path(cluster.env["KUBECONFIG"]).parent / "dup.json"
    path.write_text(json.dumps(dup))
    cluster.kubectl("apply", "-f", str(path))
    cluster.wait_ready("topics", "orders-events-copy", "False", "ResourceConflict")
    assert "Topic default/orders-events" in cluster.condition("topics", "orders-events-copy")["message"]
    time.sleep(2)
    assert cluster.admin("GET", "persistent/acme/orders/events/maxConsumers") == 20  # the owner's value holds
    cluster.kubectl("delete", "--wait=false", "topic", "orders-events-copy")
    cluster.wait(lambda: cluster.obj("topics", "orders-events-copy") is None, "the duplicate to go")
    assert cluster.admin("GET", "persistent/acme/orders/events/partitions") == {"partitions": 6}


def test_deletion_in_reverse_dependency_order_with_both_policies(cluster: Cluster) -> None:
    # Retain: the resource goes, the topic stays.
    cluster.kubectl("delete", "--wait=false", "topic", "orders-audit")
    # In 2 of ~8 full CI runs this deletion took just over 60 s: the drift timer was in an admin call when it
    # came, and kopf looked at the stopping timer again only after its 60 s polling period (now
    # MAGNETAR_OPERATOR_TIMER_STOP_POLL, 1 s; reproduced in test_timer_deletion.py).
    cluster.wait(lambda: cluster.obj("topics", "orders-audit") is None, "orders-audit to go",
                 about="topics/orders-audit")  # fmt: skip
    assert "persistent://acme/orders/audit" in cluster.admin("GET", "persistent/acme/orders")
    # The namespace waits for the Topic that still uses it.
    cluster.kubectl("delete", "--wait=false", "topicnamespace", "acme-orders")
    cluster.wait(lambda: "Topic default/orders-events" in cluster.condition("topicnamespaces", "acme-orders")
                 .get("message", ""), "the namespace to wait for its topic")  # fmt: skip
    assert cluster.admin_or_none("namespaces/acme/orders") is not None
    # Delete: the topic goes from Pulsar.
    cluster.kubectl("delete", "--wait=false", "topic", "orders-events")
    cluster.wait(lambda: cluster.obj("topics", "orders-events") is None, "orders-events to go")
    assert cluster.admin_or_none("persistent/acme/orders/events/partitions") == {"partitions": 0}
    # The retained topic keeps the namespace from being deleted until forced.
    cluster.wait(lambda: "not empty" in cluster.condition("topicnamespaces", "acme-orders").get("message", ""),
                 "the namespace to report it is not empty")  # fmt: skip
    cluster.kubectl("annotate", "topicnamespace", "acme-orders", "magnetar.io/force-delete=true")
    cluster.wait(lambda: cluster.obj("topicnamespaces", "acme-orders") is None, "the namespace resource to go")
    assert cluster.admin_or_none("namespaces/acme/orders") is None
    cluster.kubectl("delete", "--wait=false", "tenant", "acme", "external")
    cluster.wait(lambda: cluster.obj("tenants", "acme") is None and cluster.obj("tenants", "external") is None,
                 "the tenants to go (external was never reachable: released)")  # fmt: skip
    assert cluster.admin_or_none("tenants/acme") is None
    cluster.kubectl("delete", "--wait=false", "retentionpolicy", "standard")
    cluster.wait(lambda: cluster.obj("retentionpolicies", "standard") is None, "the policy to go")


def test_replicas_coordinate_through_peering(tmp_path: Path) -> None:
    """HA: two replicas with peering (no --standalone) register in the ClusterKopfPeering the operator
    creates; the lower-priority one pauses and resumes when the other stops."""
    emu = EmulatorThread().start()
    env = {**os.environ, "KUBECONFIG": emu.kubeconfig(str(tmp_path / "kubeconfig")),
           "KUBECACHEDIR": str(tmp_path / "cache")}  # fmt: skip
    procs: list[subprocess.Popen[bytes]] = []
    try:
        subprocess.run([KUBECTL, "apply", "-f", str(ROOT / "crds")], env=env, check=True,
                       capture_output=True, timeout=60)  # fmt: skip
        logs = [tmp_path / "low.log", tmp_path / "high.log"]

        def start(priority: int, log: Path) -> None:
            with open(log, "wb") as out:
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "magnetar.cli.main", "operator", "--priority", str(priority),
                     "--liveness", "", "--log-level", "DEBUG"],
                    env=env, stdout=out, stderr=subprocess.STDOUT,
                ))  # fmt: skip

        def peers() -> int:
            assert emu.emulator is not None
            found = emu.call(emu.emulator.objects, "clusterkopfpeerings")
            return len(found[0].get("status") or {}) if found else 0

        def wait_log(path: Path, text: str, after: int = 0) -> int:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                found = path.read_text(errors="replace").find(text, after)
                if found >= 0:
                    return found
                time.sleep(0.2)
            raise AssertionError(f"{text!r} not logged:\n{path.read_text(errors='replace')[-3000:]}")

        # A rolling start: the first replica works alone, then a higher-priority one takes over.
        start(0, logs[0])
        working = wait_log(logs[0], "Resuming operations")
        start(10, logs[1])
        paused = wait_log(logs[0], "Pausing operations in favour of", working)
        assert peers() == 2
        procs[1].send_signal(signal.SIGTERM)
        procs[1].wait(15)
        wait_log(logs[0], "Resuming operations", paused)
        assert peers() == 1
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
        emu.stop()
