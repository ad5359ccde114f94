"""Namespace and topic policies: Pulsar's JSON documents, Pulsar's validation rules, and the
:class:`PolicyStore` the broker resolves effective settings with.

Resolution order for every setting is topic-level > namespace-level > broker configuration,
as in Pulsar. Namespace policies live at ``/admin/policies/<tenant>/<ns>`` (Pulsar's path and
``Policies`` JSON); topic policies at ``/admin/topic-policies/<tenant>/<ns>/<domain>/<encoded
topic>`` with Pulsar's ``TopicPolicies`` field names. Partitions share their partitioned topic's
policies.

Request models forbid unknown fields and are strict about JSON types, so a malformed body is a
400 before any handler logic runs; documents read back from the store are parsed leniently
(unknown fields dropped) so data written by another version never breaks a read.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import logging
import math
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal, TypeVar
from urllib.parse import unquote

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from magnetar.broker.config import BrokerConfig, snake_case
from magnetar.broker.topic_name import TopicName
from magnetar.metadata.api import NOT_EXISTS, BadVersionError, MetadataStore, NotFoundError, Notification

log = logging.getLogger(__name__)

POLICIES_ROOT = "/admin/policies"
TOPIC_POLICIES_ROOT = "/admin/topic-policies"
FIRST_BOUNDARY = "0x00000000"
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
TopicType = Literal["partitioned", "non-partitioned"]

# The deprecated auto-update strategy maps onto the current one (Pulsar's fromAutoUpdatePolicy).
_FROM_AUTO_UPDATE: dict[str, str] = {
    "AutoUpdateDisabled": "ALWAYS_INCOMPATIBLE",
    "Backward": "BACKWARD",
    "Forward": "FORWARD",
    "Full": "FULL",
    "AlwaysCompatible": "ALWAYS_COMPATIBLE",
    "BackwardTransitive": "BACKWARD_TRANSITIVE",
    "ForwardTransitive": "FORWARD_TRANSITIVE",
    "FullTransitive": "FULL_TRANSITIVE",
}


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


# ---------------------------------------------------------------------------------------- policy documents
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
    """``AuthPolicies`` (permissions are stored but not enforced)."""

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
    autoSubscriptionCreationOverride: AutoSubscriptionCreationOverride | None = None

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True)

    def is_empty(self) -> bool:
        """Whether no override is set (the stored document can then be removed)."""
        return not self.backLogQuotaMap and all(
            getattr(self, name) is None for name in type(self).model_fields if name != "backLogQuotaMap"
        )


# ---------------------------------------------------------------------------------------- broker settings
_M = TypeVar("_M", bound=BaseModel)
_T = TypeVar("_T")


def setting(config: BrokerConfig, name: str, default: _T) -> _T:
    """Pulsar setting ``name`` (camelCase): a :class:`BrokerConfig` field when it has one, else the raw
    value from its ``extra`` settings, else ``default`` (whose type the raw value is coerced to)."""
    snake = snake_case(name)
    if snake != "extra" and hasattr(config, snake):
        return getattr(config, snake)  # type: ignore[no-any-return]
    raw = config.extra.get(name, config.extra.get(snake))
    if raw is None or str(raw).strip() == "":
        return default
    text = str(raw).strip()
    try:
        if isinstance(default, bool):
            return text.lower() in ("true", "1", "yes", "on")  # type: ignore[return-value]
        if isinstance(default, int) or (default is None and text.lstrip("-").isdigit()):
            return int(text)  # type: ignore[return-value]
        if isinstance(default, float):
            return float(text)  # type: ignore[return-value]
    except ValueError:
        log.warning("ignoring invalid value %r for setting %s", raw, name)
        return default
    return text  # type: ignore[return-value]


def default_backlog_quota(config: BrokerConfig, quota_type: str = "destination_storage") -> BacklogQuota:
    """The broker-wide quota (``backlogQuotaDefaultLimitBytes`` / ``backlogQuotaDefaultLimitSecond``)."""
    size = config.backlog_quota_default_limit_bytes
    seconds = config.backlog_quota_default_limit_second
    policy = config.backlog_quota_default_retention_policy
    if policy not in ("producer_request_hold", "producer_exception", "consumer_backlog_eviction"):
        policy = "producer_request_hold"
    return BacklogQuota(limitSize=size, limitTime=max(min(seconds, 2**31 - 1), -(2**31)), policy=policy)


def bundles_data(num_bundles: int) -> BundlesData:
    """Evenly split hash range into ``num_bundles`` bundles, as Pulsar's ``getBundles``."""
    num_bundles = max(1, num_bundles)
    size = (1 << 32) // num_bundles
    boundaries = [f"0x{i * size:08x}" for i in range(num_bundles)] + [LAST_BOUNDARY]
    return BundlesData(boundaries=boundaries, numBundles=num_bundles)


