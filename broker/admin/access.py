"""Who may call each admin endpoint: one table from route to the operation it performs, and the middleware
that asks the :class:`~magnetar.broker.auth.authorization.AuthorizationService` before any handler runs.

Checking before the handler means a role that may not act on a tenant gets the same 403 whether the
tenant, namespace or topic exists or not: other tenants' names never leak through a 404. Every route
must match a rule (tests/admin/test_authorization.py checks the registry); one that somehow does not is
treated as superuser-only.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from aiohttp import web

from magnetar.broker.admin.api import Handler, service_of
from magnetar.broker.auth.authorization import (
    AuthorizationService,
    NamespaceOperation,
    TopicOperation,
)
from magnetar.broker.auth.provider import request_role
from magnetar.broker.topic_name import TopicName

NsOp = NamespaceOperation
TopicOp = TopicOperation


@dataclass(frozen=True, slots=True)
class Requirement:
    """What a route needs: ``kind`` is ``open``, ``superuser``, ``tenant``, ``namespace``, ``topic`` or
    ``handler`` (checked by the handler, for bodies naming what is acted on)."""

    kind: str
    operation: TopicOperation | NamespaceOperation | None = None


OPEN = Requirement("open")
#: The body names what is acted on: the handler asks the authorization service itself.
IN_HANDLER = Requirement("handler")
SUPERUSER = Requirement("superuser")
TENANT_ADMIN = Requirement("tenant")


def _ns(op: NamespaceOperation) -> Requirement:
    return Requirement("namespace", op)


def _topic(op: TopicOperation) -> Requirement:
    return Requirement("topic", op)


_TOPIC = r"/admin/v2/(?:\{domain\}|persistent|non-persistent)/\{tenant\}/\{namespace\}/\{topic\}"
_SCHEMA = r"/admin/v2/schemas/\{tenant\}/\{namespace\}/\{topic\}"
_NS = r"/admin/v2/namespaces/\{tenant\}/\{namespace\}"
_SUB = _TOPIC + r"/subscription/\{subscription\}"

#: (methods, route path pattern, requirement): the first match decides. Paths are aiohttp's canonical
#: route paths (``{domain}`` for ``{domain:persistent|non-persistent}``).
RULES: list[tuple[str, str, Requirement]] = [
    # Probes and scraping: reachable by anything authentication lets through.
    ("GET", r"/status\.html", OPEN),
    ("GET", r"/admin/v2/brokers/ready", OPEN),
    ("GET", r"/metrics/?", OPEN),
    ("GET", r"/admin/v2/openapi\.json", OPEN),
    # The cluster itself.
    ("*", r"/admin/v2/(brokers|broker-stats|autorecovery|clusters)(/.*)?", SUPERUSER),
    ("GET", r"/admin/v2/tenants", SUPERUSER),
    ("PUT|DELETE", r"/admin/v2/tenants/\{tenant\}", SUPERUSER),
    ("GET|POST", r"/admin/v2/tenants/\{tenant\}", TENANT_ADMIN),
    ("GET", r"/admin/v2/namespaces/\{tenant\}", TENANT_ADMIN),
    ("POST", r"/admin/v2/namespaces/(grant|revoke)PermissionsOnTopics", IN_HANDLER),
    # Namespaces.
    ("GET", _NS + r"/topics", _ns(NsOp.GET_TOPICS)),
    ("GET", r"/admin/v2/\{domain\}/\{tenant\}/\{namespace\}(/partitioned)?", _ns(NsOp.GET_TOPICS)),
    ("GET", _NS + r"/permissions(/subscription)?", _ns(NsOp.GET_PERMISSION)),
    ("POST", _NS + r"/permissions(/subscription)?/\{[^}]+\}", _ns(NsOp.GRANT_PERMISSION)),
    ("DELETE", _NS + r"/permissions/\{[^}]+\}(/\{[^}]+\})?", _ns(NsOp.REVOKE_PERMISSION)),
    ("*", _NS + r"(/.*)?", _ns(NsOp.POLICIES)),
    # Topics: what producers and consumers may read or do themselves.
    ("GET", r"/lookup/v2/topic/\{domain\}/\{tenant\}/\{namespace\}/\{topic\}", _topic(TopicOp.LOOKUP)),
    ("GET", _TOPIC + r"/partitions", _topic(TopicOp.GET_METADATA)),
    ("GET", _TOPIC + r"/(stats|partitioned-stats|internalStats)", _topic(TopicOp.GET_STATS)),
    ("GET", _TOPIC + r"/subscriptions", _topic(TopicOp.GET_SUBSCRIPTIONS)),
    ("PUT", _SUB, _topic(TopicOp.SUBSCRIBE)),
    ("DELETE", _SUB, _topic(TopicOp.UNSUBSCRIBE)),
    ("POST", _SUB + r"/(skip/\{count\}|skip_all)", _topic(TopicOp.SKIP)),
    ("POST", _SUB + r"/resetcursor(/\{timestamp\})?", _topic(TopicOp.RESET_CURSOR)),
    ("POST", _TOPIC + r"/(subscription/\{subscription\}|all_subscription)/expireMessages/\{seconds\}",
     _topic(TopicOp.EXPIRE_MESSAGES)),
    ("GET", _SUB + r"/position/\{position\}", _topic(TopicOp.PEEK_MESSAGES)),
    ("GET", _TOPIC + r"/(examinemessage|lastMessageId|ledger/\{ledgerId\}/entry/\{entryId\})",
     _topic(TopicOp.PEEK_MESSAGES)),
    ("GET", _SCHEMA + r"/(schema|schema/\{version\}|schemas)", _topic(TopicOp.GET_SCHEMA)),
    ("POST", _SCHEMA + r"/(compatibility|version)", _topic(TopicOp.GET_SCHEMA)),
    ("POST|DELETE", _SCHEMA + r"/schema", _topic(TopicOp.SCHEMA_ADMIN)),
    # Topics: what only tenant admins may do.
    ("GET", _TOPIC + r"/permissions", _topic(TopicOp.GET_PERMISSION)),
    ("POST", _TOPIC + r"/permissions/\{role\}", _topic(TopicOp.GRANT_PERMISSION)),
    ("DELETE", _TOPIC + r"/permissions/\{role\}", _topic(TopicOp.REVOKE_PERMISSION)),
    ("PUT", _TOPIC, _topic(TopicOp.CREATE_TOPIC)),
    ("DELETE", _TOPIC + r"(/partitions)?", _topic(TopicOp.DELETE_TOPIC)),
    ("PUT|POST", _TOPIC + r"/partitions", _topic(TopicOp.UPDATE_METADATA)),
    ("PUT", _TOPIC + r"/unload", _topic(TopicOp.UNLOAD)),
    ("POST", _TOPIC + r"/terminate", _topic(TopicOp.TERMINATE)),
    ("*", _TOPIC + r"/compaction", _topic(TopicOp.COMPACT)),
    ("*", _TOPIC + r"/.*", _topic(TopicOp.POLICIES)),
]  # fmt: skip

_COMPILED: list[tuple[frozenset[str] | None, re.Pattern[str], Requirement]] = [
    (None if methods == "*" else frozenset(methods.split("|")), re.compile(path), requirement)
    for methods, path, requirement in RULES
]


@functools.lru_cache(maxsize=1024)
def requirement_for(method: str, path: str) -> Requirement | None:
    """The requirement of the route ``method path`` (canonical path), ``None`` if no rule names it.

    Cached: the canonical paths are the registered routes' (a bounded set), so each request costs one
    lookup instead of a scan of every rule's regex."""
    for methods, pattern, requirement in _COMPILED:
        if (methods is None or method in methods) and pattern.fullmatch(path):
            return requirement
    return None


