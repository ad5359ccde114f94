"""StatefulSet and Job controllers and an ownerReference garbage collector over the emulated API server.

Simplified from Kubernetes' own controllers: ``Parallel`` pod management only (the operator uses it),
``OnDelete`` updates only for pods (a deleted pod is recreated from the current template; a
``RollingUpdate`` StatefulSet does not roll, which the operator never relies on), PVCs named
``<claim>-<statefulset>-<ordinal>`` created once and never deleted by the controller (``Retain``, the
default), Jobs run one pod at a time until one succeeds.
"""

from __future__ import annotations

import json
import secrets
import urllib.error
import urllib.request
from typing import Any

Obj = dict[str, Any]

TYPES = {
    # kind: (API prefix, plural, namespaced, status subresource)
    "StatefulSet": ("/apis/apps/v1", "statefulsets"),
    "Service": ("/api/v1", "services"),
    "Pod": ("/api/v1", "pods"),
    "PersistentVolumeClaim": ("/api/v1", "persistentvolumeclaims"),
    "ConfigMap": ("/api/v1", "configmaps"),
    "Job": ("/apis/batch/v1", "jobs"),
    "PodDisruptionBudget": ("/apis/policy/v1", "poddisruptionbudgets"),
    "MagnetarCluster": ("/apis/magnetar.io/v1alpha1", "magnetarclusters"),
    "Tenant": ("/apis/magnetar.io/v1alpha1", "tenants"),
    "TopicNamespace": ("/apis/magnetar.io/v1alpha1", "topicnamespaces"),
    "Topic": ("/apis/magnetar.io/v1alpha1", "topics"),
}
#: kinds whose objects can own others (the garbage collector's owners)
OWNER_KINDS = ("MagnetarCluster", "StatefulSet", "Job")
#: kinds the garbage collector deletes when their owner is gone
OWNED_KINDS = ("StatefulSet", "Service", "Pod", "ConfigMap", "Job", "PodDisruptionBudget")


def register_types(emulator: Any) -> None:
    """Add the built-in kinds the operator uses to the emulator (call on its loop)."""
    from tests.operator.kubeemu import ResourceType

    for rtype in (
        ResourceType("apps", "v1", "statefulsets", "StatefulSet", status_subresource=True, short_names=["sts"]),
        ResourceType("", "v1", "services", "Service", status_subresource=True, short_names=["svc"]),
        ResourceType("", "v1", "pods", "Pod", status_subresource=True, short_names=["po"]),
        ResourceType("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", status_subresource=True,
                     short_names=["pvc"]),
        ResourceType("batch", "v1", "jobs", "Job", status_subresource=True),
        ResourceType("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", status_subresource=True,
                     short_names=["pdb"]),
    ):  # fmt: skip
        emulator.add_type(rtype)


