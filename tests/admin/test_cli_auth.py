"""``magnetar admin`` with pulsar-admin's auth/TLS flags and ``client.conf``, against a real HTTPS server that
records the credentials it receives (the command runs as a subprocess, as users run it)."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import jwt
import pytest

from tests.admin.tls_fixtures import Recorder, https_server
from tests.conftest import StandaloneProcess
from tests.tlsutil import Pki, make_pki

TOKEN_CLASS = "org.apache.pulsar.client.impl.auth.AuthenticationToken"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def server(pki: Pki) -> Iterator[tuple[str, Recorder]]:
    recorder = Recorder()
    with https_server(pki, recorder) as url:
        yield url, recorder


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if k not in ("PULSAR_CLIENT_CONF", "MAGNETAR_ADMIN_URL")}
    full_env.update(env or {})
    cmd = [sys.executable, "-m", "magnetar.cli.main", "admin", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=full_env)


def test_flags_send_token_over_https(server: tuple[str, Recorder], pki: Pki) -> None:
    url, recorder = server
    r = cli(
        "--admin-url", url, "--auth-plugin", TOKEN_CLASS, "--auth-params", "token:jwt-1",
        "--tls-trust-cert-path", str(pki.ca_cert), "tenants", "list",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    # Flags after the verb work too (as the other global options do).
    r = cli("tenants", "list", "--admin-url", url, "--auth-plugin", "basic", "--auth-params",
            '{"userId": "admin", "password": "pw"}', "--tls-allow-insecure")  # fmt: skip
    assert r.returncode == 0, r.stderr
    basic = "Basic " + base64.b64encode(b"admin:pw").decode()
    assert [(q["path"], q["authorization"]) for q in recorder.requests] == [
        ("/admin/v2/tenants", "Bearer jwt-1"),
        ("/admin/v2/tenants", basic),
    ]


def test_client_conf_from_env_and_flags_override_it(server: tuple[str, Recorder], pki: Pki, tmp_path: Path) -> None:
    url, recorder = server
    token_file = tmp_path / "token"
    token_file.write_text("jwt-from-file\n")
    conf = tmp_path / "client.conf"
    conf.write_text(
        "# pulsar-admin's client.conf\n"
        f"webServiceUrl={url}\n"
        "brokerServiceUrl=pulsar+ssl://127.0.0.1:6651/\n"
        f"authPlugin={TOKEN_CLASS}\n"
        f"authParams=file://{token_file}\n"
        f"tlsTrustCertsFilePath={pki.ca_cert}\n"
        "tlsAllowInsecureConnection=false\n"
        "tlsEnableHostnameVerification=\n"
    )
    r = cli("clusters", "list", env={"PULSAR_CLIENT_CONF": str(conf)})
    assert r.returncode == 0, r.stderr
    r = cli("--conf", str(conf), "--auth-params", "token:jwt-flag", "clusters", "list")
    assert r.returncode == 0, r.stderr
    assert [q["authorization"] for q in recorder.requests] == ["Bearer jwt-from-file", "Bearer jwt-flag"]


def test_untrusted_server_and_bad_params_are_clear(server: tuple[str, Recorder], tmp_path: Path) -> None:
    url, recorder = server
    r = cli("--admin-url", url, "tenants", "list")
    assert r.returncode == 1
    assert "CERTIFICATE_VERIFY_FAILED" in r.stderr
    r = cli("--admin-url", url, "--auth-plugin", "org.example.Kerberos", "--auth-params", "x", "tenants", "list")
    assert r.returncode == 2
    assert r.stderr.startswith("error: unsupported authentication plugin 'org.example.Kerberos'")
    r = cli("--admin-url", url, "--auth-plugin", "basic", "--auth-params", "userId:u", "tenants", "list")
    assert (r.returncode, r.stderr.count("AuthenticationBasic: expected")) == (2, 1)
    r = cli("--conf", str(tmp_path / "missing.conf"), "tenants", "list")
    assert r.returncode == 2 and "cannot read client configuration" in r.stderr
    assert recorder.requests == []


# ------------------------------------------------------------------------------- against a token-auth broker
SECRET = b"cli-test-secret-key-of-32-bytes!!!"


@pytest.fixture(scope="module")
def token_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneProcess]:
    node = StandaloneProcess(
        tmp_path_factory.mktemp("cli-token") / "data",
        {
            "authenticationEnabled": "true",
            "authenticationProviders": "token",
            "tokenSecretKey": "data:;base64," + base64.b64encode(SECRET).decode(),
        },
    )
    node.start()
    yield node
    assert node.stop() == 0, node.log()


def test_token_against_a_real_broker(token_broker: StandaloneProcess, tmp_path: Path) -> None:
    token = jwt.encode({"sub": "admin"}, SECRET, algorithm="HS256")
    r = cli("--admin-url", token_broker.http_url, "--auth-plugin", TOKEN_CLASS, "--auth-params", f"token:{token}",
            "tenants", "list")  # fmt: skip
    assert (r.returncode, r.stdout.split()) == (0, ["public"]), r.stderr
    conf = tmp_path / "client.conf"
    conf.write_text(f"webServiceUrl={token_broker.http_url}\nauthPlugin=token\nauthParams={token}\n")
    r = cli("--conf", str(conf), "namespaces", "list", "public")
    assert (r.returncode, r.stdout.split()) == (0, ["public/default"]), r.stderr
    r = cli("--admin-url", token_broker.http_url, "tenants", "list")
    assert r.returncode == 1 and "(HTTP 401)" in r.stderr
    wrong = jwt.encode({"sub": "admin"}, b"x" * 32, algorithm="HS256")
    r = cli("--admin-url", token_broker.http_url, "--auth-plugin", "token", "--auth-params", wrong, "tenants", "list")
    assert r.returncode == 1 and "(HTTP 401)" in r.stderr