def default_namespace_policies(cluster: str, num_bundles: int = 1) -> Policies:
    """A new namespace's policies: replicated to ``cluster``, ``num_bundles`` bundles."""
    return Policies(replication_clusters=[cluster], bundles=bundles_data(num_bundles))


# ---------------------------------------------------------------------------------------- validation
def _rest_error(status: int, reason: str) -> Exception:
    # Imported late: the admin package imports the broker service, which imports this module.
    from magnetar.broker.admin.api import RestError

    return RestError(status, reason)


def validate_retention(retention: RetentionPolicies) -> None:
    """Pulsar's ``validateRetentionPolicies`` (400)."""
    if retention.retentionSizeInMB < -1:
        raise _rest_error(400, "Invalid retention policy: size limit must be >= -1")
    if retention.retentionTimeInMinutes < -1:
        raise _rest_error(400, "Invalid retention policy: time limit must be >= -1")
    if (retention.retentionTimeInMinutes == 0) != (retention.retentionSizeInMB == 0):
        raise _rest_error(
            400,
            "Invalid retention policy: Setting a single time or size limit to 0 is invalid when one of the "
            "limits has a non-zero value. Use the value of -1 instead of 0 to ignore a specific limit. "
            "To disable retention both limits must be set to 0.",
        )


def backlog_quota_fits(quota: BacklogQuota | None, retention: RetentionPolicies | None, config: BrokerConfig) -> bool:
    """Pulsar's ``checkBacklogQuota``: a backlog quota must stay below the retention limits."""
    if retention is None or (retention.retentionSizeInMB <= 0 and retention.retentionTimeInMinutes <= 0):
        return True
    if quota is None:
        quota = default_backlog_quota(config)
    if retention.retentionSizeInMB > 0 and (quota.limitSize or 0) >= retention.retentionSizeInMB * 1024 * 1024:
        return False
    # Time quotas are in seconds, retention in minutes.
    minutes = retention.retentionTimeInMinutes
    return not (minutes > 0 and (quota.limitTime or 0) >= minutes * 60)


def retention_fits_quotas(
    quotas: dict[str, BacklogQuota], retention: RetentionPolicies | None, config: BrokerConfig
) -> bool:
    """Pulsar's ``checkQuotas``: only the ``destination_storage`` quota bounds retention."""
    if not quotas:
        return True
    return backlog_quota_fits(quotas.get("destination_storage"), retention, config)


