"""Permissions: grant, revoke and list what roles may do on a namespace, a topic or a subscription, and the
namespace's subscription auth mode (Pulsar's ``Namespaces`` / ``PersistentTopics`` permission endpoints).

Everything is stored in the namespace's ``Policies.auth_policies`` with Pulsar's JSON (``namespace_auth``,
``destination_auth`` keyed by full topic name, ``subscription_auth_roles``), so a change reaches every
broker through the metadata store's watches. Only superusers and the tenant's admins get here (see
:mod:`.access`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

from aiohttp import web
from pydantic import ConfigDict

from magnetar.broker.admin.api import (
    Routes,
    bad_request,
    json_body,
    json_response,
    no_content,
    precondition_failed,
    service_of,
)
from magnetar.broker.admin.namespaces import existing_policies, namespace_of, policies_of
from magnetar.broker.admin.topics import TOPIC, topic_from
from magnetar.broker.auth.authorization import AuthActionName, TopicOperation
from magnetar.broker.auth.provider import request_role
from magnetar.broker.errors import InvalidTopicNameError
from magnetar.broker.policies import Policies, StrictModel
from magnetar.broker.policies.documents import SubscriptionAuthMode
from magnetar.broker.topic_name import TopicName

log = logging.getLogger(__name__)
routes = Routes("permissions")

_NS = "/admin/v2/namespaces/{tenant}/{namespace}"
_NOT_FOUND = {403: "Not a superuser or an admin of the tenant", 404: "Namespace does not exist"}


def _actions(actions: Iterable[str]) -> list[str]:
    return sorted(set(actions))


async def _set_auth_entry(request: web.Request, ns: str, field: str, key: str, value: list[str]) -> None:
    """Store ``auth_policies.<field>[key] = value`` in the namespace's policies."""

    def mutate(policies: Policies) -> None:
        getattr(policies.auth_policies, field)[key] = value

    await policies_of(request).update_namespace(ns, mutate)


def _grant_on_topic(policies: Policies, topic: TopicName, role: str, actions: Iterable[str]) -> None:
    policies.auth_policies.destination_auth.setdefault(str(topic), {})[role] = _actions(actions)


def _revoke_on_topic(policies: Policies, topic: TopicName, role: str) -> bool:
    """Drop the role's grants on the topic itself (and the topic's entry once empty); whether it had any."""
    destination = policies.auth_policies.destination_auth
    grants = destination.get(str(topic), {})
    had = role in grants
    grants.pop(role, None)
    if not grants:
        destination.pop(str(topic), None)
    return had


# ---------------------------------------------------------------------------------------- namespace
@routes.get(
    _NS + "/permissions",
    summary="Roles and the actions granted to them on the namespace",
    responses={200: "role -> actions", **_NOT_FOUND},
)
async def get_namespace_permissions(request: web.Request) -> web.Response:
    policies = await existing_policies(request, namespace_of(request))
    return json_response(policies.auth_policies.namespace_auth)


@routes.post(
    _NS + "/permissions/{role}",
    summary="Grant actions (produce, consume, functions, sources, sinks, packages) on the namespace to a role",
    body=list[AuthActionName],
    responses={204: "Granted", 400: "Malformed actions", **_NOT_FOUND},
)
async def grant_namespace_permission(request: web.Request) -> web.Response:
    ns = namespace_of(request)
    role = request.match_info["role"]
    actions = _actions(await json_body(request, list[AuthActionName]))
    await _set_auth_entry(request, ns, "namespace_auth", role, actions)
    log.info("granted %s on namespace %s to role %s", actions, ns, role)
    return no_content()


@routes.delete(
    _NS + "/permissions/{role}",
    summary="Revoke every action a role was granted on the namespace",
    responses={204: "Revoked", **_NOT_FOUND},
)
async def revoke_namespace_permission(request: web.Request) -> web.Response:
    ns = namespace_of(request)
    role = request.match_info["role"]
    await policies_of(request).update_namespace(ns, lambda p: p.auth_policies.namespace_auth.pop(role, None))
    log.info("revoked the permissions of role %s on namespace %s", role, ns)
    return no_content()


