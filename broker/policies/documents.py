"""Pulsar's policy documents: the namespace ``Policies``, topic-level ``TopicPolicies`` and their parts,
with Pulsar's JSON field names.

Request models forbid unknown fields and are strict about JSON types, so a malformed body is a
400 before any handler logic runs; documents read back from the store are parsed leniently
(:func:`parse_stored` drops unknown fields) so data written by another version never breaks a read.
"""

from __future__ import annotations

import copy
import math
from typing import Annotated, Any, ClassVar, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

LAST_BOUNDARY = "0xffffffff"

#: Java ``int`` and ``long``: Jackson rejects values outside these, so do we.
Int32 = Annotated[int, Field(ge=-(2**31), le=2**31 - 1)]
Int64 = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]
#: NaN and infinities are not JSON: refused rather than stored.
Float = Annotated[float, Field(allow_inf_nan=False)]

BacklogQuotaType = Literal["destination_storage", "message_age"]
RetentionPolicy = Literal["producer_request_hold", "producer_exception", "consumer_backlog_eviction"]
InactiveTopicDeleteMode = Literal["delete_when_no_subscriptions", "delete_when_subscriptions_caught_up"]
SchemaCompatibilityStrategy = Literal[
    "UNDEFINED",
    "ALWAYS_INCOMPATIBLE",
    "ALWAYS_COMPATIBLE",
    "BACKWARD",
    "FORWARD",
    "FULL",
    "BACKWARD_TRANSITIVE",
    "FORWARD_TRANSITIVE",
    "FULL_TRANSITIVE",
]
SchemaAutoUpdateCompatibilityStrategy = Literal[
    "AutoUpdateDisabled",
    "Backward",
    "Forward",
    "Full",
    "AlwaysCompatible",
    "BackwardTransitive",
    "ForwardTransitive",
    "FullTransitive",
]
SubscriptionAuthMode = Literal["None", "Prefix"]


class StrictModel(BaseModel):
    """Request/stored document: unknown fields and loosely typed values are rejected."""

    model_config = ConfigDict(extra="forbid", strict=True)

    #: Fields where an empty string means "not set" (Go clients send enums' zero value as "").
    empty_means_unset: ClassVar[frozenset[str]] = frozenset()

    @model_validator(mode="before")
    @classmethod
    def _lenient_nulls(cls, data: Any) -> Any:
        # Python's json accepts NaN/Infinity; they would be echoed back as invalid JSON.
        if not _all_finite(data):
            raise ValueError("NaN and Infinity are not valid JSON numbers")
        if isinstance(data, dict):
            # null means "not set" (the default), as clients that serialise every field send it.
            data = {k: v for k, v in data.items() if v is not None and not (v == "" and k in cls.empty_means_unset)}
        return data

    def to_json(self) -> dict[str, Any]:
        """Pulsar's serialisation: every non-null field (Jackson ``NON_NULL``)."""
        return self.model_dump(mode="json", exclude_none=True)


def _all_finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_all_finite(v) for v in value.values())
    if isinstance(value, list):
        return all(_all_finite(v) for v in value)
    return True


# ---------------------------------------------------------------------------------------- documents
class RetentionPolicies(StrictModel):
    """``RetentionPolicies``: keep acknowledged data this long / this much (-1 = unlimited, 0 = none)."""

    retentionTimeInMinutes: Int32 = 0
    retentionSizeInMB: Int64 = 0


class BacklogQuota(StrictModel):
    """``BacklogQuota``: ``limitSize`` in bytes, ``limitTime`` in seconds; ``limit`` is the deprecated alias
    of ``limitSize`` (both are always written, as Pulsar does)."""

    empty_means_unset = frozenset({"policy"})

    limit: Int64 | None = None
    limitSize: Int64 | None = None
    limitTime: Int32 | None = None
    policy: RetentionPolicy | None = None

    @model_validator(mode="after")
    def _normalise(self) -> BacklogQuota:
        # Pulsar keeps limit and limitSize equal; an absent limitSize falls back to limit.
        size = self.limitSize if self.limitSize is not None else (self.limit if self.limit is not None else 0)
        object.__setattr__(self, "limitSize", size)
        object.__setattr__(self, "limit", size)
        if self.limitTime is None:
            object.__setattr__(self, "limitTime", 0)
        return self


