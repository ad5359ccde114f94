"""Reconciliation of a ``MagnetarCluster`` into Kubernetes objects, step by step and health-gated.

One pass (:meth:`ClusterReconciler.reconcile`) does at most one disruptive step and reports where the
cluster stands; the kopf handlers call it again until the cluster is Ready (and on a timer, for drift).

- Start-up order: etcd (all members ready) -> metadata init Job (succeeded) -> bookies (all ready) ->
  brokers. Later components are not even created before earlier ones are healthy.
- Apply: every owned object carries ``magnetar.io/applied-hash`` (hash of what was rendered). A missing
  object is (re)created; a different hash means the spec changed (patch); the same hash but different
  content means someone edited it by hand (patched back, Warning Event ``DriftCorrected``).
- Rolling: bookie, broker and etcd StatefulSets use ``OnDelete``; the operator deletes one outdated pod
  (template hash differs) at a time, highest ordinal first, only when every pod of the component is
  ready, and for bookies only when every bookie is writable; the StatefulSet controller recreates it and
  the next pass waits for its readiness. Brokers shut down gracefully on SIGTERM (their topics are
  closed and the ledgers fenced by the next owner).
- Scale-down of bookies: the highest bookie is first made read-only and the StatefulSet shrinks only
  once no ledger still lists it in an ensemble (auto-recovery re-replicates it); its PVCs are then
  deleted.
"""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from magnetar.operator.clusteraccess import (
    CA_KEY,
    SECRET_KEY_MISSING,
    SecretProblem,
    check_secrets,
    operator_token_ref,
    read_secret_key,
    ssl_context,
    token_subject,
)
from magnetar.operator.clusterobjects import APPLIED_HASH, TEMPLATE_HASH, ClusterRenderer, Obj, digest
from magnetar.operator.clusterspec import BOOKIE_HTTP_PORT, BOOKIE_PORT, MagnetarClusterSpec
from magnetar.operator.config import OperatorConfig
from magnetar.operator.kube import KubeClient, KubeError

log = logging.getLogger("magnetar.operator.cluster")

READY = "Ready"
PROGRESSING = "Progressing"
DEGRADED = "Degraded"

#: kind -> (API path prefix, plural)
API = {
    "StatefulSet": ("/apis/apps/v1", "statefulsets"),
    "Service": ("/api/v1", "services"),
    "ConfigMap": ("/api/v1", "configmaps"),
    "Job": ("/apis/batch/v1", "jobs"),
    "PodDisruptionBudget": ("/apis/policy/v1", "poddisruptionbudgets"),
    "ServiceMonitor": ("/apis/monitoring.coreos.com/v1", "servicemonitors"),
    "Pod": ("/api/v1", "pods"),
    "PersistentVolumeClaim": ("/api/v1", "persistentvolumeclaims"),
}

EventSink = Callable[[str, str, str], None]
MERGE_PATCH = "application/merge-patch+json"


def path(kind: str, namespace: str, name: str | None = None) -> str:
    prefix, plural = API[kind]
    out = f"{prefix}/namespaces/{namespace}/{plural}"
    return f"{out}/{name}" if name else out


def is_subset(want: Any, have: Any) -> bool:
    """Whether ``have`` contains everything in ``want`` (the API server adds defaults, never removes)."""
    if isinstance(want, dict):
        return isinstance(have, dict) and all(is_subset(v, have.get(k)) for k, v in want.items())
    if isinstance(want, list):
        return isinstance(have, list) and len(want) == len(have) and all(map(is_subset, want, have))
    if isinstance(want, int | float) and isinstance(have, int | float):
        return want == have
    return want == have or str(want) == str(have)


def _managed(obj: Obj) -> Obj:
    """The parts of an object the operator owns (compared for drift, sent in patches)."""
    meta = obj.get("metadata") or {}
    out: Obj = {"metadata": {"labels": meta.get("labels") or {}, "annotations": meta.get("annotations") or {}}}
    for key in ("spec", "data"):
        if key in obj:
            out[key] = obj[key]
    return out


def pod_ready(pod: Obj) -> bool:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return cond.get("status") == "True"
    return False


def ordinal(pod_name: str) -> int:
    try:
        return int(pod_name.rsplit("-", 1)[1])
    except (IndexError, ValueError):
        return -1