def validate_persistence(persistence: PersistencePolicies, config: BrokerConfig) -> None:
    """Pulsar's ``validatePersistencePolicies`` (400): 0 < ack <= write <= ensemble, each under its max."""
    max_e = config.managed_ledger_max_ensemble_size
    max_w = config.managed_ledger_max_write_quorum
    max_a = config.managed_ledger_max_ack_quorum
    e, w, a = persistence.bookkeeperEnsemble, persistence.bookkeeperWriteQuorum, persistence.bookkeeperAckQuorum
    if not 0 < e <= max_e:
        raise _rest_error(400, f"Bookkeeper-Ensemble must be <= {max_e} and > 0.")
    if not 0 < w <= max_w:
        raise _rest_error(400, f"Bookkeeper-WriteQuorum must be <= {max_w} and > 0.")
    if not 0 < a <= max_a:
        raise _rest_error(400, f"Bookkeeper-AckQuorum must be <= {max_a} and > 0.")
    if not e >= w >= a:
        raise _rest_error(400, f"Bookkeeper Ensemble ({e}) >= WriteQuorum ({w}) >= AckQuorum ({a})")


def validate_auto_topic_creation(override: AutoTopicCreationOverride, config: BrokerConfig) -> None:
    """Pulsar's ``AutoTopicCreationOverrideImpl.validateOverride`` (412) and partition cap (406)."""
    problem = None
    if override.allowAutoTopicCreation:
        if override.topicType not in ("partitioned", "non-partitioned"):
            problem = f"Unknown topic type [{override.topicType}]"
        elif override.topicType == "partitioned":
            if override.defaultNumPartitions is None:
                problem = "[defaultNumPartitions] cannot be null when the type is partitioned."
            elif override.defaultNumPartitions <= 0:
                problem = "[defaultNumPartitions] cannot be less than 1 for partition type."
        elif override.defaultNumPartitions is not None:
            problem = "[defaultNumPartitions] is not allowed to be set when the type is non-partition."
    if problem:
        raise _rest_error(412, f"Invalid configuration for autoTopicCreationOverride. the detail is {problem}")
    max_partitions = config.max_num_partitions_per_partitioned_topic
    if (
        override.topicType == "partitioned"
        and max_partitions > 0
        and (override.defaultNumPartitions or 0) > max_partitions
    ):
        raise _rest_error(406, f"Number of partitions should be less than or equal to {max_partitions}")


def validate_namespace_policies(policies: Policies, config: BrokerConfig) -> None:
    """What Pulsar checks in a namespace-creation body (after tenant/cluster checks)."""
    if policies.message_ttl_in_seconds is not None and policies.message_ttl_in_seconds < 0:
        raise _rest_error(412, "Invalid value for message TTL")
    max_bundles = config.load_balancer_namespace_maximum_bundles
    if policies.bundles is not None and policies.bundles.numBundles > max_bundles:
        raise _rest_error(412, f"Invalid number of bundles: {policies.bundles.numBundles} (at most {max_bundles})")
    if policies.bundles is not None and policies.bundles.numBundles > 0 and policies.bundles.boundaries:
        policies.bundles = _validate_bundles(policies.bundles, max_bundles)
    elif policies.bundles is not None and policies.bundles.numBundles > 0:
        policies.bundles = bundles_data(policies.bundles.numBundles)
    else:
        policies.bundles = bundles_data(min(config.default_number_of_namespace_bundles, max_bundles))
    if policies.persistence is not None:
        validate_persistence(policies.persistence, config)
    if policies.retention_policies is not None:
        validate_retention(policies.retention_policies)
    if policies.autoTopicCreationOverride is not None:
        validate_auto_topic_creation(policies.autoTopicCreationOverride, config)


def _validate_bundles(bundles: BundlesData, max_bundles: int) -> BundlesData:
    count = len(bundles.boundaries or []) - 1
    if count > max_bundles:
        raise _rest_error(412, f"Invalid number of bundles: {count} (at most {max_bundles})")
    points: set[int] = set()
    for text in bundles.boundaries or []:
        try:
            value = int(text, 0)
        except ValueError:
            raise _rest_error(400, f"Invalid bundle boundary: {text}") from None
        if not 0 <= value <= 0xFFFFFFFF:
            raise _rest_error(400, f"Invalid bundle boundary: {text}")
        points.add(value)
    ordered = sorted(points)
    if len(ordered) < 2 or ordered[0] != 0 or ordered[-1] != 0xFFFFFFFF:
        first = f"0x{ordered[0]:08x}" if ordered else ""
        last = f"0x{ordered[-1]:08x}" if ordered else ""
        raise _rest_error(400, f"Input bundles do not cover the whole hash range. first:{first}, last:{last}")
    return BundlesData(boundaries=[f"0x{p:08x}" for p in ordered], numBundles=len(ordered) - 1)


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


