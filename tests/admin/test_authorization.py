"""Authorization on the admin API: superuser vs tenant admin vs granted roles, Pulsar's 403 bodies, no leak of
other tenants, and the permission endpoints' paths and JSON shapes."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from magnetar.broker.admin import app  # noqa: F401 - registers every module's routes
from magnetar.broker.admin.access import requirement_for
from magnetar.broker.admin.api import _PATH_PARAM, OPERATIONS
from tests.admin.test_cli import Admin, run_cli
from tests.authz_broker import SUPERUSER, AuthzBroker, running_with_tenants
from tests.conftest import StandaloneProcess

SUPER_ONLY = {"reason": "This operation requires super-user access"}
NOT_TENANT_ADMIN = {"reason": "Don't have permission to administrate resources on this tenant"}


def test_every_route_has_a_rule() -> None:
    missing = [
        f"{op.method} {op.path}"
        for op in OPERATIONS
        if requirement_for(op.method, _PATH_PARAM.sub(r"{\1}", op.path)) is None
    ]
    assert not missing


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuthzBroker]:
    yield from running_with_tenants(tmp_path_factory.mktemp("authz-rest") / "data", topic=True)


def test_superuser_only_endpoints(broker: AuthzBroker) -> None:
    for role in ("acme-admin", "someone"):
        for method, path in [
            ("GET", "/admin/v2/tenants"),
            ("PUT", "/admin/v2/tenants/newco"),
            ("DELETE", "/admin/v2/tenants/acme"),
            ("GET", "/admin/v2/clusters"),
            ("GET", "/admin/v2/clusters/standalone"),
            ("GET", "/admin/v2/brokers/configuration"),
        ]:
            reply = broker.rest(role, method, path, {"adminRoles": [], "allowedClusters": ["standalone"]}
                                if method == "PUT" else None)  # fmt: skip
            assert (reply.status, reply.json) == (403, SUPER_ONLY), (role, method, path)
    assert set(broker.rest(SUPERUSER, "GET", "/admin/v2/tenants").json) >= {"acme", "globex", "public"}
    assert broker.rest(SUPERUSER, "GET", "/admin/v2/clusters").status == 200
    # The health check is the superusers' (Pulsar's); probes use /status.html, open to anyone.
    assert broker.rest("acme-admin", "GET", "/admin/v2/brokers/health").json == SUPER_ONLY
    assert broker.rest(SUPERUSER, "GET", "/admin/v2/brokers/health").status == 200
    assert broker.rest(None, "GET", "/status.html").status == 200
    # Without credentials: authentication's 401, before any authorization.
    assert broker.rest(None, "GET", "/admin/v2/tenants").status == 401


def test_tenant_admin_administers_its_tenant_only(broker: AuthzBroker) -> None:
    admin = "acme-admin"
    assert broker.rest(admin, "GET", "/admin/v2/tenants/acme").json["adminRoles"] == ["acme-admin"]
    info = {"adminRoles": ["acme-admin", "acme-ops"], "allowedClusters": ["standalone"]}
    assert broker.rest(admin, "POST", "/admin/v2/tenants/acme", info).status == 204
    assert broker.rest("acme-ops", "GET", "/admin/v2/namespaces/acme").status == 200
    ns = f"ns-{uuid.uuid4().hex[:6]}"
    assert broker.rest(admin, "PUT", f"/admin/v2/namespaces/acme/{ns}").status == 204
    assert broker.rest(admin, "POST", f"/admin/v2/namespaces/acme/{ns}/messageTTL", 60).status == 204
    assert broker.rest(admin, "PUT", f"/admin/v2/persistent/acme/{ns}/x").status == 204
    assert broker.rest(admin, "GET", f"/admin/v2/persistent/acme/{ns}/x/stats").status == 200
    assert broker.rest(admin, "DELETE", f"/admin/v2/persistent/acme/{ns}/x").status == 204

    # Nothing of globex.
    assert (broker.rest(admin, "GET", "/admin/v2/tenants/globex").json) == NOT_TENANT_ADMIN
    assert broker.rest(admin, "GET", "/admin/v2/namespaces/globex").json == NOT_TENANT_ADMIN
    refused = broker.rest(admin, "POST", "/admin/v2/namespaces/globex/ns/messageTTL", 60)
    assert refused.status == 403
    assert refused.json == {
        "reason": "Unauthorized to validateNamespaceOperation for operation [POLICIES] on namespace [globex/ns]"
    }
    refused = broker.rest(admin, "DELETE", "/admin/v2/persistent/globex/ns/t")
    assert refused.status == 403
    assert refused.json == {
        "reason": "Unauthorized to validateTopicOperation for operation [DELETE_TOPIC] on topic [persistent://globex/ns/t]"
    }
    # The superuser administers every tenant.
    assert broker.rest(SUPERUSER, "GET", "/admin/v2/namespaces/globex").json == ["globex/ns"]


def test_no_leak_of_other_tenants(broker: AuthzBroker) -> None:
    """A role without access gets the same 403 for an existing and a missing tenant, namespace or topic."""
    for role in ("acme-admin", "someone"):
        for template in [
            "/admin/v2/tenants/{t}",
            "/admin/v2/namespaces/{t}",
            "/admin/v2/namespaces/{t}/ns",
            "/admin/v2/namespaces/{t}/ns/topics",
            "/admin/v2/persistent/{t}/ns",
            "/admin/v2/persistent/{t}/ns/t/stats",
            "/admin/v2/persistent/{t}/ns/t/partitions",
            "/admin/v2/persistent/{t}/ns/t/subscriptions",
            "/admin/v2/schemas/{t}/ns/t/schema",
            "/lookup/v2/topic/persistent/{t}/ns/t",
        ]:
            existing = broker.rest(role, "GET", template.format(t="globex"))
            missing = broker.rest(role, "GET", template.format(t="ghost"))
            assert existing.status == missing.status == 403, (role, template, existing.body, missing.body)
            assert existing.reason.replace("globex", "X") == missing.reason.replace("ghost", "X")
    # The tenant's own admin does learn that a namespace of its tenant is missing.
    assert broker.rest("acme-admin", "GET", "/admin/v2/namespaces/acme/nope").status == 404


def test_granted_roles_on_read_only_and_subscription_endpoints(broker: AuthzBroker) -> None:
    role = f"reader-{uuid.uuid4().hex[:6]}"
    assert (
        broker.rest("acme-admin", "POST", f"/admin/v2/namespaces/acme/ns/permissions/{role}", ["consume"]).status == 204
    )
    topic = "/admin/v2/persistent/acme/ns/t"
    assert broker.rest(role, "GET", f"{topic}/stats").status == 200
    assert broker.rest(role, "GET", f"{topic}/partitions").status == 200
    assert broker.rest(role, "GET", "/lookup/v2/topic/persistent/acme/ns/t").status == 200
    assert broker.rest(role, "GET", "/admin/v2/namespaces/acme/ns/topics").status == 200
    assert broker.rest(role, "PUT", f"{topic}/subscription/mine").status == 204
    assert broker.rest(role, "GET", f"{topic}/subscriptions").json == ["mine"]
    assert broker.rest(role, "POST", f"{topic}/subscription/mine/skip_all").status == 204
    assert broker.rest(role, "DELETE", f"{topic}/subscription/mine").status == 204
    # Administration stays the tenant admins'.
    for method, path in [
        ("DELETE", topic),
        ("PUT", f"{topic}/unload"),
        ("POST", f"{topic}/terminate"),
        ("GET", f"{topic}/retention"),
        ("GET", "/admin/v2/namespaces/acme/ns/retention"),
        ("GET", "/admin/v2/namespaces/acme/ns/permissions"),
        ("POST", f"/admin/v2/namespaces/acme/ns/permissions/{role}"),
        ("GET", "/admin/v2/namespaces/acme"),
    ]:
        assert broker.rest(role, method, path, ["produce"] if method == "POST" else None).status == 403, path
    # Consume does not reach the other tenant.
    assert broker.rest(role, "GET", "/admin/v2/persistent/globex/ns/t/stats").status == 403


def test_permission_endpoints_json_shapes(broker: AuthzBroker) -> None:
    admin = "acme-admin"
    ns = "/admin/v2/namespaces/acme/ns"
    assert broker.rest(admin, "POST", f"{ns}/permissions/writer", ["produce", "consume", "produce"]).status == 204
    got = broker.rest(admin, "GET", f"{ns}/permissions").json
    assert got["writer"] == ["consume", "produce"]
    bad = broker.rest(admin, "POST", f"{ns}/permissions/writer", ["fly"])
    assert bad.status == 400 and "reason" in bad.json
    assert broker.rest(admin, "DELETE", f"{ns}/permissions/writer").status == 204
    assert "writer" not in broker.rest(admin, "GET", f"{ns}/permissions").json

    # Subscription permissions.
    assert broker.rest(admin, "POST", f"{ns}/permissions/subscription/billing", ["bob", "alice"]).status == 204
    assert broker.rest(admin, "GET", f"{ns}/permissions/subscription").json == {"billing": ["alice", "bob"]}
    assert broker.rest(admin, "DELETE", f"{ns}/permissions/billing/bob").status == 204
    assert broker.rest(admin, "GET", f"{ns}/permissions/subscription").json == {"billing": ["alice"]}
    assert broker.rest(admin, "DELETE", f"{ns}/permissions/nosuch/bob").status == 412

    # Subscription auth mode.
    assert broker.rest(admin, "GET", f"{ns}/subscriptionAuthMode").json == "None"
    assert broker.rest(admin, "POST", f"{ns}/subscriptionAuthMode", "Prefix").status == 204
    assert broker.rest(admin, "GET", f"{ns}/subscriptionAuthMode").json == "Prefix"
    assert broker.rest(admin, "POST", f"{ns}/subscriptionAuthMode", "Bogus").status == 400
    assert broker.rest(admin, "POST", f"{ns}/subscriptionAuthMode", "None").status == 204

    # Topic permissions: the namespace's grants and the topic's own, united.
    topic = "/admin/v2/persistent/acme/ns/t"
    assert broker.rest(admin, "POST", f"{ns}/permissions/both", ["consume"]).status == 204
    assert broker.rest(admin, "POST", f"{topic}/permissions/both", ["produce"]).status == 204
    assert broker.rest(admin, "POST", f"{topic}/permissions/only-topic", ["produce"]).status == 204
    got = broker.rest(admin, "GET", f"{topic}/permissions").json
    assert got["both"] == ["consume", "produce"] and got["only-topic"] == ["produce"]
    stored = broker.rest(SUPERUSER, "GET", ns).json["auth_policies"]
    assert stored["destination_auth"]["persistent://acme/ns/t"] == {"both": ["produce"], "only-topic": ["produce"]}
    assert broker.rest(admin, "DELETE", f"{topic}/permissions/only-topic").status == 204
    missing = broker.rest(admin, "DELETE", f"{topic}/permissions/only-topic")
    assert missing.status == 412 and missing.json == {"reason": "Permissions are not set at the topic level"}
    # A namespace that does not exist (asked by the superuser, who may know): 404.
    assert broker.rest(SUPERUSER, "GET", "/admin/v2/namespaces/acme/ghost/permissions").status == 404


def test_cli_permission_verbs(standalone: StandaloneProcess) -> None:
    """pulsar-admin's permission verbs, against a broker without authorization (the CLI's own auth options
    are the client side's)."""
    cli = Admin(standalone.http_url)
    ns = f"public/perm-{uuid.uuid4().hex[:6]}"
    cli.ok("namespaces", "create", ns)
    try:
        cli.ok("namespaces", "grant-permission", ns, "--role", "app", "--actions", "produce,consume")
        assert cli.json("namespaces", "permissions", ns) == {"app": ["consume", "produce"]}
        cli.ok("namespaces", "grant-subscription-permission", ns, "--subscription", "s", "--roles", "app,ops")
        assert cli.json("namespaces", "get-subscription-permission", ns) == {"s": ["app", "ops"]}
        cli.ok("namespaces", "revoke-subscription-permission", ns, "--subscription", "s", "--role", "ops")
        assert cli.json("namespaces", "get-subscription-permission", ns) == {"s": ["app"]}
        cli.ok("namespaces", "set-subscription-auth-mode", ns, "-m", "Prefix")
        assert cli.json("namespaces", "get-subscription-auth-mode", ns) == "Prefix"
        topic = f"persistent://{ns}/t"
        cli.ok("topics", "grant-permission", topic, "--role", "reader", "--actions", "consume")
        assert cli.json("topics", "permissions", topic) == {"app": ["consume", "produce"], "reader": ["consume"]}
        cli.ok("topics", "revoke-permission", topic, "--role", "reader")
        cli.ok("namespaces", "revoke-permission", ns, "--role", "app")
        assert cli.json("namespaces", "permissions", ns) == {}
        assert "Permissions are not set at the topic level" in cli.fails(
            "topics", "revoke-permission", topic, "--role", "reader"
        )
        bad = run_cli(standalone.http_url, "namespaces", "grant-permission", ns, "--role", "x", "--actions", "fly")
        assert bad.returncode == 2
    finally:
        cli.ok("namespaces", "delete", ns, "--force")


