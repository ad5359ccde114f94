"""Namespace and topic policies: the spec's fields as Pulsar JSON values, how to read them from the
admin API and how to write them. Pure data and functions (no I/O): the engine does the calls.

A policy is addressed by a *key* (``retention``, ``backlogQuota.message_age``, ...); its value is
in the admin API's JSON form. Object values are compared on the fields the spec sets only, so a
sub-field left out of the spec (e.g. ``markDeleteRateLimit``) is not managed either.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from magnetar.operator.specs import Policies, RetentionFields


@dataclass(frozen=True)
class PolicyField:
    """How one policy maps onto the namespace and topic admin endpoints."""

    key: str
    #: read the value from a namespace's full ``Policies`` document
    ns_read: Callable[[dict[str, Any]], Any]
    #: (method, path segment, query) of the namespace write; the value is the JSON body
    ns_write: tuple[str, str, dict[str, str] | None]
    #: (GET segment, extract) of the topic read; None = not a topic policy
    topic_read: tuple[str, Callable[[Any], Any]] | None
    #: (method, segment, query); the value is the body unless ``topic_value_in_query``
    topic_write: tuple[str, str, dict[str, str] | None] | None
    #: write {observed, then desired} merged, keeping unmanaged sub-fields as they are
    merge: bool = False
    topic_value_in_query: str | None = None


def _same(value: Any) -> Any:
    return value


def _quota_field(kind: str) -> PolicyField:
    def ns_read(doc: dict[str, Any]) -> Any:
        return (doc.get("backlog_quota_map") or {}).get(kind)

    def topic_extract(quota_map: Any) -> Any:
        return (quota_map or {}).get(kind)

    query = {"backlogQuotaType": kind}
    return PolicyField(
        key=f"backlogQuota.{kind}",
        ns_read=ns_read,
        ns_write=("POST", "backlogQuota", query),
        topic_read=("backlogQuotaMap", topic_extract),
        topic_write=("POST", "backlogQuota", query),
    )


FIELDS: dict[str, PolicyField] = {
    f.key: f
    for f in [
        PolicyField("retention", lambda d: d.get("retention_policies"), ("POST", "retention", None),
                    ("retention", _same), ("POST", "retention", None)),
        PolicyField("messageTTL", lambda d: d.get("message_ttl_in_seconds"), ("POST", "messageTTL", None),
                    ("messageTTL", _same), ("POST", "messageTTL", None), topic_value_in_query="messageTTL"),
        _quota_field("destination_storage"),
        _quota_field("message_age"),
        PolicyField("deduplication", lambda d: d.get("deduplicationEnabled"), ("POST", "deduplication", None),
                    ("deduplicationEnabled", _same), ("POST", "deduplicationEnabled", None)),
        PolicyField("persistence", lambda d: d.get("persistence"), ("POST", "persistence", None),
                    ("persistence", _same), ("POST", "persistence", None), merge=True),
        PolicyField("delayedDelivery", lambda d: d.get("delayed_delivery_policies"), ("POST", "delayedDelivery", None),
                    ("delayedDelivery", _same), ("POST", "delayedDelivery", None), merge=True),
        PolicyField("maxProducers", lambda d: d.get("max_producers_per_topic"), ("POST", "maxProducersPerTopic", None),
                    ("maxProducers", _same), ("POST", "maxProducers", None)),
        PolicyField("maxConsumers", lambda d: d.get("max_consumers_per_topic"), ("POST", "maxConsumersPerTopic", None),
                    ("maxConsumers", _same), ("POST", "maxConsumers", None)),
        PolicyField("schemaCompatibilityStrategy", lambda d: d.get("schema_compatibility_strategy"),
                    ("PUT", "schemaCompatibilityStrategy", None), ("schemaCompatibilityStrategy", _same),
                    ("PUT", "schemaCompatibilityStrategy", None)),
        PolicyField("autoTopicCreation", lambda d: d.get("autoTopicCreationOverride"),
                    ("POST", "autoTopicCreation", None), None, None),
    ]
}  # fmt: skip

# Retention and backlog quotas validate against each other: their order matters (see order_writes).
_RETENTION_KEYS = ("retention", "backlogQuota.destination_storage", "backlogQuota.message_age")


def desired_policies(policies: Policies, shared: RetentionFields | None = None) -> dict[str, Any]:
    """The managed policies (key -> admin API JSON value) of a spec, ``shared`` being a RetentionPolicy's
    fields when the resource references one. Fields left out are absent (unmanaged)."""
    source: RetentionFields = shared if shared is not None else policies
    out: dict[str, Any] = {}
    if source.retention is not None:
        out["retention"] = {
            "retentionTimeInMinutes": source.retention.timeInMinutes,
            "retentionSizeInMB": source.retention.sizeInMB,
        }
    if source.messageTTLSeconds is not None:
        out["messageTTL"] = source.messageTTLSeconds
    quota = source.backlogQuota
    if quota is not None:
        if quota.limitSizeBytes is not None:
            out["backlogQuota.destination_storage"] = {"limitSize": quota.limitSizeBytes, "policy": quota.policy}
        if quota.limitTimeSeconds is not None:
            out["backlogQuota.message_age"] = {"limitTime": quota.limitTimeSeconds, "policy": quota.policy}
    if policies.deduplication is not None:
        out["deduplication"] = policies.deduplication
    if policies.persistence is not None:
        p = policies.persistence
        value: dict[str, Any] = {
            "bookkeeperEnsemble": p.ensembleSize,
            "bookkeeperWriteQuorum": p.writeQuorum,
            "bookkeeperAckQuorum": p.ackQuorum,
        }
        if p.markDeleteRateLimit is not None:
            value["managedLedgerMaxMarkDeleteRate"] = float(p.markDeleteRateLimit)
        out["persistence"] = value
    if policies.delayedDelivery is not None:
        d = policies.delayedDelivery
        value = {"active": d.enabled}
        if d.tickTimeMillis is not None:
            value["tickTime"] = d.tickTimeMillis
        if d.maxDelayMillis is not None:
            value["maxDeliveryDelayInMillis"] = d.maxDelayMillis
        out["delayedDelivery"] = value
    if policies.maxProducers is not None:
        out["maxProducers"] = policies.maxProducers
    if policies.maxConsumers is not None:
        out["maxConsumers"] = policies.maxConsumers
    if policies.schemaCompatibilityStrategy is not None:
        out["schemaCompatibilityStrategy"] = policies.schemaCompatibilityStrategy
    if policies.autoTopicCreation is not None:
        a = policies.autoTopicCreation
        value = {"allowAutoTopicCreation": a.allow}
        if a.type is not None:
            value["topicType"] = a.type
        if a.defaultNumPartitions is not None:
            value["defaultNumPartitions"] = a.defaultNumPartitions
        out["autoTopicCreation"] = value
    return out


def matches(desired: Any, observed: Any) -> bool:
    """Whether the observed value satisfies the desired one (objects: on the desired sub-fields only)."""
    if isinstance(desired, dict):
        if not isinstance(observed, dict):
            return False
        return all(matches(v, observed.get(k)) for k, v in desired.items())
    if isinstance(desired, bool) or isinstance(observed, bool):
        return desired is observed
    if isinstance(desired, float) or isinstance(observed, float):
        return observed is not None and abs(float(desired) - float(observed)) < 1e-9
    return bool(desired == observed)


def write_value(key: str, desired: Any, observed: Any) -> Any:
    """The body to send: the desired value, merged over the observed one for merge fields."""
    field = FIELDS[key]
    if field.merge and isinstance(desired, dict) and isinstance(observed, dict):
        return {**observed, **desired}
    return desired


@dataclass(frozen=True)
class Write:
    """One policy write: set ``key`` to ``value`` (``previous`` is what was observed)."""

    key: str
    value: Any
    previous: Any


def plan_writes(desired: dict[str, Any], observed: dict[str, Any]) -> list[Write]:
    """The writes that bring the observed policies to the desired ones, in an order Pulsar accepts."""
    writes = [
        Write(key, write_value(key, value, observed.get(key)), observed.get(key))
        for key, value in desired.items()
        if not matches(value, observed.get(key))
    ]
    return order_writes(writes, observed)


def _limit(value: Any, field: str) -> int:
    return int((value or {}).get(field) or 0)


def _fits(retention: Any, storage_quota: Any, age_quota: Any) -> bool:
    """Pulsar's rule: a positive retention dimension must exceed the matching backlog quota."""
    if not retention:
        return True
    size_mb = int(retention.get("retentionSizeInMB", 0))
    minutes = int(retention.get("retentionTimeInMinutes", 0))
    if size_mb > 0 and _limit(storage_quota, "limitSize") >= size_mb * 1024 * 1024:
        return False
    return not (minutes > 0 and _limit(age_quota, "limitTime") >= minutes * 60)