class Api:
    """A small synchronous client of the emulated API server."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")

    def _call(self, method: str, path: str, body: Any = None, ctype: str = "application/json") -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method, headers={"Content-Type": ctype})
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                text = resp.read()
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise
        return json.loads(text) if text else None

    @staticmethod
    def path(kind: str, namespace: str, name: str | None = None, sub: str | None = None) -> str:
        prefix, plural = TYPES[kind]
        out = f"{prefix}/namespaces/{namespace}/{plural}"
        if name:
            out += f"/{name}"
        if sub:
            out += f"/{sub}"
        return out

    def list(self, kind: str, namespace: str | None = None) -> list[Obj]:
        prefix, plural = TYPES[kind]
        path = f"{prefix}/namespaces/{namespace}/{plural}" if namespace else f"{prefix}/{plural}"
        return list((self._call("GET", path) or {}).get("items") or [])

    def get(self, kind: str, namespace: str, name: str) -> Obj | None:
        return self._call("GET", self.path(kind, namespace, name))

    def create(self, kind: str, namespace: str, body: Obj) -> Obj | None:
        try:
            return self._call("POST", self.path(kind, namespace), body)
        except urllib.error.HTTPError as exc:
            if exc.code == 409:
                return None
            raise

    def delete(self, kind: str, namespace: str, name: str) -> None:
        self._call("DELETE", self.path(kind, namespace, name))

    def patch_status(self, kind: str, namespace: str, name: str, status: Obj) -> None:
        self._call("PATCH", self.path(kind, namespace, name, "status"), {"status": status},
                   "application/merge-patch+json")  # fmt: skip

    def patch(self, kind: str, namespace: str, name: str, body: Obj) -> None:
        self._call("PATCH", self.path(kind, namespace, name), body, "application/merge-patch+json")


def _owner_ref(obj: Obj, kind: str, api_version: str) -> Obj:
    meta = obj["metadata"]
    return {"apiVersion": api_version, "kind": kind, "name": meta["name"], "uid": meta["uid"], "controller": True,
            "blockOwnerDeletion": True}  # fmt: skip


def pod_ready(pod: Obj) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])  # fmt: skip


def _annotation(obj: Obj, key: str) -> str | None:
    return (obj["metadata"].get("annotations") or {}).get(key)


def _owned_by(obj: Obj, uid: str) -> bool:
    return any(ref.get("uid") == uid for ref in obj["metadata"].get("ownerReferences") or [])


class Controllers:
    """One pass of every controller (:meth:`sync`), called in a loop by the harness."""

    def __init__(self, api: Api) -> None:
        self.api = api

    def sync(self) -> None:
        pods = self.api.list("Pod")
        for sts in self.api.list("StatefulSet"):
            self._statefulset(sts, [p for p in pods if _owned_by(p, sts["metadata"]["uid"])])
        for job in self.api.list("Job"):
            self._job(job, [p for p in pods if _owned_by(p, job["metadata"]["uid"])])
        self._collect_garbage()

    # ------------------------------------------------------------------------------------------ StatefulSet
    def _statefulset(self, sts: Obj, pods: list[Obj]) -> None:
        meta, spec = sts["metadata"], sts["spec"]
        ns, name = meta["namespace"], meta["name"]
        replicas = int(spec.get("replicas", 1))
        by_name = {p["metadata"]["name"]: p for p in pods}
        for i in range(replicas):
            pod_name = f"{name}-{i}"
            if pod_name not in by_name:
                self._create_pod(sts, i)
        for pod_name in sorted(by_name, reverse=True):
            if int(pod_name.rsplit("-", 1)[1]) >= replicas:
                self.api.delete("Pod", ns, pod_name)
        want = (spec["template"]["metadata"].get("annotations") or {}).get("magnetar.io/template-hash")
        live = [p for p in pods if int(p["metadata"]["name"].rsplit("-", 1)[1]) < replicas]
        status = {
            "observedGeneration": meta.get("generation", 1),
            "replicas": len(live),
            "readyReplicas": sum(1 for p in live if pod_ready(p)),
            "currentReplicas": len(live),
            "updatedReplicas": sum(1 for p in live if _annotation(p, "magnetar.io/template-hash") == want),
            "availableReplicas": sum(1 for p in live if pod_ready(p)),
        }  # fmt: skip
        if {k: (sts.get("status") or {}).get(k) for k in status} != status:
            self.api.patch_status("StatefulSet", ns, name, status)

    def _create_pod(self, sts: Obj, index: int) -> None:
        meta, spec = sts["metadata"], sts["spec"]
        ns, name = meta["namespace"], meta["name"]
        pod_name = f"{name}-{index}"
        template = json.loads(json.dumps(spec["template"]))
        pod_spec = template["spec"]
        pod_spec["hostname"] = pod_name
        pod_spec["subdomain"] = spec.get("serviceName", "")
        volumes = pod_spec.setdefault("volumes", [])
        for claim in spec.get("volumeClaimTemplates") or []:
            claim_name = f"{claim['metadata']['name']}-{pod_name}"
            if self.api.get("PersistentVolumeClaim", ns, claim_name) is None:
                self.api.create("PersistentVolumeClaim", ns, {
                    "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                    "metadata": {"name": claim_name, "namespace": ns,
                                 "labels": {**(claim["metadata"].get("labels") or {}),
                                            **spec["selector"].get("matchLabels", {})}},
                    "spec": claim["spec"],
                })  # fmt: skip
                self.api.patch_status("PersistentVolumeClaim", ns, claim_name, {"phase": "Bound"})
            volumes.append({"name": claim["metadata"]["name"], "persistentVolumeClaim": {"claimName": claim_name}})
        labels = {**(template["metadata"].get("labels") or {}), "statefulset.kubernetes.io/pod-name": pod_name,
                  "apps.kubernetes.io/pod-index": str(index)}  # fmt: skip
        self.api.create("Pod", ns, {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod_name, "namespace": ns, "labels": labels,
                         "annotations": template["metadata"].get("annotations") or {},
                         "ownerReferences": [_owner_ref(sts, "StatefulSet", "apps/v1")]},
            "spec": pod_spec,
        })  # fmt: skip

    # ------------------------------------------------------------------------------------------ Job
    def _job(self, job: Obj, pods: list[Obj]) -> None:
        meta = job["metadata"]
        ns, name = meta["namespace"], meta["name"]
        if int((job.get("status") or {}).get("succeeded") or 0) >= 1:
            return
        succeeded = [p for p in pods if (p.get("status") or {}).get("phase") == "Succeeded"]
        if succeeded:
            self.api.patch_status("Job", ns, name, {"succeeded": 1, "active": 0, "conditions": [
                {"type": "Complete", "status": "True"}]})  # fmt: skip
            return
        if any((p.get("status") or {}).get("phase") not in ("Failed",) for p in pods):
            return
        template = json.loads(json.dumps(job["spec"]["template"]))
        labels = {**(template.get("metadata", {}).get("labels") or {}), "job-name": name}
        self.api.create("Pod", ns, {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{name}-{secrets.token_hex(3)}", "namespace": ns, "labels": labels,
                         "ownerReferences": [_owner_ref(job, "Job", "batch/v1")]},
            "spec": template["spec"],
        })  # fmt: skip
        self.api.patch_status("Job", ns, name, {"active": 1})

    # ------------------------------------------------------------------------------------------ GC
    def _collect_garbage(self) -> None:
        """Delete objects whose owners (by uid) are gone, as Kubernetes' garbage collector does."""
        everything: dict[str, list[Obj]] = {kind: self.api.list(kind) for kind in {*OWNER_KINDS, *OWNED_KINDS}}
        uids = {o["metadata"]["uid"] for kind in OWNER_KINDS for o in everything[kind]}
        for kind in OWNED_KINDS:
            objs = everything[kind]
            for obj in objs:
                refs = obj["metadata"].get("ownerReferences") or []
                if refs and not any(ref.get("uid") in uids for ref in refs):
                    self.api.delete(kind, obj["metadata"]["namespace"], obj["metadata"]["name"])