def test_grant_and_revoke_on_several_topics(broker: AuthzBroker) -> None:
    grant = [
        {"topic": "persistent://acme/ns/a", "role": "multi", "actions": ["produce"]},
        {"topic": "persistent://acme/ns/b", "role": "multi", "actions": ["consume", "produce"]},
    ]
    url = "/admin/v2/namespaces/grantPermissionsOnTopics"
    assert broker.rest("acme-admin", "POST", url, grant).status == 204
    stored = broker.rest(SUPERUSER, "GET", "/admin/v2/namespaces/acme/ns").json["auth_policies"]["destination_auth"]
    assert stored["persistent://acme/ns/a"]["multi"] == ["produce"]
    assert stored["persistent://acme/ns/b"]["multi"] == ["consume", "produce"]
    # Another tenant's topics: refused; several namespaces at once: refused.
    other = [{"topic": "persistent://globex/ns/a", "role": "multi", "actions": ["produce"]}]
    assert broker.rest("acme-admin", "POST", url, other).status == 403
    assert broker.rest("acme-admin", "POST", url, grant + other).status == 400
    revoke = [{"topic": t["topic"], "role": "multi"} for t in grant]
    assert broker.rest("acme-admin", "POST", "/admin/v2/namespaces/revokePermissionsOnTopics", revoke).status == 204
    stored = broker.rest(SUPERUSER, "GET", "/admin/v2/namespaces/acme/ns").json["auth_policies"]["destination_auth"]
    assert "persistent://acme/ns/a" not in stored and "persistent://acme/ns/b" not in stored


def test_deleting_a_topic_forgets_its_grants(broker: AuthzBroker) -> None:
    topic = f"/admin/v2/persistent/acme/ns/doomed-{uuid.uuid4().hex[:6]}"
    assert broker.rest("acme-admin", "PUT", topic).status == 204
    assert broker.rest("acme-admin", "POST", f"{topic}/permissions/someone", ["produce"]).status == 204
    assert broker.rest("acme-admin", "DELETE", topic).status == 204
    assert broker.rest("acme-admin", "PUT", topic).status == 204
    assert "someone" not in broker.rest("acme-admin", "GET", f"{topic}/permissions").json
