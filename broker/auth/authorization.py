"""Authorization: what an authenticated role may do (Pulsar's ``PulsarAuthorizationProvider``).

Who may do what:

- superusers (``superUserRoles``) may do everything;
- a tenant's admins (``adminRoles`` of its ``TenantInfo``) administer the tenant, its namespaces and topics;
- other roles hold actions (:class:`AuthAction`) granted on a namespace (``auth_policies.namespace_auth``) or
  on one topic (``auth_policies.destination_auth``), optionally matched by wildcard roles (``a.*``, ``*.a``)
  when ``authorizationAllowWildcardsMatching`` is on;
- consuming also needs the subscription's roles (``subscription_auth_roles``, when set) and, in the
  namespace's ``Prefix`` ``subscription_auth_mode``, a subscription name starting with the role.

Every operation names its requirement in one table (:data:`TOPIC_OPERATIONS`, :data:`NAMESPACE_OPERATIONS`);
callers ask :meth:`AuthorizationService.check_topic` / :meth:`~AuthorizationService.check_namespace` /
:meth:`~AuthorizationService.check_tenant_admin` / :meth:`~AuthorizationService.check_superuser`, which raise
:class:`~magnetar.broker.errors.AuthorizationError`. A tenant that does not exist is simply one the role does
not administer: the answer is the same 403 as for an existing one, so other tenants' names never leak.

Namespace policies come from the :class:`~magnetar.broker.policies.PolicyStore` (cached, invalidated by
metadata watches); tenants' admin roles are cached here the same way. Listeners added with
:meth:`AuthorizationService.add_listener` hear of every change that may take a permission away, on this
broker or another, so live producers and consumers can be re-checked.
"""

from __future__ import annotations

import contextlib
import enum
import json
import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from typing import Literal

from magnetar.broker.config import BrokerConfig
from magnetar.broker.errors import AuthorizationError, NamespaceNotFoundError
from magnetar.broker.policies import Policies, PolicyStore
from magnetar.broker.topic_name import TopicName
from magnetar.metadata.api import MetadataStore, Notification

log = logging.getLogger(__name__)

TENANTS_ROOT = "/admin/policies"
MAX_CACHED_TENANTS = 10_000


class AuthAction(enum.StrEnum):
    """Pulsar's ``AuthAction``: what a permission grants."""

    produce = "produce"
    consume = "consume"
    functions = "functions"
    sources = "sources"
    sinks = "sinks"
    packages = "packages"


#: The actions' JSON spelling, for request bodies (``["produce", "consume"]``).
AuthActionName = Literal["produce", "consume", "functions", "sources", "sinks", "packages"]


class Rule(enum.Enum):
    """What an operation requires of a role that is neither a superuser nor the tenant's admin."""

    #: Nothing more: only superusers and tenant admins.
    ADMIN = "admin"
    #: ``produce`` on the topic (or its namespace).
    PRODUCE = "produce"
    #: ``consume`` on the topic (or its namespace), the subscription's roles and auth mode.
    CONSUME = "consume"
    #: ``produce`` or ``consume`` (Pulsar's ``canLookup``).
    LOOKUP = "lookup"
    #: ``produce`` or ``consume`` granted on the namespace itself.
    NAMESPACE_PRODUCE_OR_CONSUME = "namespace produce or consume"
    #: ``consume`` granted on the namespace itself.
    NAMESPACE_CONSUME = "namespace consume"
    #: ``packages`` granted on the namespace itself.
    NAMESPACE_PACKAGES = "namespace packages"


