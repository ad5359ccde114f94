"""Typed views of the custom resources' ``spec`` (pydantic, lenient: unknown fields are ignored so an
older operator tolerates a newer CRD; the API server's schema and CEL rules did the strict checking).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

DeletionPolicy = Literal["Delete", "Retain"]


class _Spec(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class ClusterRef(_Spec):
    name: str


class SecretRef(_Spec):
    name: str
    key: str = "token"


class Connection(_Spec):
    adminUrl: str
    credentialsSecretRef: SecretRef | None = None


class Retention(_Spec):
    timeInMinutes: int
    sizeInMB: int


class BacklogQuota(_Spec):
    limitSizeBytes: int | None = None
    limitTimeSeconds: int | None = None
    policy: str = "producer_request_hold"


class Persistence(_Spec):
    ensembleSize: int
    writeQuorum: int
    ackQuorum: int
    markDeleteRateLimit: float | None = None


class DelayedDelivery(_Spec):
    enabled: bool
    tickTimeMillis: int | None = None
    maxDelayMillis: int | None = None


class AutoTopicCreation(_Spec):
    allow: bool
    type: Literal["partitioned", "non-partitioned"] | None = None
    defaultNumPartitions: int | None = None


class RetentionFields(_Spec):
    """The fields a RetentionPolicy supplies (also settable inline)."""

    retention: Retention | None = None
    messageTTLSeconds: int | None = None
    backlogQuota: BacklogQuota | None = None


class Policies(RetentionFields):
    """Namespace policies or topic-level overrides; ``None`` = not managed."""

    deduplication: bool | None = None
    persistence: Persistence | None = None
    delayedDelivery: DelayedDelivery | None = None
    maxProducers: int | None = None
    maxConsumers: int | None = None
    schemaCompatibilityStrategy: str | None = None
    # namespace only
    autoTopicCreation: AutoTopicCreation | None = None
    bundles: int | None = None


class ObjectRef(_Spec):
    name: str


class TargetSpec(_Spec):
    """What every applied kind has: where it goes and what happens on deletion."""

    name: str | None = None
    clusterRef: ClusterRef | None = None
    connection: Connection | None = None
    deletionPolicy: DeletionPolicy = "Delete"


class TenantSpec(TargetSpec):
    adminRoles: list[str] | None = None
    allowedClusters: list[str] | None = None


class TopicNamespaceSpec(TargetSpec):
    tenant: str
    retentionPolicyRef: ObjectRef | None = None
    policies: Policies = Field(default_factory=Policies)


class TopicSpec(TargetSpec):
    namespace: str
    persistent: bool = True
    partitions: int = 0
    retentionPolicyRef: ObjectRef | None = None
    policies: Policies = Field(default_factory=Policies)


class RetentionPolicySpec(RetentionFields):
    pass


SPEC_TYPES: dict[str, type[TargetSpec]] = {
    "Tenant": TenantSpec,
    "TopicNamespace": TopicNamespaceSpec,
    "Topic": TopicSpec,
}


def parse_spec(kind: str, spec: dict[str, Any] | Any) -> TargetSpec:
    """The typed spec of a Tenant / TopicNamespace / Topic."""
    return SPEC_TYPES[kind].model_validate(dict(spec or {}))


def pulsar_name(kind: str, spec: TargetSpec, metadata_name: str) -> str:
    """The Pulsar object a resource manages: ``tenant``, ``tenant/ns`` or ``persistent://tenant/ns/topic``."""
    name = spec.name or metadata_name
    if isinstance(spec, TopicNamespaceSpec):
        return f"{spec.tenant}/{name}"
    if isinstance(spec, TopicSpec):
        domain = "persistent" if spec.persistent else "non-persistent"
        return f"{domain}://{spec.namespace}/{name}"
    return name
