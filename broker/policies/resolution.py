"""Effective policies: every setting the broker enforces for a topic, resolved topic-level >
namespace-level > broker configuration, as in Pulsar."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, get_args

from magnetar.broker.config import BrokerConfig
from magnetar.broker.policies.documents import (
    BacklogQuota,
    BacklogQuotaType,
    Policies,
    RetentionPolicies,
    RetentionPolicy,
    TopicPolicies,
)

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


_RETENTION_POLICIES: dict[str, RetentionPolicy] = {p: p for p in get_args(RetentionPolicy)}


def default_backlog_quota(config: BrokerConfig) -> BacklogQuota:
    """The broker-wide quota of either kind (``backlogQuotaDefaultLimitBytes`` / ``backlogQuotaDefaultLimitSecond``)."""
    size = config.backlog_quota_default_limit_bytes
    seconds = config.backlog_quota_default_limit_second
    # An unknown policy name falls back to Pulsar's default rather than failing every quota check.
    policy = _RETENTION_POLICIES.get(config.backlog_quota_default_retention_policy, "producer_request_hold")
    return BacklogQuota(limitSize=size, limitTime=max(min(seconds, 2**31 - 1), -(2**31)), policy=policy)


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


#: Effective policies resolved so far, by value: most topics resolve to the same settings, so they
#: share one object (and its backlog quotas) instead of ~0.4 KiB each. Bounded: cleared when full.
_INTERNED: dict[tuple[Any, ...], EffectivePolicies] = {}
_INTERNED_MAX = 4096


def _hashable(value: Any) -> Any:
    return tuple(value) if isinstance(value, BacklogQuota) else value  # (field, value) pairs


def _interned(eff: EffectivePolicies) -> EffectivePolicies:
    """The one shared object equal to ``eff`` (EffectivePolicies is frozen; its quotas are never mutated)."""
    key = tuple(_hashable(getattr(eff, f.name)) for f in fields(eff))
    shared = _INTERNED.get(key)
    if shared is None:
        if len(_INTERNED) >= _INTERNED_MAX:
            _INTERNED.clear()
        shared = _INTERNED[key] = eff
    return shared


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

    def quota(kind: BacklogQuotaType, limit_field: str) -> BacklogQuota | None:
        found = tp.backLogQuotaMap.get(kind) or nsp.backlog_quota_map.get(kind)
        if found is not None:
            return found
        default = default_backlog_quota(config)
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

    eff = EffectivePolicies(
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
    return _interned(eff)
