"""End to end: a ``MagnetarCluster`` applied to the emulated API server becomes real containers of the
project image (:mod:`tests.harness`: StatefulSet/Job controllers and a podman "kubelet"), reconciled by
the operator running as a pod; then Tenant/TopicNamespace/Topic through ``clusterRef`` and the official
client producing and consuming through the broker Service; then day-2 operations in sequence on one
module-scoped cluster.

What this does not prove (the stand-in is not Kubernetes): scheduling and anti-affinity (every pod runs
on this machine), CNI and kube-proxy (a Service name resolves to every selected pod by DNS, ready or
not, instead of a virtual IP over ready endpoints), admission (schema/CEL checks: tests/operator/
test_crds.py), RBAC (tests/deploy), PodDisruptionBudgets being honoured by evictions, image pulls, real
kubelet timing and eviction quirks, node or disk failures. etcd runs from the Debian base image with the
etcd binary of the other tests instead of the upstream image.

Skipped unless podman, runc and mmdebstrap are installed (``.ci/run`` installs them).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.harness.cluster import Harness
from tests.harness.podman import podman_available

pytestmark = [
    pytest.mark.skipif(not podman_available(), reason="podman, runc and mmdebstrap are needed"),
    pytest.mark.timeout(1500),
]

NAME = "demo"


def cluster_spec(image: str, **changes: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "image": image,
        "metadataStore": {"etcd": {"replicas": 3, "storage": {"size": "1Gi"}}},
        "bookies": {"replicas": 4, "ensembleSize": 3, "writeQuorum": 2, "ackQuorum": 2,
                    "journal": {"size": "1Gi"}, "ledgers": {"size": "2Gi"}},
        "brokers": {"replicas": 2, "config": {"brokerDeduplicationEnabled": "true"}},
        "autoRecovery": {"lostBookieDelaySeconds": 5, "checkIntervalSeconds": 5},
    }  # fmt: skip
    for key, value in changes.items():
        spec[key] = {**spec.get(key, {}), **value}
    return {"apiVersion": "magnetar.io/v1alpha1", "kind": "MagnetarCluster", "metadata": {"name": NAME},
            "spec": spec}  # fmt: skip


def condition(obj: dict[str, Any] | None, ctype: str = "Ready") -> dict[str, Any]:
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == ctype:
            return c
    return {}


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    h = Harness(tmp_path_factory.mktemp("harness"))
    try:
        h.start({"MAGNETAR_OPERATOR_DRIFT_INTERVAL": "5", "MAGNETAR_OPERATOR_CLUSTER_POLL": "2"})
        yield h
    finally:
        h.stop()


def ready(h: Harness) -> Any:
    obj = h.get("MagnetarCluster", NAME)
    c = condition(obj)
    gen = (obj or {}).get("metadata", {}).get("generation")
    return c.get("status") == "True" and c.get("observedGeneration") == gen and obj


PRODUCE_CONSUME = """
import pulsar, sys
client = pulsar.Client("pulsar://demo-broker.default.svc:6650", operation_timeout_seconds=30,
                       logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
topic = "persistent://acme/orders/events"
consumer = client.subscribe(topic, "e2e", initial_position=pulsar.InitialPosition.Earliest)
producer = client.create_producer(topic)
for i in range(20):
    producer.send(f"m-{i}".encode())
got = [consumer.receive(timeout_millis=20000).data().decode() for _ in range(20)]
print("GOT", ",".join(got))
client.close()
"""


def test_cluster_becomes_ready_in_order(harness: Harness) -> None:
    harness.apply("MagnetarCluster", cluster_spec(harness.image))
    obj = harness.wait(lambda: ready(harness), "MagnetarCluster Ready", timeout=600)
    status = obj["status"]
    assert status["serviceUrl"] == "pulsar://demo-broker.default.svc:6650"
    assert status["adminUrl"] == "http://demo-broker.default.svc:8080"
    assert status["bookies"] == {"desired": 4, "ready": 4, "updated": 4}
    assert status["etcd"]["ready"] == 3 and status["brokers"]["ready"] == 2
    names = {(o["kind"], o["metadata"]["name"]) for kind in ("StatefulSet", "Service", "Job", "ConfigMap")
             for o in harness.objects(kind)}  # fmt: skip
    assert {
        ("StatefulSet", "demo-etcd"),
        ("StatefulSet", "demo-bookie"),
        ("StatefulSet", "demo-broker"),
        ("Service", "demo-broker"),
        ("Job", "demo-init-metadata"),
        ("ConfigMap", "demo-broker"),
    } <= names
    pvcs = {p["metadata"]["name"] for p in harness.objects("PersistentVolumeClaim")}
    assert {"journal-demo-bookie-0", "ledgers-demo-bookie-3", "data-demo-etcd-2"} <= pvcs
    reasons = [r for r, _ in harness.events(NAME)]
    assert "Created" in reasons


def test_resources_wait_for_the_cluster_then_messages_flow(harness: Harness) -> None:
    ref = {"clusterRef": {"name": NAME}}
    harness.apply("Tenant", {"apiVersion": "magnetar.io/v1alpha1", "kind": "Tenant", "metadata": {"name": "acme"},
                             "spec": {**ref, "adminRoles": ["ops"]}})  # fmt: skip
    harness.apply("TopicNamespace", {"apiVersion": "magnetar.io/v1alpha1", "kind": "TopicNamespace",
                                     "metadata": {"name": "acme-orders"},
                                     "spec": {**ref, "tenant": "acme", "name": "orders",
                                              "policies": {"deduplication": True}}})  # fmt: skip
    harness.apply("Topic", {"apiVersion": "magnetar.io/v1alpha1", "kind": "Topic", "metadata": {"name": "events"},
                            "spec": {**ref, "namespace": "acme/orders", "name": "events"}})  # fmt: skip
    for kind, name in (("Tenant", "acme"), ("TopicNamespace", "acme-orders"), ("Topic", "events")):
        harness.wait(lambda k=kind, n=name: condition(harness.get(k, n)).get("status") == "True", f"{kind} Ready")
    result = harness.client(PRODUCE_CONSUME)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "GOT " + ",".join(f"m-{i}" for i in range(20)) in result.stdout


def test_drifted_objects_are_put_back_with_events(harness: Harness) -> None:
    assert harness.api is not None
    harness.api.delete("Service", "default", "demo-broker")
    harness.api.patch("ConfigMap", "default", "demo-broker", {"data": {"broker.conf": "clusterName=wrong\n"}})
    harness.wait(lambda: harness.get("Service", "demo-broker"), "broker Service recreated", timeout=60)
    harness.wait(lambda: "clusterName=demo" in (harness.get("ConfigMap", "demo-broker") or {})["data"]["broker.conf"],
                 "broker.conf restored", timeout=60)  # fmt: skip
    events = harness.events(NAME)
    assert ("Created", "created Service demo-broker") in events
    assert any(r == "DriftCorrected" and "ConfigMap demo-broker" in m for r, m in events), events


PRODUCER = """
import os, time, pulsar
client = pulsar.Client("pulsar://demo-broker.default.svc:6650", operation_timeout_seconds=30,
                       logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
# Subscriptions first: without one (and without retention) Pulsar keeps no backlog to check.
for name in ("drain", "after-decommission"):
    client.subscribe("persistent://acme/orders/rolling", name).close()
producer = client.create_producer("persistent://acme/orders/rolling", producer_name="roller",
                                  send_timeout_millis=60000, batching_enabled=False)
seq = 0
with open("/out/acked.txt", "a") as acked:
    while not os.path.exists("/out/stop") and seq < 100000:
        try:
            producer.send(f"r-{seq}".encode(), sequence_id=seq)
        except Exception as exc:  # timeout during a restart: the same sequence id again (dedup drops copies)
            print("retry", seq, exc, flush=True)
            time.sleep(1)
            continue
        acked.write(f"{seq}\\n")
        acked.flush()
        seq += 1
        time.sleep(0.05)
client.close()
print("DONE", seq, flush=True)
"""

DRAIN = """
import pulsar
client = pulsar.Client("pulsar://demo-broker.default.svc:6650", operation_timeout_seconds=30,
                       logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
consumer = client.subscribe("persistent://acme/orders/rolling", "drain")
got = []
while True:
    try:
        msg = consumer.receive(timeout_millis=8000)
    except Exception:
        break
    got.append(msg.data().decode())
    consumer.acknowledge(msg)
print("GOT", ",".join(got))
client.close()
"""


def test_rolling_update_while_producing_loses_and_duplicates_nothing(harness: Harness) -> None:
    before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in harness.objects("Pod")}
    producer = harness.client_background(PRODUCER, "roller")
    out = harness.workdir
    harness.wait(lambda: (out / "acked.txt").exists() and len((out / "acked.txt").read_text().split()) >= 20,
                 "producer running", timeout=120)  # fmt: skip
    generation = harness.get("MagnetarCluster", NAME)["metadata"]["generation"]
    spec = cluster_spec(harness.image)
    spec["spec"]["bookies"]["resources"] = {"requests": {"cpu": "10m"}}
    spec["spec"]["brokers"]["config"]["maxUnackedMessagesPerConsumer"] = "40000"
    harness.apply("MagnetarCluster", spec)

    def rolled() -> Any:
        obj = ready(harness)
        return obj and obj["metadata"]["generation"] > generation and obj["status"]["bookies"]["updated"] == 4 and (
            obj["status"]["brokers"]["updated"] == 2) and obj  # fmt: skip

    harness.wait(rolled, "rolling update done", timeout=600)
    (out / "stop").write_text("")
    harness.podman.run("wait", producer, timeout=120)
    log = harness.podman.run("logs", producer, check=False)
    assert "DONE" in log.stdout, log.stdout[-2000:] + log.stderr[-2000:]
    after = {p["metadata"]["name"]: p["metadata"]["uid"] for p in harness.objects("Pod")}
    for pod in ("demo-bookie-0", "demo-bookie-3", "demo-broker-0", "demo-broker-1"):
        assert after[pod] != before[pod], f"{pod} was not replaced"
    assert after["demo-etcd-0"] == before["demo-etcd-0"], "etcd's template did not change: not restarted"
    rolls = [m for r, m in harness.events(NAME) if r == "RollingUpdate"]
    restarted = {m.split(" pod ")[1].split()[0] for m in rolls}
    assert restarted == {
        "demo-bookie-0",
        "demo-bookie-1",
        "demo-bookie-2",
        "demo-bookie-3",
        "demo-broker-0",
        "demo-broker-1",
    }, rolls

    acked = [int(x) for x in (out / "acked.txt").read_text().split()]
    result = harness.client(DRAIN)
    assert result.returncode == 0, result.stderr[-3000:]
    got = [int(m.removeprefix("r-")) for m in result.stdout.split("GOT ", 1)[1].strip().split(",") if m]
    assert len(got) == len(set(got)), "duplicates despite deduplication"
    assert set(acked) <= set(got), f"acknowledged but lost: {sorted(set(acked) - set(got))[:20]}"


def test_killed_bookie_container_is_restarted_like_a_kubelet_would(harness: Harness) -> None:
    harness.podman.run("kill", "--signal", "KILL", harness.container_of("demo-bookie-1"))

    def restarted() -> bool:
        pod = harness.get("Pod", "demo-bookie-1") or {}
        st = pod.get("status") or {}
        return bool(st.get("containerStatuses")) and st["containerStatuses"][0]["restartCount"] >= 1 and any(
            c["type"] == "Ready" and c["status"] == "True" for c in st.get("conditions") or [])  # fmt: skip

    harness.wait(restarted, "bookie-1 restarted and ready", timeout=180)
    harness.wait(lambda: ready(harness), "cluster Ready again", timeout=120)
    result = harness.client(PRODUCE_CONSUME.replace('"e2e"', '"after-kill"'))
    assert result.returncode == 0, result.stderr[-3000:]


AUTORECOVERY = """
import json, urllib.request
with urllib.request.urlopen("http://demo-broker.default.svc:8080/admin/v2/autorecovery/status", timeout=10) as r:
    print("STATUS", r.read().decode())
"""


def test_scaling_bookies_down_decommissions_the_highest_bookie(harness: Harness) -> None:
    spec = cluster_spec(harness.image)
    spec["spec"]["bookies"]["resources"] = {"requests": {"cpu": "10m"}}  # as rolled out above
    spec["spec"]["brokers"]["config"]["maxUnackedMessagesPerConsumer"] = "40000"
    spec["spec"]["bookies"]["replicas"] = 3
    harness.apply("MagnetarCluster", spec)

    def done() -> Any:
        obj = ready(harness)
        return obj and obj["status"]["bookies"]["desired"] == 3 and not obj["status"].get("decommission") and obj

    harness.wait(done, "bookie-3 decommissioned", timeout=600)
    wanted = {("Decommissioning", "bookie demo-bookie-3 set read-only before scale-down"),
              ("Decommissioned", "bookie demo-bookie-3 decommissioned, its PVCs deleted")}  # fmt: skip

    def reasons() -> list[tuple[str, str]]:
        return [(r, m) for r, m in harness.events(NAME) if r in ("Decommissioning", "Decommissioned")]

    # kopf posts events from its own queue, so the status patch can land before the last event does.
    try:
        harness.wait(lambda: wanted <= set(reasons()), "the decommission events", timeout=60)
    except AssertionError:
        raise AssertionError(reasons()) from None
    pvcs = {p["metadata"]["name"] for p in harness.objects("PersistentVolumeClaim")}
    assert "journal-demo-bookie-3" not in pvcs and "ledgers-demo-bookie-2" in pvcs
    result = harness.client(AUTORECOVERY)
    status = json.loads(result.stdout.split("STATUS ", 1)[1])
    assert status["underReplicatedLedgers"] == [], status
    # Every message is still readable with bookie-3 gone.
    drained = harness.client(DRAIN.replace('"drain"', '"after-decommission"'))
    got = {int(m.removeprefix("r-")) for m in drained.stdout.split("GOT ", 1)[1].strip().split(",") if m}
    acked = {int(x) for x in (harness.workdir / "acked.txt").read_text().split()}
    assert acked <= got


def test_deleting_the_cluster_removes_owned_objects_and_keeps_volumes(harness: Harness) -> None:
    assert harness.api is not None
    harness.api.delete("MagnetarCluster", "default", NAME)
    for kind in ("StatefulSet", "Service", "ConfigMap", "Job", "PodDisruptionBudget"):
        harness.wait(lambda k=kind: not [o for o in harness.objects(k) if o["metadata"]["name"].startswith("demo-")],
                     f"every {kind} of the cluster gone", timeout=120)  # fmt: skip
    harness.wait(lambda: [p["metadata"]["name"] for p in harness.objects("Pod")] == ["magnetar-operator"],
                 "cluster pods gone", timeout=180)  # fmt: skip
    pvcs = {p["metadata"]["name"] for p in harness.objects("PersistentVolumeClaim")}
    assert {"journal-demo-bookie-0", "ledgers-demo-bookie-2", "data-demo-etcd-0"} <= pvcs
