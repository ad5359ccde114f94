"""``/admin/v2/tenants`` over real HTTP against the session's standalone broker."""

from __future__ import annotations

import uuid

import pytest

from tests.admin.rest import call
from tests.conftest import StandaloneProcess

INFO = {"adminRoles": ["admin"], "allowedClusters": ["standalone"]}


@pytest.fixture
def base(standalone: StandaloneProcess) -> str:
    return f"{standalone.http_url}/admin/v2"


@pytest.fixture
def tenant(base: str) -> str:
    name = f"t-{uuid.uuid4().hex[:8]}"
    yield name
    call("DELETE", f"{base}/tenants/{name}?force=true")


def test_public_tenant_exists(base: str) -> None:
    assert "public" in call("GET", f"{base}/tenants").json
    got = call("GET", f"{base}/tenants/public")
    assert got.status == 200 and got.json == {"adminRoles": [], "allowedClusters": ["standalone"]}


def test_create_get_update_delete(base: str, tenant: str) -> None:
    url = f"{base}/tenants/{tenant}"
    created = call("PUT", url, INFO)
    assert created.status == 204 and created.body == b""
    assert tenant in call("GET", f"{base}/tenants").json
    assert call("GET", url).json == INFO

    again = call("PUT", url, INFO)
    assert again.status == 409 and again.reason == "Tenant already exist"

    assert call("POST", url, {"adminRoles": ["a", "b", "a"], "allowedClusters": ["standalone"]}).status == 204
    assert call("GET", url).json == {"adminRoles": ["a", "b"], "allowedClusters": ["standalone"]}

    assert call("DELETE", url).status == 204
    missing = call("GET", url)
    assert missing.status == 404 and missing.reason == "Tenant does not exist"
    gone = call("DELETE", url)
    assert gone.status == 404 and gone.reason == "Tenant doesn't exist"


def test_update_missing_tenant(base: str) -> None:
    reply = call("POST", f"{base}/tenants/no-such-tenant", INFO)
    assert reply.status == 404 and reply.reason == "Tenant no-such-tenant not found"


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (None, "Clusters can not be empty"),
        ({"adminRoles": []}, "Clusters can not be empty"),
        ({"allowedClusters": []}, "Clusters can not be empty"),
        ({"allowedClusters": [" "]}, "Clusters can not be empty"),
        ({"allowedClusters": ["standalone", ""]}, "Clusters can not be empty"),
        ({"allowedClusters": ["no-such-cluster"]}, "Clusters do not exist"),
    ],
)
def test_cluster_validation(base: str, tenant: str, body: dict | None, reason: str) -> None:
    for method in ("PUT", "POST"):
        reply = call(method, f"{base}/tenants/{tenant}", body)
        assert reply.status == 412 and reply.reason == reason, method
    assert call("GET", f"{base}/tenants/{tenant}").status == 404


@pytest.mark.parametrize(
    "raw",
    [b"{", b'{"adminRoles": "admin"}', b'{"allowedClusters": [1]}', b'{"x": 1}', b"[]", b'"standalone"'],
)
def test_malformed_bodies(base: str, tenant: str, raw: bytes) -> None:
    reply = call("PUT", f"{base}/tenants/{tenant}", raw=raw)
    assert reply.status == 400 and reply.reason


@pytest.mark.parametrize("name", ["bad%20name", "a$b", "a%2Fb"])
def test_invalid_tenant_name(base: str, name: str) -> None:
    reply = call("PUT", f"{base}/tenants/{name}", INFO)
    assert reply.status == 412 and reply.reason == "Tenant name is not valid"


def test_null_admin_roles_mean_none(base: str, tenant: str) -> None:
    assert (
        call("PUT", f"{base}/tenants/{tenant}", {"adminRoles": None, "allowedClusters": ["standalone"]}).status == 204
    )
    assert call("GET", f"{base}/tenants/{tenant}").json == {"adminRoles": [], "allowedClusters": ["standalone"]}


def test_global_cluster_is_allowed(base: str, tenant: str) -> None:
    assert call("PUT", f"{base}/tenants/{tenant}", {"allowedClusters": ["global", "standalone"]}).status == 204


def test_delete_refused_while_namespaces_exist_unless_forced(base: str, tenant: str) -> None:
    assert call("PUT", f"{base}/tenants/{tenant}", INFO).status == 204
    assert call("PUT", f"{base}/namespaces/{tenant}/a").status == 204
    assert call("PUT", f"{base}/namespaces/{tenant}/b").status == 204
    assert call("PUT", f"{base}/persistent/{tenant}/a/topic-1").status == 204
    refused = call("DELETE", f"{base}/tenants/{tenant}")
    assert refused.status == 409 and refused.reason == "The tenant still has active namespaces"
    assert call("DELETE", f"{base}/tenants/{tenant}?force=notabool").status == 400
    assert call("DELETE", f"{base}/tenants/{tenant}?force=true").status == 204
    assert call("GET", f"{base}/tenants/{tenant}").status == 404
    assert call("GET", f"{base}/namespaces/{tenant}/a").status == 404
    assert tenant not in call("GET", f"{base}/tenants").json
    # The name is free again, with nothing left behind.
    assert call("PUT", f"{base}/tenants/{tenant}", INFO).status == 204
    assert call("GET", f"{base}/namespaces/{tenant}").json == []


def test_removing_a_cluster_in_use_is_refused(base: str, tenant: str) -> None:
    cluster = f"c-{uuid.uuid4().hex[:8]}"
    assert call("PUT", f"{base}/clusters/{cluster}", {"serviceUrl": "http://x:8080"}).status == 200
    try:
        assert call("PUT", f"{base}/tenants/{tenant}", {"allowedClusters": ["standalone", cluster]}).status == 204
        assert call("PUT", f"{base}/namespaces/{tenant}/ns", {"replication_clusters": [cluster]}).status == 204
        refused = call("POST", f"{base}/tenants/{tenant}", INFO)
        assert refused.status == 412 and refused.reason == "Active namespaces"
        assert call("DELETE", f"{base}/namespaces/{tenant}/ns").status == 204
        assert call("POST", f"{base}/tenants/{tenant}", INFO).status == 204
    finally:
        call("DELETE", f"{base}/clusters/{cluster}")