class TopicOperation(enum.StrEnum):
    """Pulsar's ``TopicOperation`` names (as in its error messages)."""

    LOOKUP = "LOOKUP"
    GET_METADATA = "GET_METADATA"
    GET_STATS = "GET_STATS"
    GET_SCHEMA = "GET_SCHEMA"
    PRODUCE = "PRODUCE"
    CONSUME = "CONSUME"
    SUBSCRIBE = "SUBSCRIBE"
    UNSUBSCRIBE = "UNSUBSCRIBE"
    GET_SUBSCRIPTIONS = "GET_SUBSCRIPTIONS"
    SKIP = "SKIP"
    EXPIRE_MESSAGES = "EXPIRE_MESSAGES"
    PEEK_MESSAGES = "PEEK_MESSAGES"
    RESET_CURSOR = "RESET_CURSOR"
    GET_BACKLOG_SIZE = "GET_BACKLOG_SIZE"
    # Tenant admins only:
    CREATE_TOPIC = "CREATE_TOPIC"
    DELETE_TOPIC = "DELETE_TOPIC"
    UPDATE_METADATA = "UPDATE_METADATA"
    TERMINATE = "TERMINATE"
    COMPACT = "COMPACT"
    UNLOAD = "UNLOAD"
    GRANT_PERMISSION = "GRANT_PERMISSION"
    GET_PERMISSION = "GET_PERMISSION"
    REVOKE_PERMISSION = "REVOKE_PERMISSION"
    SCHEMA_ADMIN = "SCHEMA_ADMIN"
    POLICIES = "POLICIES"


class NamespaceOperation(enum.StrEnum):
    """Pulsar's ``NamespaceOperation`` names, plus ``POLICIES`` for its namespace policy operations."""

    GET_TOPICS = "GET_TOPICS"
    GET_TOPIC = "GET_TOPIC"
    UNSUBSCRIBE = "UNSUBSCRIBE"
    CLEAR_BACKLOG = "CLEAR_BACKLOG"
    PACKAGES = "PACKAGES"
    # Tenant admins only:
    CREATE_TOPIC = "CREATE_TOPIC"
    DELETE_TOPIC = "DELETE_TOPIC"
    GET_BUNDLE = "GET_BUNDLE"
    GRANT_PERMISSION = "GRANT_PERMISSION"
    GET_PERMISSION = "GET_PERMISSION"
    REVOKE_PERMISSION = "REVOKE_PERMISSION"
    POLICIES = "POLICIES"


#: The one table of what each topic operation needs (Pulsar's ``allowTopicOperationAsync``).
TOPIC_OPERATIONS: Mapping[TopicOperation, Rule] = {
    TopicOperation.LOOKUP: Rule.LOOKUP,
    TopicOperation.GET_METADATA: Rule.LOOKUP,
    TopicOperation.GET_STATS: Rule.LOOKUP,
    TopicOperation.GET_SCHEMA: Rule.LOOKUP,
    TopicOperation.PRODUCE: Rule.PRODUCE,
    TopicOperation.CONSUME: Rule.CONSUME,
    TopicOperation.SUBSCRIBE: Rule.CONSUME,
    TopicOperation.UNSUBSCRIBE: Rule.CONSUME,
    TopicOperation.GET_SUBSCRIPTIONS: Rule.CONSUME,
    TopicOperation.SKIP: Rule.CONSUME,
    TopicOperation.EXPIRE_MESSAGES: Rule.CONSUME,
    TopicOperation.PEEK_MESSAGES: Rule.CONSUME,
    TopicOperation.RESET_CURSOR: Rule.CONSUME,
    TopicOperation.GET_BACKLOG_SIZE: Rule.CONSUME,
    TopicOperation.CREATE_TOPIC: Rule.ADMIN,
    TopicOperation.DELETE_TOPIC: Rule.ADMIN,
    TopicOperation.UPDATE_METADATA: Rule.ADMIN,
    TopicOperation.TERMINATE: Rule.ADMIN,
    TopicOperation.COMPACT: Rule.ADMIN,
    TopicOperation.UNLOAD: Rule.ADMIN,
    TopicOperation.GRANT_PERMISSION: Rule.ADMIN,
    TopicOperation.GET_PERMISSION: Rule.ADMIN,
    TopicOperation.REVOKE_PERMISSION: Rule.ADMIN,
    TopicOperation.SCHEMA_ADMIN: Rule.ADMIN,
    TopicOperation.POLICIES: Rule.ADMIN,
}

