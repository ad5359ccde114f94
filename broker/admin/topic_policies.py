"""Topic-level policies: ``/admin/v2/persistent/{tenant}/{namespace}/{topic}/<policy>`` (the policy part of
Pulsar's ``PersistentTopics`` resource).

Each policy has ``GET`` (``applied=true`` answers the effective value: topic, else namespace, else broker
default), ``POST`` (``PUT`` for ``schemaCompatibilityStrategy``) and ``DELETE``. Writes answer 204; an
unset policy reads as 204 with no body. Policies are set on a topic or a partitioned topic, never on a
single partition, and the topic must exist (404). ``isGlobal`` and ``authoritative`` are accepted and
ignored (one cluster).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiohttp import web
from pydantic import BaseModel

from magnetar.broker.admin.api import (
    RestError,
    Routes,
    bad_request,
    json_body,
    json_response,
    no_content,
    not_found,
    precondition_failed,
    query_bool,
    query_int,
    service_of,
)
from magnetar.broker.admin.namespaces import backlog_quota_type, optional_json
from magnetar.broker.config import BrokerConfig
from magnetar.broker.errors import InvalidTopicNameError
from magnetar.broker.policies import (
    AutoSubscriptionCreationOverride,
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
    TopicPolicies,
    backlog_quota_fits,
    default_backlog_quota,
    resolve,
    validate_persistence,
    validate_retention,
)
from magnetar.broker.topic_name import TopicName

routes = Routes("topic policies")

_TOPIC = "/admin/v2/persistent/{tenant}/{namespace}/{topic}"
_READ_QUERY: dict[str, Any] = {"applied": bool, "isGlobal": bool, "authoritative": bool}
_WRITE_QUERY: dict[str, Any] = {"isGlobal": bool, "authoritative": bool}
_ERRORS = {
    404: "Topic does not exist",
    405: "Topic level policies are disabled",
    412: "Topic name is not valid, or a partition",
}


class _Context:
    """A validated topic-policy request: the topic, the policy store and the broker config."""

    def __init__(self, request: web.Request, topic: TopicName) -> None:
        self.request = request
        self.topic = topic
        self.service = service_of(request)
        self.store: PolicyStore = self.service.policies
        self.config = self.service.config

    async def namespace(self) -> Policies:
        return await self.store.namespace(self.topic.namespace) or Policies()

    async def overrides(self) -> TopicPolicies:
        return await self.store.topic(self.topic) or TopicPolicies()

    async def update(self, mutate: Callable[[TopicPolicies], object]) -> None:
        await self.store.update_topic(self.topic, mutate)


async def _context(request: web.Request) -> _Context:
    """Pulsar's topic-policy pre-validation: valid name, policies enabled, not a partition, topic exists."""
    m = request.match_info
    try:
        topic = TopicName.parse(f"persistent://{m['tenant']}/{m['namespace']}/{m['topic']}")
    except InvalidTopicNameError:
        raise precondition_failed("Topic name is not valid") from None
    for name in ("applied", "isGlobal", "authoritative"):
        query_bool(request, name)
    ctx = _Context(request, topic)
    if not ctx.config.topic_level_policies_enabled:
        raise RestError(405, "Topic level policies is disabled, to enable the topic level policy and retry.")
    if topic.partition_index >= 0:
        raise precondition_failed("Not allowed to set/get topic policy for a partition")
    resources = ctx.service.resources
    exists = await resources.namespace_exists(topic.namespace) and (
        await resources.get_partitions(topic) > 0 or await ctx.service.topic_exists(topic)
    )
    if not exists:
        raise not_found(f"Topic {topic} not found")
    return ctx


def _applied(request: web.Request) -> bool:
    return query_bool(request, "applied")


