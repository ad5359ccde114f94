"""The Helm chart: lint, render with several value sets, validate every built-in object offline."""

from __future__ import annotations

import argparse
import json
import re
import sys
from functools import cache
from typing import Any

import pytest
import yaml

from magnetar.operator import cli as operator_cli
from tests.deploy import tools

#: Value combinations rendered and validated. Keys are test ids.
VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "namespaced": {"watchNamespaces": ["team-a", "team-b"]},
    "cluster": {
        "cluster": {"enabled": True, "name": "prod", "spec": {"brokers": {"replicas": 2}}},
        "image": {"repository": "registry.example.com/magnetar", "tag": "1.2.3"},
    },
    "secured": {
        "cluster": {
            "enabled": True,
            "name": "prod",
            "certificate": {"enabled": True, "issuerRef": {"name": "magnetar-ca", "kind": "Issuer"}, "bookies": True},
            "spec": {
                "security": {
                    "authentication": {
                        "token": {"secretKey": {"name": "prod-token-key", "key": "secret.key"}},
                        "superUserRoles": ["magnetar-operator"],
                    },
                    "authorization": {"enabled": True},
                }
            },
        },
        "operatorToken": {"secretName": "ops-token", "key": "jwt"},
    },
    "ha": {
        "replicaCount": 2,
        "podDisruptionBudget": {"enabled": True},
        "priorityClassName": "system-cluster-critical",
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "magnetar", "effect": "NoSchedule"}],
        "affinity": {
            "podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 100,
                        "podAffinityTerm": {
                            "topologyKey": "kubernetes.io/hostname",
                            "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "magnetar-operator"}},
                        },
                    }
                ]
            }
        },
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": "topology.kubernetes.io/zone",
                "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "magnetar-operator"}},
            }
        ],
        "podAnnotations": {"prometheus.io/scrape": "false"},
        "podLabels": {"team": "messaging"},
    },
    "minimal": {
        "peering": {"enabled": False},
        "rbac": {"readSecrets": False, "clusterDiscovery": False},
        "serviceAccount": {"create": False, "name": "existing-sa"},
        "image": {"repository": "registry.example.com/magnetar", "tag": "1.2.3", "pullPolicy": "Always"},
        "imagePullSecrets": [{"name": "regcred"}],
        "logLevel": "DEBUG",
        "driftIntervalSeconds": 60,
        "extraArgs": ["--cluster-url-template=http://{name}-broker.{namespace}:8080"],
        "extraEnv": [{"name": "TZ", "value": "UTC"}],
    },
    "namespaced-restricted": {
        "watchNamespaces": ["apps"],
        "rbac": {"clusterDiscovery": False, "secretNames": ["magnetar-admin-token"]},
        "podDisruptionBudget": {"enabled": True, "maxUnavailable": None, "minAvailable": 1},
        "replicaCount": 3,
    },
}


