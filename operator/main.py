"""kopf handlers: thin wrappers that feed custom resources to the :class:`~magnetar.operator.engine.Engine`
and write its outcome to ``status`` and Events.

Run with ``magnetar operator`` or ``kopf run -m magnetar.operator.main --all-namespaces``.

Per kind: ``on.resume/create/update`` reconcile at once (transient problems retried by kopf with
exponential backoff; permanent ones written to status and left to the drift timer, so nothing
hot-loops), ``timer`` re-reconciles every ``MAGNETAR_OPERATOR_DRIFT_INTERVAL`` seconds (drift
correction), ``on.delete`` holds the finalizer until the Pulsar object is gone (or retained).
In-memory indexes give every handler the other resources without API calls: who claims which
Pulsar object (conflicts, deletion order) and which resources use a RetentionPolicy.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

import aiohttp
import kopf

from magnetar.operator import reconcile as rc
from magnetar.operator.admin import AdminClient
from magnetar.operator.clusteraccess import ClusterAccess, ssl_context
from magnetar.operator.clusterhandlers import ClusterHandlers
from magnetar.operator.clusterhandlers import register as register_cluster_handlers
from magnetar.operator.config import FINALIZER, GROUP, VERSION, OperatorConfig
from magnetar.operator.engine import CredentialsUnreadable, Engine, Resource, events_for, make_claim
from magnetar.operator.kube import KubeClient, KubeError
from magnetar.operator.reconcile import Claim, Outcome
from magnetar.operator.specs import RetentionPolicySpec

log = logging.getLogger("magnetar.operator")

CONFIG = OperatorConfig.from_env()
PLURALS = {"Tenant": "tenants", "TopicNamespace": "topicnamespaces", "Topic": "topics"}
INDEXES = ("tenant_index", "namespace_index", "topic_index")


def _plain(value: Any) -> Any:
    """A deep plain-dict copy of kopf's body views (index values outlive the event they came from)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


class KopfEnvironment:
    """The engine's :class:`~magnetar.operator.engine.Environment` over kopf's indexes and Events."""

    def __init__(self, config: OperatorConfig) -> None:
        self.config = config
        self.kube = KubeClient()
        self.indexes: dict[str, Any] = {}
        self._admins: dict[tuple[str, str | None, str | None], AdminClient] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self.peering_ready = False
        #: RetentionPolicies seen deleted (kopf's index may still hold them while their delete handler runs)
        self.deleted_policies: set[tuple[str, str]] = set()

    def bind(self, kwargs: dict[str, Any]) -> None:
        """Remember kopf's live indexes (passed to every handler as keyword arguments)."""
        for name in (*INDEXES, "retention_index", "cluster_index"):
            if name in kwargs:
                self.indexes[name] = kwargs[name]

    def claims(self, key: tuple[str, ...]) -> list[Claim]:
        found: list[Claim] = []
        for name in INDEXES:
            index = self.indexes.get(name)
            if index is not None and key in index:
                found.extend(index[key])
        return found

    def retention_policy(self, namespace: str, name: str) -> RetentionPolicySpec | None:
        if (namespace, name) in self.deleted_policies:
            return None
        index = self.indexes.get("retention_index")
        if index is None or (namespace, name) not in index:
            return None
        for spec in index[(namespace, name)]:
            return RetentionPolicySpec.model_validate(spec)
        return None

    def cluster_ready(self, namespace: str, name: str) -> bool | None:
        """Whether a MagnetarCluster is Ready (None: no such cluster)."""
        access = self.cluster_access(namespace, name)
        return None if access is None else access.ready

    def cluster_access(self, namespace: str, name: str) -> ClusterAccess | None:
        """How to reach a MagnetarCluster's admin API (None: no such cluster)."""
        index = self.indexes.get("cluster_index")
        if index is None or (namespace, name) not in index:
            return None
        for value in index[(namespace, name)]:
            return ClusterAccess.from_index(value)
        return None

    async def secret_value(self, namespace: str, name: str, key: str) -> str | None:
        try:
            return await self.kube.secret_value(namespace, name, key)
        except KubeError as exc:  # e.g. 403: RBAC does not let the operator read it; status, not a crash
            raise CredentialsUnreadable(f"Secret {namespace}/{name} cannot be read: {exc}") from exc
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise CredentialsUnreadable(f"Secret {namespace}/{name} cannot be read: {exc!r}") from exc

    def event(self, resource: Resource, type_: str, reason: str, message: str) -> None:
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": resource.kind,
            "metadata": {"namespace": resource.namespace, "name": resource.name, "uid": resource.uid},
        }
        kopf.event(body, type=type_, reason=reason, message=message)  # type: ignore[arg-type]

    def admin(self, url: str, token: str | None, ca: str | None = None) -> AdminClient:
        key = (url, token, ca)
        if key not in self._admins:
            self._admins[key] = AdminClient(url, token, tls=ssl_context(ca) if url.startswith("https") else None)
        return self._admins[key]

    def lock(self, uid: str) -> asyncio.Lock:
        return self._locks.setdefault(uid, asyncio.Lock())

    def forget(self, uid: str) -> None:
        self._locks.pop(uid, None)

    async def close(self) -> None:
        for client in self._admins.values():
            await client.close()
        self._admins.clear()
        await self.kube.close()