def _register(
    segment: str,
    label: str,
    body: Any,
    read: Callable[[TopicPolicies], Any],
    write: Callable[[TopicPolicies, Any], None],
    fallback: Callable[[_Context, Policies], Any],
    check: Callable[[_Context, TopicPolicies, Any], None] | None = None,
    *,
    set_method: str = "post",
) -> None:
    """GET / POST (or PUT) / DELETE of one topic-level policy.

    ``read`` extracts the override (``None`` = unset), ``write`` stores a value (``None`` removes it),
    ``fallback`` gives the namespace-or-broker value ``applied=true`` answers when the topic has none.
    """
    path = f"{_TOPIC}/{segment}"

    @routes.get(
        path,
        summary=f"Get the topic's {label}",
        query=_READ_QUERY,
        responses={200: label, 204: "Not set", **_ERRORS},
    )
    async def get_value(request: web.Request) -> web.Response:
        ctx = await _context(request)
        value = read(await ctx.overrides())
        if value is None and _applied(request):
            value = fallback(ctx, await ctx.namespace())
        return optional_json(value)

    async def set_value(request: web.Request) -> web.Response:
        ctx = await _context(request)
        value = await json_body(request, body)
        if check is not None:
            check(ctx, await ctx.overrides(), value)
        await ctx.update(lambda tp: write(tp, value))
        return no_content()

    getattr(routes, set_method)(
        path,
        summary=f"Set the topic's {label}",
        body=body,
        query=_WRITE_QUERY,
        responses={204: "Set", 400: "Malformed or invalid value", **_ERRORS},
    )(set_value)

    @routes.delete(
        path, summary=f"Remove the topic's {label}", query=_WRITE_QUERY, responses={204: "Removed", **_ERRORS}
    )
    async def remove_value(request: web.Request) -> web.Response:
        ctx = await _context(request)
        await ctx.update(lambda tp: write(tp, None))
        return no_content()


def _non_negative(reason: str) -> Callable[[_Context, TopicPolicies, Any], None]:
    def check(ctx: _Context, tp: TopicPolicies, value: int) -> None:
        if value < 0:
            raise precondition_failed(reason)

    return check


def _attr(name: str) -> tuple[Callable[[TopicPolicies], Any], Callable[[TopicPolicies, Any], None]]:
    return (lambda tp: getattr(tp, name)), (lambda tp, value: setattr(tp, name, value))


# -- retention
async def _retention_quota_check(ctx: _Context, retention: RetentionPolicies) -> None:
    tp, ns = await ctx.overrides(), await ctx.namespace()
    quota = tp.backLogQuotaMap.get("destination_storage") or ns.backlog_quota_map.get("destination_storage")
    if not backlog_quota_fits(quota, retention, ctx.config):
        raise precondition_failed(
            "Retention Quota must exceed configured backlog quota for topic. Please increase retention quota and retry"
        )


def _ns_or(attr: str, broker_default: Callable[[BrokerConfig], Any]) -> Callable[[_Context, Policies], Any]:
    def fallback(ctx: _Context, ns: Policies) -> Any:
        value = getattr(ns, attr)
        return value if value is not None else broker_default(ctx.config)

    return fallback


# Integer policies: (path segment, label, TopicPolicies attribute, reason for a negative value, applied fallback)
for _segment, _label, _attr_name, _reason, _fallback in [
    ("maxProducers", "maximum producers", "maxProducerPerTopic", "maxProducers must be 0 or more",
     _ns_or("max_producers_per_topic", lambda c: c.max_producers_per_topic)),
    ("maxConsumers", "maximum consumers", "maxConsumerPerTopic", "maxConsumers must be 0 or more",
     _ns_or("max_consumers_per_topic", lambda c: c.max_consumers_per_topic)),
    ("maxConsumersPerSubscription", "maximum consumers per subscription", "maxConsumersPerSubscription",
     "Invalid value for maxConsumersPerSubscription",
     _ns_or("max_consumers_per_subscription", lambda c: c.max_consumers_per_subscription)),
    ("maxUnackedMessagesOnConsumer", "maximum unacknowledged messages per consumer", "maxUnackedMessagesOnConsumer",
     "maxUnackedNum must be 0 or more",
     _ns_or("max_unacked_messages_per_consumer", lambda c: c.max_unacked_messages_per_consumer)),
    ("maxUnackedMessagesOnSubscription", "maximum unacknowledged messages per subscription",
     "maxUnackedMessagesOnSubscription", "maxUnackedNum must be 0 or more",
     _ns_or("max_unacked_messages_per_subscription", lambda c: c.max_unacked_messages_per_subscription)),
    ("maxSubscriptionsPerTopic", "maximum subscriptions", "maxSubscriptionsPerTopic",
     "maxSubscriptionsPerTopic must be 0 or more",
     _ns_or("max_subscriptions_per_topic", lambda c: c.max_subscriptions_per_topic)),
]:  # fmt: skip
    _register(_segment, _label, Int32, *_attr(_attr_name), _fallback, _non_negative(_reason))

