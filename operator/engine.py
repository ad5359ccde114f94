"""Reconciliation against the admin API: observe, plan (:mod:`~magnetar.operator.reconcile`,
:mod:`~magnetar.operator.policies`), act, and return an :class:`~magnetar.operator.reconcile.Outcome`.

Independent of kopf: everything from the Kubernetes side (other resources, Secrets, Events) comes
through the :class:`Environment` protocol, so the engine runs in tests against a real broker with a
fake environment. Never raises for Pulsar-side problems: they become outcomes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from magnetar.admin_client.errors import AdminConnectionError, AdminError
from magnetar.operator import reconcile as rc
from magnetar.operator.admin import AdminClient
from magnetar.operator.clusteraccess import CA_KEY, ClusterAccess
from magnetar.operator.config import FORCE_DELETE_ANNOTATION, PAUSE_ANNOTATION, OperatorConfig, is_true
from magnetar.operator.limits import ReconcileLimiter, TopicLists
from magnetar.operator.policies import FIELDS, describe, desired_policies, namespace_observed, plan_writes, topic_keys
from magnetar.operator.reconcile import Claim, Outcome
from magnetar.operator.specs import (
    RetentionFields,
    RetentionPolicySpec,
    TargetSpec,
    TenantSpec,
    TopicNamespaceSpec,
    TopicSpec,
    parse_spec,
    pulsar_name,
)

log = logging.getLogger("magnetar.operator")

KINDS = ("Tenant", "TopicNamespace", "Topic")


@dataclass
class Resource:
    """The parts of a custom resource the engine looks at."""

    kind: str
    namespace: str
    name: str
    uid: str = ""
    generation: int = 1
    created: str = ""
    spec: dict[str, Any] = field(default_factory=dict)
    status: dict[str, Any] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    deleting: bool = False
    #: ``metadata.deletionTimestamp`` (bounds how long a deletion may wait on an unreachable cluster)
    deleted_at: str = ""

    @classmethod
    def from_body(cls, kind: str, body: Any) -> Resource:
        meta = body.get("metadata", {}) or {}
        return cls(
            kind=kind,
            namespace=meta.get("namespace") or "",
            name=meta.get("name") or "",
            uid=meta.get("uid") or "",
            generation=int(meta.get("generation") or 1),
            created=meta.get("creationTimestamp") or "",
            spec=dict(body.get("spec") or {}),
            status=dict(body.get("status") or {}),
            annotations=dict(meta.get("annotations") or {}),
            deleting=bool(meta.get("deletionTimestamp")),
            deleted_at=meta.get("deletionTimestamp") or "",
        )

    @property
    def ref(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}"

    @property
    def paused(self) -> bool:
        return is_true(self.annotations.get(PAUSE_ANNOTATION, ""))


class CredentialsMissing(Exception):
    """The credentials Secret (or its key) of a connection does not exist."""


class CredentialsUnreadable(Exception):
    """The credentials Secret could not be read (e.g. 403: the operator may not read it, or the API failed)."""


class Environment(Protocol):
    """What the engine needs from Kubernetes (implemented over kopf, or faked in tests)."""

    config: OperatorConfig

    def claims(self, key: tuple[str, ...]) -> list[Claim]:
        """Resources indexed under ``key`` (see :func:`claim_keys`)."""

    def retention_policy(self, namespace: str, name: str) -> RetentionPolicySpec | None: ...

    async def secret_value(self, namespace: str, name: str, key: str) -> str | None:
        """A Secret's value, ``None`` when it or the key does not exist; raises :class:`CredentialsUnreadable`."""

    def cluster_ready(self, namespace: str, name: str) -> bool | None:
        """Whether the MagnetarCluster ``namespace/name`` is Ready (None when it does not exist)."""

    def cluster_access(self, namespace: str, name: str) -> ClusterAccess | None:
        """How to reach the MagnetarCluster ``namespace/name`` (TLS, the operator's token; None: no cluster)."""

    def event(self, resource: Resource, type_: str, reason: str, message: str) -> None: ...

    def admin(self, url: str, token: str | None, ca: str | None = None) -> AdminClient:
        """An admin client for ``url`` sending ``token``, trusting the PEM ``ca`` (None: system CAs) for https."""

    def lock(self, uid: str) -> asyncio.Lock: ...


