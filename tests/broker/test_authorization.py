"""AuthorizationService against a real (embedded) metadata store: Pulsar's PulsarAuthorizationProvider rules."""

from __future__ import annotations

import asyncio
import json
import typing
from collections.abc import AsyncIterator

import pytest

from magnetar.broker.auth.authorization import (
    NAMESPACE_OPERATIONS,
    TOPIC_OPERATIONS,
    AuthAction,
    AuthActionName,
    AuthorizationService,
    NamespaceOperation,
    TopicOperation,
    wildcard_match,
)
from magnetar.broker.config import BrokerConfig
from magnetar.broker.errors import AuthorizationError
from magnetar.broker.policies import Policies, PolicyStore
from magnetar.broker.resources import Resources, default_policies
from magnetar.broker.topic_name import TopicName
from magnetar.metadata.embedded import EmbeddedMetadataStore

T = TopicName.parse
TOPIC = T("persistent://acme/ns/orders")


class Env:
    def __init__(self, store: EmbeddedMetadataStore, authz: AuthorizationService, policies: PolicyStore) -> None:
        self.store, self.authz, self.policies = store, authz, policies
        self.resources = Resources(store)

    async def grant(self, mutate: object) -> None:
        await self.policies.update_namespace("acme/ns", mutate)  # type: ignore[arg-type]


async def _env(**settings: object) -> tuple[EmbeddedMetadataStore, Env]:
    config = BrokerConfig(authentication_enabled=True, authorization_enabled=True, super_user_roles="root, ops")
    for key, value in settings.items():
        setattr(config, key, value)
    store = EmbeddedMetadataStore(":memory:")
    await store.start()
    policies = PolicyStore(store, config)
    env = Env(store, AuthorizationService(config, store, policies), policies)
    await env.resources.create_tenant("acme", {"adminRoles": ["acme-admin"], "allowedClusters": ["standalone"]})
    await env.resources.create_namespace("acme/ns", default_policies("standalone"))
    return store, env


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    store, e = await _env()
    yield e
    e.authz.close()
    e.policies.close()
    await store.close()


async def test_superuser_and_tenant_admin(env: Env) -> None:
    authz = env.authz
    for op in TopicOperation:
        assert await authz.allow_topic(TOPIC, "root", op, "sub")
        assert await authz.allow_topic(TOPIC, "acme-admin", op, "sub")
    assert await authz.is_tenant_admin("acme", "ops")
    assert not await authz.is_tenant_admin("acme", "alice")
    assert not await authz.is_tenant_admin("other", "acme-admin")
    # A tenant that does not exist is just one the role does not administer.
    assert not await authz.is_tenant_admin("ghost", "acme-admin")
    with pytest.raises(AuthorizationError, match="administrate resources on this tenant"):
        await authz.check_tenant_admin("ghost", "acme-admin")
    with pytest.raises(AuthorizationError, match="super-user"):
        authz.check_superuser("acme-admin")
    authz.check_superuser("root")


async def test_namespace_and_topic_permissions(env: Env) -> None:
    authz = env.authz
    assert not await authz.allow_topic(TOPIC, "alice", TopicOperation.PRODUCE)
    await env.grant(lambda p: p.auth_policies.namespace_auth.update(alice=["produce"]))
    assert await authz.allow_topic(TOPIC, "alice", TopicOperation.PRODUCE)
    assert await authz.allow_topic(T("persistent://acme/ns/any"), "alice", TopicOperation.LOOKUP)
    assert not await authz.allow_topic(TOPIC, "alice", TopicOperation.CONSUME, "s")
    # Topic-level grants cover that topic (and its partitions) only.
    await env.grant(lambda p: p.auth_policies.destination_auth.update({str(TOPIC): {"bob": ["consume"]}}))
    assert await authz.allow_topic(TOPIC, "bob", TopicOperation.CONSUME, "s")
    assert await authz.allow_topic(TOPIC.partition(3), "bob", TopicOperation.SUBSCRIBE, "s")
    assert await authz.allow_topic(TOPIC, "bob", TopicOperation.LOOKUP)
    assert not await authz.allow_topic(T("persistent://acme/ns/other"), "bob", TopicOperation.CONSUME, "s")
    assert not await authz.allow_topic(TOPIC, "bob", TopicOperation.PRODUCE)
    # Admin-only operations stay refused to roles with produce/consume.
    for op, rule in TOPIC_OPERATIONS.items():
        if rule.value == "admin":
            assert not await authz.allow_topic(TOPIC, "alice", op)
    # Namespace operations: listing topics needs produce or consume granted on the namespace itself.
    assert await authz.allow_namespace("acme/ns", "alice", NamespaceOperation.GET_TOPICS)
    assert not await authz.allow_namespace("acme/ns", "bob", NamespaceOperation.GET_TOPICS)
    for op, rule in NAMESPACE_OPERATIONS.items():
        if rule.value == "admin":
            assert not await authz.allow_namespace("acme/ns", "alice", op)
    # No role, or another tenant: nothing.
    assert not await authz.allow_topic(TOPIC, None, TopicOperation.LOOKUP)
    assert not await authz.allow_topic(T("persistent://other/ns/orders"), "alice", TopicOperation.LOOKUP)


