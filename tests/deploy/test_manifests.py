"""manifests/: the plain install (rendered from the chart, kept current), its kustomization, and
the Argo CD argocd-cm patch; every built-in object validated offline."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml

from tests.deploy import tools
from tests.deploy.test_crds import schemas_by_kind

# The operator's install manifests; samples are custom resources (checked against the CRDs) and
# manifests/spark holds Spark-operator resources checked by tests/spark/test_spark_manifests.py.
MANIFEST_FILES = sorted(
    p
    for p in tools.MANIFESTS.rglob("*.yaml")
    if not {"samples", "spark"} & set(p.parts) and p.name != "kustomization.yaml"
)


def test_install_yaml_is_current(helm_bin: str) -> None:
    assert tools.INSTALL_YAML.read_text() == tools.render_install(), (
        "manifests/install.yaml is stale: run `python -m tests.deploy.render`"
    )


def test_argocd_cm_is_current() -> None:
    assert tools.ARGOCD_CM.read_text() == tools.render_argocd_cm(), (
        "manifests/argocd/argocd-cm.yaml is stale: run `python -m tests.deploy.render`"
    )


def test_argocd_cm_keys_and_scripts() -> None:
    (cm,) = tools.documents(tools.ARGOCD_CM.read_text())
    assert cm["metadata"] == {
        "name": "argocd-cm",
        "namespace": "argocd",
        "labels": {"app.kubernetes.io/name": "argocd-cm", "app.kubernetes.io/part-of": "argocd"},
    }
    # Argo CD's key format: resource.customizations.health.<group>_<kind>.
    assert set(cm["data"]) == {f"resource.customizations.health.magnetar.io_{kind}" for kind in tools.KINDS}
    for kind in tools.KINDS:
        assert (
            cm["data"][f"resource.customizations.health.magnetar.io_{kind}"]
            == tools.health_script_path(kind).read_text()
        )


@pytest.mark.parametrize("path", MANIFEST_FILES, ids=lambda p: str(p.relative_to(tools.MANIFESTS)))
def test_manifest_objects_validate(path: Path) -> None:
    docs = tools.documents(path.read_text())
    assert docs
    assert tools.validate_builtin(docs) == []


def test_install_yaml_contents() -> None:
    docs = tools.documents(tools.INSTALL_YAML.read_text())
    kinds = [d["kind"] for d in docs]
    # Namespace and CRDs first: `kubectl apply -f` applies in file order, and namespaced objects
    # and custom resources need them to exist.
    assert kinds[0] == "Namespace"
    first_other = next(i for i, k in enumerate(kinds) if k not in ("Namespace", "CustomResourceDefinition"))
    assert "CustomResourceDefinition" not in kinds[first_other:]
    crds = {d["metadata"]["name"]: d for d in docs if d["kind"] == "CustomResourceDefinition"}
    assert crds == {d["metadata"]["name"]: d for d in tools.crd_documents()}
    for kind in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Deployment", "ClusterKopfPeering"):
        assert kind in kinds
    for doc in docs:
        if "namespace" in doc["metadata"]:
            assert doc["metadata"]["namespace"] == tools.NAMESPACE


def test_kustomization_builds_the_install(kubectl_bin: str) -> None:
    result = subprocess.run(
        [kubectl_bin, "kustomize", str(tools.MANIFESTS)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    built = tools.documents(result.stdout)
    expected = tools.documents(tools.INSTALL_YAML.read_text())

    def key(doc: dict) -> tuple[str, str, str]:
        return (doc["kind"], doc["metadata"].get("namespace", ""), doc["metadata"]["name"])

    # kustomize reorders objects and rewrites formatting, but must not change any object.
    assert sorted(map(key, built)) == sorted(map(key, expected))
    assert {key(d): d for d in built} == {key(d): d for d in expected}


def test_kustomization_lists_the_install() -> None:
    kustomization = yaml.safe_load((tools.MANIFESTS / "kustomization.yaml").read_text())
    assert kustomization["resources"] == ["install.yaml"]


def test_gitops_guide_examples() -> None:
    """docs/gitops.md: its YAML examples parse, Magnetar resources in them match the CRDs, and
    every repository path it lists exists."""
    guide = (tools.ROOT / "docs" / "gitops.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", guide, flags=re.S)
    assert blocks
    schemas = schemas_by_kind()
    kinds = set()
    for block in blocks:
        for doc in tools.documents(block):
            kinds.add(doc["kind"])
            key = (doc["apiVersion"], doc["kind"])
            if doc["apiVersion"].startswith("magnetar.io/"):
                errors = list(jsonschema.Draft7Validator(schemas[key]).iter_errors(doc))
                assert not errors, [e.message for e in errors]
    assert {"Application", "HelmRelease", "GitRepository", "Kustomization"} <= kinds
    shipped = guide.split("| path | what |", 1)[1].split("\n\n", 1)[0]
    for path in re.findall(r"^\| `([^`]+)` \|", shipped, flags=re.M):
        assert list(tools.ROOT.glob(path.rstrip("/"))), f"docs/gitops.md lists {path}, which does not exist"
