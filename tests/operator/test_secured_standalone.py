"""The settings a secured MagnetarCluster renders, run for real: a ``magnetar standalone`` started with the
TLS part, or the authentication/authorization part, of the rendered broker.conf (files where the projected
volumes would put them), and the operator's engine reaching it through a ``clusterRef``: over HTTPS trusting
the TLS Secret's ca.crt, with the operator token.
"""

from __future__ import annotations

import copy
import ssl
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from magnetar.admin_client.errors import AdminError
from magnetar.operator import reconcile as rc
from magnetar.operator.clusteraccess import ClusterAccess
from magnetar.operator.clusterobjects import AUTH_DIR, TLS_DIR, ClusterRenderer
from magnetar.operator.config import OperatorConfig
from magnetar.operator.engine import Engine
from tests.broker.test_tls import TlsStandalone
from tests.conftest import StandaloneProcess
from tests.operator.test_cluster_security import BODY
from tests.operator.test_engine import FakeEnv
from tests.tlsutil import make_pki

#: broker.conf keys of spec.security.authentication / authorization (the rest needs a real cluster)
AUTH_PREFIXES = ("authentication", "token", "superUser", "authorization", "brokerClient", "basicAuth")


def tokens(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "magnetar.cli.main", "tokens", *args], capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


class SecuredBroker:
    def __init__(self, node: StandaloneProcess, auth_dir: Path, operator_token: str) -> None:
        self.node = node
        self.auth_dir = auth_dir
        self.operator_token = operator_token


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredBroker]:
    base = tmp_path_factory.mktemp("secured-standalone")
    auth_dir = base / "auth"  # stands in for the projected volume at AUTH_DIR
    auth_dir.mkdir()
    tokens("create-secret-key", "--output", str(auth_dir / "token-secret-key"))
    operator_token = tokens("create", "--secret-key", f"file://{auth_dir / 'token-secret-key'}",
                            "--subject", "magnetar-operator")  # fmt: skip
    (auth_dir / "broker-client-token").write_text(operator_token)
    body: dict[str, Any] = copy.deepcopy(BODY)
    security = body["spec"]["security"]
    del security["tls"], security["authentication"]["basic"]
    security["authentication"]["superUserRoles"] = ["magnetar-operator"]
    conf = ClusterRenderer(body).broker_conf()
    settings = {k: v.replace(AUTH_DIR, str(auth_dir)) for k, v in conf.items() if k.startswith(AUTH_PREFIXES)}
    assert settings["authenticationEnabled"] == "true" and settings["tokenSecretKey"].startswith("file://")
    node = StandaloneProcess(base / "data", settings)
    node.start()
    try:
        yield SecuredBroker(node, auth_dir, operator_token)
    finally:
        assert node.stop() == 0, node.log()


def _env(broker: SecuredBroker, token: str | None) -> FakeEnv:
    env = FakeEnv(broker.node.http_url)
    env.clusters[("default", "magnetar")] = ClusterAccess(ready=True, token_secret="op-token", token_key="token")
    if token is not None:
        env.secrets[("default", "op-token", "token")] = token
    return env


async def test_operator_token_manages_a_secured_broker(secured: SecuredBroker) -> None:
    env = _env(secured, secured.operator_token)
    try:
        res = env.add("Tenant", "secured-acme", {"adminRoles": ["acme-admin"]})
        outcome = await Engine(env).reconcile(res)
        assert outcome.reason == rc.SYNCED, outcome.message
        client = env.admin(secured.node.http_url, secured.operator_token)
        assert (await client.get_tenant("secured-acme") or {}).get("adminRoles") == ["acme-admin"]
    finally:
        await env.close()


async def test_missing_or_foreign_token_is_reported_not_raised(secured: SecuredBroker, tmp_path: Path) -> None:
    env = _env(secured, None)
    try:
        outcome = await Engine(env).reconcile(env.add("Tenant", "secured-none", {}))
        assert outcome.reason == rc.CREDENTIALS_MISSING
    finally:
        await env.close()
    tokens("create-secret-key", "--output", str(tmp_path / "other.key"))
    foreign = tokens("create", "--secret-key", f"file://{tmp_path / 'other.key'}", "--subject", "magnetar-operator")
    env = _env(secured, foreign)
    try:
        outcome = await Engine(env).reconcile(env.add("Tenant", "secured-foreign", {}))
        assert outcome.severity == "transient" and outcome.reason == rc.UNAUTHORIZED, outcome.message
    finally:
        await env.close()


@pytest.fixture(scope="module")
def tls_only(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsStandalone]:
    """A TLS-only standalone from the rendered TLS settings; the certificate files under cert-manager's names."""
    base = tmp_path_factory.mktemp("tls-only")
    pki = make_pki(base / "pki")
    secret = base / "tls"  # stands in for the projected volume at TLS_DIR
    secret.mkdir()
    for name, source in (("tls.crt", pki.server.cert), ("tls.key", pki.server.key), ("ca.crt", pki.ca_cert)):
        (secret / name).write_bytes(source.read_bytes())
    body: dict[str, Any] = copy.deepcopy(BODY)
    body["spec"]["security"] = {"tls": {"secretName": "demo-tls", "tlsOnly": True}}
    conf = ClusterRenderer(body).broker_conf()
    settings = {k: v.replace(TLS_DIR, str(secret)) for k, v in conf.items() if k.startswith("tls")}
    settings.update(brokerServicePort=conf["brokerServicePort"], webServicePort=conf["webServicePort"])
    assert settings["brokerServicePort"] == "" and settings["tlsCertificateFilePath"] == str(secret / "tls.crt")
    # The TLS ports themselves (6651/8443 in a pod) are free ports here.
    node = TlsStandalone(base / "data", pki, tls_only=True, **settings)
    node.start()
    try:
        yield node
    finally:
        assert node.stop() == 0, node.log()