async def test_revoke_is_seen_at_once(env: Env) -> None:
    """The policy cache is invalidated by the metadata watch: a revoke applies to the next check."""
    authz = env.authz
    changes: list[str] = []
    authz.add_listener(changes.append)
    await env.grant(lambda p: p.auth_policies.namespace_auth.update(alice=["produce"]))
    assert await authz.allow_topic(TOPIC, "alice", TopicOperation.PRODUCE)

    # Written behind the service's back (as another broker would): the watch invalidates the cache.
    stored = await env.store.get("/admin/policies/acme/ns")
    assert stored is not None
    data = json.loads(stored.data)
    data["auth_policies"]["namespace_auth"] = {}
    await env.store.put("/admin/policies/acme/ns", json.dumps(data).encode(), stored.stat.version)
    for _ in range(100):
        if not await authz.allow_topic(TOPIC, "alice", TopicOperation.PRODUCE):
            break
        await asyncio.sleep(0.02)
    assert not await authz.allow_topic(TOPIC, "alice", TopicOperation.PRODUCE)
    assert "acme/ns" in changes

    # Tenant admin roles are cached and invalidated the same way.
    assert await authz.is_tenant_admin("acme", "acme-admin")
    await env.resources.update_tenant("acme", {"adminRoles": ["new-admin"], "allowedClusters": ["standalone"]})
    for _ in range(100):
        if await authz.is_tenant_admin("acme", "new-admin"):
            break
        await asyncio.sleep(0.02)
    assert await authz.is_tenant_admin("acme", "new-admin")
    assert not await authz.is_tenant_admin("acme", "acme-admin")
    assert "acme" in changes


async def test_subscription_permissions_and_prefix_mode(env: Env) -> None:
    authz = env.authz
    await env.grant(lambda p: p.auth_policies.namespace_auth.update(alice=["consume"], bob=["consume"]))
    await env.grant(lambda p: p.auth_policies.subscription_auth_roles.update(billing=["alice"]))
    assert await authz.allow_topic(TOPIC, "alice", TopicOperation.SUBSCRIBE, "billing")
    assert not await authz.allow_topic(TOPIC, "bob", TopicOperation.SUBSCRIBE, "billing")
    assert await authz.allow_topic(TOPIC, "bob", TopicOperation.SUBSCRIBE, "other")
    # Lookup checks no subscription.
    assert await authz.allow_topic(TOPIC, "bob", TopicOperation.LOOKUP)

    def prefix(p: Policies) -> None:
        p.subscription_auth_mode = "Prefix"

    await env.grant(prefix)
    assert await authz.allow_topic(TOPIC, "bob", TopicOperation.SUBSCRIBE, "bob-reports")
    with pytest.raises(AuthorizationError, match="prefixed by the authentication role, like bob-xxxx"):
        await authz.allow_topic(TOPIC, "bob", TopicOperation.SUBSCRIBE, "reports")
    # Admins are not bound by the mode.
    assert await authz.allow_topic(TOPIC, "acme-admin", TopicOperation.SUBSCRIBE, "reports")


async def test_wildcards_only_when_enabled() -> None:
    assert wildcard_match("my.role.1", "my.role.*")
    assert wildcard_match("1.role.my", "*.role.my")
    assert not wildcard_match("my.1.role", "my.*.role")
    for enabled in (False, True):
        store, env = await _env(authorization_allow_wildcards_matching=enabled)
        try:
            await env.grant(lambda p: p.auth_policies.namespace_auth.update({"app.*": ["produce"]}))
            await env.grant(lambda p: p.auth_policies.destination_auth.update({str(TOPIC): {"*.reader": ["consume"]}}))
            assert await env.authz.allow_topic(TOPIC, "app.one", TopicOperation.PRODUCE) is enabled
            assert await env.authz.allow_topic(TOPIC, "x.reader", TopicOperation.CONSUME, "s") is enabled
            assert not await env.authz.allow_topic(TOPIC, "x.reader", TopicOperation.PRODUCE)
        finally:
            env.authz.close()
            env.policies.close()
            await store.close()


async def test_everything_allowed_when_disabled() -> None:
    for settings in ({"authorization_enabled": False}, {"authentication_enabled": False}):
        store, env = await _env(**settings)
        try:
            assert not env.authz.enabled
            assert await env.authz.allow_topic(TOPIC, None, TopicOperation.DELETE_TOPIC)
            await env.authz.check_tenant_admin("ghost", None)
            env.authz.check_superuser(None)
        finally:
            env.authz.close()
            env.policies.close()
            await store.close()


def test_action_names_match_the_enum() -> None:
    assert set(typing.get_args(AuthActionName)) == {a.value for a in AuthAction}


def test_super_user_roles_takes_pulsars_name() -> None:
    config = BrokerConfig()
    assert config.apply({"superUserRoles": "a,b", "authorizationAllowWildcardsMatching": "true"}) == []
    assert config.super_user_roles == "a,b"
    assert config.authorization_allow_wildcards_matching


async def test_tenant_cache_is_bounded(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """Made-up tenant names (any client can send them) never grow the cache past its bound."""
    from magnetar.broker.auth import authorization

    monkeypatch.setattr(authorization, "MAX_CACHED_TENANTS", 5)
    for i in range(20):
        assert not await env.authz.is_tenant_admin(f"ghost{i}", "acme-admin")
    assert await env.authz.is_tenant_admin("acme", "acme-admin")
    assert not await env.authz.allow_topic(T("persistent://ghost0/ns/t"), "acme-admin", TopicOperation.LOOKUP)
    assert env.authz.cached_tenants <= 5
