"""Resources with a ``clusterRef`` to a secured MagnetarCluster: the engine calls the cluster's HTTPS admin URL,
trusts the ca.crt of the cluster's TLS Secret and sends the operator's token from the Secret the cluster
names. The admin API here is a small HTTPS server that checks the token (certificates generated in the test).
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from magnetar.operator import reconcile as rc
from magnetar.operator.clusteraccess import ClusterAccess
from magnetar.operator.config import OperatorConfig
from magnetar.operator.engine import Engine
from tests.operator.test_engine import FakeEnv

TOKEN = "operator-token-1"


def _cert(subject: str, key: ec.EllipticCurvePrivateKey, issuer: x509.Certificate | None,
          issuer_key: ec.EllipticCurvePrivateKey | None) -> x509.Certificate:  # fmt: skip
    now = datetime.datetime.now(datetime.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer.subject if issuer else name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
    )
    if issuer is None:
        builder = builder.add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
    else:
        san = x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
        builder = builder.add_extension(san, critical=False)
    return builder.sign(issuer_key or key, hashes.SHA256())


def _pem(cert: x509.Certificate) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode()


class SecuredAdmin:
    """An HTTPS admin API that wants ``Authorization: Bearer <TOKEN>`` (401 otherwise, as Pulsar answers)."""

    def __init__(self, tmp: Path) -> None:
        ca_key = ec.generate_private_key(ec.SECP256R1())
        self.ca = _cert("test-ca", ca_key, None, None)
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _cert("magnetar-broker", key, self.ca, ca_key)
        (tmp / "tls.crt").write_text(_pem(cert))
        pem, pkcs8 = serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8
        (tmp / "tls.key").write_bytes(key.private_bytes(pem, pkcs8, serialization.NoEncryption()))
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.load_cert_chain(tmp / "tls.crt", tmp / "tls.key")
        self.tenants: dict[str, Any] = {}
        self.authorizations: list[str | None] = []
        self.url = ""

    @web.middleware
    async def auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        header = request.headers.get("Authorization")
        self.authorizations.append(header)
        if header != f"Bearer {TOKEN}":
            return web.json_response({"reason": "Authentication required"}, status=401)
        return await handler(request)

    async def get_tenant(self, request: web.Request) -> web.Response:
        info = self.tenants.get(request.match_info["tenant"])
        return web.json_response(info) if info else web.json_response({"reason": "Tenant does not exist"}, status=404)

    async def put_tenant(self, request: web.Request) -> web.Response:
        self.tenants[request.match_info["tenant"]] = json.loads(await request.text())
        return web.Response(status=204)

    async def clusters(self, request: web.Request) -> web.Response:
        return web.json_response(["secured"])

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self.auth])
        app.router.add_get("/admin/v2/clusters", self.clusters)
        app.router.add_get("/admin/v2/tenants/{tenant}", self.get_tenant)
        app.router.add_put("/admin/v2/tenants/{tenant}", self.put_tenant)
        return app


@pytest.fixture
async def admin(tmp_path: Path) -> AsyncIterator[SecuredAdmin]:
    server = SecuredAdmin(tmp_path)
    runner = web.AppRunner(server.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server.context)
    await site.start()
    port = runner.addresses[0][1]
    server.url = f"https://127.0.0.1:{port}"
    try:
        yield server
    finally:
        await runner.cleanup()


def _env(admin: SecuredAdmin) -> FakeEnv:
    env = FakeEnv("http://127.0.0.1:9/unused-plaintext-url")
    env.config = OperatorConfig(cluster_url_template="http://127.0.0.1:9", cluster_tls_url_template=admin.url)
    env.clusters[("default", "magnetar")] = ClusterAccess(
        ready=True, tls=True, token_secret="magnetar-operator-token", token_key="token", ca_secret="magnetar-tls"
    )
    env.secrets[("default", "magnetar-tls", "ca.crt")] = _pem(admin.ca)
    return env


async def test_clusterref_to_secured_cluster_uses_https_and_the_operator_token(admin: SecuredAdmin) -> None:
    env = _env(admin)
    env.secrets[("default", "magnetar-operator-token", "token")] = TOKEN + "\n"  # kubectl create secret adds one
    try:
        res = env.add("Tenant", "acme", {"adminRoles": ["acme-admin"]})
        outcome = await Engine(env).reconcile(res)
        assert outcome.reason == rc.SYNCED, outcome.message
        assert admin.tenants == {"acme": {"adminRoles": ["acme-admin"], "allowedClusters": ["secured"]}}
        assert admin.authorizations and set(admin.authorizations) == {f"Bearer {TOKEN}"}
        assert outcome.status["adminUrl"] == admin.url
    finally:
        await env.close()


async def test_missing_operator_token_waits_with_credentials_missing(admin: SecuredAdmin) -> None:
    env = _env(admin)
    try:
        outcome = await Engine(env).reconcile(env.add("Tenant", "acme", {}))
        assert outcome.severity == "transient" and outcome.reason == rc.CREDENTIALS_MISSING
        assert "magnetar-operator-token" in outcome.message
        assert admin.authorizations == []  # nothing was called without credentials
    finally:
        await env.close()


async def test_wrong_token_is_unauthorized_and_retried(admin: SecuredAdmin) -> None:
    env = _env(admin)
    env.secrets[("default", "magnetar-operator-token", "token")] = "stale-token"
    try:
        outcome = await Engine(env).reconcile(env.add("Tenant", "acme", {}))
        assert outcome.severity == "transient" and outcome.reason == rc.UNAUTHORIZED
        assert admin.authorizations == ["Bearer stale-token"]
    finally:
        await env.close()


async def test_untrusted_certificate_is_not_accepted(admin: SecuredAdmin) -> None:
    env = _env(admin)
    env.secrets[("default", "magnetar-operator-token", "token")] = TOKEN
    other = _cert("other-ca", ec.generate_private_key(ec.SECP256R1()), None, None)
    env.secrets[("default", "magnetar-tls", "ca.crt")] = _pem(other)
    try:
        outcome = await Engine(env).reconcile(env.add("Tenant", "acme", {}))
        # A certificate the cluster's CA did not sign: the token is never sent.
        assert outcome.severity == "transient" and outcome.reason == rc.CLUSTER_UNREACHABLE
        assert "certificate" in outcome.message.lower()
        assert admin.authorizations == []
    finally:
        await env.close()