# ---------------------------------------------------------------------------------------- effective values
@dataclass(frozen=True, slots=True)
class EffectivePolicies:
    """Every enforced setting of one topic, resolved topic > namespace > broker configuration.

    ``0`` means unlimited for the ``max_*`` fields; ``message_ttl_seconds`` 0 = no TTL;
    ``subscription_expiration_minutes`` 0 = never; a ``None`` backlog quota = no quota.
    """

    retention_time_minutes: int
    retention_size_mb: int
    message_ttl_seconds: int
    backlog_quota_size: BacklogQuota | None
    backlog_quota_time: BacklogQuota | None
    deduplication_enabled: bool
    allow_auto_topic_creation: bool
    auto_topic_creation_type: str
    default_num_partitions: int
    allow_auto_subscription_creation: bool
    delayed_delivery_enabled: bool
    delayed_delivery_tick_ms: int
    ensemble_size: int
    write_quorum: int
    ack_quorum: int
    subscription_expiration_minutes: int
    inactive_topic_delete_mode: str | None
    inactive_topic_max_seconds: int
    inactive_topic_delete_while_inactive: bool
    max_producers_per_topic: int
    max_consumers_per_topic: int
    max_consumers_per_subscription: int
    max_unacked_messages_per_consumer: int
    schema_compatibility_strategy: str


def _first(*values: Any) -> Any:
    for value in values:
        if value is not None:
            return value
    return None


