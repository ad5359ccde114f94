"""Pure reconciliation logic: desired vs observed -> actions, outcomes -> status. No I/O, no kopf.

The engine (:mod:`magnetar.operator.engine`) observes Pulsar, asks these functions what to do, does
it and turns the result into an :class:`Outcome`; the kopf handlers only write the outcome's status.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from typing import Any, Literal

# ---------------------------------------------------------------------------------------------- reasons
READY = "Ready"
RECONCILING = "Reconciling"
STALLED = "Stalled"

SYNCED = "Synced"
PAUSED = "ReconciliationPaused"
CLUSTER_UNREACHABLE = "ClusterUnreachable"
CLUSTER_NOT_READY = "ClusterNotReady"
CREDENTIALS_MISSING = "CredentialsMissing"
TENANT_MISSING = "TenantMissing"
NAMESPACE_MISSING = "NamespaceMissing"
RETENTION_POLICY_MISSING = "RetentionPolicyMissing"
RESOURCE_CONFLICT = "ResourceConflict"
NOT_SUPPORTED = "NotSupported"
ADMIN_API_REJECTED = "AdminApiRejected"
ADMIN_API_ERROR = "AdminApiError"
DEPENDENTS_EXIST = "DependentsExist"
DELETING = "Deleting"
TOPIC_IN_USE = "TopicInUse"
ORPHANED = "Orphaned"
HANDED_OVER = "HandedOver"
CREDENTIALS_UNREADABLE = "CredentialsUnreadable"
UNAUTHORIZED = "Unauthorized"
CONNECTION_NOT_ALLOWED = "ConnectionNotAllowed"

Severity = Literal["ok", "transient", "permanent", "paused"]


@dataclass
class Outcome:
    """The result of one reconciliation, enough to write status, Events and pick a retry policy.

    ``severity``: ``ok`` (Ready), ``transient`` (waiting or retrying: Reconciling, retry with backoff),
    ``permanent`` (needs a change first: Stalled, re-checked only on the drift timer), ``paused``.
    """

    severity: Severity
    reason: str = SYNCED
    message: str = ""
    status: dict[str, Any] = field(default_factory=dict)
    #: what this pass changed in Pulsar (human-readable), for Events
    changes: list[str] = field(default_factory=list)

    @property
    def ready(self) -> bool:
        return self.severity == "ok"


def ok(message: str = "", /, **status: Any) -> Outcome:
    return Outcome("ok", SYNCED, message, dict(status))


def waiting(reason: str, message: str, **status: Any) -> Outcome:
    return Outcome("transient", reason, message, dict(status))


def stalled(reason: str, message: str, **status: Any) -> Outcome:
    return Outcome("permanent", reason, message, dict(status))


def seconds_since(timestamp: str, now: datetime.datetime | None = None) -> float | None:
    """Seconds since a Kubernetes timestamp (``2026-01-01T00:00:00Z``); ``None`` if it cannot be read."""
    try:
        then = datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    if then.tzinfo is None:
        then = then.replace(tzinfo=datetime.UTC)
    return ((now or datetime.datetime.now(datetime.UTC)) - then).total_seconds()


# ---------------------------------------------------------------------------------------------- conditions
def now_iso(now: datetime.datetime | None = None) -> str:
    now = now or datetime.datetime.now(datetime.UTC)
    return now.replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


def _condition(
    previous: dict[str, dict[str, Any]], ctype: str, status: bool, reason: str, message: str, generation: int, ts: str
) -> dict[str, Any]:
    text = "True" if status else "False"
    old = previous.get(ctype)
    # lastTransitionTime moves only when the status flips (Kubernetes convention).
    kept = old is not None and old.get("status") == text and old.get("lastTransitionTime")
    transition = old["lastTransitionTime"] if kept and old else ts
    return {
        "type": ctype,
        "status": text,
        "reason": reason,
        "message": message,
        "lastTransitionTime": transition,
        "observedGeneration": generation,
    }


def conditions(
    previous: list[dict[str, Any]] | None, outcome: Outcome, generation: int, ts: str | None = None
) -> list[dict[str, Any]]:
    """Ready / Reconciling / Stalled for an outcome (kstatus semantics: Reconciling while progressing or
    waiting, Stalled when stuck until something changes, Ready only when in sync)."""
    ts = ts or now_iso()
    prev = {c.get("type", ""): c for c in previous or []}
    msg = outcome.message
    if outcome.severity == "paused":
        # Paused: keep Ready as it was, say so in Reconciling.
        ready = prev.get(READY) or _condition(prev, READY, False, PAUSED, msg, generation, ts)
        return [
            ready,
            _condition(prev, RECONCILING, False, PAUSED, msg, generation, ts),
            _condition(prev, STALLED, False, PAUSED, "", generation, ts),
        ]
    return [
        _condition(prev, READY, outcome.ready, outcome.reason, msg, generation, ts),
        _condition(
            prev,
            RECONCILING,
            outcome.severity == "transient",
            outcome.reason if outcome.severity == "transient" else SYNCED,
            msg if outcome.severity == "transient" else "",
            generation,
            ts,
        ),
        _condition(
            prev,
            STALLED,
            outcome.severity == "permanent",
            outcome.reason if outcome.severity == "permanent" else SYNCED,
            msg if outcome.severity == "permanent" else "",
            generation,
            ts,
        ),
    ]


def status_patch(
    old_status: dict[str, Any] | None, outcome: Outcome, generation: int, ts: str | None = None
) -> dict[str, Any]:
    """The status fields to write (merge patch) for an outcome; empty when nothing would change, so that
    a drift check finding nothing writes nothing."""
    old_status = dict(old_status or {})
    new: dict[str, Any] = {
        "conditions": conditions(old_status.get("conditions"), outcome, generation, ts),
        **outcome.status,
    }
    if outcome.severity != "paused":
        new["observedGeneration"] = generation
    patch = {k: v for k, v in new.items() if old_status.get(k) != v}
    if "applied" in patch and isinstance(old_status.get("applied"), dict):
        # A merge patch only adds keys: null out the keys no longer managed.
        for gone in set(old_status["applied"]) - set(patch["applied"] or {}):
            patch["applied"] = {**patch["applied"], gone: None}
    if patch:
        patch["lastReconcileTime"] = ts or now_iso()
    return patch


# ---------------------------------------------------------------------------------------------- ownership
@dataclass(frozen=True)
class Claim:
    """One custom resource claiming a Pulsar object (from the operator's in-memory index)."""

    kind: str
    namespace: str
    name: str
    uid: str
    created: str
    pulsar_name: str
    target: str
    #: the claimer's spec (RetentionPolicy propagation reconciles referencing resources with it)
    body: Any = None
    #: the claimer is being deleted (has a deletionTimestamp)
    deleting: bool = False

    @property
    def ref(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}"


def owner(claims: list[Claim]) -> Claim | None:
    """The resource that owns a contested Pulsar object: the oldest one not being deleted (a resource being
    deleted hands the object over to a live claimer: a rename in Git keeps the object), ties broken by
    namespace/name."""
    if not claims:
        return None
    return min(claims, key=lambda c: (c.deleting, c.created or "", c.namespace, c.name, c.uid))


def conflict(claims: list[Claim], uid: str) -> Claim | None:
    """The owner when it is another resource than ``uid`` (then ``uid`` must not touch the object)."""
    first = owner(claims)
    return first if first is not None and first.uid != uid else None


# ---------------------------------------------------------------------------------------------- tenants
def tenant_update(
    desired_roles: list[str] | None, desired_clusters: list[str] | None, observed: dict[str, Any]
) -> dict[str, Any] | None:
    """The full TenantInfo to POST when a managed field differs (unmanaged fields keep their values), else None."""
    roles = sorted(set(observed.get("adminRoles") or []))
    clusters = sorted(set(observed.get("allowedClusters") or []))
    new_roles = sorted(set(desired_roles)) if desired_roles is not None else roles
    new_clusters = sorted(set(desired_clusters)) if desired_clusters is not None else clusters
    if (new_roles, new_clusters) == (roles, clusters):
        return None
    return {"adminRoles": new_roles, "allowedClusters": new_clusters}


# ---------------------------------------------------------------------------------------------- topics
TopicAction = Literal["none", "create", "grow", "decrease", "kind-mismatch"]


def topic_action(desired_partitions: int, exists: bool, observed_partitions: int) -> TopicAction:
    """What to do about a topic's existence and partitions.

    ``decrease`` and ``kind-mismatch`` (partitioned vs non-partitioned) cannot be done: reported as
    NotSupported, the policies are still applied."""
    if not exists:
        return "create"
    if (desired_partitions > 0) != (observed_partitions > 0):
        return "kind-mismatch"
    if desired_partitions > observed_partitions:
        return "grow"
    if desired_partitions < observed_partitions:
        return "decrease"
    return "none"


# ---------------------------------------------------------------------------------------------- retries
def backoff(retry: int, base: float = 1.0, cap: float = 60.0) -> float:
    """Exponential backoff for the ``retry``-th retry (0-based): base, 2*base, 4*base ... capped."""
    return float(min(cap, base * (2 ** min(max(retry, 0), 16))))


def applied_changes(old: dict[str, Any] | None, new: dict[str, Any]) -> list[str]:
    """Fields the operator stopped managing since the last pass (removed from the spec)."""
    return sorted(set(old or {}) - set(new))