@dataclass
class ComponentState:
    desired: int = 0
    ready: int = 0
    updated: int = 0

    def as_status(self) -> dict[str, int]:
        return {"desired": self.desired, "ready": self.ready, "updated": self.updated}


@dataclass
class ClusterResult:
    """Where the cluster stands after one pass."""

    ready: bool
    reason: str
    message: str
    phase: str
    components: dict[str, ComponentState] = field(default_factory=dict)
    rollout: dict[str, str] | None = None
    degraded: str = ""
    initialized: bool = False
    #: the bookie being decommissioned (kept in status across passes)
    decommission: dict[str, Any] | None = None


class ClusterReconciler:
    """Drives one MagnetarCluster through the Kubernetes API (``kube``) and the pods' own HTTP endpoints."""

    def __init__(self, kube: KubeClient, http: aiohttp.ClientSession | None = None,
                 config: OperatorConfig | None = None) -> None:  # fmt: skip
        self.kube = kube
        self._http = http
        self.config = config or OperatorConfig()
        #: (cluster uid, role) already warned about (OperatorNotSuperUser)
        self._warned_roles: set[tuple[str, str]] = set()

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None

    def _session(self) -> aiohttp.ClientSession:
        if self._http is None:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5))
        return self._http

    # ------------------------------------------------------------------------------------------ API helpers
    async def get(self, kind: str, namespace: str, name: str) -> Obj | None:
        try:
            return await self.kube.request("GET", path(kind, namespace, name))
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    async def list_objects(self, kind: str, namespace: str, selector: dict[str, str]) -> list[Obj]:
        query = ",".join(f"{k}={v}" for k, v in sorted(selector.items()))
        found = await self.kube.request("GET", f"{path(kind, namespace)}?labelSelector={query}")
        return list((found or {}).get("items") or [])

    async def delete(self, kind: str, namespace: str, name: str) -> None:
        try:
            await self.kube.request("DELETE", path(kind, namespace, name))
        except KubeError as exc:
            if exc.status != 404:
                raise

    async def apply(self, obj: Obj, events: EventSink, *, immutable: bool = False) -> Obj:
        """Create, update (spec changed) or restore (drifted) one owned object; returns the live object."""
        obj = dict(obj)
        meta = obj["metadata"] = dict(obj["metadata"])
        applied = digest(_managed(obj))
        meta["annotations"] = {**(meta.get("annotations") or {}), APPLIED_HASH: applied}
        kind, ns, name = obj["kind"], meta["namespace"], meta["name"]
        live = await self.get(kind, ns, name)
        if live is None:
            created = await self.kube.request("POST", path(kind, ns), obj)
            events("Normal", "Created", f"created {kind} {name}")
            return created or obj
        if immutable:
            return live
        live_hash = ((live.get("metadata") or {}).get("annotations") or {}).get(APPLIED_HASH)
        want = _managed(obj)
        if live_hash == applied and is_subset(want, _managed(live)):
            return live
        patch = want
        if kind == "StatefulSet":
            # volumeClaimTemplates and selector are immutable; the CRD's rules keep them unchanged.
            patch = {**want, "spec": {k: v for k, v in want["spec"].items()
                                      if k not in ("volumeClaimTemplates", "selector", "serviceName")}}  # fmt: skip
        if live_hash == applied:
            events("Warning", "DriftCorrected", f"{kind} {name} was changed outside the operator; restored")
        else:
            events("Normal", "Updated", f"updated {kind} {name}")
        return await self.kube.request("PATCH", path(kind, ns, name), patch, content_type=MERGE_PATCH)

    # ------------------------------------------------------------------------------------------ health
    async def _bookie_writable(self, host: str) -> bool:
        try:
            async with self._session().get(f"http://{host}:{BOOKIE_HTTP_PORT}/api/v1/bookie/state/readonly") as r:
                body = await r.json(content_type=None)
                return r.status == 200 and not body.get("readOnly")
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return False

    # ------------------------------------------------------------------------------------------ reconcile
    async def reconcile(self, body: Obj, events: EventSink) -> ClusterResult:
        spec = MagnetarClusterSpec.model_validate(body.get("spec") or {})
        r = ClusterRenderer(body, spec, self.config)
        status = body.get("status") or {}
        comps: dict[str, ComponentState] = {}

        def result(ready: bool, reason: str, message: str, phase: str, **kw: Any) -> ClusterResult:
            return ClusterResult(ready, reason, message, phase, comps, **kw)

        # 1. etcd
        if spec.metadataStore.external is None:
            state, rolling = await self._component(r, r.etcd_objects(), "etcd", events)
            comps["etcd"] = state
            if rolling is not None:
                return result(False, "RollingUpdate", rolling["step"], "RollingUpdate", rollout=rolling)
            if state.ready < state.desired:
                return result(False, "WaitingForEtcd", f"etcd {state.ready}/{state.desired} ready", "Creating")
        # 2. metadata
        initialized = bool(status.get("metadataInitialized"))
        if not initialized:
            job = await self.apply(r.init_job(), events, immutable=True)
            succeeded = int((job.get("status") or {}).get("succeeded") or 0)
            if succeeded < 1:
                return result(False, "InitializingMetadata", "waiting for the metadata init Job", "Initializing")
            initialized = True
        # 3. bookies (a scale-down decommissions one bookie at a time first)
        replicas, step, decommission = await self._decommission(r, status.get("decommission"), events)
        state, rolling = await self._component(r, r.bookie_objects(replicas), "bookie", events)
        comps["bookies"] = state
        if step is not None:
            rollout = {"component": "bookie", "pod": (decommission or {}).get("pod", ""), "step": step}
            return result(False, "Decommissioning", step, "Decommissioning", initialized=initialized,
                          decommission=decommission, rollout=rollout)  # fmt: skip
        if rolling is not None:
            return result(False, "RollingUpdate", rolling["step"], "RollingUpdate", rollout=rolling,
                          initialized=initialized)  # fmt: skip
        if state.ready < state.desired:
            return result(False, "WaitingForBookies", f"bookies {state.ready}/{state.desired} ready", "Creating",
                          initialized=initialized)  # fmt: skip
        # 4. brokers: every Secret they mount (and the operator's token) must exist first
        try:
            secrets = await check_secrets(self.kube, r.namespace, spec, self.config)
        except SecretProblem as exc:
            if (status_reason(status) or "") != exc.reason:  # one Warning per new problem, not per retry
                events("Warning", exc.reason, str(exc))
            return result(False, exc.reason, str(exc), "WaitingForSecrets", initialized=initialized)
        self._check_operator_role(r, secrets, events)
        state, rolling = await self._component(r, r.broker_objects(), "broker", events)
        comps["brokers"] = state
        monitor = r.service_monitor()
        if monitor is not None:
            try:
                await self.apply(monitor, events)
            except KubeError as exc:  # the Prometheus Operator's CRD may be missing
                events("Warning", "ServiceMonitorFailed", str(exc))
        if rolling is not None:
            return result(False, "RollingUpdate", rolling["step"], "RollingUpdate", rollout=rolling,
                          initialized=initialized)  # fmt: skip
        if state.ready < state.desired:
            return result(False, "WaitingForBrokers", f"brokers {state.ready}/{state.desired} ready", "Creating",
                          initialized=initialized)  # fmt: skip
        return result(True, "Running", "all components ready", "Running", initialized=initialized)

    async def _decommission(self, r: ClusterRenderer, current: dict[str, Any] | None,
                            events: EventSink) -> tuple[int, str | None, dict[str, Any] | None]:  # fmt: skip
        """Bookie scale-down, one bookie at a time: make the highest bookie read-only (no new ledgers on it),
        remove its pod, wait until auto-recovery has re-replicated every ledger that used it, delete its
        PVCs. Returns the bookie replicas to render, the step waited for (None: nothing to do) and the
        decommission state to keep in status."""
        n, spec = r.names, r.spec
        live = await self.get("StatefulSet", r.namespace, n.bookie)
        live_replicas = int(((live or {}).get("spec") or {}).get("replicas") or 0)
        desired = spec.bookies.replicas
        if current:
            grace = (spec.autoRecovery.lostBookieDelaySeconds or 30) + (spec.autoRecovery.checkIntervalSeconds or 30)
            waited = time.time() - float(current.get("since", 0))
            if waited < grace:
                return (
                    live_replicas,
                    f"waiting {grace - waited:.0f} s for auto-recovery to notice {current['pod']}",
                    current,
                )
            recovery = await self._autorecovery_status(r)
            if recovery is None:
                return live_replicas, "waiting for the brokers' auto-recovery status", current
            if recovery.get("underReplicatedLedgers") or current["bookieId"] in (recovery.get("lostBookies") or []):
                return live_replicas, f"waiting for the ledgers of {current['pod']} to be re-replicated", current
            for claim in ("journal", "ledgers"):
                await self.delete("PersistentVolumeClaim", r.namespace, f"{claim}-{current['pod']}")
            events("Normal", "Decommissioned", f"bookie {current['pod']} decommissioned, its PVCs deleted")
            current = None
        if live is None or live_replicas <= desired:
            return desired if live is None else max(desired, live_replicas), None, None
        pod = f"{n.bookie}-{live_replicas - 1}"
        host = n.pod_host(pod, n.bookie_headless)
        state = await self._bookie_state(host)
        if state is not None and not state:
            await self._set_read_only(host)
            events("Normal", "Decommissioning", f"bookie {pod} set read-only before scale-down")
            return live_replicas, f"making bookie {pod} read-only", None
        decommission = {"pod": pod, "bookieId": f"{host}:{BOOKIE_PORT}", "since": int(time.time())}
        events("Normal", "Decommissioning", f"removing bookie {pod}; auto-recovery re-replicates its ledgers")
        return live_replicas - 1, f"removing bookie {pod}", decommission

    async def _bookie_state(self, host: str) -> bool | None:
        """Whether a bookie is read-only (None when it does not answer)."""
        try:
            async with self._session().get(f"http://{host}:{BOOKIE_HTTP_PORT}/api/v1/bookie/state/readonly") as r:
                body = await r.json(content_type=None)
                return bool(body.get("readOnly")) if r.status == 200 else None
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None

    async def _set_read_only(self, host: str) -> None:
        url = f"http://{host}:{BOOKIE_HTTP_PORT}/api/v1/bookie/state/readonly"
        try:
            async with self._session().put(url, json={"readOnly": True}) as r:
                await r.read()
        except (aiohttp.ClientError, TimeoutError):
            pass  # retried on the next pass

    async def _autorecovery_status(self, r: ClusterRenderer) -> dict[str, Any] | None:
        """The brokers' auto-recovery status through the admin API (HTTPS and the operator's token when the
        cluster is secured); None when it cannot be had (retried on the next pass)."""
        spec = r.spec
        headers: dict[str, str] = {}
        tls: Any = None
        try:
            token = operator_token_ref(spec, self.config)
            if token is not None:
                value = await read_secret_key(self.kube, r.namespace, token[0], token[1], "operator admin token")
                headers["Authorization"] = f"Bearer {value.strip()}"
            if spec.security.tls is not None:
                tls = ssl_context(await self._cluster_ca(r.namespace, spec.security.tls.secretName))
        except SecretProblem as exc:
            log.warning("%s/%s: %s", r.namespace, r.name, exc)
            return None
        admin_url = r.names.client_urls(spec)[1]
        try:
            async with self._session().get(f"{admin_url}/admin/v2/autorecovery/status", headers=headers,
                                           ssl=tls if tls is not None else True) as resp:  # fmt: skip
                return await resp.json(content_type=None) if resp.status == 200 else None
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None

    def _check_operator_role(self, r: ClusterRenderer, secrets: dict[tuple[str, str], str],
                             events: EventSink) -> None:  # fmt: skip
        """Warn (once per cluster and role) when the operator's token is not a superuser's: its admin calls
        would be refused (403) once authorization is on."""
        ref = operator_token_ref(r.spec, self.config)
        auth = r.spec.security.authentication
        if ref is None or auth is None or ref not in secrets:
            return
        subject = token_subject(secrets[ref])
        key = (r.uid or r.name, subject or "")
        if subject is not None and subject not in auth.superUserRoles and key not in self._warned_roles:
            self._warned_roles.add(key)
            events("Warning", "OperatorNotSuperUser",
                   f"the operator's token (Secret {ref[0]}) has role {subject!r}, which is not in "
                   f"security.authentication.superUserRoles {auth.superUserRoles}")  # fmt: skip

    async def _cluster_ca(self, namespace: str, secret: str) -> str | None:
        """The TLS Secret's ca.crt (None: trust the system's CAs, e.g. a publicly trusted certificate)."""
        try:
            return await read_secret_key(self.kube, namespace, secret, CA_KEY)
        except SecretProblem as exc:
            if exc.reason == SECRET_KEY_MISSING:
                return None
            raise

    async def _component(self, r: ClusterRenderer, objects: list[Obj], component: str,
                         events: EventSink) -> tuple[ComponentState, dict[str, str] | None]:  # fmt: skip
        """Apply a component's objects; roll one outdated pod if all are healthy. Returns its state and the
        rollout step in progress (None when nothing is being rolled)."""
        sts: Obj | None = None
        for obj in objects:
            live = await self.apply(obj, events)
            if obj["kind"] == "StatefulSet":
                sts = obj
                live_sts = live
        assert sts is not None
        want_hash = sts["spec"]["template"]["metadata"]["annotations"][TEMPLATE_HASH]
        desired = int(sts["spec"]["replicas"])
        pods = await self.list_objects("Pod", r.namespace, r.selector(component))
        pods = [p for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp")]
        ready = [p for p in pods if pod_ready(p)]
        updated = [p for p in pods if (p["metadata"].get("annotations") or {}).get(TEMPLATE_HASH) == want_hash]
        state = ComponentState(desired, len(ready), len(updated))
        sts_status = live_sts.get("status") or {}
        state.ready = min(state.ready, int(sts_status.get("readyReplicas") or state.ready))
        outdated = sorted((p for p in pods if p not in updated), key=lambda p: -ordinal(p["metadata"]["name"]))
        if not outdated:
            return state, None
        victim = outdated[0]["metadata"]["name"]
        if len(ready) < desired or len(pods) < desired:
            return state, {"component": component, "pod": victim, "step": f"waiting for all {component} pods ready"}
        if component == "bookie":
            n = r.names
            for p in pods:
                host = n.pod_host(p["metadata"]["name"], n.bookie_headless)
                if not await self._bookie_writable(host):
                    step = f"waiting for bookie {p['metadata']['name']} to be writable"
                    return state, {"component": component, "pod": victim, "step": step}
        await self.delete("Pod", r.namespace, victim)
        events("Normal", "RollingUpdate", f"restarting {component} pod {victim} with the new template")
        return state, {"component": component, "pod": victim, "step": f"replaced {victim}, waiting for it"}


def status_reason(status: Obj) -> str | None:
    """The reason of a status' Ready condition."""
    for cond in status.get("conditions") or []:
        if cond.get("type") == READY:
            return cond.get("reason")
    return None


def now_iso() -> str:
    return datetime.datetime.now(datetime.UTC).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


def status_of(previous: Obj, result: ClusterResult, generation: int, r: ClusterRenderer) -> Obj:
    """The MagnetarCluster status for a pass's result (conditions keep their lastTransitionTime)."""
    prev = {c.get("type"): c for c in previous.get("conditions") or []}
    ts = now_iso()

    def cond(ctype: str, ok: bool, reason: str, message: str) -> Obj:
        text = "True" if ok else "False"
        old = prev.get(ctype) or {}
        when = old.get("lastTransitionTime") if old.get("status") == text else ts
        return {"type": ctype, "status": text, "reason": reason, "message": message,
                "lastTransitionTime": when or ts, "observedGeneration": generation}  # fmt: skip

    was_ready = (prev.get(READY) or {}).get("status") == "True"
    if not result.ready and was_ready and result.reason.startswith("WaitingFor"):
        result.degraded = result.message
    out: Obj = {
        "observedGeneration": generation,
        "conditions": [
            cond(READY, result.ready, result.reason, result.message),
            cond(
                PROGRESSING,
                not result.ready,
                result.reason if not result.ready else "Running",
                result.message if not result.ready else "",
            ),
            cond(DEGRADED, bool(result.degraded), "ComponentDown" if result.degraded else "Running", result.degraded),
        ],
        "phase": result.phase,
        "serviceUrl": r.names.client_urls(r.spec)[0],
        "adminUrl": r.names.client_urls(r.spec)[1],
        "rollout": result.rollout,
        "metadataInitialized": result.initialized or bool(previous.get("metadataInitialized")),
        "decommission": result.decommission,
    }
    for key, state in result.components.items():
        out[key] = state.as_status()
    return out
