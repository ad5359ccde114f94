"""What a GitOps user does to the operator (Argo CD / Flux pruning, renames, outages), with the real
``magnetar operator`` (kopf), ``kubectl`` (validating against the emulator's OpenAPI documents, no
``--validate=false``), the emulated API server admitting like kube-apiserver, and a real
``magnetar standalone``:

- a pruned Topic with live clients is kept and reported (TopicInUse) until idle;
- a rename in Git (new object, old one pruned) keeps the topic and its messages;
- a deletion while the broker is down is bounded, then the resource is released with an ``Orphaned`` Event;
- a 403 reading the credentials Secret is status (CredentialsUnreadable), not a crash loop, and heals;
  a rotated Secret is picked up at once (watched);
- deleting a RetentionPolicy updates its users at once (the drift interval here is long on purpose);
- invalid changes are refused at admission with the server's message.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import StandaloneProcess, _quiet_logger
from tests.operator.kubeemu import EmulatorThread, ResourceType
from tests.operator.test_operator_loop import KUBECTL, ROOT, Cluster, start_operator, stop_operator

pytestmark = pytest.mark.skipif(not Path(KUBECTL).exists(), reason="kubectl not installed")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("gitops")
    broker = StandaloneProcess(tmp / "broker")
    broker.start()
    emu = EmulatorThread().start()
    env = {
        **os.environ,
        "KUBECONFIG": emu.kubeconfig(str(tmp / "kubeconfig")),
        "KUBECACHEDIR": str(tmp / "kubecache"),
        "MAGNETAR_OPERATOR_CLUSTER_URL_TEMPLATE": broker.http_url,
        # Long: everything below must happen through events and retries, not the drift timer.
        "MAGNETAR_OPERATOR_DRIFT_INTERVAL": "120",
        "MAGNETAR_OPERATOR_BACKOFF_BASE": "0.5",
        "MAGNETAR_OPERATOR_BACKOFF_CAP": "2",
        "MAGNETAR_OPERATOR_DELETE_TIMEOUT": "4",
        "MAGNETAR_OPERATOR_WATCH_SECRETS": "true",
    }
    log = tmp / "operator.log"
    cluster = Cluster(emu, broker, env, log)
    proc: subprocess.Popen[bytes] | None = None
    try:
        cluster.kubectl("apply", "-f", str(ROOT / "crds"))
        cluster.stand_in_magnetar_cluster()
        proc = start_operator(env, log)
        cluster.proc = proc  # type: ignore[attr-defined]  (the uninstall test stops it)
        ns = _res("TopicNamespace", "apps", {"tenant": "gitops", "name": "apps"})
        apply(cluster, _res("Tenant", "gitops", {}), ns)
        cluster.wait_ready("topicnamespaces", "apps")
        yield cluster
    finally:
        if proc is not None:
            stop_operator(proc)
        emu.stop()
        broker.stop()


def _res(kind: str, name: str, spec: dict[str, Any], target: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"apiVersion": "magnetar.io/v1alpha1", "kind": kind, "metadata": {"name": name},
            "spec": {**spec, **(target or {"clusterRef": {"name": "magnetar"}})}}  # fmt: skip


def apply(cluster: Cluster, *objs: dict[str, Any], check: bool = True) -> str:
    path = Path(cluster.env["KUBECONFIG"]).parent / "apply.yaml"
    path.write_text(yaml.safe_dump_all(objs))
    return cluster.kubectl("apply", "-f", str(path), check=check, stderr=True)


def _client(cluster: Cluster) -> Any:
    import pulsar

    return pulsar.Client(cluster.broker.service_url, operation_timeout_seconds=10, logger=_quiet_logger())


def _topics(cluster: Cluster) -> list[str]:
    return cluster.admin("GET", "persistent/gitops/apps")


def test_prune_of_a_live_topic_keeps_it_until_idle(cluster: Cluster) -> None:
    apply(cluster, _res("Topic", "live", {"namespace": "gitops/apps"}))
    cluster.wait_ready("topics", "live")
    client = _client(cluster)
    try:
        producer = client.create_producer("persistent://gitops/apps/live")
        cluster.kubectl("delete", "--wait=false", "topic", "live")
        cluster.wait(lambda: cluster.condition("topics", "live", "Reconciling").get("reason") == "TopicInUse",
                     "the deletion to report the live topic")  # fmt: skip
        assert "1 producers" in cluster.condition("topics", "live", "Reconciling")["message"]
        assert any(reason == "TopicInUse" for reason, _ in cluster.events("live"))
        assert "persistent://gitops/apps/live" in _topics(cluster)
        producer.send(b"still here")  # the producer was not cut off
        producer.close()
    finally:
        client.close()
    # Idle (no subscription, so no backlog): deleted on the next retry.
    cluster.wait(lambda: cluster.obj("topics", "live") is None, "the idle topic's resource to go")
    assert "persistent://gitops/apps/live" not in _topics(cluster)


def test_rename_in_git_keeps_the_topic_and_its_messages(cluster: Cluster) -> None:
    spec = {"namespace": "gitops/apps", "name": "orders", "partitions": 2}
    apply(cluster, _res("Topic", "orders-v1", spec))
    cluster.wait_ready("topics", "orders-v1")
    topic = "persistent://gitops/apps/orders"
    client = _client(cluster)
    try:
        client.subscribe(topic, "billing").close()
        producer = client.create_producer(topic)
        for i in range(4):
            producer.send(f"m{i}".encode())
        producer.close()
        # Git: the file is renamed. Argo CD applies the new object, then prunes the old one.
        apply(cluster, _res("Topic", "orders-v2", spec))
        cluster.wait_ready("topics", "orders-v2", "False", "ResourceConflict")
        cluster.kubectl("delete", "--wait=false", "topic", "orders-v1")
        cluster.wait(lambda: cluster.obj("topics", "orders-v1") is None, "the old resource to go")
        assert any(reason == "HandedOver" for reason, _ in cluster.events("orders-v1"))
        cluster.wait_ready("topics", "orders-v2")  # at once, not on the (long) drift timer
        consumer = client.subscribe(topic, "billing")
        got = sorted(consumer.receive(timeout_millis=5000).data() for _ in range(4))
        consumer.close()
        assert got == [f"m{i}".encode() for i in range(4)]
    finally:
        client.close()


def test_broker_down_during_delete_is_bounded_then_orphaned(cluster: Cluster, tmp_path: Path) -> None:
    far = StandaloneProcess(tmp_path / "far")
    far.start()
    try:
        apply(cluster, _res("Tenant", "far", {}, {"connection": {"adminUrl": far.http_url}}))
        cluster.wait_ready("tenants", "far")
    finally:
        far.stop()
    cluster.kubectl("delete", "--wait=false", "tenant", "far")
    cluster.wait(lambda: cluster.condition("tenants", "far", "Reconciling").get("reason") == "ClusterUnreachable",
                 "the deletion to wait for the cluster")  # fmt: skip
    cluster.wait(lambda: cluster.obj("tenants", "far") is None, "the bounded wait to end", timeout=20)
    orphaned = [message for reason, message in cluster.events("far") if reason == "Orphaned"]
    assert orphaned and orphaned[0].startswith("far orphaned") and "ClusterUnreachable" in orphaned[0], orphaned


def test_secret_403_is_status_not_a_crash_loop(cluster: Cluster) -> None:
    assert cluster.emu.emulator is not None
    apply(cluster, {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "broker-token"},
                    "stringData": {"token": "t0"}})  # fmt: skip
    # RBAC that does not let the operator read it (the emulator answers 403 as kube-apiserver would).
    cluster.emu.emulator.forbidden.add(("secrets", "default", "broker-token"))
    target = {"connection": {"adminUrl": cluster.broker.http_url,
                             "credentialsSecretRef": {"name": "broker-token", "key": "token"}}}  # fmt: skip
    apply(cluster, _res("Tenant", "locked", {}, target))
    cluster.wait_ready("tenants", "locked", "False", "CredentialsUnreadable")
    assert "403" in cluster.condition("tenants", "locked")["message"]
    assert "Traceback" not in cluster.log_tail()
    # RBAC fixed: picked up by the retry with backoff (capped at 2 s here).
    cluster.emu.emulator.forbidden.clear()
    cluster.wait_ready("tenants", "locked")
    # Rotation: the watched Secret changes, its users are reconciled at once (not on the drift timer).
    apply(cluster, {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "broker-token"},
                    "stringData": {"token": "t1"}})  # fmt: skip
    cluster.wait(lambda: any(r == "CredentialsChanged" for r, _ in cluster.events("locked")), "the rotation")
    cluster.wait_ready("tenants", "locked")
    cluster.kubectl("delete", "--wait=false", "tenant", "locked")
    cluster.wait(lambda: cluster.obj("tenants", "locked") is None, "locked to go")


def test_deleting_a_retention_policy_updates_its_users_at_once(cluster: Cluster) -> None:
    apply(cluster, {"apiVersion": "magnetar.io/v1alpha1", "kind": "RetentionPolicy", "metadata": {"name": "keep"},
                    "spec": {"messageTTLSeconds": 600}},
          _res("Topic", "kept", {"namespace": "gitops/apps", "retentionPolicyRef": {"name": "keep"}}))  # fmt: skip
    cluster.wait_ready("topics", "kept")
    assert cluster.admin("GET", "persistent/gitops/apps/kept/messageTTL") == 600
    cluster.kubectl("delete", "--wait=false", "retentionpolicy", "keep")
    cluster.wait(lambda: cluster.obj("retentionpolicies", "keep") is None, "the policy to go (no finalizer)")
    cluster.wait_ready("topics", "kept", "False", "RetentionPolicyMissing")


def test_invalid_changes_are_refused_at_admission(cluster: Cluster) -> None:
    apply(cluster, _res("Topic", "strict", {"namespace": "gitops/apps", "partitions": 3}))
    cluster.wait_ready("topics", "strict")
    out = apply(cluster, _res("Topic", "strict", {"namespace": "gitops/apps", "partitions": 1}), check=False)
    assert 'The Topic "strict" is invalid' in out and "partitions may only grow" in out, out
    out = apply(cluster, _res("Topic", "strict", {"namespace": "gitops/other", "partitions": 3}), check=False)
    assert "namespace is immutable" in out, out
    out = apply(cluster, _res("Topic", "strict", {"namespace": "gitops/apps", "partitions": 3},
                              {"connection": {"adminUrl": "http://127.0.0.1:1"}}), check=False)  # fmt: skip
    assert "cannot switch between clusterRef and connection" in out, out
    out = apply(cluster, _res("Topic", "strict", {"namespace": "gitops/apps", "partitionz": 4}), check=False)
    assert 'strict decoding error: unknown field "spec.partitionz"' in out, out
    out = apply(cluster, _res("Topic", "bad", {"namespace": "no-slash", "partitions": -1}), check=False)
    assert 'The Topic "bad" is invalid' in out and "spec.namespace" in out and "spec.partitions" in out, out
    assert cluster.obj("topics", "bad") is None
    assert (cluster.obj("topics", "strict") or {})["spec"]["partitions"] == 3
    # A replace carrying an old resourceVersion is refused (optimistic concurrency).
    stale = cluster.obj("topics", "strict") or {}
    cluster.kubectl("annotate", "topic", "strict", "team=payments")
    stale_path = Path(cluster.env["KUBECONFIG"]).parent / "stale.yaml"
    stale_path.write_text(yaml.safe_dump({k: v for k, v in stale.items() if k != "status"}))
    out = cluster.kubectl("replace", "-f", str(stale_path), check=False, stderr=True)
    assert 'Operation cannot be fulfilled on topics.magnetar.io "strict": the object has been modified' in out, out
    # The operator's own status writes go through the same admission and are accepted.
    assert cluster.condition("topics", "strict")["status"] == "True"


def test_admin_url_is_immutable(cluster: Cluster) -> None:
    target = {"connection": {"adminUrl": cluster.broker.http_url}}
    apply(cluster, _res("Tenant", "inline", {}, target))
    cluster.wait_ready("tenants", "inline")
    moved = {"connection": {"adminUrl": cluster.broker.http_url.replace("127.0.0.1", "localhost")}}
    out = apply(cluster, _res("Tenant", "inline", {}, moved), check=False)
    assert "connection.adminUrl is immutable" in out, out


def test_server_side_apply_as_argo_cd_uses_it(cluster: Cluster) -> None:
    """`kubectl apply --server-side` (Argo CD's ServerSideApply=true): create, drop a field by no longer
    applying it, conflicts between managers, and no fight with the operator's status writes."""
    path = Path(cluster.env["KUBECONFIG"]).parent / "ssa.yaml"

    def ssa(spec: dict[str, Any], *flags: str) -> str:
        path.write_text(yaml.safe_dump(_res("Topic", "ssa", {"namespace": "gitops/apps", **spec})))
        return cluster.kubectl("apply", "--server-side", *flags, "-f", str(path), check=False, stderr=True)

    out = ssa({"partitions": 2, "policies": {"maxConsumers": 7, "maxProducers": 3}}, "--field-manager=argocd")
    assert "serverside-applied" in out, out
    cluster.wait_ready("topics", "ssa")
    assert cluster.admin("GET", "persistent/gitops/apps/ssa/maxProducers") == 3
    # The operator wrote status meanwhile; re-applying without maxProducers removes it from spec.
    out = ssa({"partitions": 2, "policies": {"maxConsumers": 7}}, "--field-manager=argocd")
    assert "serverside-applied" in out, out
    obj = cluster.obj("topics", "ssa") or {}
    assert obj["spec"]["policies"] == {"maxConsumers": 7} and obj["status"]["conditions"]
    assert [f["manager"] for f in obj["metadata"]["managedFields"]] == ["argocd"]
    cluster.wait(lambda: "maxProducers" not in (cluster.obj("topics", "ssa") or {})["status"]["applied"],
                 "maxProducers to be unmanaged")  # fmt: skip
    # Another manager changing a field argocd owns: a conflict, unless forced.
    out = ssa({"partitions": 4, "policies": {"maxConsumers": 7}}, "--field-manager=someone")
    assert "conflict" in out.lower() and '"argocd"' in out and ".spec.partitions" in out, out
    assert (cluster.obj("topics", "ssa") or {})["spec"]["partitions"] == 2
    out = ssa({"partitions": 4, "policies": {"maxConsumers": 7}}, "--field-manager=someone", "--force-conflicts")
    assert "serverside-applied" in out, out
    cluster.wait(lambda: cluster.admin("GET", "persistent/gitops/apps/ssa/partitions") == {"partitions": 4}, "4")
    # Admission applies to server-side apply too.
    out = ssa({"partitions": 1, "policies": {"maxConsumers": 7}}, "--field-manager=someone")
    assert "partitions may only grow" in out, out


def test_uninstall_releases_finalizers_and_keeps_pulsar_objects(cluster: Cluster, tmp_path: Path) -> None:
    """The chart's pre-delete hook: scale the operator down, release the finalizers; deleting a resource
    afterwards is immediate and leaves its topic in Pulsar."""
    proc: subprocess.Popen[bytes] = cluster.proc  # type: ignore[attr-defined]
    assert proc.poll() is None, "the operator exited before the uninstall"
    assert cluster.emu.emulator is not None
    cluster.emu.call(cluster.emu.emulator.add_type, ResourceType("apps", "v1", "deployments", "Deployment"))
    env = {**cluster.env, "KUBECACHEDIR": str(tmp_path / "cache"), "POD_NAMESPACE": "default"}
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "magnetar-operator"},
                  "spec": {"replicas": 1, "selector": {}, "template": {}}}  # fmt: skip
    manifest = tmp_path / "deployment.yaml"
    manifest.write_text(yaml.safe_dump(deployment))
    subprocess.run([KUBECTL, "apply", "-f", str(manifest)], env=env, check=True, capture_output=True, timeout=60)
    # No controller here: the test stops the operator the scale-down would have stopped.
    proc.send_signal(signal.SIGTERM)
    proc.wait(15)
    assert "magnetar.io/finalizer" in (cluster.obj("topics", "strict") or {})["metadata"]["finalizers"]
    result = subprocess.run(
        [sys.executable, "-m", "magnetar.cli.main", "operator", "--release-finalizers", "--scale-down",
         "magnetar-operator"], env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert (
        cluster.emu.call(cluster.emu.emulator.get, "deployments", "default", "magnetar-operator")["spec"]["replicas"]
        == 0
    )
    assert not (cluster.obj("topics", "strict") or {})["metadata"].get("finalizers")
    assert any(reason == "FinalizerReleased" for reason, _ in cluster.events("strict"))
    cluster.kubectl("delete", "--wait=false", "topic", "strict")
    assert cluster.obj("topics", "strict") is None
    assert cluster.admin("GET", "persistent/gitops/apps/strict/partitions") == {"partitions": 3}