_register(
    "deduplicationEnabled",
    "deduplication flag",
    bool,
    *_attr("deduplicationEnabled"),
    _ns_or("deduplicationEnabled", lambda c: c.broker_deduplication_enabled),
)


def _retention_fallback(ctx: _Context, ns: Policies) -> Any:
    return ns.retention_policies or RetentionPolicies(
        retentionTimeInMinutes=int(ctx.config.default_retention_time_in_minutes),
        retentionSizeInMB=int(ctx.config.default_retention_size_in_mb),
    )


def _persistence_fallback(ctx: _Context, ns: Policies) -> Any:
    c = ctx.config
    return ns.persistence or PersistencePolicies(
        bookkeeperEnsemble=c.managed_ledger_default_ensemble_size,
        bookkeeperWriteQuorum=c.managed_ledger_default_write_quorum,
        bookkeeperAckQuorum=c.managed_ledger_default_ack_quorum,
        managedLedgerMaxMarkDeleteRate=c.managed_ledger_default_mark_delete_rate_limit,
    )


def _check_persistence(ctx: _Context, tp: TopicPolicies, persistence: PersistencePolicies) -> None:
    validate_persistence(persistence, ctx.config)


def _inactive_fallback(ctx: _Context, ns: Policies) -> Any:
    if ns.inactive_topic_policies is not None:
        return ns.inactive_topic_policies
    eff = resolve(ctx.config, None, None)
    return InactiveTopicPolicies(
        inactiveTopicDeleteMode=eff.inactive_topic_delete_mode,  # type: ignore[arg-type]
        maxInactiveDurationSeconds=eff.inactive_topic_max_seconds,
        deleteWhileInactive=eff.inactive_topic_delete_while_inactive,
    )


def _auto_subscription_fallback(ctx: _Context, ns: Policies) -> Any:
    return ns.autoSubscriptionCreationOverride or AutoSubscriptionCreationOverride(
        allowAutoSubscriptionCreation=bool(ctx.config.allow_auto_subscription_creation)
    )


_register("persistence", "persistence policies", PersistencePolicies, *_attr("persistence"), _persistence_fallback,
          _check_persistence)  # fmt: skip
_register("inactiveTopicPolicies", "inactive topic policies", InactiveTopicPolicies, *_attr("inactiveTopicPolicies"),
          _inactive_fallback)  # fmt: skip
_register("autoSubscriptionCreation", "auto subscription creation override", AutoSubscriptionCreationOverride,
          *_attr("autoSubscriptionCreationOverride"), _auto_subscription_fallback)  # fmt: skip


# -- delayed delivery: stored as three TopicPolicies fields, served as DelayedDeliveryPolicies
def _read_delayed(tp: TopicPolicies) -> DelayedDeliveryPolicies | None:
    if tp.delayedDeliveryEnabled is None and tp.delayedDeliveryTickTimeMillis is None:
        return None
    return DelayedDeliveryPolicies(
        tickTime=tp.delayedDeliveryTickTimeMillis or 0,
        active=bool(tp.delayedDeliveryEnabled),
        maxDeliveryDelayInMillis=tp.delayedDeliveryMaxDelayInMillis or 0,
    )