async def test_operator_reaches_a_tls_only_broker_trusting_the_secret_ca(tls_only: TlsStandalone) -> None:
    env = FakeEnv("http://127.0.0.1:9")  # the plaintext port is off: only the TLS URL may be used
    env.config = OperatorConfig(cluster_url_template="http://127.0.0.1:9", cluster_tls_url_template=tls_only.https_url)
    env.clusters[("default", "magnetar")] = ClusterAccess(ready=True, tls=True, ca_secret="demo-tls")
    env.secrets[("default", "demo-tls", "ca.crt")] = tls_only.pki.ca_cert.read_text()
    try:
        outcome = await Engine(env).reconcile(env.add("Tenant", "tls-acme", {"adminRoles": ["a"]}))
        assert outcome.reason == rc.SYNCED, outcome.message
        assert outcome.status["adminUrl"] == tls_only.https_url
        client = env.admin(tls_only.https_url, None, tls_only.pki.ca_cert.read_text())
        assert (await client.get_tenant("tls-acme") or {}).get("adminRoles") == ["a"]
    finally:
        await env.close()


def test_rendered_probes_answer_on_a_tls_only_broker(tls_only: TlsStandalone) -> None:
    """What the kubelet does with the rendered HTTPS probes: GET without verifying the certificate."""
    body: dict[str, Any] = copy.deepcopy(BODY)
    body["spec"]["security"] = {"tls": {"secretName": "demo-tls", "tlsOnly": True}}
    sts = next(o for o in ClusterRenderer(body).broker_objects() if o["kind"] == "StatefulSet")
    container = sts["spec"]["template"]["spec"]["containers"][0]
    insecure = ssl.create_default_context()
    insecure.check_hostname = False
    insecure.verify_mode = ssl.CERT_NONE
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        get = container[probe]["httpGet"]
        assert get["scheme"] == "HTTPS" and get["port"] == "https"
        with urllib.request.urlopen(tls_only.https_url + get["path"], timeout=5, context=insecure) as resp:
            assert resp.status == 200


class SecuredTlsStandalone(TlsStandalone):
    """TLS-only with authentication on: healthy when Pulsar's open status page answers over HTTPS."""

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.https_url}/status.html", timeout=1,
                                        context=self.client_context(with_cert=False)) as r:  # fmt: skip
                return r.status == 200
        except OSError:
            return False


async def test_full_security_settings_run_a_broker_the_operator_manages(tmp_path: Path) -> None:
    """Everything spec.security renders for brokers at once (TLS-only, token authentication, authorization,
    broker client token): the engine manages the broker over HTTPS with the operator token; the probe path
    answers without credentials."""
    pki = make_pki(tmp_path / "pki")
    tls_dir, auth_dir = tmp_path / "tls", tmp_path / "auth"
    tls_dir.mkdir()
    auth_dir.mkdir()
    for name, source in (("tls.crt", pki.server.cert), ("tls.key", pki.server.key), ("ca.crt", pki.ca_cert)):
        (tls_dir / name).write_bytes(source.read_bytes())
    tokens("create-secret-key", "--output", str(auth_dir / "token-secret-key"))
    operator_token = tokens("create", "--secret-key", f"file://{auth_dir / 'token-secret-key'}",
                            "--subject", "magnetar-operator")  # fmt: skip
    (auth_dir / "broker-client-token").write_text(operator_token)
    body: dict[str, Any] = copy.deepcopy(BODY)
    security = body["spec"]["security"]
    security["tls"]["tlsOnly"] = True
    del security["authentication"]["basic"]
    security["authentication"]["superUserRoles"] = ["magnetar-operator"]
    conf = ClusterRenderer(body).broker_conf()
    tls = {k: v.replace(TLS_DIR, str(tls_dir)) for k, v in conf.items()
           if k.startswith("tls") or k in ("brokerServicePort", "webServicePort")}  # fmt: skip
    node = SecuredTlsStandalone(tmp_path / "data", pki, tls_only=True, **tls)
    # As environment variables: a name this broker does not know yet is logged, not refused (as in broker.conf).
    node.extra_config = {k: v.replace(AUTH_DIR, str(auth_dir)) for k, v in conf.items() if k.startswith(AUTH_PREFIXES)}
    node.start()
    env = FakeEnv("http://127.0.0.1:9")
    env.config = OperatorConfig(cluster_url_template="http://127.0.0.1:9", cluster_tls_url_template=node.https_url)
    env.clusters[("default", "magnetar")] = ClusterAccess(ready=True, tls=True, token_secret="op-token",
                                                          token_key="token", ca_secret="demo-tls")  # fmt: skip
    env.secrets[("default", "demo-tls", "ca.crt")] = pki.ca_cert.read_text()
    env.secrets[("default", "op-token", "token")] = operator_token
    try:
        outcome = await Engine(env).reconcile(env.add("Tenant", "full-acme", {"adminRoles": ["a"]}))
        assert outcome.reason == rc.SYNCED, outcome.message
        client = env.admin(node.https_url, operator_token, pki.ca_cert.read_text())
        assert (await client.get_tenant("full-acme") or {}).get("adminRoles") == ["a"]
        # Without the token the same API refuses (so the operator's token is what worked).
        anonymous = env.admin(node.https_url, None, pki.ca_cert.read_text())
        with pytest.raises(AdminError) as refused:
            await anonymous.get_tenant("full-acme")
        assert refused.value.status == 401
    finally:
        await env.close()
        assert node.stop() == 0, node.log()