def resolve(config: BrokerConfig, ns: Policies | None, tp: TopicPolicies | None) -> EffectivePolicies:
    """Combine topic and namespace overrides with the broker defaults (pure; used by :class:`PolicyStore`)."""
    tp = tp or TopicPolicies()
    nsp = ns or Policies()

    retention = tp.retentionPolicies or nsp.retention_policies
    if retention is None:
        retention = RetentionPolicies(
            retentionTimeInMinutes=int(config.default_retention_time_in_minutes),
            retentionSizeInMB=int(config.default_retention_size_in_mb),
        )

    def quota(kind: str, limit_field: str) -> BacklogQuota | None:
        found = tp.backLogQuotaMap.get(kind) or nsp.backlog_quota_map.get(kind)  # type: ignore[call-overload]
        if found is not None:
            return found
        default = default_backlog_quota(config, kind)
        return default if (getattr(default, limit_field) or 0) >= 0 else None

    auto_topic = nsp.autoTopicCreationOverride
    allow_topic = auto_topic.allowAutoTopicCreation if auto_topic else config.allow_auto_topic_creation
    topic_type = (auto_topic.topicType if auto_topic and auto_topic.topicType else None) or (
        config.allow_auto_topic_creation_type
    )
    partitions = _first(auto_topic.defaultNumPartitions if auto_topic else None, config.default_num_partitions)

    auto_sub = tp.autoSubscriptionCreationOverride or nsp.autoSubscriptionCreationOverride
    delayed = nsp.delayed_delivery_policies
    persistence = tp.persistence or nsp.persistence

    inactive = tp.inactiveTopicPolicies or nsp.inactive_topic_policies
    if inactive is not None:
        inactive_mode: str | None = inactive.inactiveTopicDeleteMode
        inactive_seconds = inactive.maxInactiveDurationSeconds
        inactive_enabled = inactive.deleteWhileInactive
    else:
        inactive_mode = config.broker_delete_inactive_topics_mode
        inactive_seconds = int(
            _first(
                config.broker_delete_inactive_topics_max_inactive_duration_seconds,
                config.broker_delete_inactive_topics_frequency_seconds,
            )
        )
        inactive_enabled = config.broker_delete_inactive_topics_enabled

    strategy: str | None = tp.schemaCompatibilityStrategy
    if strategy in (None, "UNDEFINED"):
        strategy = nsp.schema_compatibility_strategy
    if strategy == "UNDEFINED":
        strategy = _FROM_AUTO_UPDATE.get(nsp.schema_auto_update_compatibility_strategy or "", "UNDEFINED")
    if strategy == "UNDEFINED":
        strategy = config.schema_compatibility_strategy.upper()

    return EffectivePolicies(
        retention_time_minutes=retention.retentionTimeInMinutes,
        retention_size_mb=retention.retentionSizeInMB,
        message_ttl_seconds=int(
            _first(tp.messageTTLInSeconds, nsp.message_ttl_in_seconds, config.ttl_duration_default_in_seconds)
        ),
        backlog_quota_size=quota("destination_storage", "limitSize"),
        backlog_quota_time=quota("message_age", "limitTime"),
        deduplication_enabled=bool(
            _first(tp.deduplicationEnabled, nsp.deduplicationEnabled, config.broker_deduplication_enabled)
        ),
        allow_auto_topic_creation=bool(allow_topic),
        auto_topic_creation_type=str(topic_type),
        default_num_partitions=int(partitions),
        allow_auto_subscription_creation=(
            auto_sub.allowAutoSubscriptionCreation if auto_sub else bool(config.allow_auto_subscription_creation)
        ),
        delayed_delivery_enabled=bool(
            _first(
                tp.delayedDeliveryEnabled,
                delayed.active if delayed else None,
                config.delayed_delivery_enabled,
            )
        ),
        delayed_delivery_tick_ms=int(
            _first(
                tp.delayedDeliveryTickTimeMillis,
                delayed.tickTime if delayed else None,
                config.delayed_delivery_tick_time_millis,
            )
        ),
        ensemble_size=persistence.bookkeeperEnsemble if persistence else config.managed_ledger_default_ensemble_size,
        write_quorum=persistence.bookkeeperWriteQuorum if persistence else config.managed_ledger_default_write_quorum,
        ack_quorum=persistence.bookkeeperAckQuorum if persistence else config.managed_ledger_default_ack_quorum,
        subscription_expiration_minutes=int(
            _first(nsp.subscription_expiration_time_minutes, config.subscription_expiration_time_minutes)
        ),
        inactive_topic_delete_mode=inactive_mode,
        inactive_topic_max_seconds=inactive_seconds,
        inactive_topic_delete_while_inactive=inactive_enabled,
        max_producers_per_topic=int(
            _first(tp.maxProducerPerTopic, nsp.max_producers_per_topic, config.max_producers_per_topic)
        ),
        max_consumers_per_topic=int(
            _first(tp.maxConsumerPerTopic, nsp.max_consumers_per_topic, config.max_consumers_per_topic)
        ),
        max_consumers_per_subscription=int(
            _first(
                tp.maxConsumersPerSubscription,
                nsp.max_consumers_per_subscription,
                config.max_consumers_per_subscription,
            )
        ),
        max_unacked_messages_per_consumer=int(
            _first(
                tp.maxUnackedMessagesOnConsumer,
                nsp.max_unacked_messages_per_consumer,
                config.max_unacked_messages_per_consumer,
            )
        ),
        schema_compatibility_strategy=str(strategy),
    )


# ---------------------------------------------------------------------------------------- the store
def namespace_path(ns: str) -> str:
    return f"{POLICIES_ROOT}/{ns}"


def topic_policies_path(topic: TopicName) -> str:
    """Where a topic's policies live; partitions map to their partitioned topic."""
    return f"{TOPIC_POLICIES_ROOT}/{topic.partitioned_base.persistence_name}"