def _write_delayed(tp: TopicPolicies, value: DelayedDeliveryPolicies | None) -> None:
    tp.delayedDeliveryEnabled = None if value is None else value.active
    tp.delayedDeliveryTickTimeMillis = None if value is None else value.tickTime
    tp.delayedDeliveryMaxDelayInMillis = None if value is None else value.maxDeliveryDelayInMillis


def _delayed_fallback(ctx: _Context, ns: Policies) -> Any:
    c = ctx.config
    return ns.delayed_delivery_policies or DelayedDeliveryPolicies(
        tickTime=c.delayed_delivery_tick_time_millis,
        active=c.delayed_delivery_enabled,
        maxDeliveryDelayInMillis=c.delayed_delivery_max_delay_in_millis,
    )


def _check_delayed(ctx: _Context, tp: TopicPolicies, value: DelayedDeliveryPolicies) -> None:
    if value.tickTime < 0 or value.maxDeliveryDelayInMillis < 0:
        raise precondition_failed(
            "Invalid delayed delivery policies: tickTime and maxDeliveryDelayInMillis must be >= 0"
        )


_register("delayedDelivery", "delayed delivery policies", DelayedDeliveryPolicies, _read_delayed, _write_delayed,
          _delayed_fallback, _check_delayed)  # fmt: skip


# -- schema compatibility (PUT, as Pulsar)
def _schema_fallback(ctx: _Context, ns: Policies) -> Any:
    return resolve(ctx.config, ns, None).schema_compatibility_strategy


_register("schemaCompatibilityStrategy", "schema compatibility strategy", SchemaCompatibilityStrategy,
          *_attr("schemaCompatibilityStrategy"), _schema_fallback, set_method="put")  # fmt: skip


# -- retention: checked against the backlog quota in force
@routes.get(
    _TOPIC + "/retention",
    summary="Get the topic's retention policies",
    query=_READ_QUERY,
    responses={200: "RetentionPolicies", 204: "Not set", **_ERRORS},
)
async def get_retention(request: web.Request) -> web.Response:
    ctx = await _context(request)
    value: BaseModel | None = (await ctx.overrides()).retentionPolicies
    if value is None and _applied(request):
        value = _retention_fallback(ctx, await ctx.namespace())
    return optional_json(value)


@routes.post(
    _TOPIC + "/retention",
    summary="Set the topic's retention policies",
    body=RetentionPolicies,
    query=_WRITE_QUERY,
    responses={204: "Set", 400: "Invalid retention policies", **_ERRORS, 412: "Smaller than the backlog quota"},
)
async def set_retention(request: web.Request) -> web.Response:
    ctx = await _context(request)
    retention = await json_body(request, RetentionPolicies)
    validate_retention(retention)
    await _retention_quota_check(ctx, retention)
    await ctx.update(lambda tp: setattr(tp, "retentionPolicies", retention))
    return no_content()


@routes.delete(
    _TOPIC + "/retention",
    summary="Remove the topic's retention policies",
    query=_WRITE_QUERY,
    responses={204: "Removed", **_ERRORS},
)
async def remove_retention(request: web.Request) -> web.Response:
    ctx = await _context(request)
    await ctx.update(lambda tp: setattr(tp, "retentionPolicies", None))
    return no_content()


# -- message TTL: the value travels as the messageTTL query parameter, as in Pulsar
@routes.get(
    _TOPIC + "/messageTTL",
    summary="Get the topic's message TTL in seconds",
    query=_READ_QUERY,
    responses={200: "TTL in seconds", 204: "Not set", **_ERRORS},
)
async def get_message_ttl(request: web.Request) -> web.Response:
    ctx = await _context(request)
    value = (await ctx.overrides()).messageTTLInSeconds
    if value is None and _applied(request):
        ns = await ctx.namespace()
        value = _ns_or("message_ttl_in_seconds", lambda c: c.ttl_duration_default_in_seconds)(ctx, ns)
    return optional_json(value)


