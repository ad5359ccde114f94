"""The CRDs as shipped: structural, apiextensions v1, status subresource, no defaulting diffs,
identical in the chart, and the samples in manifests/samples/ valid against them."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from tests.deploy import tools

SAMPLES = sorted((tools.MANIFESTS / "samples").glob("*.yaml"))

#: Keywords that structural schemas forbid inside allOf/anyOf/oneOf/not (they may only add value
#: validations, never shape).
SHAPE_KEYWORDS = {"type", "properties", "additionalProperties", "items", "default", "nullable", "description"}


def crd_files() -> list[Path]:
    return sorted(tools.CRDS.glob("*.yaml"))


def magnetar_crds() -> list[dict[str, Any]]:
    return [doc for doc in tools.crd_documents() if doc["spec"]["group"] == "magnetar.io"]


def walk(schema: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    """Every schema node with its path (properties, additionalProperties and items)."""
    nodes = [(path or "<root>", schema)]
    for name, sub in schema.get("properties", {}).items():
        nodes += walk(sub, f"{path}.{name}")
    if isinstance(schema.get("additionalProperties"), dict):
        nodes += walk(schema["additionalProperties"], f"{path}.*")
    if isinstance(schema.get("items"), dict):
        nodes += walk(schema["items"], f"{path}[]")
    return nodes


def structural_problems(schema: dict[str, Any]) -> list[str]:
    problems = []
    for path, node in walk(schema):
        exempt = node.get("x-kubernetes-int-or-string") or node.get("x-kubernetes-preserve-unknown-fields")
        if not node.get("type") and not exempt:
            problems.append(f"{path}: no type")
        for combinator in ("allOf", "anyOf", "oneOf", "not"):
            branches = node.get(combinator, [])
            for branch in branches if isinstance(branches, list) else [branches]:
                for sub_path, sub in walk(branch, f"{path}.{combinator}"):
                    if SHAPE_KEYWORDS & set(sub) - {"properties", "items"}:
                        problems.append(f"{sub_path}: {sorted(SHAPE_KEYWORDS & set(sub))} inside {combinator}")
        if "default" in node:
            # A default the user did not write shows up as a permanent diff in Argo CD / Flux.
            problems.append(f"{path}: has a default ({node['default']!r}); GitOps tools would show a diff")
    metadata = schema.get("properties", {}).get("metadata", {})
    if set(metadata) - {"type", "properties", "description"} or set(metadata.get("properties", {})) - {
        "name",
        "generateName",
    }:
        problems.append("metadata: only name/generateName may be restricted")
    return problems


def test_crds_exist_for_every_kind() -> None:
    kinds = {doc["spec"]["names"]["kind"] for doc in magnetar_crds()}
    assert kinds == set(tools.KINDS)
    assert {doc["spec"]["names"]["kind"] for doc in tools.crd_documents()} - kinds == {
        "ClusterKopfPeering",
        "KopfPeering",
    }


@pytest.mark.parametrize("path", crd_files(), ids=lambda p: p.name)
def test_crd_is_v1_and_structural(path: Path) -> None:
    for crd in tools.documents(path.read_text()):
        assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
        assert crd["kind"] == "CustomResourceDefinition"
        spec = crd["spec"]
        assert crd["metadata"]["name"] == f"{spec['names']['plural']}.{spec['group']}"
        assert sum(v["storage"] for v in spec["versions"]) == 1
        for version in spec["versions"]:
            schema = version["schema"]["openAPIV3Schema"]
            assert structural_problems(schema) == [], f"{crd['metadata']['name']} {version['name']}"
            if spec["group"] == "magnetar.io":
                # The operator writes status through the subresource only, and users' applies
                # (kubectl, Argo CD, Flux) then never touch or diff status.
                assert version.get("subresources", {}).get("status") == {}
                status = schema["properties"]["status"]["properties"]
                assert status["observedGeneration"]["type"] == "integer"
                assert status["conditions"]["type"] == "array"
        # The CRD object itself, strictly, against the oldest and newest Kubernetes schemas.
        assert tools.validate_builtin([crd]) == []


def test_chart_crds_equal_top_level_crds() -> None:
    top = {p.name: p.read_bytes() for p in crd_files()}
    chart = {p.name: p.read_bytes() for p in sorted(tools.CHART_CRDS.glob("*.yaml"))}
    assert sorted(chart) == sorted(top), "run `python -m tests.deploy.render` to sync the chart's crds/"
    stale = [name for name in top if chart[name] != top[name]]
    assert not stale, f"chart CRDs differ from crds/: {stale}; run `python -m tests.deploy.render`"


def strict_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """The OpenAPI schema as JSON Schema, closed against unknown fields.

    The API server prunes unknown fields silently (or rejects them with kubectl's strict field
    validation), so a misspelt field in a sample is a bug: reject it here.
    """
    schema = copy.deepcopy(schema)
    for _, node in walk(schema):
        if node.get("nullable") and isinstance(node.get("type"), str):
            node["type"] = [node["type"], "null"]
        if (
            node.get("type") == "object"
            and "properties" in node
            and "additionalProperties" not in node
            and not node.get("x-kubernetes-preserve-unknown-fields")
        ):
            node["additionalProperties"] = False
    return schema


def schemas_by_kind() -> dict[tuple[str, str], dict[str, Any]]:
    found = {}
    for crd in tools.crd_documents():
        spec = crd["spec"]
        for version in spec["versions"]:
            if version["served"]:
                key = (f"{spec['group']}/{version['name']}", spec["names"]["kind"])
                found[key] = strict_schema(version["schema"]["openAPIV3Schema"])
    return found


def test_there_is_a_sample_for_every_kind() -> None:
    kinds = {doc["kind"] for path in SAMPLES for doc in tools.documents(path.read_text())}
    assert set(tools.KINDS) <= kinds


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.name)
def test_sample_validates_against_its_crd(path: Path) -> None:
    schemas = schemas_by_kind()
    docs = tools.documents(path.read_text())
    assert docs
    for doc in docs:
        if tools.is_builtin(doc):  # e.g. the Secret a Tenant's credentials live in
            assert tools.validate_builtin([doc]) == []
            continue
        key = (doc["apiVersion"], doc["kind"])
        assert key in schemas, f"{path.name}: no served CRD version for {key}"
        errors = sorted(jsonschema.Draft7Validator(schemas[key]).iter_errors(doc), key=lambda e: list(e.path))
        assert not errors, "\n".join(f"{'/'.join(map(str, e.path))}: {e.message}" for e in errors)
        assert "status" not in doc, "samples describe desired state only"


def test_strict_schema_catches_a_misspelt_field() -> None:
    # Guard for the test above: a typo must not pass just because the schema is open.
    schemas = schemas_by_kind()
    sample = next(d for p in SAMPLES for d in tools.documents(p.read_text()) if d.get("kind") == "Tenant")
    broken = copy.deepcopy(sample)
    broken["spec"]["adminRolez"] = ["x"]
    assert list(jsonschema.Draft7Validator(schemas[("magnetar.io/v1alpha1", "Tenant")]).iter_errors(broken))