#: The one table of what each namespace operation needs (Pulsar's ``allowNamespaceOperationAsync``).
NAMESPACE_OPERATIONS: Mapping[NamespaceOperation, Rule] = {
    NamespaceOperation.GET_TOPICS: Rule.NAMESPACE_PRODUCE_OR_CONSUME,
    NamespaceOperation.GET_TOPIC: Rule.NAMESPACE_PRODUCE_OR_CONSUME,
    NamespaceOperation.UNSUBSCRIBE: Rule.NAMESPACE_CONSUME,
    NamespaceOperation.CLEAR_BACKLOG: Rule.NAMESPACE_CONSUME,
    NamespaceOperation.PACKAGES: Rule.NAMESPACE_PACKAGES,
    NamespaceOperation.CREATE_TOPIC: Rule.ADMIN,
    NamespaceOperation.DELETE_TOPIC: Rule.ADMIN,
    NamespaceOperation.GET_BUNDLE: Rule.ADMIN,
    NamespaceOperation.GRANT_PERMISSION: Rule.ADMIN,
    NamespaceOperation.GET_PERMISSION: Rule.ADMIN,
    NamespaceOperation.REVOKE_PERMISSION: Rule.ADMIN,
    NamespaceOperation.POLICIES: Rule.ADMIN,
}

SUPERUSER_REQUIRED = "This operation requires super-user access"
TENANT_ADMIN_REQUIRED = "Don't have permission to administrate resources on this tenant"


def split_roles(value: str) -> frozenset[str]:
    """A comma list of roles (``superUserRoles``) as a set, blanks dropped."""
    return frozenset(r.strip() for r in value.split(",") if r.strip())


def wildcard_match(role: str, permitted: str) -> bool:
    """Pulsar's wildcard roles: ``prefix*`` and ``*suffix`` (only at the start or the end)."""
    if not permitted:
        return False
    if permitted.endswith("*") and role.startswith(permitted[:-1]):
        return True
    return permitted.startswith("*") and role.endswith(permitted[1:])


