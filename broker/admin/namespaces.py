"""``/admin/v2/namespaces``: namespaces of a tenant, their policies and their topics (Pulsar's
``Namespaces`` resource).

Writes answer 204. A policy ``GET`` answers the value, or 204 with no body when the policy is not
set (Pulsar returns ``null``, which JAX-RS turns into 204); ``backlogQuotaMap`` is always a map.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

from aiohttp import web
from pydantic import BaseModel

from magnetar.broker.admin.api import (
    RestError,
    Routes,
    bad_request,
    conflict,
    json_body,
    json_response,
    no_content,
    not_found,
    precondition_failed,
    query_bool,
    service_of,
)
from magnetar.broker.errors import InvalidTopicNameError, TopicNotFoundError
from magnetar.broker.policies import (
    AutoSubscriptionCreationOverride,
    AutoTopicCreationOverride,
    BacklogQuota,
    BacklogQuotaType,
    DelayedDeliveryPolicies,
    InactiveTopicPolicies,
    Int32,
    PersistencePolicies,
    Policies,
    PolicyStore,
    RetentionPolicies,
    SchemaCompatibilityStrategy,
    backlog_quota_fits,
    default_namespace_policies,
    retention_fits_quotas,
    validate_auto_topic_creation,
    validate_namespace_policies,
    validate_persistence,
    validate_retention,
)
from magnetar.broker.protocol import pulsar_api_pb2 as pb
from magnetar.broker.system_topics import is_system_topic, without_system_topics
from magnetar.broker.topic_name import TopicName, check_named_entity

log = logging.getLogger(__name__)
routes = Routes("namespaces")

_NS = "/admin/v2/namespaces/{tenant}/{namespace}"
_MODES = {
    "PERSISTENT": pb.CommandGetTopicsOfNamespace.PERSISTENT,
    "NON_PERSISTENT": pb.CommandGetTopicsOfNamespace.NON_PERSISTENT,
    "ALL": pb.CommandGetTopicsOfNamespace.ALL,
}
_NOT_FOUND = {404: "Tenant or namespace does not exist", 412: "Namespace name is not valid"}


# ---------------------------------------------------------------------------------------- shared helpers
def namespace_of(request: web.Request) -> str:
    """``tenant/namespace`` from the path; 412 if either name is not a valid Pulsar name."""
    tenant, namespace = request.match_info["tenant"], request.match_info["namespace"]
    try:
        check_named_entity("tenant", tenant)
        check_named_entity("namespace", namespace)
    except InvalidTopicNameError:
        raise precondition_failed("Namespace name is not valid") from None
    return f"{tenant}/{namespace}"


def policies_of(request: web.Request) -> PolicyStore:
    return service_of(request).policies


async def existing_policies(request: web.Request, ns: str) -> Policies:
    policies = await policies_of(request).namespace(ns)
    if policies is None:
        raise not_found("Namespace does not exist")
    return policies


def optional_json(value: Any) -> web.Response:
    """A policy value, or 204 for an unset (null) one as Pulsar answers."""
    if value is None:
        return no_content()
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json", exclude_none=True)
    return json_response(value)


_BACKLOG_QUOTA_TYPES: dict[str, BacklogQuotaType] = {
    "destination_storage": "destination_storage",
    "message_age": "message_age",
}


def backlog_quota_type(request: web.Request) -> BacklogQuotaType:
    """The ``backlogQuotaType`` query parameter (default ``destination_storage``)."""
    value = request.query.get("backlogQuotaType") or "destination_storage"
    quota_type = _BACKLOG_QUOTA_TYPES.get(value)
    if quota_type is not None:
        return quota_type
    raise bad_request(f"Invalid backlogQuotaType: {value!r} (destination_storage or message_age)")


async def namespace_topics(service: Any, ns: str) -> tuple[list[TopicName], list[TopicName]]:
    """(partitioned topics, other topics) of a namespace; partitions of partitioned topics excluded."""
    partitioned = [
        TopicName.parse(t)
        for domain in ("persistent", "non-persistent")
        for t in await service.resources.list_partitioned_topics(ns, domain)
    ]
    bases = {str(t) for t in partitioned}
    others = [
        TopicName.parse(t)
        for t in await service.list_topics(ns, pb.CommandGetTopicsOfNamespace.ALL)
        if str(TopicName.parse(t).partitioned_base) not in bases
    ]
    return partitioned, others


async def delete_namespace_records(service: Any, ns: str, *, force: bool) -> None:
    """Delete a namespace: refused (409) while it has non-system topics unless ``force``, which deletes
    them (disconnecting their clients) first."""
    store: PolicyStore = service.policies
    if await store.namespace(ns) is None:
        raise not_found(f"Namespace {ns} does not exist.")
    partitioned, others = await namespace_topics(service, ns)
    topics = partitioned + others
    if not force and any(not is_system_topic(t) for t in topics):
        raise conflict("Cannot delete non empty namespace")

    def mark_deleted(policies: Policies) -> None:
        policies.deleted = True

    # Marked first, as Pulsar does, so nobody mistakes it for a live namespace meanwhile.
    await store.update_namespace(ns, mark_deleted)
    for topic in topics:
        # A topic that vanished meanwhile is fine.
        with contextlib.suppress(TopicNotFoundError):
            await service.delete_topic(topic, force=True)
    await service.resources.delete_namespace(ns)
    log.info("deleted namespace %s", ns)


# ---------------------------------------------------------------------------------------- namespaces
@routes.get(
    "/admin/v2/namespaces/{tenant}",
    summary="List a tenant's namespaces",
    responses={200: "Namespace names (tenant/ns)", 404: "Tenant not found", 412: "Tenant name is not valid"},
)
async def list_namespaces(request: web.Request) -> web.Response:
    tenant = request.match_info["tenant"]
    try:
        check_named_entity("tenant", tenant)
    except InvalidTopicNameError:
        raise precondition_failed("Tenant name is not valid") from None
    resources = service_of(request).resources
    if await resources.get_tenant(tenant) is None:
        raise not_found("Tenant not found")
    return json_response(sorted(await resources.list_namespaces(tenant)))


@routes.get(_NS, summary="Get all policies of a namespace", responses={200: "Policies", **_NOT_FOUND})
async def get_policies(request: web.Request) -> web.Response:
    ns = namespace_of(request)
    policies = await existing_policies(request, ns)
    config = service_of(request).config
    if policies.is_allow_auto_update_schema is None:
        # Pulsar answers the broker default for namespaces created before the field existed.
        policies.is_allow_auto_update_schema = config.is_allow_auto_update_schema_enabled
    return json_response(policies.to_json())


@routes.put(
    _NS,
    summary="Create a namespace, optionally with policies",
    body=Policies,
    responses={
        204: "Namespace created",
        400: "Malformed policies",
        403: "Cluster not allowed for the tenant",
        404: "Tenant does not exist",
        409: "Namespace already exists",
        412: "Namespace name or policies not valid",
    },
)
async def create_namespace(request: web.Request) -> web.Response:
    ns = namespace_of(request)
    service = service_of(request)
    body = await json_body(request, Policies, required=False)
    # Without a body: Pulsar's defaults (bundles and replication clusters are filled in below).
    policies = body if body is not None else default_namespace_policies(service.config.cluster_name)
    tenant = ns.split("/")[0]
    tenant_info = await service.resources.get_tenant(tenant)
    if tenant_info is None:
        raise not_found("Tenant does not exist")
    if not policies.replication_clusters:
        policies.replication_clusters = [service.config.cluster_name]
    allowed = set(tenant_info.get("allowedClusters", []))
    for cluster in policies.replication_clusters:
        if cluster not in allowed:
            raise RestError(
                403, f"Cluster [{cluster}] is not in the list of allowed clusters list for tenant [{tenant}]"
            )
    validate_namespace_policies(policies, service.config)
    if not await service.resources.create_namespace(ns, policies.to_json()):
        raise conflict("Namespace already exists")
    log.info("created namespace %s", ns)
    return no_content()


@routes.delete(
    _NS,
    summary="Delete a namespace (force=true also deletes its topics)",
    query={"force": bool, "authoritative": bool},
    responses={
        204: "Namespace deleted",
        404: "Namespace does not exist",
        405: "Forced deletion of namespaces is disabled",
        409: "Namespace is not empty",
        412: "Namespace name is not valid",
    },
)
async def delete_namespace(request: web.Request) -> web.Response:
    ns = namespace_of(request)
    force = query_bool(request, "force")
    query_bool(request, "authoritative")
    service = service_of(request)
    if force and not service.config.force_delete_namespace_allowed:
        raise RestError(405, "Broker doesn't allow forced deletion of namespaces")
    await delete_namespace_records(service, ns, force=force)
    return no_content()


@routes.get(
    _NS + "/topics",
    summary="List the topics of a namespace",
    query={"mode": str, "includeSystemTopic": bool},
    responses={200: "Topic names", 400: "Invalid mode", **_NOT_FOUND},
)
async def list_topics(request: web.Request) -> web.Response:
    ns = namespace_of(request)
    mode_name = request.query.get("mode", "PERSISTENT")
    mode = _MODES.get(mode_name)
    if mode is None:
        raise bad_request(f"Invalid mode: {mode_name!r} (PERSISTENT, NON_PERSISTENT or ALL)")
    include_system = query_bool(request, "includeSystemTopic")
    await existing_policies(request, ns)
    topics = await service_of(request).list_topics(ns, mode)
    if not include_system:
        topics = without_system_topics(topics)
    return json_response(topics)


# ---------------------------------------------------------------------------------------- policy endpoints
def _update(request: web.Request, ns: str, mutate: Callable[[Policies], object]) -> Any:
    return policies_of(request).update_namespace(ns, mutate)


def _register_object(
    segment: str,
    attr: str,
    model: Any,
    label: str,
    check: Callable[[web.Request, Policies, Any], None] | None = None,
    errors: dict[int, str] | None = None,
) -> None:
    """GET / POST / DELETE of one namespace policy stored in ``Policies.<attr>``: a pydantic model or a
    scalar type; ``check`` refuses a value before it is stored."""
    path = f"{_NS}/{segment}"
    errors = errors or {400: "Malformed or invalid value", 412: "Conflicts with other policies"}

    @routes.get(path, summary=f"Get the namespace's {label}", responses={200: label, 204: "Not set", **_NOT_FOUND})
    async def get_value(request: web.Request) -> web.Response:
        ns = namespace_of(request)
        return optional_json(getattr(await existing_policies(request, ns), attr))

    @routes.post(
        path,
        summary=f"Set the namespace's {label}",
        body=model,
        responses={204: "Set", **errors, **_NOT_FOUND},
    )
    async def set_value(request: web.Request) -> web.Response:
        ns = namespace_of(request)
        value = await json_body(request, model)

        def mutate(policies: Policies) -> None:
            if check is not None:
                check(request, policies, value)
            setattr(policies, attr, value)

        await _update(request, ns, mutate)
        return no_content()

    @routes.delete(path, summary=f"Remove the namespace's {label}", responses={204: "Removed", **_NOT_FOUND})
    async def remove_value(request: web.Request) -> web.Response:
        ns = namespace_of(request)
        await _update(request, ns, lambda p: setattr(p, attr, None))
        return no_content()


def _register_scalar(segment: str, attr: str, kind: type, negative_reason: str | None, label: str) -> None:
    """GET / POST / DELETE of one scalar (int or bool) namespace policy stored in ``Policies.<attr>``."""

    def refuse_negative(request: web.Request, policies: Policies, value: Any) -> None:
        if value < 0:
            raise precondition_failed(negative_reason or "")

    _register_object(
        segment,
        attr,
        Int32 if kind is int else bool,
        label,
        refuse_negative if negative_reason else None,
        {400: "Malformed value", 412: "Invalid value"},
    )


_SCALARS: list[tuple[str, str, type, str | None, str]] = [
    ("messageTTL", "message_ttl_in_seconds", int, "Invalid value for message TTL, message TTL must >= 0",
     "message TTL in seconds"),
    ("subscriptionExpirationTime", "subscription_expiration_time_minutes", int,
     "Invalid value for subscription expiration time", "subscription expiration time in minutes"),
    ("deduplication", "deduplicationEnabled", bool, None, "broker-side deduplication flag"),
    ("maxProducersPerTopic", "max_producers_per_topic", int, "maxProducersPerTopic must be 0 or more",
     "maximum producers per topic"),
    ("maxConsumersPerTopic", "max_consumers_per_topic", int, "maxConsumersPerTopic must be 0 or more",
     "maximum consumers per topic"),
    ("maxConsumersPerSubscription", "max_consumers_per_subscription", int,
     "maxConsumersPerSubscription must be 0 or more", "maximum consumers per subscription"),
    ("maxUnackedMessagesPerConsumer", "max_unacked_messages_per_consumer", int,
     "maxUnackedMessagesPerConsumer must be 0 or more", "maximum unacknowledged messages per consumer"),
    ("maxUnackedMessagesPerSubscription", "max_unacked_messages_per_subscription", int,
     "maxUnackedMessagesPerSubscription must be 0 or more", "maximum unacknowledged messages per subscription"),
    ("maxSubscriptionsPerTopic", "max_subscriptions_per_topic", int, "maxSubscriptionsPerTopic must be 0 or more",
     "maximum subscriptions per topic"),
]  # fmt: skip
for _segment, _attr, _kind, _reason, _label in _SCALARS:
    _register_scalar(_segment, _attr, _kind, _reason, _label)


def _check_retention(request: web.Request, policies: Policies, retention: RetentionPolicies) -> None:
    validate_retention(retention)
    if not retention_fits_quotas(policies.backlog_quota_map, retention, service_of(request).config):
        raise precondition_failed("Retention Quota must exceed configured backlog quota for namespace.")


def _check_persistence(request: web.Request, policies: Policies, persistence: PersistencePolicies) -> None:
    validate_persistence(persistence, service_of(request).config)


def _check_auto_topic(request: web.Request, policies: Policies, override: AutoTopicCreationOverride) -> None:
    validate_auto_topic_creation(override, service_of(request).config)


_register_object("retention", "retention_policies", RetentionPolicies, "retention policies", _check_retention)
_register_object("persistence", "persistence", PersistencePolicies, "persistence policies", _check_persistence)
_register_object(
    "autoTopicCreation", "autoTopicCreationOverride", AutoTopicCreationOverride, "auto topic creation override",
    _check_auto_topic,
)  # fmt: skip
_register_object(
    "autoSubscriptionCreation", "autoSubscriptionCreationOverride", AutoSubscriptionCreationOverride,
    "auto subscription creation override",
)  # fmt: skip
_register_object("delayedDelivery", "delayed_delivery_policies", DelayedDeliveryPolicies, "delayed delivery policies")
_register_object("inactiveTopicPolicies", "inactive_topic_policies", InactiveTopicPolicies, "inactive topic policies")


# ---------------------------------------------------------------------------------------- backlog quotas
@routes.get(
    _NS + "/backlogQuotaMap",
    summary="Get the namespace's backlog quotas by type",
    responses={200: "Map of backlog quota type to BacklogQuota", **_NOT_FOUND},
)
async def get_backlog_quota_map(request: web.Request) -> web.Response:
    ns = namespace_of(request)
    policies = await existing_policies(request, ns)
    return json_response({k: v.to_json() for k, v in policies.backlog_quota_map.items()})


@routes.post(
    _NS + "/backlogQuota",
    summary="Set a backlog quota of the namespace",
    body=BacklogQuota,
    query={"backlogQuotaType": BacklogQuotaType},
    responses={204: "Set", 400: "Malformed quota", 412: "Quota exceeds the retention policy", **_NOT_FOUND},
)
async def set_backlog_quota(request: web.Request) -> web.Response:
    ns = namespace_of(request)
    quota_type = backlog_quota_type(request)
    quota = await json_body(request, BacklogQuota)
    config = service_of(request).config

    def mutate(policies: Policies) -> None:
        retention = policies.retention_policies
        # Pulsar checks only a storage quota against retention (a time quota checks the default one).
        checked = quota if quota_type == "destination_storage" else None
        if retention is not None and not backlog_quota_fits(checked, retention, config):
            raise precondition_failed(
                "Backlog Quota exceeds configured retention quota for namespace. Please increase retention quota "
                "and retry"
            )
        policies.backlog_quota_map[quota_type] = quota

    await _update(request, ns, mutate)
    return no_content()


@routes.delete(
    _NS + "/backlogQuota",
    summary="Remove a backlog quota of the namespace",
    query={"backlogQuotaType": BacklogQuotaType},
    responses={204: "Removed", 400: "Invalid backlogQuotaType", **_NOT_FOUND},
)
async def remove_backlog_quota(request: web.Request) -> web.Response:
    ns = namespace_of(request)
    quota_type = backlog_quota_type(request)
    await _update(request, ns, lambda p: p.backlog_quota_map.pop(quota_type, None))
    return no_content()


# ---------------------------------------------------------------------------------------- schema compatibility
@routes.get(
    _NS + "/schemaCompatibilityStrategy",
    summary="Get the namespace's schema compatibility strategy",
    responses={200: "Strategy name", **_NOT_FOUND},
)
async def get_schema_compatibility(request: web.Request) -> web.Response:
    ns = namespace_of(request)
    return json_response((await existing_policies(request, ns)).schema_compatibility_strategy)


@routes.put(
    _NS + "/schemaCompatibilityStrategy",
    summary="Set the namespace's schema compatibility strategy",
    body=SchemaCompatibilityStrategy,
    responses={204: "Set", 400: "Unknown strategy", **_NOT_FOUND},
)
async def set_schema_compatibility(request: web.Request) -> web.Response:
    ns = namespace_of(request)
    strategy = await json_body(request, SchemaCompatibilityStrategy)
    await _update(request, ns, lambda p: setattr(p, "schema_compatibility_strategy", strategy))
    return no_content()