ENV = KopfEnvironment(CONFIG)
ENGINE = Engine(ENV)
CLUSTERS = ClusterHandlers(CONFIG, ENV.kube)


# ---------------------------------------------------------------------------------------------- lifecycle
@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.persistence.finalizer = FINALIZER
    # kopf's bookkeeping in annotations: status stays ours and schema-clean.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    # Events are posted explicitly (events_for); kopf's own log lines become Events only from warnings up.
    settings.posting.level = logging.WARNING
    # Bounded API requests: one that hangs is retried with kopf's back-offs instead of stalling the
    # resource's handlers for kopf's default 5 minutes.
    settings.networking.request_timeout = CONFIG.api_request_timeout
    settings.networking.connect_timeout = min(10.0, CONFIG.api_request_timeout)
    # A resource deleted while its drift timer is in an admin call: kopf waits a few loop cycles for the
    # timer to stop, then looks again only after this polling period; the deletion handler runs, but the
    # finalizer stays until then (60 s with kopf's default).
    settings.background.cancellation_polling = CONFIG.timer_stop_poll
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.batching.error_delays = (1, 2, 5, 10, 30)


@kopf.on.login()
async def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """In-cluster service account, else kubeconfig; the operator's own calls reuse the credentials."""
    info = kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)
    if info is not None:
        ENV.kube.set_credentials(info)
        settings: kopf.OperatorSettings | None = kwargs.get("settings")
        peering = settings.peering if settings is not None else None
        if peering and not peering.standalone and peering.name and peering.clusterwide and not ENV.peering_ready:
            # kopf keeps the peering object alive but does not create it: replicas would not see each other.
            try:
                await ENV.kube.ensure_cluster_peering(peering.name)
                ENV.peering_ready = True
            except KubeError as exc:
                log.warning("could not create ClusterKopfPeering %s: %s", peering.name, exc)
    return info


@kopf.on.cleanup()
async def cleanup(**_: Any) -> None:
    await CLUSTERS.close()
    await ENV.close()


# ---------------------------------------------------------------------------------------------- indexes
def _index(kind: str, body: kopf.Body) -> dict[tuple[str, ...], Claim]:
    made = make_claim(kind, _plain(body), CONFIG)
    if made is None:
        return {}
    claim, keys = made
    return {key: claim for key in keys.values()}


@kopf.index(GROUP, VERSION, "tenants")
def tenant_index(body: kopf.Body, **_: Any) -> dict[tuple[str, ...], Claim]:
    return _index("Tenant", body)


@kopf.index(GROUP, VERSION, "topicnamespaces")
def namespace_index(body: kopf.Body, **_: Any) -> dict[tuple[str, ...], Claim]:
    return _index("TopicNamespace", body)


@kopf.index(GROUP, VERSION, "topics")
def topic_index(body: kopf.Body, **_: Any) -> dict[tuple[str, ...], Claim]:
    return _index("Topic", body)