@cache
def render(name: str, hooks: bool = False) -> list[dict[str, Any]]:
    """The chart's documents with a value set; Helm hooks (the uninstall Job) only with ``hooks``."""
    values = json.dumps(VALUE_SETS[name])
    # --set-json on the root would not merge; a values file (stdin) does.
    result = tools.helm(
        "template",
        tools.RELEASE,
        str(tools.CHART),
        "--namespace",
        tools.NAMESPACE,
        "--values",
        "-",
        check=False,
        input_text=values,
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in tools.documents(result.stdout) if hooks or not _is_hook(doc)]


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def the(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = by_kind(docs, kind)
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (c,) = the(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    return c


def parse_operator_args(argv: list[str]) -> argparse.Namespace:
    """The container arguments through the real `magnetar operator` argument parser: a flag the
    operator does not know (or a bad value) fails here, not in a crash-looping pod."""
    parser = argparse.ArgumentParser(prog="magnetar", exit_on_error=False)
    sub = parser.add_subparsers(dest="command", required=True)
    operator_cli.add_parser(sub)
    try:
        return parser.parse_args(argv)
    except SystemExit as exc:  # argparse reports usage errors by exiting
        raise AssertionError(f"`magnetar {' '.join(argv)}` is refused by the operator's CLI") from exc


def rules_for(rules: list[dict[str, Any]], group: str, resource: str) -> set[str]:
    verbs: set[str] = set()
    for rule in rules:
        if group in rule["apiGroups"] and resource in rule["resources"]:
            verbs.update(rule["verbs"])
    return verbs


def test_helm_lint_strict(helm_bin: str) -> None:
    result = tools.helm("lint", "--strict", str(tools.CHART), check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


@pytest.mark.parametrize("name", [n for n in VALUE_SETS if n != "defaults"])
def test_helm_lint_with_values(helm_bin: str, name: str, tmp_path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(VALUE_SETS[name]))
    result = tools.helm("lint", "--strict", str(tools.CHART), "--values", str(values), check=False)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("name", list(VALUE_SETS))
def test_rendered_objects_validate(helm_bin: str, name: str) -> None:
    docs = render(name)
    assert docs
    assert tools.validate_builtin(docs) == []


@pytest.mark.parametrize("name", list(VALUE_SETS))
def test_namespaced_objects_have_the_release_namespace(helm_bin: str, name: str) -> None:
    # `kubectl apply -f` of rendered output must not depend on the current kubectl namespace.
    cluster_scoped = {"ClusterRole", "ClusterRoleBinding", "ClusterKopfPeering", "CustomResourceDefinition"}
    for doc in render(name):
        if doc["kind"] in cluster_scoped:
            assert "namespace" not in doc["metadata"], doc["metadata"]
        else:
            assert doc["metadata"].get("namespace"), f"{doc['kind']}/{doc['metadata']['name']} has no namespace"


def test_pod_security(helm_bin: str) -> None:
    pod = the(render("defaults"), "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = container(render("defaults"))["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert not sc.get("capabilities", {}).get("add")
    # A writable /tmp, since the root filesystem is read-only.
    assert {"name": "tmp", "mountPath": "/tmp"} in container(render("defaults"))["volumeMounts"]


def test_deployment_runs_the_operator_with_kopf_liveness(helm_bin: str) -> None:
    c = container(render("defaults"))
    assert "command" not in c, "one replica runs the image's entrypoint (magnetar) unchanged"
    assert c["args"][0] == "operator"
    args = parse_operator_args(c["args"])
    assert args.liveness == "http://0.0.0.0:8080/healthz"
    assert args.namespace == []  # no --namespace: all namespaces
    assert args.log_level == "INFO"
    assert args.drift_interval == 60
    assert args.peering == tools.RELEASE and not args.standalone
    assert args.priority == 0
    for probe in ("livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert c["ports"] == [{"name": "health", "containerPort": 8080, "protocol": "TCP"}]
    env = {e["name"]: e for e in c["env"]}
    assert env["POD_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert c["image"] == f"magnetar:{chart_app_version()}"
    assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]


@pytest.mark.parametrize("name", list(VALUE_SETS))
def test_operator_accepts_the_rendered_arguments(helm_bin: str, name: str) -> None:
    c = container(render(name))
    parse_operator_args(c["args"])


def test_replicas_get_distinct_priorities(helm_bin: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Several replicas start through a wrapper that appends a random --priority (kopf pauses
    every peer sharing the top priority). Run the wrapper with `main` replaced by a recorder."""
    c = container(render("ha"))
    assert c["command"][:2] == ["python", "-c"]
    import magnetar.cli.main

    seen: list[list[str]] = []

    def record(argv: list[str]) -> int:
        seen.append(argv)
        return 0

    monkeypatch.setattr(magnetar.cli.main, "main", record)
    for _ in range(2):
        monkeypatch.setattr(sys, "argv", ["-c", *c["args"]])
        with pytest.raises(SystemExit) as exited:
            exec(c["command"][2], {"__name__": "__main__"})
        assert exited.value.code == 0
    priorities = [parse_operator_args(argv).priority for argv in seen]
    assert all(p > 0 for p in priorities) and priorities[0] != priorities[1]
    assert [argv[: len(c["args"])] for argv in seen] == [c["args"], c["args"]]


def test_single_replica_is_recreated_not_rolled(helm_bin: str) -> None:
    assert the(render("defaults"), "Deployment")["spec"]["strategy"] == {"type": "Recreate"}
    assert the(render("ha"), "Deployment")["spec"]["strategy"]["type"] == "RollingUpdate"


def test_values_reach_the_pod(helm_bin: str) -> None:
    docs = render("minimal")
    c = container(docs)
    assert c["image"] == "registry.example.com/magnetar:1.2.3"
    assert c["imagePullPolicy"] == "Always"
    assert "--standalone" in c["args"] and not any(a.startswith("--peering") for a in c["args"])
    assert "--log-level=DEBUG" in c["args"] and "--drift-interval=60" in c["args"]
    assert c["args"][-1] == "--cluster-url-template=http://{name}-broker.{namespace}:8080"
    assert {"name": "TZ", "value": "UTC"} in c["env"]
    pod = the(docs, "Deployment")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "existing-sa"
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert not by_kind(docs, "ServiceAccount")
    assert not by_kind(docs, "ClusterKopfPeering")

    ha = the(render("ha"), "Deployment")
    spec = ha["spec"]["template"]["spec"]
    assert ha["spec"]["replicas"] == 2
    for key in ("affinity", "tolerations", "nodeSelector", "topologySpreadConstraints", "priorityClassName"):
        assert spec[key] == VALUE_SETS["ha"][key]
    assert ha["spec"]["template"]["metadata"]["labels"]["team"] == "messaging"
    assert ha["spec"]["template"]["metadata"]["annotations"] == {"prometheus.io/scrape": "false"}


def _is_hook(doc: dict[str, Any]) -> bool:
    return "helm.sh/hook" in ((doc.get("metadata") or {}).get("annotations") or {})


def test_cluster_wide_rbac_is_least_privilege(helm_bin: str) -> None:
    docs = render("defaults")
    assert not by_kind(docs, "Role")
    (role,) = by_kind(docs, "ClusterRole")
    rules = role["rules"]
    for plural in tools.magnetar_plurals():
        assert rules_for(rules, "magnetar.io", plural) == {"get", "list", "watch", "patch"}
        assert rules_for(rules, "magnetar.io", f"{plural}/status") == {"get", "patch"}
    assert rules_for(rules, "", "events") == {"create", "patch"}
    assert rules_for(rules, "", "secrets") == {"get", "list", "watch"}  # watched: rotation at once
    assert rules_for(rules, "kopf.dev", "clusterkopfpeerings") == {"get", "list", "watch", "patch", "create"}
    assert rules_for(rules, "apiextensions.k8s.io", "customresourcedefinitions") == {"get", "list", "watch"}
    # What a MagnetarCluster becomes (operator/clusterops.py): read, create, patch; Jobs are never patched.
    owned_rules = [("apps", "statefulsets"), ("", "services"), ("", "configmaps"),
                   ("policy", "poddisruptionbudgets"), ("monitoring.coreos.com", "servicemonitors")]  # fmt: skip
    for group, plural in owned_rules:
        assert rules_for(rules, group, plural) == {"get", "create", "patch"}, plural
    assert rules_for(rules, "batch", "jobs") == {"get", "create"}
    assert rules_for(rules, "", "pods") == {"list", "delete"}  # rolling updates delete one pod at a time
    # The operator never replaces objects, deletes nothing but pods, creates only Events, peering objects
    # and a cluster's owned objects, and no rule uses wildcards.
    owned = {"statefulsets", "services", "configmaps", "jobs", "poddisruptionbudgets", "servicemonitors"}
    for rule in rules:
        assert not {"update", "deletecollection", "*"} & set(rule["verbs"]), rule
        assert "delete" not in rule["verbs"] or rule["resources"] == ["pods"], rule
        assert (
            "create" not in rule["verbs"]
            or rule["resources"] in (["events"], ["clusterkopfpeerings"])
            or set(rule["resources"]) <= owned
        ), rule
        assert "*" not in rule["resources"] and "*" not in rule["apiGroups"], rule
    binding = the(docs, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {
            "kind": "ServiceAccount",
            "name": the(docs, "ServiceAccount")["metadata"]["name"],
            "namespace": tools.NAMESPACE,
        }
    ]
    assert the(docs, "ClusterKopfPeering")["metadata"]["name"] == tools.RELEASE


def test_namespaced_rbac_stays_in_the_watched_namespaces(helm_bin: str) -> None:
    docs = render("namespaced")
    roles = by_kind(docs, "Role")
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    assert sorted(b["metadata"]["namespace"] for b in by_kind(docs, "RoleBinding")) == ["team-a", "team-b"]
    for role in roles:
        for plural in tools.magnetar_plurals():
            assert rules_for(role["rules"], "magnetar.io", plural) == {"get", "list", "watch", "patch"}
        assert rules_for(role["rules"], "kopf.dev", "kopfpeerings") == {"get", "list", "watch", "patch"}
    assert sorted(p["metadata"]["namespace"] for p in by_kind(docs, "KopfPeering")) == ["team-a", "team-b"]
    assert not by_kind(docs, "ClusterKopfPeering")
    # The only cluster-wide access left is read-only discovery of CRDs and namespaces.
    (discovery,) = by_kind(docs, "ClusterRole")
    assert {g for r in discovery["rules"] for g in r["apiGroups"]} == {"apiextensions.k8s.io", ""}
    assert {v for r in discovery["rules"] for v in r["verbs"]} == {"get", "list", "watch"}
    assert parse_operator_args(container(docs)["args"]).namespace == ["team-a", "team-b"]

    restricted = render("namespaced-restricted")
    assert not by_kind(restricted, "ClusterRole") and not by_kind(restricted, "ClusterRoleBinding")
    (role,) = by_kind(restricted, "Role")
    (secret_rule,) = [r for r in role["rules"] if r["resources"] == ["secrets"]]
    assert secret_rule["resourceNames"] == ["magnetar-admin-token"]
    assert secret_rule["verbs"] == ["get"]  # a watch cannot be limited by name: not watched
    env = {e["name"]: e.get("value") for e in container(restricted)["env"]}
    assert env["MAGNETAR_OPERATOR_WATCH_SECRETS"] == "false"
    env = {e["name"]: e.get("value") for e in container(render("defaults"))["env"]}
    assert env["MAGNETAR_OPERATOR_WATCH_SECRETS"] == "true"


def test_minimal_rbac_reads_no_secrets(helm_bin: str) -> None:
    (role,) = by_kind(render("minimal"), "ClusterRole")
    assert not rules_for(role["rules"], "", "secrets")
    assert not rules_for(role["rules"], "kopf.dev", "clusterkopfpeerings")
    assert not rules_for(role["rules"], "apiextensions.k8s.io", "customresourcedefinitions")


def test_pod_disruption_budget(helm_bin: str) -> None:
    assert not by_kind(render("defaults"), "PodDisruptionBudget")
    pdb = the(render("ha"), "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1 and "minAvailable" not in pdb["spec"]
    deployment = the(render("ha"), "Deployment")
    assert pdb["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    assert the(render("namespaced-restricted"), "PodDisruptionBudget")["spec"] == {
        "minAvailable": 1,
        "selector": deployment["spec"]["selector"],
    }


def test_selector_matches_pod_labels(helm_bin: str) -> None:
    for name in VALUE_SETS:
        deployment = the(render(name), "Deployment")
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()


@pytest.mark.parametrize(
    ("values", "error"),
    [
        ({"watchNamespaces": ["Not_A_Namespace"]}, "watchNamespaces"),
        ({"logLevel": "chatty"}, "logLevel"),
        ({"replicaCont": 2}, "replicaCont"),
        ({"image": {"repository": "x", "pullPolicy": "Sometimes"}}, "pullPolicy"),
        ({"podDisruptionBudget": {"enabled": True, "minAvailable": 1}}, "not both"),
        ({"podDisruptionBudget": {"enabled": True, "minAvailable": 1, "maxUnavailable": None}}, "below replicaCount"),
        ({"replicaCount": 2, "peering": {"enabled": False}}, "needs peering"),
        ({"cluster": {"certificate": {"enabled": True}}}, "issuerRef"),
        ({"operatorToken": {"secretName": "Bad_Name", "key": "token"}}, "secretName"),
    ],
)
def test_bad_values_are_refused(helm_bin: str, values: dict[str, Any], error: str) -> None:
    result = tools.helm("template", "x", str(tools.CHART), "--values", "-", check=False, input_text=json.dumps(values))
    assert result.returncode != 0
    assert error in result.stderr


def chart_app_version() -> str:
    return yaml.safe_load((tools.CHART / "Chart.yaml").read_text())["appVersion"]


def test_readme_documents_every_value() -> None:
    readme = (tools.CHART / "README.md").read_text()
    table = readme.split("\n## Values\n", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^\| `([^`]+)` \|", table, flags=re.M))
    values = yaml.safe_load((tools.CHART / "values.yaml").read_text())

    def leaves(node: Any, prefix: str = "") -> set[str]:
        # Free-form maps (resources, securityContext, ...) are documented as a whole.
        if isinstance(node, dict) and node and prefix not in FREE_FORM:
            return set().union(*(leaves(v, f"{prefix}.{k}" if prefix else k) for k, v in node.items()))
        return {prefix}

    missing = leaves(values) - documented
    assert not missing, f"values missing from the chart README table: {sorted(missing)}"
    stale = documented - leaves(values)
    assert not stale, f"README documents values that do not exist: {sorted(stale)}"
    schema = json.loads((tools.CHART / "values.schema.json").read_text())
    assert set(values) <= set(schema["properties"])


FREE_FORM = {
    "resources",
    "cluster.spec",
    "podSecurityContext",
    "securityContext",
    "livenessProbe",
    "readinessProbe",
    "podAnnotations",
    "podLabels",
    "nodeSelector",
    "affinity",
    "serviceAccount.annotations",
}


def test_uninstall_hook_scales_down_then_releases_finalizers(helm_bin: str) -> None:
    """`helm uninstall` runs a pre-delete Job (docs/operator.md, "Uninstalling"); its only extra right is
    scaling this release's Deployment; `kubectl apply` of install.yaml carries no hook."""
    hooks = [doc for doc in render("defaults", hooks=True) if _is_hook(doc)]
    assert {doc["kind"] for doc in hooks} == {"Role", "RoleBinding", "Job"}
    assert all(doc["metadata"]["annotations"]["helm.sh/hook"] == "pre-delete" for doc in hooks)
    (role,) = by_kind(hooks, "Role")
    assert role["rules"] == [{"apiGroups": ["apps"], "resources": ["deployments"],
                              "resourceNames": [tools.RELEASE], "verbs": ["get", "patch"]}]  # fmt: skip
    (job,) = by_kind(hooks, "Job")
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["args"] == ["operator", "--release-finalizers", f"--scale-down={tools.RELEASE}"]
    off = tools.documents(tools.helm_template("--set", "uninstall.releaseFinalizers=false"))
    assert not [doc for doc in off if _is_hook(doc)]
    assert "helm.sh/hook" not in tools.INSTALL_YAML.read_text()


def test_chart_installs_a_magnetar_cluster_next_to_the_operator(helm_bin: str) -> None:
    assert not by_kind(render("defaults"), "MagnetarCluster")
    mc = the(render("cluster"), "MagnetarCluster")
    assert mc["metadata"]["name"] == "prod" and mc["metadata"]["namespace"] == tools.NAMESPACE
    spec = mc["spec"]
    assert spec["image"] == "registry.example.com/magnetar:1.2.3"
    assert spec["brokers"]["replicas"] == 2 and spec["bookies"]["replicas"] == 3  # values merged over defaults
    from tests.operator import crdcheck

    assert crdcheck.validate(mc) == []


def test_chart_secures_its_cluster_with_a_cert_manager_certificate(helm_bin: str) -> None:
    """cluster.certificate: cert-manager writes <name>-broker-tls for the broker Service and every broker's DNS
    name, and the MagnetarCluster's TLS defaults to it; operatorToken reaches the operator's environment."""
    docs = render("secured")
    cert, bookie_cert = by_kind(docs, "Certificate")
    assert bookie_cert["spec"]["secretName"] == "prod-bookie-tls"
    assert bookie_cert["spec"]["dnsNames"][0] == f"*.prod-bookie-headless.{tools.NAMESPACE}.svc"
    assert cert["apiVersion"] == "cert-manager.io/v1" and cert["spec"]["secretName"] == "prod-broker-tls"
    ns = tools.NAMESPACE
    service, pods = f"prod-broker.{ns}.svc", f"*.prod-broker-headless.{ns}.svc"
    assert set(cert["spec"]["dnsNames"]) == {"prod-broker", service, f"{service}.cluster.local", pods,
                                             f"{pods}.cluster.local"}  # fmt: skip
    assert cert["spec"]["issuerRef"] == {"name": "magnetar-ca", "kind": "Issuer"}
    mc = the(docs, "MagnetarCluster")
    security = mc["spec"]["security"]
    assert security["tls"] == {"secretName": "prod-broker-tls", "bookieSecretName": "prod-bookie-tls"}
    assert security["authentication"]["superUserRoles"] == ["magnetar-operator"]
    from tests.operator import crdcheck

    assert crdcheck.validate(mc) == []
    env = {e["name"]: e.get("value") for e in container(docs)["env"]}
    assert env["MAGNETAR_OPERATOR_TOKEN_SECRET"] == "ops-token" and env["MAGNETAR_OPERATOR_TOKEN_KEY"] == "jwt"
    defaults = {e["name"]: e.get("value") for e in container(render("defaults"))["env"]}
    assert defaults["MAGNETAR_OPERATOR_TOKEN_SECRET"] == "magnetar-operator-token"
    assert not by_kind(render("cluster"), "Certificate")
