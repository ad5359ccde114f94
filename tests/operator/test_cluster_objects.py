"""The objects a MagnetarCluster renders into (operator/clusterobjects.py), checked offline: every built-in
object validates strictly against the Kubernetes schemas (kubernetes-validate, as the chart's objects do),
and the wiring the cluster depends on holds (names, DNS, start-up arguments, ownerReferences, probes on
real health endpoints, volumes, rollout strategy, overrides). The MagnetarCluster spec itself is checked
against its CRD (schema + CEL rules) with tests/operator/crdcheck.py.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from magnetar.operator.clusterobjects import TEMPLATE_HASH, ClusterRenderer
from tests.deploy import tools
from tests.operator import crdcheck

BODY: dict[str, Any] = {
    "apiVersion": "magnetar.io/v1alpha1",
    "kind": "MagnetarCluster",
    "metadata": {"name": "demo", "namespace": "prod", "uid": "0f0e0d0c-1111-2222-3333-444455556666"},
    "spec": {
        "image": "registry.example.com/magnetar:1.0",
        "metadataStore": {"etcd": {"replicas": 3, "storage": {"size": "1Gi", "storageClassName": "fast"}}},
        "bookies": {"replicas": 4, "ensembleSize": 3, "writeQuorum": 2, "ackQuorum": 2,
                    "journal": {"size": "5Gi", "storageClassName": "fast"}, "ledgers": {"size": "50Gi"},
                    "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}},
        "brokers": {"replicas": 2, "config": {"brokerDeduplicationEnabled": "true"},
                    "externalListener": {"type": "LoadBalancer", "hostTemplate": "broker-{index}.example.com"}},
        "podTemplate": {"labels": {"team": "messaging"}, "tolerations": [{"key": "dedicated", "operator": "Exists"}],
                        "nodeSelector": {"disk": "ssd"}},
        "monitoring": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}},
    },
}  # fmt: skip


def render(body: dict[str, Any] = BODY) -> list[dict[str, Any]]:
    return ClusterRenderer(copy.deepcopy(body)).all_objects()


def by(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def test_every_builtin_object_validates_against_kubernetes_schemas() -> None:
    objs = render()
    # ServiceMonitor is the Prometheus Operator's CRD: kubernetes-validate has no schema for it.
    builtin = [o for o in objs if tools.is_builtin(o) and o["kind"] != "ServiceMonitor"]
    assert len(builtin) >= 14
    assert tools.validate_builtin(builtin) == []


def test_spec_is_valid_against_the_crd() -> None:
    assert crdcheck.validate(BODY) == []
    sample = yaml.safe_load((tools.MANIFESTS / "samples" / "magnetarcluster.yaml").read_text())
    assert crdcheck.validate(sample) == []


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"bookies": {"replicas": 2, "ensembleSize": 3}}, "at least the ensemble size"),
        ({"bookies": {"replicas": 4, "ensembleSize": 2, "writeQuorum": 3, "ackQuorum": 2}},
         "ensembleSize >= writeQuorum"),
        ({"metadataStore": {"etcd": {"replicas": 3}, "external": {"endpoints": ["e:2379"]}}}, "either"),
    ],
)  # fmt: skip
def test_cel_refuses_unsafe_specs(change: dict[str, Any], message: str) -> None:
    body = copy.deepcopy(BODY)
    body["spec"].update(change)
    problems = crdcheck.validate(body)
    assert any(message in p for p in problems), problems


def test_cel_refuses_unsafe_changes() -> None:
    new = copy.deepcopy(BODY)
    new["spec"]["metadataStore"]["etcd"]["replicas"] = 5
    new["spec"]["bookies"]["journal"] = {"size": "10Gi"}
    problems = crdcheck.validate(new, old=BODY)
    assert any("etcd replicas are immutable" in p for p in problems), problems
    assert any("bookies.journal is immutable" in p for p in problems), problems
    grow = copy.deepcopy(BODY)
    grow["spec"]["bookies"]["replicas"] = 6
    grow["spec"]["brokers"]["replicas"] = 3
    assert crdcheck.validate(grow, old=BODY) == []


def test_wiring() -> None:
    objs = render()
    for obj in objs:
        (ref,) = obj["metadata"]["ownerReferences"]
        assert ref["kind"] == "MagnetarCluster" and ref["uid"] == BODY["metadata"]["uid"] and ref["controller"]
    svc = by(objs, "Service", "demo-broker")
    assert {p["port"] for p in svc["spec"]["ports"]} == {6650, 8080}
    etcd = by(objs, "StatefulSet", "demo-etcd")
    args = etcd["spec"]["template"]["spec"]["containers"][0]["args"]
    assert ("--initial-cluster=demo-etcd-0=http://demo-etcd-0.demo-etcd-headless.prod.svc:2380,"
            "demo-etcd-1=http://demo-etcd-1.demo-etcd-headless.prod.svc:2380,"
            "demo-etcd-2=http://demo-etcd-2.demo-etcd-headless.prod.svc:2380") in args  # fmt: skip
    assert by(objs, "Service", "demo-etcd-headless")["spec"]["publishNotReadyAddresses"] is True
    bookie = by(objs, "StatefulSet", "demo-bookie")
    c = bookie["spec"]["template"]["spec"]["containers"][0]
    assert "--advertised-address=$(POD_NAME).demo-bookie-headless.prod.svc" in c["args"]
    assert "--metadata-url=etcd://demo-etcd.prod.svc:2379" in c["args"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/ready" and c["livenessProbe"]["httpGet"]["path"] == "/health"
    claims = {t["metadata"]["name"]: t["spec"] for t in bookie["spec"]["volumeClaimTemplates"]}
    assert claims["journal"]["storageClassName"] == "fast" and "storageClassName" not in claims["ledgers"]
    assert claims["ledgers"]["resources"]["requests"]["storage"] == "50Gi"
    assert bookie["spec"]["updateStrategy"] == {"type": "OnDelete"}
    assert bookie["spec"]["persistentVolumeClaimRetentionPolicy"]["whenDeleted"] == "Retain"
    pod = bookie["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["fsGroup"] == 10001
    assert pod["tolerations"] == [{"key": "dedicated", "operator": "Exists"}] and pod["nodeSelector"] == {"disk": "ssd"}
    assert bookie["spec"]["template"]["metadata"]["labels"]["team"] == "messaging"
    conf = by(objs, "ConfigMap", "demo-broker")["data"]["broker.conf"].splitlines()
    for line in ("clusterName=demo", "metadataStoreUrl=etcd://demo-etcd.prod.svc:2379",
                 "managedLedgerDefaultEnsembleSize=3", "managedLedgerDefaultWriteQuorum=2",
                 "managedLedgerDefaultAckQuorum=2", "brokerDeduplicationEnabled=true"):  # fmt: skip
        assert line in conf
    broker = by(objs, "StatefulSet", "demo-broker")["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in broker["env"]}
    assert env["MAGNETAR_advertisedListeners"]["value"] == (
        "internal:pulsar://$(POD_NAME).demo-broker-headless.prod.svc:6650,"
        "external:pulsar://broker-$(POD_INDEX).example.com:6650"
    )
    assert by(objs, "Service", "demo-broker-1-external")["spec"]["type"] == "LoadBalancer"
    job = by(objs, "Job", "demo-init-metadata")["spec"]["template"]["spec"]["containers"][0]
    assert job["args"][0] == "initialize-cluster-metadata"
    assert "--broker-service-url=pulsar://demo-broker.prod.svc:6650" in job["args"]
    monitor = by(objs, "ServiceMonitor", "demo")
    assert monitor["metadata"]["labels"]["release"] == "prom"


def test_config_change_changes_only_the_broker_template() -> None:
    before = render()
    body = copy.deepcopy(BODY)
    body["spec"]["brokers"]["config"]["maxMessageSize"] = "1048576"
    after = render(body)

    def hashes(objs: list[dict[str, Any]]) -> dict[str, str]:
        return {o["metadata"]["name"]: o["spec"]["template"]["metadata"]["annotations"][TEMPLATE_HASH]
                for o in objs if o["kind"] == "StatefulSet"}  # fmt: skip

    old, new = hashes(before), hashes(after)
    assert old["demo-broker"] != new["demo-broker"]
    assert old["demo-bookie"] == new["demo-bookie"] and old["demo-etcd"] == new["demo-etcd"]


def test_external_metadata_store_runs_no_etcd() -> None:
    body = copy.deepcopy(BODY)
    body["spec"]["metadataStore"] = {"external": {"endpoints": ["etcd-a:2379", "etcd-b:2379"]}}
    objs = render(body)
    assert not [o for o in objs if o["metadata"]["name"].startswith("demo-etcd")]
    conf = by(objs, "ConfigMap", "demo-broker")["data"]["broker.conf"]
    assert "metadataStoreUrl=etcd://etcd-a:2379,etcd-b:2379" in conf