@kopf.index(GROUP, VERSION, "retentionpolicies")
def retention_index(namespace: str | None, name: str, spec: kopf.Spec, **_: Any) -> dict[tuple[str, str], Any]:
    return {(_namespace(namespace), name): _plain(spec)}


def _namespace(value: str | None) -> str:
    """The namespace kopf passes to handlers of namespaced kinds (``None`` only for cluster-scoped ones)."""
    if value is None:
        raise kopf.PermanentError("a namespaced resource arrived without a namespace")
    return value


# ---------------------------------------------------------------------------------------------- handlers
def _write(res: Resource, outcome: Outcome, trigger: str, patch: kopf.Patch) -> None:
    """Status and Events of an outcome (status only when something changed)."""
    for type_, reason, message in events_for(res.status, outcome, trigger):
        ENV.event(res, type_, reason, message)
    for key, value in rc.status_patch(res.status, outcome, res.generation).items():
        patch.status[key] = value


def _retrying(res: Resource) -> bool:
    """Whether the change handler is retrying this generation (then the timer stays out of its way)."""
    conditions = {c.get("type"): c for c in res.status.get("conditions") or []}
    reconciling = conditions.get(rc.RECONCILING, {})
    return reconciling.get("status") == "True" and reconciling.get("observedGeneration") == res.generation


def _retry_delay(retry: int) -> float:
    return rc.backoff(retry, CONFIG.backoff_base, CONFIG.backoff_cap)


def _register(kind: str, plural: str) -> None:
    async def apply(body: kopf.Body, patch: kopf.Patch, retry: int, **kwargs: Any) -> None:
        ENV.bind(kwargs)
        res = Resource.from_body(kind, _plain(body))
        outcome = await ENGINE.reconcile(res, "change")
        _write(res, outcome, "change", patch)
        if outcome.severity == "transient":
            # Waiting (dependency, unreachable cluster): kopf retries with our backoff, forever.
            raise kopf.TemporaryError(f"{outcome.reason}: {outcome.message}", delay=_retry_delay(retry))

    async def drift(body: kopf.Body, patch: kopf.Patch, **kwargs: Any) -> None:
        ENV.bind(kwargs)
        res = Resource.from_body(kind, _plain(body))
        if res.deleting or _retrying(res):
            return
        outcome = await ENGINE.reconcile(res, "timer")
        _write(res, outcome, "timer", patch)

    async def delete(body: kopf.Body, patch: kopf.Patch, retry: int, **kwargs: Any) -> None:
        ENV.bind(kwargs)
        res = Resource.from_body(kind, _plain(body))
        outcome = await ENGINE.finalize(res)
        if outcome.severity != "ok":
            _write(res, outcome, "delete", patch)
            raise kopf.TemporaryError(f"{outcome.reason}: {outcome.message}", delay=_retry_delay(retry))
        if outcome.reason == rc.HANDED_OVER:
            await _take_over(kind, res)
        if outcome.reason == rc.ORPHANED:
            # Released without deleting the Pulsar object: say so where `kubectl describe` shows it.
            _write(res, rc.stalled(rc.ORPHANED, outcome.message), "delete", patch)
        else:
            ENV.event(res, "Normal", rc.DELETING if outcome.reason == rc.SYNCED else outcome.reason, outcome.message)
        ENV.forget(res.uid)

    for decorator in (kopf.on.resume, kopf.on.create, kopf.on.update):
        decorator(GROUP, VERSION, plural, id=f"{kind}-apply")(apply)
    kopf.timer(
        GROUP, VERSION, plural, id=f"{kind}-drift", interval=CONFIG.drift_interval, initial_delay=CONFIG.drift_interval
    )(drift)
    kopf.on.delete(GROUP, VERSION, plural, id=f"{kind}-delete")(delete)


for _kind, _plural in PLURALS.items():
    _register(_kind, _plural)
register_cluster_handlers(CLUSTERS, _plain)