class PersistencePolicies(StrictModel):
    """``PersistencePolicies``: BookKeeper ensemble / write quorum / ack quorum for new ledgers."""

    bookkeeperEnsemble: Int32 = 2
    bookkeeperWriteQuorum: Int32 = 2
    bookkeeperAckQuorum: Int32 = 2
    managedLedgerMaxMarkDeleteRate: Float = 0.0
    managedLedgerStorageClassName: str | None = None


class AutoTopicCreationOverride(StrictModel):
    """``AutoTopicCreationOverride``: a namespace's override of ``allowAutoTopicCreation*``."""

    allowAutoTopicCreation: bool = False
    # A plain string so an unknown type is Pulsar's 412, not a schema 400.
    topicType: str | None = None
    defaultNumPartitions: Int32 | None = None


class AutoSubscriptionCreationOverride(StrictModel):
    """``AutoSubscriptionCreationOverride``."""

    allowAutoSubscriptionCreation: bool = False


class DelayedDeliveryPolicies(StrictModel):
    """``DelayedDeliveryPolicies``: ``tickTime`` in milliseconds."""

    tickTime: Int64 = 0
    active: bool = False
    maxDeliveryDelayInMillis: Int64 = 0


class InactiveTopicPolicies(StrictModel):
    """``InactiveTopicPolicies``."""

    empty_means_unset = frozenset({"inactiveTopicDeleteMode"})
    inactiveTopicDeleteMode: InactiveTopicDeleteMode | None = None
    maxInactiveDurationSeconds: Int32 = 0
    deleteWhileInactive: bool = False


class BundlesData(StrictModel):
    """``BundlesData``: hash-range boundaries of a namespace's bundles."""

    boundaries: list[str] | None = None
    numBundles: Int32 = 0


class AuthPolicies(StrictModel):
    """``AuthPolicies``: permissions granted per namespace, per topic and per subscription (enforced by
    :mod:`magnetar.broker.auth.authorization` when `authorizationEnabled`)."""

    namespace_auth: dict[str, list[str]] = Field(default_factory=dict)
    destination_auth: dict[str, dict[str, list[str]]] = Field(default_factory=dict)
    subscription_auth_roles: dict[str, list[str]] = Field(default_factory=dict)


class Policies(StrictModel):
    """Pulsar's namespace ``Policies`` document, field for field (values Magnetar does not act on are
    kept so clients can round-trip them)."""

    empty_means_unset = frozenset(
        {"schema_auto_update_compatibility_strategy", "schema_compatibility_strategy", "subscription_auth_mode"}
    )

    auth_policies: AuthPolicies = Field(default_factory=AuthPolicies)
    replication_clusters: list[str] = Field(default_factory=list)
    allowed_clusters: list[str] = Field(default_factory=list)
    bundles: BundlesData | None = None
    backlog_quota_map: dict[BacklogQuotaType, BacklogQuota] = Field(default_factory=dict)
    clusterDispatchRate: dict[str, dict[str, Any]] = Field(default_factory=dict)
    topicDispatchRate: dict[str, dict[str, Any]] = Field(default_factory=dict)
    subscriptionDispatchRate: dict[str, dict[str, Any]] = Field(default_factory=dict)
    replicatorDispatchRate: dict[str, dict[str, Any]] = Field(default_factory=dict)
    clusterSubscribeRate: dict[str, dict[str, Any]] = Field(default_factory=dict)
    persistence: PersistencePolicies | None = None
    deduplicationEnabled: bool | None = None
    autoTopicCreationOverride: AutoTopicCreationOverride | None = None
    autoSubscriptionCreationOverride: AutoSubscriptionCreationOverride | None = None
    publishMaxMessageRate: dict[str, dict[str, Any]] = Field(default_factory=dict)
    latency_stats_sample_rate: dict[str, Int32] = Field(default_factory=dict)
    message_ttl_in_seconds: Int32 | None = None
    subscription_expiration_time_minutes: Int32 | None = None
    retention_policies: RetentionPolicies | None = None
    deleted: bool = False
    encryption_required: bool = False
    delayed_delivery_policies: DelayedDeliveryPolicies | None = None
    inactive_topic_policies: InactiveTopicPolicies | None = None
    subscription_auth_mode: SubscriptionAuthMode = "None"
    max_producers_per_topic: Int32 | None = None
    max_consumers_per_topic: Int32 | None = None
    max_consumers_per_subscription: Int32 | None = None
    max_unacked_messages_per_consumer: Int32 | None = None
    max_unacked_messages_per_subscription: Int32 | None = None
    max_subscriptions_per_topic: Int32 | None = None
    compaction_threshold: Int64 | None = None
    offload_threshold: Int64 = -1
    offload_threshold_in_seconds: Int64 = -1
    offload_deletion_lag_ms: Int64 | None = None
    max_topics_per_namespace: Int32 | None = None
    schema_auto_update_compatibility_strategy: SchemaAutoUpdateCompatibilityStrategy | None = None
    schema_compatibility_strategy: SchemaCompatibilityStrategy = "UNDEFINED"
    is_allow_auto_update_schema: bool | None = None
    schema_validation_enforced: bool = False
    offload_policies: dict[str, Any] | None = None
    deduplicationSnapshotIntervalSeconds: Int32 | None = None
    subscription_types_enabled: list[str] = Field(default_factory=list)
    allowed_topic_properties_for_metrics: list[str] = Field(default_factory=list)
    properties: dict[str, str] = Field(default_factory=dict)
    resource_group_name: str | None = None
    migrated: bool = False
    dispatcherPauseOnAckStatePersistentEnabled: bool | None = None
    entryFilters: dict[str, Any] | None = None
    replicate_subscription_state: bool | None = None
    #: Sent by the Go admin client (pulsarctl, Terraform); a local policy in Pulsar, not stored here.
    antiAffinityGroup: str | None = Field(default=None, exclude=True)