# ---------------------------------------------------------------------------------------------- targets
def target_url(config: OperatorConfig, namespace: str, spec: TargetSpec) -> str:
    """The admin URL a resource applies to (clusterRef through the URL convention, or connection.adminUrl)."""
    if spec.clusterRef is not None:
        return config.cluster_url(namespace, spec.clusterRef.name)
    if spec.connection is not None:
        return spec.connection.adminUrl.rstrip("/")
    return ""


def claim_keys(kind: str, url: str, spec: TargetSpec, pulsar: str) -> dict[str, tuple[str, ...]]:
    """Index keys of a resource: ``own`` (the Pulsar object it claims), ``parent`` (its tenant or namespace,
    for deletion order) and ``ref`` (the RetentionPolicy it references, filled by the caller)."""
    keys: dict[str, tuple[str, ...]] = {"own": (kind, url, pulsar)}
    if isinstance(spec, TopicNamespaceSpec):
        keys["parent"] = ("Tenant-children", url, spec.tenant)
    elif isinstance(spec, TopicSpec):
        keys["parent"] = ("TopicNamespace-children", url, spec.namespace)
    return keys


def make_claim(kind: str, body: Any, config: OperatorConfig) -> tuple[Claim, dict[str, tuple[str, ...]]] | None:
    """The claim and index keys of a custom resource body (None if its spec cannot be read)."""
    res = Resource.from_body(kind, body)
    try:
        spec = parse_spec(kind, res.spec)
    except ValueError:
        return None
    url = target_url(config, res.namespace, spec)
    pulsar = pulsar_name(kind, spec, res.name)
    claim = Claim(kind, res.namespace, res.name, res.uid, res.created, pulsar, url, body, res.deleting)
    keys = claim_keys(kind, url, spec, pulsar)
    ref = getattr(spec, "retentionPolicyRef", None)
    if ref is not None:
        keys["ref"] = ("RetentionPolicy-users", res.namespace, ref.name)
    if spec.connection is not None and spec.connection.credentialsSecretRef is not None:
        keys["secret"] = ("Secret-users", res.namespace, spec.connection.credentialsSecretRef.name)
    return claim, keys


