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
        "brokers": {"replicas": 1, "config": {"brokerDeduplicationEnabled": "true"}},
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
    assert status["etcd"]["ready"] == 3 and status["brokers"]["ready"] == 1
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