class TopicPolicies(BaseModel):
    """Topic-level overrides (Pulsar's ``TopicPolicies`` names); ``None`` = inherit."""

    model_config = ConfigDict(extra="ignore")

    backLogQuotaMap: dict[BacklogQuotaType, BacklogQuota] = Field(default_factory=dict)
    persistence: PersistencePolicies | None = None
    retentionPolicies: RetentionPolicies | None = None
    deduplicationEnabled: bool | None = None
    messageTTLInSeconds: Int32 | None = None
    maxProducerPerTopic: Int32 | None = None
    maxConsumerPerTopic: Int32 | None = None
    maxConsumersPerSubscription: Int32 | None = None
    maxUnackedMessagesOnConsumer: Int32 | None = None
    maxUnackedMessagesOnSubscription: Int32 | None = None
    maxSubscriptionsPerTopic: Int32 | None = None
    delayedDeliveryTickTimeMillis: Int64 | None = None
    delayedDeliveryEnabled: bool | None = None
    delayedDeliveryMaxDelayInMillis: Int64 | None = None
    inactiveTopicPolicies: InactiveTopicPolicies | None = None
    schemaCompatibilityStrategy: SchemaCompatibilityStrategy | None = None
    compactionThreshold: Int64 | None = None
    autoSubscriptionCreationOverride: AutoSubscriptionCreationOverride | None = None

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True)

    def is_empty(self) -> bool:
        """Whether no override is set (the stored document can then be removed)."""
        return not self.backLogQuotaMap and all(
            getattr(self, name) is None for name in type(self).model_fields if name != "backLogQuotaMap"
        )


def bundles_data(num_bundles: int) -> BundlesData:
    """Evenly split hash range into ``num_bundles`` bundles, as Pulsar's ``getBundles``."""
    num_bundles = max(1, num_bundles)
    size = (1 << 32) // num_bundles
    boundaries = [f"0x{i * size:08x}" for i in range(num_bundles)] + [LAST_BOUNDARY]
    return BundlesData(boundaries=boundaries, numBundles=num_bundles)


def default_namespace_policies(cluster: str, num_bundles: int = 1) -> Policies:
    """A new namespace's policies: replicated to ``cluster``, ``num_bundles`` bundles."""
    return Policies(replication_clusters=[cluster], bundles=bundles_data(num_bundles))


_M = TypeVar("_M", bound=BaseModel)


def parse_stored(model: type[_M], data: Any) -> _M:
    """Parse a stored document, dropping fields this version does not know (written by a newer one)."""
    data = copy.deepcopy(data)
    for _ in range(20):
        try:
            return model.model_validate(data)
        except ValidationError as exc:
            extras = [e["loc"] for e in exc.errors() if e["type"] == "extra_forbidden"]
            if not extras:
                raise
            for loc in extras:
                _drop(data, loc)
    return model.model_validate(data)


def _drop(data: Any, loc: tuple[int | str, ...]) -> None:
    node = data
    for key in loc[:-1]:
        node = node[key]
    node.pop(loc[-1], None)