class _Cache:
    """A bounded LRU of parsed documents with an epoch that makes invalidation race-free: a value read
    before an invalidation is never stored after it."""

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self.values: OrderedDict[str, Any] = OrderedDict()
        self.epoch = 0

    def get(self, key: str) -> tuple[bool, Any]:
        if key in self.values:
            self.values.move_to_end(key)
            return True, self.values[key]
        return False, None

    def put(self, key: str, value: Any, epoch: int) -> None:
        if epoch != self.epoch:
            return
        self.values[key] = value
        self.values.move_to_end(key)
        while len(self.values) > self.max_entries:
            self.values.popitem(last=False)

    def invalidate(self, key: str) -> None:
        self.epoch += 1
        self.values.pop(key, None)

    def clear(self) -> None:
        self.epoch += 1
        self.values.clear()


class PolicyStore:
    """Cached, watch-invalidated access to namespace and topic policies, and their effective values.

    Safe to share across coroutines of one event loop; every method is non-blocking.
    """

    #: CAS attempts before an update gives up with 409 (Pulsar's "Concurrent modification").
    MAX_CAS_ATTEMPTS = 50

    def __init__(self, store: MetadataStore, config: BrokerConfig, *, max_cached: int = 65_536) -> None:
        self.store = store
        self.config = config
        self._namespaces = _Cache(max_cached)
        self._topics = _Cache(max_cached)
        self._listeners: list[Callable[[str], None]] = []
        self._unwatch = [
            store.watch(POLICIES_ROOT + "/", self._on_namespace_change),
            store.watch(TOPIC_POLICIES_ROOT + "/", self._on_topic_change),
        ]

    def close(self) -> None:
        """Stop watching the store (listeners are no longer called)."""
        for unwatch in self._unwatch:
            unwatch()
        self._unwatch.clear()

    # -- listeners
    def add_listener(self, callback: Callable[[str], None]) -> None:
        """Call ``callback(name)`` when a namespace's (``tenant/ns``) or a topic's (full name, of the
        partitioned topic for partitions) policies change, on this broker or any other."""
        self._listeners.append(callback)

    def _notify(self, name: str) -> None:
        for callback in list(self._listeners):
            try:
                callback(name)
            except Exception:
                log.exception("policy listener failed for %s", name)

    def _on_namespace_change(self, note: Notification) -> None:
        parts = note.path[len(POLICIES_ROOT) + 1 :].split("/")
        if len(parts) != 2:
            return  # a tenant record
        ns = "/".join(parts)
        self._namespaces.invalidate(ns)
        self._notify(ns)

    def _on_topic_change(self, note: Notification) -> None:
        parts = note.path[len(TOPIC_POLICIES_ROOT) + 1 :].split("/")
        if len(parts) != 4:
            return
        tenant, ns, domain, encoded = parts
        name = f"{domain}://{tenant}/{ns}/{unquote(encoded)}"
        self._topics.invalidate(name)
        self._notify(name)

    # -- namespaces
    async def namespace(self, ns: str) -> Policies | None:
        """The namespace's policies (a private copy), ``None`` if it does not exist."""
        value = await self._cached_namespace(ns)
        return None if value is None else value.model_copy(deep=True)

    async def _cached_namespace(self, ns: str) -> Policies | None:
        # The shared cached object: callers must not mutate it.
        hit, value = self._namespaces.get(ns)
        if not hit:
            epoch = self._namespaces.epoch
            stored = await self.store.get(namespace_path(ns))
            value = None if stored is None else parse_stored(Policies, json.loads(stored.data))
            self._namespaces.put(ns, value, epoch)
        return value  # type: ignore[no-any-return]

    async def update_namespace(self, ns: str, mutate: Callable[[Policies], None]) -> Policies:
        """Apply ``mutate`` to the stored policies with compare-and-swap, retrying on conflicts.

        ``mutate`` may raise (e.g. a ``RestError``) to abort; 404 if the namespace does not exist.
        """
        path = namespace_path(ns)
        for _ in range(self.MAX_CAS_ATTEMPTS):
            stored = await self.store.get(path)
            if stored is None:
                raise _rest_error(404, "Namespace does not exist")
            policies = parse_stored(Policies, json.loads(stored.data))
            mutate(policies)
            try:
                await self.store.put(path, _dumps(policies.to_json()), stored.stat.version)
            except BadVersionError:
                continue
            self._namespaces.invalidate(ns)
            return policies.model_copy(deep=True)
        raise _rest_error(409, "Concurrent modification")

    # -- topics
    async def topic(self, topic: TopicName) -> TopicPolicies | None:
        """The topic's own overrides (a private copy), ``None`` if it has none."""
        value = await self._cached_topic(topic)
        return None if value is None else value.model_copy(deep=True)

    async def _cached_topic(self, topic: TopicName) -> TopicPolicies | None:
        key = str(topic.partitioned_base)
        hit, value = self._topics.get(key)
        if not hit:
            epoch = self._topics.epoch
            stored = await self.store.get(topic_policies_path(topic))
            value = None if stored is None else parse_stored(TopicPolicies, json.loads(stored.data))
            self._topics.put(key, value, epoch)
        return value  # type: ignore[no-any-return]

    async def update_topic(self, topic: TopicName, mutate: Callable[[TopicPolicies], None]) -> TopicPolicies:
        """Apply ``mutate`` to the topic's overrides (created if absent) with compare-and-swap; a document
        left without any override is removed."""
        path = topic_policies_path(topic)
        for _ in range(self.MAX_CAS_ATTEMPTS):
            stored = await self.store.get(path)
            policies = TopicPolicies() if stored is None else parse_stored(TopicPolicies, json.loads(stored.data))
            mutate(policies)
            try:
                if policies.is_empty():
                    if stored is not None:
                        await self.store.delete(path, stored.stat.version)
                else:
                    expected = NOT_EXISTS if stored is None else stored.stat.version
                    await self.store.put(path, _dumps(policies.to_json()), expected)
            except (BadVersionError, NotFoundError):
                continue
            self._topics.invalidate(str(topic.partitioned_base))
            return policies.model_copy(deep=True)
        raise _rest_error(409, "Concurrent modification")

    async def delete_topic_policies(self, topic: TopicName) -> None:
        """Forget a topic's overrides (e.g. when the topic is deleted)."""
        with contextlib.suppress(NotFoundError):
            await self.store.delete(topic_policies_path(topic))
        self._topics.invalidate(str(topic.partitioned_base))

    async def delete_namespace_topic_policies(self, ns: str) -> None:
        """Forget the overrides of every topic of a namespace."""
        await self.store.delete_recursive(f"{TOPIC_POLICIES_ROOT}/{ns}")
        self._topics.clear()

    # -- effective values
    async def effective(self, topic: TopicName) -> EffectivePolicies:
        """Everything the broker enforces for ``topic``, resolved topic > namespace > configuration."""
        ns, tp = await asyncio.gather(self._cached_namespace(topic.namespace), self._cached_topic(topic))
        return resolve(self.config, ns, tp)


_ADMIN_STORES: weakref.WeakKeyDictionary[Any, PolicyStore] = weakref.WeakKeyDictionary()


def policy_store_of(service: Any) -> PolicyStore:
    """The broker's :class:`PolicyStore` (``service.policies``), or one kept for it until that is wired."""
    existing = getattr(service, "policies", None)
    if isinstance(existing, PolicyStore):
        return existing
    store = _ADMIN_STORES.get(service)
    if store is None:
        store = _ADMIN_STORES[service] = PolicyStore(service.store, service.config)
    return store


def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()
