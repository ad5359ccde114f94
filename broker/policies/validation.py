"""Pulsar's validation rules for policies. A broken rule raises
:class:`~magnetar.broker.errors.PolicyValidationError` carrying the HTTP status Pulsar answers
(400 unless noted); the admin API turns it into ``{"reason": ...}``."""

from __future__ import annotations

from magnetar.broker.config import BrokerConfig
from magnetar.broker.errors import PolicyValidationError
from magnetar.broker.policies.documents import (
    AutoTopicCreationOverride,
    BacklogQuota,
    BacklogQuotaType,
    BundlesData,
    PersistencePolicies,
    Policies,
    RetentionPolicies,
    bundles_data,
)
from magnetar.broker.policies.resolution import default_backlog_quota


def validate_retention(retention: RetentionPolicies) -> None:
    """Pulsar's ``validateRetentionPolicies``."""
    if retention.retentionSizeInMB < -1:
        raise PolicyValidationError("Invalid retention policy: size limit must be >= -1")
    if retention.retentionTimeInMinutes < -1:
        raise PolicyValidationError("Invalid retention policy: time limit must be >= -1")
    if (retention.retentionTimeInMinutes == 0) != (retention.retentionSizeInMB == 0):
        raise PolicyValidationError(
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
    quotas: dict[BacklogQuotaType, BacklogQuota], retention: RetentionPolicies | None, config: BrokerConfig
) -> bool:
    """Pulsar's ``checkQuotas``: only the ``destination_storage`` quota bounds retention."""
    if not quotas:
        return True
    return backlog_quota_fits(quotas.get("destination_storage"), retention, config)


def validate_persistence(persistence: PersistencePolicies, config: BrokerConfig) -> None:
    """Pulsar's ``validatePersistencePolicies``: 0 < ack <= write <= ensemble, each under its max."""
    max_e = config.managed_ledger_max_ensemble_size
    max_w = config.managed_ledger_max_write_quorum
    max_a = config.managed_ledger_max_ack_quorum
    e, w, a = persistence.bookkeeperEnsemble, persistence.bookkeeperWriteQuorum, persistence.bookkeeperAckQuorum
    if not 0 < e <= max_e:
        raise PolicyValidationError(f"Bookkeeper-Ensemble must be <= {max_e} and > 0.")
    if not 0 < w <= max_w:
        raise PolicyValidationError(f"Bookkeeper-WriteQuorum must be <= {max_w} and > 0.")
    if not 0 < a <= max_a:
        raise PolicyValidationError(f"Bookkeeper-AckQuorum must be <= {max_a} and > 0.")
    if not e >= w >= a:
        raise PolicyValidationError(f"Bookkeeper Ensemble ({e}) >= WriteQuorum ({w}) >= AckQuorum ({a})")


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
        raise PolicyValidationError(
            f"Invalid configuration for autoTopicCreationOverride. the detail is {problem}", http_status=412
        )
    max_partitions = config.max_num_partitions_per_partitioned_topic
    if (
        override.topicType == "partitioned"
        and max_partitions > 0
        and (override.defaultNumPartitions or 0) > max_partitions
    ):
        raise PolicyValidationError(
            f"Number of partitions should be less than or equal to {max_partitions}", http_status=406
        )


def validate_namespace_policies(policies: Policies, config: BrokerConfig) -> None:
    """What Pulsar checks in a namespace-creation body (after tenant/cluster checks)."""
    if policies.message_ttl_in_seconds is not None and policies.message_ttl_in_seconds < 0:
        raise PolicyValidationError("Invalid value for message TTL", http_status=412)
    max_bundles = config.load_balancer_namespace_maximum_bundles
    if policies.bundles is not None and policies.bundles.numBundles > max_bundles:
        raise PolicyValidationError(
            f"Invalid number of bundles: {policies.bundles.numBundles} (at most {max_bundles})", http_status=412
        )
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
        raise PolicyValidationError(f"Invalid number of bundles: {count} (at most {max_bundles})", http_status=412)
    points: set[int] = set()
    for text in bundles.boundaries or []:
        try:
            value = int(text, 0)
        except ValueError:
            raise PolicyValidationError(f"Invalid bundle boundary: {text}") from None
        if not 0 <= value <= 0xFFFFFFFF:
            raise PolicyValidationError(f"Invalid bundle boundary: {text}")
        points.add(value)
    ordered = sorted(points)
    if len(ordered) < 2 or ordered[0] != 0 or ordered[-1] != 0xFFFFFFFF:
        first = f"0x{ordered[0]:08x}" if ordered else ""
        last = f"0x{ordered[-1]:08x}" if ordered else ""
        raise PolicyValidationError(f"Input bundles do not cover the whole hash range. first:{first}, last:{last}")
    return BundlesData(boundaries=[f"0x{p:08x}" for p in ordered], numBundles=len(ordered) - 1)