# ---------------------------------------------------------------------------------------------- engine
class Engine:
    """Reconciles Tenants, TopicNamespaces and Topics through an :class:`Environment`."""

    def __init__(self, env: Environment) -> None:
        self.env = env
        config = env.config
        self.limiter = ReconcileLimiter(config.max_concurrent_reconciles, config.reconciles_per_second)
        self.topic_lists = TopicLists(config.topic_list_cache_seconds)

    @asynccontextmanager
    async def _client(self, res: Resource, spec: TargetSpec, url: str,
                      access: ClusterAccess | None = None) -> AsyncIterator[AdminClient]:  # fmt: skip
        """The admin client of a resource: a connection's Secret token, or for a ``clusterRef`` to a secured
        cluster the operator's token (and the cluster's CA when TLS is on)."""
        token = ca = None
        conn = spec.connection
        if conn is not None and conn.credentialsSecretRef is not None:
            ref = conn.credentialsSecretRef
            token = await self._secret(res.namespace, ref.name, ref.key)
        if access is not None and access.token_secret:
            token = await self._secret(res.namespace, access.token_secret, access.token_key)
        if access is not None and access.tls and access.ca_secret:
            # No ca.crt (a publicly trusted certificate): the system's CAs.
            ca = await self.env.secret_value(res.namespace, access.ca_secret, CA_KEY)
        yield self.env.admin(url, token.strip() if token else token, ca)

    def _access(self, res: Resource, spec: TargetSpec, url: str) -> tuple[str, ClusterAccess | None]:
        """The URL to call and, for a ``clusterRef``, how to reach the cluster (its HTTPS URL when TLS is on).
        ``url`` (the plaintext convention) stays the resource's identity in claims."""
        if spec.clusterRef is None:
            return url, None
        access = self.env.cluster_access(res.namespace, spec.clusterRef.name)
        if access is not None and access.tls:
            return self.env.config.cluster_url(res.namespace, spec.clusterRef.name, tls=True), access
        return url, access

    async def _secret(self, namespace: str, name: str, key: str) -> str:
        value = await self.env.secret_value(namespace, name, key)
        if value is None:
            raise CredentialsMissing(f"Secret {namespace}/{name} (key {key!r}) not found")
        return value

    # ------------------------------------------------------------------------------------------ apply
    async def reconcile(self, res: Resource, trigger: str = "change") -> Outcome:
        """Bring the Pulsar object in line with the resource. ``trigger`` is ``change`` (spec or annotation
        changed, or operator start), ``timer`` (drift check) or ``policy`` (a RetentionPolicy changed)."""
        async with self.limiter.slot(), self.env.lock(res.uid or res.ref):
            outcome = await self._reconcile(res)
        self._log(res, outcome, trigger)
        return outcome

    async def _reconcile(self, res: Resource) -> Outcome:
        try:
            spec = parse_spec(res.kind, res.spec)
        except ValueError as exc:
            return rc.stalled("InvalidSpec", f"spec cannot be read: {exc}")
        url = target_url(self.env.config, res.namespace, spec)
        pulsar = pulsar_name(res.kind, spec, res.name)
        base = {"pulsarName": pulsar, "adminUrl": url}
        if res.paused:
            return Outcome("paused", rc.PAUSED, f"paused by annotation {PAUSE_ANNOTATION}", base)
        if not url:
            return rc.stalled("InvalidSpec", "neither clusterRef nor connection is set", **base)
        refusal = self._refusal(spec, url)
        if refusal:
            return rc.stalled(rc.CONNECTION_NOT_ALLOWED, refusal, **base)
        if spec.clusterRef is not None:
            ready = self.env.cluster_ready(res.namespace, spec.clusterRef.name)
            if not ready:
                what = "does not exist" if ready is None else "is not Ready yet"
                return rc.waiting(rc.CLUSTER_NOT_READY, f"MagnetarCluster {spec.clusterRef.name} {what}", **base)
        owner = rc.conflict(self.env.claims((res.kind, url, pulsar)), res.uid)
        if owner is not None:
            return rc.stalled(rc.RESOURCE_CONFLICT, f"{pulsar} is already managed by {owner.ref}", **base)
        call_url, access = self._access(res, spec, url)
        base["adminUrl"] = call_url
        try:
            async with self._client(res, spec, call_url, access) as client:
                if isinstance(spec, TenantSpec):
                    outcome = await self._tenant(client, spec, pulsar)
                elif isinstance(spec, TopicNamespaceSpec):
                    outcome = await self._namespace(client, res, spec, pulsar)
                else:
                    assert isinstance(spec, TopicSpec)
                    outcome = await self._topic(client, res, spec, pulsar)
        except CredentialsMissing as exc:
            outcome = rc.waiting(rc.CREDENTIALS_MISSING, str(exc))
        except CredentialsUnreadable as exc:
            outcome = rc.waiting(rc.CREDENTIALS_UNREADABLE, str(exc))
        except AdminConnectionError as exc:
            outcome = rc.waiting(rc.CLUSTER_UNREACHABLE, f"admin API not reachable: {exc}")
        except AdminError as exc:
            if exc.status in (401, 403):
                # A token being rotated, or roles being granted: retried with backoff, and at once when the
                # referenced Secret changes.
                outcome = rc.waiting(rc.UNAUTHORIZED, f"admin API refused the operator's credentials: {exc}")
            elif exc.transient:
                outcome = rc.waiting(rc.ADMIN_API_ERROR, str(exc))
            else:
                outcome = rc.stalled(rc.ADMIN_API_REJECTED, str(exc))
        outcome.status = {**base, **outcome.status}
        return outcome

    def _refusal(self, spec: TargetSpec, url: str) -> str | None:
        """Why an inline admin URL may not be called (see :meth:`OperatorConfig.inline_url_refusal`)."""
        if spec.clusterRef is None and spec.connection is not None:
            return self.env.config.inline_url_refusal(url)
        return None

    def _shared(self, res: Resource, spec: TopicNamespaceSpec | TopicSpec) -> RetentionFields | Outcome | None:
        if spec.retentionPolicyRef is None:
            return None
        found = self.env.retention_policy(res.namespace, spec.retentionPolicyRef.name)
        if found is None:
            return rc.waiting(
                rc.RETENTION_POLICY_MISSING,
                f"RetentionPolicy {res.namespace}/{spec.retentionPolicyRef.name} does not exist (yet)",
            )
        return found

    async def _tenant(self, client: AdminClient, spec: TenantSpec, tenant: str) -> Outcome:
        changes: list[str] = []
        observed = await client.get_tenant(tenant)
        if observed is None:
            clusters = spec.allowedClusters or await client.clusters()
            info = {"adminRoles": sorted(set(spec.adminRoles or [])), "allowedClusters": sorted(set(clusters))}
            try:
                await client.create_tenant(tenant, info)
                changes.append(f"created tenant {tenant}")
            except AdminError as exc:
                if exc.status != 409:  # 409: created meanwhile, compared on the next pass
                    raise
                return rc.waiting(rc.ADMIN_API_ERROR, f"tenant {tenant} was created concurrently")
        else:
            update = rc.tenant_update(spec.adminRoles, spec.allowedClusters, observed)
            if update is not None:
                await client.update_tenant(tenant, update)
                changes.append(
                    f"tenant {tenant}: adminRoles {sorted(observed.get('adminRoles') or [])} -> {update['adminRoles']}"
                    f", allowedClusters {sorted(observed.get('allowedClusters') or [])} -> {update['allowedClusters']}"
                )
        applied: dict[str, Any] = {}
        if spec.adminRoles is not None:
            applied["adminRoles"] = sorted(set(spec.adminRoles))
        if spec.allowedClusters is not None:
            applied["allowedClusters"] = sorted(set(spec.allowedClusters))
        outcome = rc.ok(applied=applied)
        outcome.changes = changes
        return outcome

    async def _namespace(self, client: AdminClient, res: Resource, spec: TopicNamespaceSpec, ns: str) -> Outcome:
        shared = self._shared(res, spec)
        if isinstance(shared, Outcome):
            return shared
        desired = desired_policies(spec.policies, shared)
        changes: list[str] = []
        doc = await client.get_namespace(ns)
        if doc is None:
            body = {"bundles": {"numBundles": spec.policies.bundles}} if spec.policies.bundles else None
            try:
                await client.create_namespace(ns, body)
                changes.append(f"created namespace {ns}")
            except AdminError as exc:
                if exc.status == 404:
                    return rc.waiting(rc.TENANT_MISSING, f"tenant {spec.tenant} does not exist (yet)")
                if exc.status != 409:
                    raise
            doc = await client.get_namespace(ns) or {}
        observed = namespace_observed(doc, list(desired))
        for write in plan_writes(desired, observed):
            method, segment, query = FIELDS[write.key].ns_write
            await client.namespace_policy(ns, method, segment, write.value, query)
            changes.append(f"{ns} {write.key}: {describe(write.previous)} -> {describe(write.value)}")
        outcome = rc.ok(applied=desired)
        outcome.changes = changes
        return outcome

    async def _topic(self, client: AdminClient, res: Resource, spec: TopicSpec, topic: str) -> Outcome:
        shared = self._shared(res, spec)
        if isinstance(shared, Outcome):
            return shared
        # One list per namespace and cache period, shared by all its topics (not one per topic: N^2 at scale).
        listed = (client.base_url, spec.namespace, spec.persistent)
        try:
            names = await self.topic_lists.names(listed, lambda: client.list_topics(spec.namespace, spec.persistent))
        except AdminError as exc:
            if exc.status == 404:
                return rc.waiting(rc.NAMESPACE_MISSING, f"namespace {spec.namespace} does not exist (yet)")
            raise
        changes: list[str] = []
        problems: list[str] = []
        partitions = await client.topic_partitions(topic)
        exists = partitions > 0 or topic in names
        action = rc.topic_action(spec.partitions, exists, partitions)
        if action == "kind-mismatch" and partitions == 0:
            # Act only on a fresh list (a cached one may predate a deletion behind our back). A stale "missing"
            # is caught by the create's 409 below.
            fetch = lambda: client.list_topics(spec.namespace, spec.persistent)  # noqa: E731
            exists = topic in await self.topic_lists.names(listed, fetch, fresh=True)
            action = rc.topic_action(spec.partitions, exists, partitions)
        if action == "create":
            try:
                await client.create_topic(topic, spec.partitions)
            except AdminError as exc:
                if exc.status == 409:  # created meanwhile (e.g. auto-created by a client): look again
                    self.topic_lists.forget(listed)
                    return rc.waiting(rc.ADMIN_API_ERROR, f"{topic} was created concurrently")
                raise
            partitions = spec.partitions
            self.topic_lists.added(listed, topic)
            changes.append(f"created topic {topic}" + (f" with {partitions} partitions" if partitions else ""))
        elif action == "grow":
            await client.grow_partitions(topic, spec.partitions)
            changes.append(f"{topic}: partitions {partitions} -> {spec.partitions}")
            partitions = spec.partitions
        elif action == "decrease":
            problems.append(f"partitions cannot decrease ({partitions} in Pulsar, {spec.partitions} in spec)")
        elif action == "kind-mismatch":
            kinds = ("non-partitioned", "partitioned")
            problems.append(
                f"{topic} is {kinds[partitions > 0]} in Pulsar but {kinds[spec.partitions > 0]} in spec; "
                "a topic cannot change between the two"
            )
        desired = desired_policies(spec.policies, shared) if spec.persistent else {}
        desired = {k: v for k, v in desired.items() if k in topic_keys(desired)}
        observed: dict[str, Any] = {}
        reads: dict[str, Any] = {}
        for key in desired:
            segment, extract = FIELDS[key].topic_read  # type: ignore[misc]
            if segment not in reads:
                reads[segment] = await client.topic_policy(topic, "GET", segment)
            observed[key] = extract(reads[segment])
        for write in plan_writes(desired, observed):
            method, segment, query = FIELDS[write.key].topic_write  # type: ignore[misc]
            in_query = FIELDS[write.key].topic_value_in_query
            if in_query:
                await client.topic_policy(topic, method, segment, None, {**(query or {}), in_query: str(write.value)})
            else:
                await client.topic_policy(topic, method, segment, write.value, query)
            changes.append(f"{topic} {write.key}: {describe(write.previous)} -> {describe(write.value)}")
        status = {"partitions": partitions, "applied": desired}
        outcome = rc.stalled(rc.NOT_SUPPORTED, "; ".join(problems), **status) if problems else rc.ok(**status)
        outcome.changes = changes
        return outcome

    # ------------------------------------------------------------------------------------------ delete
    async def finalize(self, res: Resource) -> Outcome:
        """Handle deletion: ``ok`` = the finalizer may go, ``transient`` = try again later."""
        async with self.limiter.slot(), self.env.lock(res.uid or res.ref):
            outcome = await self._finalize(res)
        self._log(res, outcome, "delete")
        return outcome

    async def _finalize(self, res: Resource) -> Outcome:
        try:
            spec = parse_spec(res.kind, res.spec)
        except ValueError:
            return rc.ok("spec unreadable: nothing deleted")
        url = target_url(self.env.config, res.namespace, spec)
        pulsar = pulsar_name(res.kind, spec, res.name)
        if spec.deletionPolicy == "Retain":
            return rc.ok(f"deletionPolicy Retain: {pulsar} left in place")
        if res.paused:
            return rc.ok(f"paused: {pulsar} left in place")
        if not url or self._refusal(spec, url):
            return rc.ok(f"{pulsar} is not managed by this resource: left in place")
        owner = rc.conflict(self.env.claims((res.kind, url, pulsar)), res.uid)
        if owner is not None:
            if not owner.deleting:
                # A rename (new resource, old one pruned) or a second claimer: the object stays theirs.
                return Outcome("ok", rc.HANDED_OVER, f"{pulsar} is kept: it is claimed by {owner.ref}")
            return rc.ok(f"{pulsar} is not managed by this resource: left in place")
        children_key = {"Tenant": "Tenant-children", "TopicNamespace": "TopicNamespace-children"}.get(res.kind)
        if children_key:
            children = sorted(c.ref for c in self.env.claims((children_key, url, pulsar)))
            if children:
                shown = ", ".join(children[:5]) + (f" and {len(children) - 5} more" if len(children) > 5 else "")
                return rc.waiting(rc.DEPENDENTS_EXIST, f"waiting for {shown} to be deleted first")
        force = is_true(res.annotations.get(FORCE_DELETE_ANNOTATION, ""))
        call_url, access = self._access(res, spec, url)
        try:
            async with self._client(res, spec, call_url, access) as client:
                if res.kind == "Tenant":
                    await client.delete_tenant(pulsar, force=force)
                elif res.kind == "TopicNamespace":
                    await client.delete_namespace(pulsar, force=force)
                else:
                    partitioned = await client.topic_partitions(pulsar) > 0
                    if not force:
                        usage = await client.topic_usage(pulsar, partitioned)
                        if usage:
                            return rc.waiting(
                                rc.TOPIC_IN_USE,
                                f"{pulsar} is in use ({usage}): deleted once idle, or annotate "
                                f"{FORCE_DELETE_ANNOTATION}=true to delete it now",
                            )
                    await client.delete_topic(pulsar, partitioned, force=force)
                    assert isinstance(spec, TopicSpec)
                    self.topic_lists.removed((client.base_url, spec.namespace, spec.persistent), pulsar)
        except AdminError as exc:
            if exc.status == 404:
                return rc.ok(f"{pulsar} already gone")
            if exc.status in (409, 412):
                # Not empty or in use (topics nobody here manages, retained ones, clients that connected
                # meanwhile): wait for someone to clean up, or for the force-delete annotation.
                return rc.waiting(
                    rc.DEPENDENTS_EXIST,
                    f"{pulsar} is not empty or in use ({exc.reason}); delete its contents or annotate "
                    f"{FORCE_DELETE_ANNOTATION}=true",
                )
            reason = rc.UNAUTHORIZED if exc.status in (401, 403) else rc.ADMIN_API_ERROR
            return self._bounded(res, pulsar, rc.waiting(reason, str(exc)))
        except AdminConnectionError as exc:
            if "applied" not in res.status:
                # Never reached Pulsar: there is nothing of ours to delete.
                return rc.ok(f"{pulsar} was never created: nothing to delete")
            return self._bounded(res, pulsar, rc.waiting(rc.CLUSTER_UNREACHABLE, f"admin API not reachable: {exc}"))
        except CredentialsMissing as exc:
            return self._bounded(res, pulsar, rc.waiting(rc.CREDENTIALS_MISSING, str(exc)))
        except CredentialsUnreadable as exc:
            return self._bounded(res, pulsar, rc.waiting(rc.CREDENTIALS_UNREADABLE, str(exc)))
        return rc.ok(f"deleted {pulsar}")

    def _bounded(self, res: Resource, pulsar: str, outcome: Outcome) -> Outcome:
        """A deletion that cannot reach Pulsar waits at most ``delete_timeout`` seconds after the deletion
        request, then releases the resource and orphans the Pulsar object (finalizers never deadlock)."""
        limit = self.env.config.delete_timeout
        waited = rc.seconds_since(res.deleted_at)
        if limit > 0 and waited is not None and waited >= limit:
            return Outcome(
                "ok", rc.ORPHANED,
                f"{pulsar} orphaned: not deleted after {waited:.0f}s ({outcome.reason}: {outcome.message}); "
                "delete it by hand if it must go",
            )  # fmt: skip
        outcome.message += (
            f"; the resource is released (object orphaned) {limit:.0f}s after the deletion request" if limit > 0 else ""
        )
        return outcome

    # ------------------------------------------------------------------------------------------ retention
    async def propagate(
        self, namespace: str, name: str, policy: RetentionPolicySpec | None,
        report: Callable[[Resource, Outcome], Awaitable[None]] | None = None,
    ) -> Outcome:  # fmt: skip
        """Apply a (changed or deleted) RetentionPolicy to every resource referencing it now; ``report``
        receives each user's outcome (to write its status at once)."""
        users = self.env.claims(("RetentionPolicy-users", namespace, name))
        applied = 0
        transient = False
        failures: list[str] = []
        for claim in sorted(users, key=lambda c: (c.kind, c.namespace, c.name)):
            res = Resource.from_body(claim.kind, claim.body)
            if res.deleting:
                continue
            outcome = await self.reconcile(res, trigger="policy")
            if report is not None:
                await report(res, outcome)
            if outcome.ready or outcome.severity == "paused":
                applied += outcome.ready
            else:
                failures.append(f"{claim.ref}: {outcome.reason}")
                transient = transient or outcome.severity == "transient"
        status = {"referencedBy": len(users), "appliedTo": applied}
        if failures:
            message = "not applied to " + "; ".join(failures[:10])
            # Retry while a user is waiting (dependency, unreachable cluster); a stalled user is reported by
            # itself and retried by its own drift timer, so the policy does not hot-loop on it.
            if transient:
                return rc.waiting("PropagationIncomplete", message, **status)
            return rc.stalled("PropagationIncomplete", message, **status)
        return rc.ok(f"applied to {applied} of {len(users)} referencing resources", **status)

    # ------------------------------------------------------------------------------------------ logging
    def _log(self, res: Resource, outcome: Outcome, trigger: str) -> None:
        for change in outcome.changes:
            log.info("%s (%s): %s", res.ref, trigger, change)
        if outcome.severity in ("transient", "permanent"):
            log.info("%s (%s): %s: %s", res.ref, trigger, outcome.reason, outcome.message)


