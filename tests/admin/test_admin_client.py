"""``magnetar.admin_client``: the errors, paths and synchronous client shared by the CLI, Spark and the operator."""

from __future__ import annotations

import socket

import pytest

from magnetar.admin_client.client import AdminClient
from magnetar.admin_client.errors import AdminConnectionError, AdminError, reason_of
from magnetar.admin_client.paths import api_path, namespace_path, parse_topic, subscription_path, topic_path


def test_reason_of_error_bodies() -> None:
    assert reason_of('{"reason": "Tenant already exists"}') == "Tenant already exists"
    assert reason_of('{"message": "HTTP 404 Not Found"}') == "HTTP 404 Not Found"
    assert reason_of("  plain text \n") == "plain text"
    assert reason_of("", "Not Found") == "Not Found"
    assert reason_of("x" * 600) == "x" * 500


def test_admin_error_text_and_transience() -> None:
    err = AdminError(409, "Tenant already exists", "PUT", "/admin/v2/tenants/t")
    assert str(err) == "PUT /admin/v2/tenants/t: HTTP 409: Tenant already exists"
    assert (err.status, err.reason, err.transient) == (409, "Tenant already exists", False)
    assert str(AdminError(503, "busy")) == "HTTP 503: busy"
    assert AdminError(503, "busy").transient and AdminError(429, "slow down").transient


def test_paths_encode_each_segment() -> None:
    topic = parse_topic("my-tenant/ns/a b%")
    assert topic_path(topic) == "/admin/v2/persistent/my-tenant/ns/a%20b%25"
    assert subscription_path(topic, "s/1") == "/admin/v2/persistent/my-tenant/ns/a%20b%25/subscription/s%2F1"
    assert namespace_path("t", "ns") == "/admin/v2/namespaces/t/ns"
    assert api_path("brokers", "health") == "/admin/v2/brokers/health"
    assert str(parse_topic("non-persistent://t/ns/x")) == "non-persistent://t/ns/x"
    with pytest.raises(ValueError, match="Invalid"):
        parse_topic("t/ns")


def test_unreachable_admin_api_is_a_connection_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens once the socket is closed
    client = AdminClient(f"http://127.0.0.1:{port}", timeout=5)
    with pytest.raises(AdminConnectionError, match="cannot reach the admin API"):
        client.get(api_path("clusters"))