# ---------------------------------------------------------------------------------------------- retention policies
@kopf.on.resume(GROUP, VERSION, "retentionpolicies", id="RetentionPolicy-apply")
@kopf.on.create(GROUP, VERSION, "retentionpolicies", id="RetentionPolicy-apply")
@kopf.on.update(GROUP, VERSION, "retentionpolicies", id="RetentionPolicy-apply")
async def apply_retention_policy(
    body: kopf.Body, namespace: str | None, name: str, spec: kopf.Spec, patch: kopf.Patch, retry: int, **kwargs: Any
) -> None:
    """Push the policy to every TopicNamespace and Topic referencing it (their own status follows on their
    next pass)."""
    ENV.bind(kwargs)
    ENV.deleted_policies.discard((_namespace(namespace), name))
    res = Resource.from_body("RetentionPolicy", _plain(body))
    policy = RetentionPolicySpec.model_validate(_plain(spec))
    outcome = await ENGINE.propagate(_namespace(namespace), name, policy, _report)
    _write(res, outcome, "policy", patch)
    if outcome.severity == "transient":
        raise kopf.TemporaryError(outcome.message, delay=_retry_delay(retry))


@kopf.timer(GROUP, VERSION, "retentionpolicies", id="RetentionPolicy-usage", interval=CONFIG.drift_interval)
async def retention_policy_usage(
    body: kopf.Body, namespace: str | None, name: str, patch: kopf.Patch, **kwargs: Any
) -> None:
    """Keep ``status.referencedBy`` current (resources start and stop referencing a policy at any time)."""
    ENV.bind(kwargs)
    users = len(ENV.claims(("RetentionPolicy-users", _namespace(namespace), name)))
    if (body.get("status") or {}).get("referencedBy") != users:
        patch.status["referencedBy"] = users


async def _take_over(kind: str, old: Resource) -> None:
    """After a hand-over (a rename: the old resource deleted, a new one claiming the same object), reconcile
    the new owner at once instead of on its next drift pass (it was Stalled as a conflict until now)."""
    made = make_claim(kind, {"metadata": {"namespace": old.namespace, "name": old.name}, "spec": old.spec}, CONFIG)
    if made is None:
        return
    for claim in ENV.claims(made[1]["own"]):
        if claim.uid != old.uid and not claim.deleting:
            res = Resource.from_body(kind, claim.body)
            await _report(res, await ENGINE.reconcile(res, "change"))


async def _report(res: Resource, outcome: Outcome) -> None:
    """Write a RetentionPolicy user's status and Events at once (its own handlers run only on its changes)."""
    for type_, reason, message in events_for(res.status, outcome, "policy"):
        ENV.event(res, type_, reason, message)
    patch = rc.status_patch(res.status, outcome, res.generation)
    if patch:
        try:
            await ENV.kube.patch_status(f"{GROUP}/{VERSION}", PLURALS[res.kind], res.namespace, res.name, patch)
        except (KubeError, aiohttp.ClientError, TimeoutError) as exc:
            log.warning("%s: status not written: %s", res.ref, exc)


@kopf.on.delete(GROUP, VERSION, "retentionpolicies", id="RetentionPolicy-gone", optional=True)
async def retention_policy_deleted(namespace: str | None, name: str, **kwargs: Any) -> None:
    """A deleted policy: its users report ``RetentionPolicyMissing`` at once (no finalizer: policies never
    strand in Terminating; the Pulsar policies they set stay as they are)."""
    ENV.bind(kwargs)
    ENV.deleted_policies.add((_namespace(namespace), name))
    await ENGINE.propagate(_namespace(namespace), name, None, _report)


async def secret_changed(type: str | None, namespace: str | None, name: str, **kwargs: Any) -> None:
    """A referenced credentials Secret was created or changed (rotation): reconcile its users now."""
    ENV.bind(kwargs)
    if type not in ("ADDED", "MODIFIED"):  # None: the initial listing at start-up
        return
    for claim in ENV.claims(("Secret-users", _namespace(namespace), name)):
        res = Resource.from_body(claim.kind, claim.body)
        if res.deleting:
            continue
        ENV.event(res, "Normal", "CredentialsChanged", f"Secret {namespace}/{name} changed: reconciling")
        await _report(res, await ENGINE.reconcile(res, "change"))


if CONFIG.watch_secrets:
    kopf.on.event("", "v1", "secrets", id="Secret-rotation")(secret_changed)