def _topic_of(match: dict[str, str], path: str) -> TopicName:
    domain = match.get("domain") or ("non-persistent" if "/non-persistent/" in path else "persistent")
    return TopicName.parse(f"{domain}://{match['tenant']}/{match['namespace']}/{match['topic']}")


async def check(authz: AuthorizationService, request: web.Request, requirement: Requirement, path: str) -> None:
    """Raise :class:`~magnetar.broker.errors.AuthorizationError` unless the request's role meets ``requirement``."""
    role = request_role(request)
    match = dict(request.match_info)
    kind = requirement.kind
    if kind in ("open", "handler"):
        return
    if kind == "superuser":
        authz.check_superuser(role)
    elif kind == "tenant":
        await authz.check_tenant_admin(match["tenant"], role)
    elif kind == "namespace":
        assert isinstance(requirement.operation, NamespaceOperation)
        namespace = f"{match['tenant']}/{match['namespace']}"
        await authz.check_namespace(namespace, role, requirement.operation)
    else:
        assert isinstance(requirement.operation, TopicOperation)
        topic = _topic_of(match, path)
        await authz.check_topic(topic, role, requirement.operation, match.get("subscription"))


@web.middleware
async def authorization_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Checks every request against :data:`RULES`: runs after authentication (which sets the role), before
    the handlers and redirects."""
    authz = service_of(request).authorization
    resource = request.match_info.route.resource
    if authz.enabled and resource is not None:
        path = resource.canonical
        await check(authz, request, requirement_for(request.method, path) or SUPERUSER, path)
    return await handler(request)