@routes.post(
    _TOPIC + "/messageTTL",
    summary="Set the topic's message TTL in seconds",
    query={"messageTTL": Int32, **_WRITE_QUERY},
    responses={204: "Set", 400: "Malformed value", **_ERRORS, 412: "Invalid message TTL"},
)
async def set_message_ttl(request: web.Request) -> web.Response:
    ctx = await _context(request)
    ttl = query_int(request, "messageTTL")
    if ttl is None:
        # Tolerated: the value as a JSON body, like the namespace endpoint takes it.
        ttl = await json_body(request, Int32, required=False)
    if ttl is None or ttl < 0:
        raise precondition_failed("Invalid value for message TTL")
    if ttl > 2**31 - 1:
        raise bad_request(f"Invalid integer for query parameter messageTTL: {ttl}")
    await ctx.update(lambda tp: setattr(tp, "messageTTLInSeconds", ttl))
    return no_content()


@routes.delete(
    _TOPIC + "/messageTTL",
    summary="Remove the topic's message TTL",
    query=_WRITE_QUERY,
    responses={204: "Removed", **_ERRORS},
)
async def remove_message_ttl(request: web.Request) -> web.Response:
    ctx = await _context(request)
    await ctx.update(lambda tp: setattr(tp, "messageTTLInSeconds", None))
    return no_content()


# -- backlog quotas
@routes.get(
    _TOPIC + "/backlogQuotaMap",
    summary="Get the topic's backlog quotas by type",
    query=_READ_QUERY,
    responses={200: "Map of backlog quota type to BacklogQuota", **_ERRORS},
)
async def get_backlog_quota_map(request: web.Request) -> web.Response:
    ctx = await _context(request)
    quotas: dict[BacklogQuotaType, BacklogQuota] = dict((await ctx.overrides()).backLogQuotaMap)
    if not quotas and _applied(request):
        quotas = dict((await ctx.namespace()).backlog_quota_map)
        if not quotas:
            quotas = dict.fromkeys(("destination_storage", "message_age"), default_backlog_quota(ctx.config))
    return json_response({kind: quota.to_json() for kind, quota in quotas.items()})


@routes.post(
    _TOPIC + "/backlogQuota",
    summary="Set a backlog quota of the topic",
    body=BacklogQuota,
    query={"backlogQuotaType": BacklogQuotaType, **_WRITE_QUERY},
    responses={204: "Set", 400: "Malformed quota", **_ERRORS, 412: "Quota exceeds the retention policy"},
)
async def set_backlog_quota(request: web.Request) -> web.Response:
    ctx = await _context(request)
    quota_type = backlog_quota_type(request)
    quota = await json_body(request, BacklogQuota)
    retention = (await ctx.overrides()).retentionPolicies or (await ctx.namespace()).retention_policies
    if not backlog_quota_fits(quota, retention, ctx.config):
        raise precondition_failed(
            "Backlog Quota exceeds configured retention quota for topic. Please increase retention quota and retry"
        )
    await ctx.update(lambda tp: tp.backLogQuotaMap.__setitem__(quota_type, quota))
    return no_content()


@routes.delete(
    _TOPIC + "/backlogQuota",
    summary="Remove a backlog quota of the topic",
    query={"backlogQuotaType": BacklogQuotaType, **_WRITE_QUERY},
    responses={204: "Removed", 400: "Invalid backlogQuotaType", **_ERRORS},
)
async def remove_backlog_quota(request: web.Request) -> web.Response:
    ctx = await _context(request)
    quota_type = backlog_quota_type(request)
    await ctx.update(lambda tp: tp.backLogQuotaMap.pop(quota_type, None))
    return no_content()


# -- compaction threshold (bytes of backlog after the last compaction)
def _check_threshold(ctx: _Context, tp: TopicPolicies, value: int) -> None:
    if not 0 <= value < 2**63:
        raise precondition_failed("Invalid value for compactionThreshold")


_register("compactionThreshold", "compaction threshold", int, *_attr("compactionThreshold"),
          _ns_or("compaction_threshold", lambda c: c.broker_service_compaction_threshold_in_bytes),
          _check_threshold)  # fmt: skip