def events_for(old_status: dict[str, Any] | None, outcome: Outcome, trigger: str) -> list[tuple[str, str, str]]:
    """The Kubernetes Events (type, reason, message) worth posting for an outcome: changes made (drift
    corrections are called so), policies no longer managed, and problems when the reason is new (a
    retried problem is not re-posted on every attempt)."""
    events: list[tuple[str, str, str]] = []
    conditions = (old_status or {}).get("conditions") or []
    old_ready: dict[str, Any] = next((c for c in conditions if c.get("type") == rc.READY), {})
    if outcome.changes:
        # A timer pass that changes a resource that was in sync found drift; before that it is just applying.
        drift = trigger == "timer" and old_ready.get("status") == "True"
        reason = "DriftCorrected" if drift else "RetentionPolicyApplied" if trigger == "policy" else "Applied"
        events.append(("Warning" if drift else "Normal", reason, "; ".join(outcome.changes)[:1000]))
    old_applied = (old_status or {}).get("applied")
    if isinstance(old_applied, dict) and "applied" in outcome.status:
        gone = rc.applied_changes(old_applied, outcome.status["applied"])
        if gone:
            events.append(("Normal", "Unmanaged", f"no longer in spec, left as they are: {', '.join(gone)}"))
    new_problem = old_ready.get("reason") != outcome.reason or old_ready.get("message") != outcome.message
    if outcome.severity in ("transient", "permanent") and new_problem:
        events.append(("Warning", outcome.reason, outcome.message[:1000]))
    return events
