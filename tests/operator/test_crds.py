"""The CRDs: generated files are current, structural, and they accept the samples and reject bad input
(schema + CEL rules evaluated offline, see :mod:`tests.operator.crdcheck`)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from magnetar.operator import crdgen
from tests.operator.crdcheck import CRD_DIR, schemas, validate

SAMPLES = Path(__file__).resolve().parents[2] / "manifests" / "samples"


def _samples() -> list[dict[str, Any]]:
    docs = []
    for path in sorted(SAMPLES.glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d and d["apiVersion"].startswith("magnetar.io/")]
    return docs


def test_generated_files_are_current() -> None:
    for name, text in crdgen.rendered().items():
        assert (CRD_DIR / name).read_text() == text, f"crds/{name} is stale: run python -m magnetar.operator.crdgen"


def _walk(schema: dict[str, Any], path: str) -> list[str]:
    problems = []
    if "type" not in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
        problems.append(f"{path}: no type (not structural)")
    if path.count(".") > 1 and "description" not in schema and path.split(".")[-1] != "metadata":
        problems.append(f"{path}: no description")
    for key, sub in (schema.get("properties") or {}).items():
        problems += _walk(sub, f"{path}.{key}")
    if "items" in schema:
        problems += _walk(schema["items"], f"{path}[]")
    return problems


@pytest.mark.parametrize("kind", ["Tenant", "TopicNamespace", "Topic", "RetentionPolicy"])
def test_crd_is_structural_and_described(kind: str) -> None:
    crd = yaml.safe_load((CRD_DIR / f"magnetar.io_{kind.lower()}.yaml").read_text())
    version = crd["spec"]["versions"][0]
    assert crd["spec"]["group"] == "magnetar.io" and version["name"] == "v1alpha1"
    assert version["subresources"] == {"status": {}}
    assert "magnetar" in crd["spec"]["names"]["categories"] and crd["spec"]["names"]["shortNames"]
    assert any(c["name"] == "Ready" for c in version["additionalPrinterColumns"])
    assert _walk(version["schema"]["openAPIV3Schema"], kind) == []
    text = yaml.safe_dump(crd)
    assert "default:" not in text  # no defaulting: GitOps tools would see a diff


def test_samples_are_valid() -> None:
    docs = _samples()
    assert {d["kind"] for d in docs} == {"MagnetarCluster", "Tenant", "TopicNamespace", "Topic", "RetentionPolicy"}
    for doc in docs:
        assert validate(doc) == [], doc["metadata"]["name"]


def _doc(kind: str) -> dict[str, Any]:
    """The first sample of a kind that uses clusterRef (RetentionPolicy has no target)."""
    return copy.deepcopy(
        next(d for d in _samples() if d["kind"] == kind and (kind == "RetentionPolicy" or "clusterRef" in d["spec"]))
    )


def _set(doc: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    node = doc
    keys = path.split(".")
    for key in keys[:-1]:
        node = node.setdefault(key, {})
    if value is _DELETE:
        node.pop(keys[-1], None)
    else:
        node[keys[-1]] = value
    return doc


_DELETE = object()

BAD = [
    ("Tenant", "spec.connection", {"adminUrl": "http://x:8080"}, "exactly one of clusterRef and connection"),
    ("Tenant", "spec.clusterRef", _DELETE, "exactly one of clusterRef and connection"),
    ("Tenant", "spec.deletionPolicy", "Orphan", "is not one of"),
    ("Tenant", "spec.allowedClusters", [], "should be non-empty"),
    ("Tenant", "spec.adminRoles", "admin", "is not of type 'array'"),
    ("Tenant", "spec.name", "bad/name", "does not match"),
    ("TopicNamespace", "spec.tenant", _DELETE, "'tenant' is a required property"),
    ("TopicNamespace", "spec.policies.persistence", {"ensembleSize": 1, "writeQuorum": 2, "ackQuorum": 1},
     "ensembleSize >= writeQuorum >= ackQuorum"),
    ("TopicNamespace", "spec.policies.persistence", {"ensembleSize": 3, "writeQuorum": 2, "ackQuorum": 3},
     "ensembleSize >= writeQuorum >= ackQuorum"),
    ("TopicNamespace", "spec.policies.retention", {"timeInMinutes": 10, "sizeInMB": 100},
     "retentionPolicyRef and inline"),
    ("TopicNamespace", "spec.policies.autoTopicCreation", {"allow": True, "type": "partitioned"},
     "defaultNumPartitions is required"),
    ("TopicNamespace", "spec.policies.autoTopicCreation", {"allow": True}, "type is required"),
    ("TopicNamespace", "spec.policies.messageTTLSeconds", -1, "less than the minimum"),
    ("TopicNamespace", "spec.policies.schemaCompatibilityStrategy", "SOMETIMES", "is not one of"),
    ("Topic", "spec.partitions", -1, "less than the minimum"),
    ("Topic", "spec.namespace", "no-slash", "does not match"),
    ("Topic", "spec.persistent", False, "topic policies apply to persistent topics only"),
    ("Topic", "spec.retentionPolicyRef", {"name": "standard"}, None),  # valid: ref alone
    ("RetentionPolicy", "spec.backlogQuota.limitSizeBytes", 1024 * 1024 * 1024 * 2,
     "retention must exceed the backlog quota"),
    ("RetentionPolicy", "spec.backlogQuota.limitSizeBytes", 1024 * 1024 * 1024, "retention must exceed"),  # equal
    ("RetentionPolicy", "spec.backlogQuota", {"limitTimeSeconds": 1440 * 60, "policy": "producer_exception"},
     "retention must exceed the backlog quota"),
    ("RetentionPolicy", "spec.backlogQuota", {"policy": "producer_exception"}, "needs limitSizeBytes or"),
    ("RetentionPolicy", "spec.retention", {"timeInMinutes": 0, "sizeInMB": 10}, "set both timeInMinutes and sizeInMB"),
    ("RetentionPolicy", "spec.retention", {"timeInMinutes": -2, "sizeInMB": 10}, "less than the minimum"),
    ("RetentionPolicy", "spec.backlogQuota.policy", "drop_everything", "is not one of"),
]  # fmt: skip


@pytest.mark.parametrize(("kind", "path", "value", "message"), BAD)
def test_bad_resources_are_rejected(kind: str, path: str, value: Any, message: str | None) -> None:
    doc = _set(_doc(kind), path, value)
    errors = validate(doc)
    if message is None:
        assert errors == []
    else:
        assert any(message in e for e in errors), errors


def test_unlimited_retention_accepts_any_quota() -> None:
    doc = _doc("RetentionPolicy")
    doc["spec"]["retention"] = {"timeInMinutes": -1, "sizeInMB": -1}
    doc["spec"]["backlogQuota"]["limitSizeBytes"] = 10**15
    assert validate(doc) == []


UPDATES = [
    ("Topic", "spec.partitions", 2, "partitions may only grow"),
    ("Topic", "spec.partitions", _DELETE, "partitions may only grow"),
    ("Topic", "spec.partitions", 5, None),
    ("Topic", "spec.namespace", "acme/other", "namespace is immutable"),
    ("Topic", "spec.name", "renamed", "name is immutable"),
    ("Topic", "spec.persistent", False, "persistent is immutable"),
    ("Topic", "spec.clusterRef.name", "other", "clusterRef is immutable"),
    ("TopicNamespace", "spec.tenant", "other", "tenant is immutable"),
    ("TopicNamespace", "spec.policies.bundles", 8, "policies.bundles is immutable"),
    ("TopicNamespace", "spec.policies.maxProducers", 99, None),
    ("Tenant", "spec.name", "other", "name is immutable"),
    ("Tenant", "spec.adminRoles", ["a", "b"], None),
]


@pytest.mark.parametrize(("kind", "path", "value", "message"), UPDATES)
def test_transition_rules(kind: str, path: str, value: Any, message: str | None) -> None:
    old = _doc(kind)
    new = _set(copy.deepcopy(old), path, value)
    errors = validate(new, old)
    if message is None:
        assert errors == []
    else:
        assert any(message in e for e in errors), errors


def test_non_partitioned_topic_stays_non_partitioned() -> None:
    old = next(d for d in _samples() if d["kind"] == "Topic" and "partitions" not in d["spec"])
    new = _set(copy.deepcopy(old), "spec.partitions", 4)
    assert any("cannot become partitioned" in e for e in validate(new, old))


def test_every_kind_has_a_schema() -> None:
    assert set(schemas()) == {"MagnetarCluster", "Tenant", "TopicNamespace", "Topic", "RetentionPolicy"}