# ---------------------------------------------------------------------------------------- subscriptions
@routes.get(
    _NS + "/permissions/subscription",
    summary="Subscriptions and the roles allowed to use them",
    responses={200: "subscription -> roles", **_NOT_FOUND},
)
async def get_subscription_permissions(request: web.Request) -> web.Response:
    policies = await existing_policies(request, namespace_of(request))
    return json_response(policies.auth_policies.subscription_auth_roles)


@routes.post(
    _NS + "/permissions/subscription/{subscription}",
    summary="Allow only these roles to use a subscription (of any topic of the namespace)",
    body=list[str],
    responses={204: "Granted", 400: "Malformed roles", **_NOT_FOUND},
)
async def grant_subscription_permission(request: web.Request) -> web.Response:
    ns = namespace_of(request)
    subscription = request.match_info["subscription"]
    roles = sorted(set(await json_body(request, list[str])))
    await _set_auth_entry(request, ns, "subscription_auth_roles", subscription, roles)
    log.info("subscription %s of namespace %s limited to roles %s", subscription, ns, roles)
    return no_content()


@routes.delete(
    _NS + "/permissions/{subscription}/{role}",
    summary="Remove a role from a subscription's allowed roles",
    responses={204: "Revoked", 412: "The subscription has no roles", **_NOT_FOUND},
)
async def revoke_subscription_permission(request: web.Request) -> web.Response:
    ns = namespace_of(request)
    subscription, role = request.match_info["subscription"], request.match_info["role"]

    def revoke(policies: Policies) -> None:
        roles = policies.auth_policies.subscription_auth_roles.get(subscription)
        if roles is None:
            raise precondition_failed("couldn't find subscription")
        policies.auth_policies.subscription_auth_roles[subscription] = [r for r in roles if r != role]

    await policies_of(request).update_namespace(ns, revoke)
    return no_content()


# ---------------------------------------------------------------------------------------- subscription auth mode
@routes.get(
    _NS + "/subscriptionAuthMode",
    summary="The namespace's subscription auth mode (None, or Prefix: names start with the role)",
    responses={200: "None or Prefix", **_NOT_FOUND},
)
async def get_subscription_auth_mode(request: web.Request) -> web.Response:
    policies = await existing_policies(request, namespace_of(request))
    return json_response(policies.subscription_auth_mode)


@routes.post(
    _NS + "/subscriptionAuthMode",
    summary="Set the namespace's subscription auth mode",
    body=SubscriptionAuthMode,
    responses={204: "Set", 400: "Not None or Prefix", **_NOT_FOUND},
)
async def set_subscription_auth_mode(request: web.Request) -> web.Response:
    ns = namespace_of(request)
    mode = await json_body(request, SubscriptionAuthMode, required=False) or "None"
    await policies_of(request).update_namespace(ns, lambda p: setattr(p, "subscription_auth_mode", mode))
    return no_content()


# ---------------------------------------------------------------------------------------- topics
@routes.get(
    TOPIC + "/permissions",
    summary="Roles and their actions on the topic (namespace grants and the topic's own, united)",
    responses={200: "role -> actions", **_NOT_FOUND},
)
async def get_topic_permissions(request: web.Request) -> web.Response:
    topic = topic_from(request)
    auth = (await existing_policies(request, topic.namespace)).auth_policies
    merged = {role: set(actions) for role, actions in auth.namespace_auth.items()}
    for role, actions in auth.destination_auth.get(str(topic), {}).items():
        merged.setdefault(role, set()).update(actions)
    return json_response({role: sorted(actions) for role, actions in merged.items()})


