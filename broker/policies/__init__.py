"""Namespace and topic policies: Pulsar's JSON documents (:mod:`.documents`), Pulsar's validation
rules (:mod:`.validation`), resolution of the effective values topic > namespace > broker
configuration (:mod:`.resolution`), and the :class:`PolicyStore` that keeps them in the metadata
store (:mod:`.store`).

Domain code only: validation raises :class:`~magnetar.broker.errors.PolicyValidationError`,
which the admin API answers as ``{"reason": ...}`` with Pulsar's status; nothing here imports
the HTTP layer.
"""

from __future__ import annotations

from magnetar.broker.policies.documents import (
    AutoSubscriptionCreationOverride,
    AutoTopicCreationOverride,
    BacklogQuota,
    BacklogQuotaType,
    DelayedDeliveryPolicies,
    InactiveTopicPolicies,
    Int32,
    PersistencePolicies,
    Policies,
    RetentionPolicies,
    SchemaCompatibilityStrategy,
    StrictModel,
    TopicPolicies,
    default_namespace_policies,
    parse_stored,
)
from magnetar.broker.policies.resolution import EffectivePolicies, default_backlog_quota, resolve
from magnetar.broker.policies.store import TOPIC_POLICIES_ROOT, PolicyStore
from magnetar.broker.policies.validation import (
    backlog_quota_fits,
    retention_fits_quotas,
    validate_auto_topic_creation,
    validate_namespace_policies,
    validate_persistence,
    validate_retention,
)

__all__ = [
    "TOPIC_POLICIES_ROOT",
    "AutoSubscriptionCreationOverride",
    "AutoTopicCreationOverride",
    "BacklogQuota",
    "BacklogQuotaType",
    "DelayedDeliveryPolicies",
    "EffectivePolicies",
    "InactiveTopicPolicies",
    "Int32",
    "PersistencePolicies",
    "Policies",
    "PolicyStore",
    "RetentionPolicies",
    "SchemaCompatibilityStrategy",
    "StrictModel",
    "TopicPolicies",
    "backlog_quota_fits",
    "default_backlog_quota",
    "default_namespace_policies",
    "parse_stored",
    "resolve",
    "retention_fits_quotas",
    "validate_auto_topic_creation",
    "validate_namespace_policies",
    "validate_persistence",
    "validate_retention",
]