def order_writes(writes: list[Write], observed: dict[str, Any]) -> list[Write]:
    """Retention before the quotas when the new retention still fits the current quotas (it grows), the
    quotas first otherwise (they shrink), so that every intermediate state passes Pulsar's checks."""
    by_key = {w.key: w for w in writes}
    retention = by_key.get("retention")
    quotas = [by_key[k] for k in _RETENTION_KEYS[1:] if k in by_key]
    others = [w for w in writes if w.key not in _RETENTION_KEYS]
    if retention is None or not quotas:
        return [*(w for w in writes if w.key in _RETENTION_KEYS), *others]
    retention_first = _fits(
        retention.value, observed.get("backlogQuota.destination_storage"), observed.get("backlogQuota.message_age")
    )
    ordered = [retention, *quotas] if retention_first else [*quotas, retention]
    return [*ordered, *others]


def namespace_observed(doc: dict[str, Any], keys: list[str] | None = None) -> dict[str, Any]:
    """The policies (key -> value) of a namespace's ``Policies`` document."""
    return {key: FIELDS[key].ns_read(doc) for key in (keys or list(FIELDS))}


def topic_keys(desired: dict[str, Any]) -> list[str]:
    """The desired keys that are topic-level policies (``autoTopicCreation`` and bundles are not)."""
    return [k for k in desired if FIELDS[k].topic_read is not None]


def describe(value: Any) -> str:
    """Short text of a policy value for Events and logs."""
    if value is None:
        return "unset"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}={v}" for k, v in sorted(value.items())) + "}"
    return str(value)