class AuthorizationService:
    """Decides every operation of a role; see the module docstring.

    With ``authorizationEnabled`` off (or authentication off: there is no role to check) every check passes.
    """

    def __init__(self, config: BrokerConfig, store: MetadataStore, policies: PolicyStore) -> None:
        self.config = config
        self.store = store
        self.policies = policies
        #: Whether checks apply: they need authorization on and an authenticated role (Pulsar's rule).
        self.enabled = config.authorization_enabled and config.authentication_enabled
        self.superusers = split_roles(config.super_user_roles)
        self.wildcards = config.authorization_allow_wildcards_matching
        #: Tenant -> admin roles (None: no such tenant), least recently used first; bounded, as any client
        #: can make the broker look up made-up tenant names.
        self._tenants: OrderedDict[str, frozenset[str] | None] = OrderedDict()
        self._tenants_epoch = 0
        self._listeners: list[Callable[[str], None]] = []
        self._unwatch: list[Callable[[], None]] = []
        if self.enabled:
            self._unwatch.append(store.watch(TENANTS_ROOT + "/", self._on_tenant_change))
            policies.add_listener(self._on_policies_change)

    def close(self) -> None:
        """Stop watching the store."""
        for unwatch in self._unwatch:
            unwatch()
        self._unwatch.clear()

    # -- change notifications
    def add_listener(self, callback: Callable[[str], None]) -> None:
        """Call ``callback(scope)`` when permissions may have changed: ``scope`` is a tenant (its admin roles
        changed) or ``tenant/namespace`` (the namespace's policies changed)."""
        self._listeners.append(callback)

    def _notify(self, scope: str) -> None:
        for callback in list(self._listeners):
            try:
                callback(scope)
            except Exception:
                log.exception("authorization listener failed for %s", scope)

    def _on_tenant_change(self, note: Notification) -> None:
        tenant = note.path[len(TENANTS_ROOT) + 1 :]
        if "/" in tenant:
            return  # a namespace: the policy store tells us
        self._tenants_epoch += 1
        self._tenants.pop(tenant, None)
        self._notify(tenant)

    def _on_policies_change(self, name: str) -> None:
        if "://" not in name:  # topic-level policies hold no permissions
            self._notify(name)

    @property
    def cached_tenants(self) -> int:
        """How many tenants' admin roles are cached (bounded by :data:`MAX_CACHED_TENANTS`)."""
        return len(self._tenants)

    # -- roles
    def is_superuser(self, role: str | None) -> bool:
        return role is not None and role in self.superusers

    async def _admin_roles(self, tenant: str) -> frozenset[str] | None:
        if tenant in self._tenants:
            self._tenants.move_to_end(tenant)
            return self._tenants[tenant]
        epoch = self._tenants_epoch
        stored = await self.store.get(f"{TENANTS_ROOT}/{tenant}") if tenant and "/" not in tenant else None
        roles: frozenset[str] | None = None
        if stored is not None:
            try:
                roles = frozenset(json.loads(stored.data).get("adminRoles") or ())
            except (ValueError, AttributeError, TypeError):
                log.warning("unreadable tenant record %s", tenant)
                roles = frozenset()
        if epoch == self._tenants_epoch:  # not invalidated while reading
            self._tenants[tenant] = roles
            if len(self._tenants) > MAX_CACHED_TENANTS:
                self._tenants.popitem(last=False)
        return roles

    async def is_tenant_admin(self, tenant: str, role: str | None) -> bool:
        """Superuser, or one of the tenant's ``adminRoles`` (a missing tenant has none)."""
        if self.is_superuser(role):
            return True
        if role is None:
            return False
        roles = await self._admin_roles(tenant)
        return roles is not None and role in roles

    # -- permissions
    def _holds(self, role: str, action: str, grants: Mapping[str, Iterable[str]] | None) -> bool:
        if not grants:
            return False
        actions = grants.get(role)
        if actions is not None and action in actions:
            return True
        return self.wildcards and any(
            action in permitted and wildcard_match(role, name) for name, permitted in grants.items()
        )

    async def _namespace_policies(self, namespace: str) -> Policies | None:
        # Read-only use of the shared cached document: a copy per check costs more than the check.
        return await self.policies.namespace_view(namespace)

    async def has_permission(self, topic: TopicName, role: str | None, action: AuthAction) -> bool:
        """``action`` granted to ``role`` on the topic's namespace, the topic, or (for a partition) its
        partitioned topic (Pulsar's ``checkPermission``)."""
        if role is None:
            return False
        policies = await self._namespace_policies(topic.namespace)
        if policies is None:
            return False
        auth = policies.auth_policies
        if self._holds(role, action, auth.namespace_auth):
            return True
        if self._holds(role, action, auth.destination_auth.get(str(topic))):
            return True
        return topic.partition_index >= 0 and self._holds(
            role, action, auth.destination_auth.get(str(topic.partitioned_base))
        )

    async def has_namespace_permission(self, namespace: str, role: str | None, action: AuthAction) -> bool:
        """``action`` granted to ``role`` on the namespace itself."""
        tenant, _, name = namespace.partition("/")
        if role is None or not tenant or not name or "/" in name:
            return False
        policies = await self._namespace_policies(namespace)
        return policies is not None and self._holds(role, action, policies.auth_policies.namespace_auth)

    async def can_produce(self, topic: TopicName, role: str | None) -> bool:
        return await self.has_permission(topic, role, AuthAction.produce)

    async def can_consume(self, topic: TopicName, role: str | None, subscription: str | None) -> bool:
        """Consume permission, the subscription's roles, and the namespace's subscription auth mode.

        A name refused by the ``Prefix`` mode raises :class:`AuthorizationError` with Pulsar's message."""
        if role is None:
            return False
        if subscription:
            policies = await self._namespace_policies(topic.namespace)
            if policies is not None:
                roles = policies.auth_policies.subscription_auth_roles.get(subscription)
                if roles and role not in roles:
                    return False
                if policies.subscription_auth_mode == "Prefix" and not subscription.startswith(role):
                    raise AuthorizationError(
                        "Failed to create consumer - The subscription name needs to be prefixed by the "
                        f"authentication role, like {role}-xxxx for topic: {topic}"
                    )
        return await self.has_permission(topic, role, AuthAction.consume)

    async def can_lookup(self, topic: TopicName, role: str | None) -> bool:
        return await self.can_produce(topic, role) or await self.can_consume(topic, role, None)

    async def remove_topic_permissions(self, topic: TopicName) -> None:
        """Forget the grants on a deleted topic and its partitions (as Pulsar does), so a topic created
        later under that name starts without them."""
        policies = await self._namespace_policies(topic.namespace)
        if policies is None:
            return
        name = str(topic)
        stale = [k for k in policies.auth_policies.destination_auth if k == name or k.startswith(name + "-partition-")]
        if not stale:
            return

        def drop(p: Policies) -> None:
            for key in stale:
                p.auth_policies.destination_auth.pop(key, None)

        with contextlib.suppress(NamespaceNotFoundError):
            await self.policies.update_namespace(topic.namespace, drop)

    # -- operations
    async def allow_topic(
        self, topic: TopicName, role: str | None, operation: TopicOperation, subscription: str | None = None
    ) -> bool:
        """Whether ``role`` may do ``operation`` on ``topic`` (always, when authorization is off)."""
        if not self.enabled or await self.is_tenant_admin(topic.tenant, role):
            return True
        rule = TOPIC_OPERATIONS[operation]
        if rule is Rule.PRODUCE:
            return await self.can_produce(topic, role)
        if rule is Rule.CONSUME:
            return await self.can_consume(topic, role, subscription)
        if rule is Rule.LOOKUP:
            return await self.can_lookup(topic, role)
        return False

    async def allow_namespace(self, namespace: str, role: str | None, operation: NamespaceOperation) -> bool:
        """Whether ``role`` may do ``operation`` on ``namespace`` (``tenant/ns``)."""
        tenant = namespace.split("/", 1)[0]
        if not self.enabled or await self.is_tenant_admin(tenant, role):
            return True
        rule = NAMESPACE_OPERATIONS[operation]
        if rule is Rule.NAMESPACE_PRODUCE_OR_CONSUME:
            return await self.has_namespace_permission(
                namespace, role, AuthAction.produce
            ) or await self.has_namespace_permission(namespace, role, AuthAction.consume)
        if rule is Rule.NAMESPACE_CONSUME:
            return await self.has_namespace_permission(namespace, role, AuthAction.consume)
        if rule is Rule.NAMESPACE_PACKAGES:
            return await self.has_namespace_permission(namespace, role, AuthAction.packages)
        return False

    async def check_topic(
        self,
        topic: TopicName,
        role: str | None,
        operation: TopicOperation,
        subscription: str | None = None,
        message: str | None = None,
    ) -> None:
        """:class:`AuthorizationError` unless :meth:`allow_topic`."""
        if not await self.allow_topic(topic, role, operation, subscription):
            log.info("role %r refused %s on %s", role, operation, topic)
            raise AuthorizationError(
                message or f"Unauthorized to validateTopicOperation for operation [{operation}] on topic [{topic}]"
            )

    async def check_namespace(
        self, namespace: str, role: str | None, operation: NamespaceOperation, message: str | None = None
    ) -> None:
        """:class:`AuthorizationError` unless :meth:`allow_namespace`."""
        if not await self.allow_namespace(namespace, role, operation):
            log.info("role %r refused %s on %s", role, operation, namespace)
            raise AuthorizationError(
                message
                or f"Unauthorized to validateNamespaceOperation for operation [{operation}] on namespace [{namespace}]"
            )

    async def check_tenant_admin(self, tenant: str, role: str | None) -> None:
        """:class:`AuthorizationError` unless ``role`` administers ``tenant`` (or authorization is off)."""
        if self.enabled and not await self.is_tenant_admin(tenant, role):
            log.info("role %r refused: not an admin of tenant %s", role, tenant)
            raise AuthorizationError(TENANT_ADMIN_REQUIRED)

    def check_superuser(self, role: str | None) -> None:
        """:class:`AuthorizationError` unless ``role`` is a superuser (or authorization is off)."""
        if self.enabled and not self.is_superuser(role):
            log.info("role %r refused: not a superuser", role)
            raise AuthorizationError(SUPERUSER_REQUIRED)