@routes.post(
    TOPIC + "/permissions/{role}",
    summary="Grant actions on the topic (and its partitions) to a role",
    body=list[AuthActionName],
    responses={204: "Granted", 400: "Malformed actions", **_NOT_FOUND},
)
async def grant_topic_permission(request: web.Request) -> web.Response:
    topic = topic_from(request)
    role = request.match_info["role"]
    actions = _actions(await json_body(request, list[AuthActionName]))
    await policies_of(request).update_namespace(topic.namespace, lambda p: _grant_on_topic(p, topic, role, actions))
    log.info("granted %s on topic %s to role %s", actions, topic, role)
    return no_content()


@routes.delete(
    TOPIC + "/permissions/{role}",
    summary="Revoke every action a role was granted on the topic itself",
    responses={204: "Revoked", 412: "The role has no permission on the topic itself", **_NOT_FOUND},
)
async def revoke_topic_permission(request: web.Request) -> web.Response:
    topic = topic_from(request)
    role = request.match_info["role"]

    def revoke(policies: Policies) -> None:
        if not _revoke_on_topic(policies, topic, role):
            raise precondition_failed("Permissions are not set at the topic level")

    await policies_of(request).update_namespace(topic.namespace, revoke)
    log.info("revoked the permissions of role %s on topic %s", role, topic)
    return no_content()


# ---------------------------------------------------------------------------------------- several topics at once
class RevokeTopicPermissionOptions(StrictModel):
    """Pulsar's ``RevokeTopicPermissionOptions``."""

    model_config = ConfigDict(extra="forbid", strict=True, title="RevokeTopicPermissionOptions")

    topic: str
    role: str


class GrantTopicPermissionOptions(RevokeTopicPermissionOptions):
    """Pulsar's ``GrantTopicPermissionOptions``."""

    model_config = ConfigDict(extra="forbid", strict=True, title="GrantTopicPermissionOptions")

    actions: list[AuthActionName]


async def _topics_of_one_namespace(
    request: web.Request, options: Sequence[RevokeTopicPermissionOptions]
) -> tuple[str, list[TopicName]]:
    """The topics the options name, all of one namespace, that the caller administers (the body names the
    topics, so the handler asks the authorization service itself)."""
    try:
        topics = [TopicName.parse(o.topic) for o in options]
    except InvalidTopicNameError as exc:
        raise precondition_failed(str(exc)) from None
    namespaces = {t.namespace for t in topics}
    if len(namespaces) != 1:
        raise bad_request("The topics must all belong to one namespace")
    await service_of(request).authorization.check_topic(
        topics[0], request_role(request), TopicOperation.GRANT_PERMISSION
    )
    return namespaces.pop(), topics


@routes.post(
    "/admin/v2/namespaces/grantPermissionsOnTopics",
    summary="Grant actions to roles on several topics of one namespace",
    body=list[GrantTopicPermissionOptions],
    responses={204: "Granted", 400: "Malformed, or topics of several namespaces", **_NOT_FOUND},
)
async def grant_permissions_on_topics(request: web.Request) -> web.Response:
    options = await json_body(request, list[GrantTopicPermissionOptions])
    ns, topics = await _topics_of_one_namespace(request, options)

    def grant(policies: Policies) -> None:
        for topic, option in zip(topics, options, strict=True):
            _grant_on_topic(policies, topic, option.role, option.actions)

    await policies_of(request).update_namespace(ns, grant)
    return no_content()


@routes.post(
    "/admin/v2/namespaces/revokePermissionsOnTopics",
    summary="Revoke roles' permissions on several topics of one namespace",
    body=list[RevokeTopicPermissionOptions],
    responses={204: "Revoked", 400: "Malformed, or topics of several namespaces", **_NOT_FOUND},
)
async def revoke_permissions_on_topics(request: web.Request) -> web.Response:
    options = await json_body(request, list[RevokeTopicPermissionOptions])
    ns, topics = await _topics_of_one_namespace(request, options)

    def revoke(policies: Policies) -> None:
        for topic, option in zip(topics, options, strict=True):
            _revoke_on_topic(policies, topic, option.role)

    await policies_of(request).update_namespace(ns, revoke)
    return no_content()
