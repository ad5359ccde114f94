"""``magnetar.admin_client.auth``: Pulsar's client auth settings -> the official client's Authentication and admin
credentials; the admin client over HTTPS (trust, hostname check, client certificates) against a real TLS server."""

from __future__ import annotations

import base64
import pickle
from pathlib import Path

import pulsar
import pytest

from magnetar.admin_client.auth import (
    BASIC,
    TLS,
    TOKEN,
    AuthConfigError,
    ClientSecurity,
    Credentials,
    parse_credentials,
    security_from_conf,
)
from magnetar.admin_client.client import AdminClient
from magnetar.admin_client.errors import AdminConnectionError, AdminError
from tests.admin.tls_fixtures import Recorder, https_server
from tests.tlsutil import Pki, issue, make_ca, make_pki

TOKEN_CLASS = "org.apache.pulsar.client.impl.auth.AuthenticationToken"
BASIC_CLASS = "org.apache.pulsar.client.impl.auth.AuthenticationBasic"
TLS_CLASS = "org.apache.pulsar.client.impl.auth.AuthenticationTls"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def test_token_params_in_every_pulsar_form(tmp_path: Path) -> None:
    token_file = tmp_path / "token.txt"
    token_file.write_text("from-file\n")
    assert parse_credentials(TOKEN_CLASS, "token:abc") == Credentials(TOKEN, token="abc")
    assert parse_credentials("token", '{"token": "abc"}') == Credentials(TOKEN, token="abc")
    assert parse_credentials("AuthenticationToken", "abc") == Credentials(TOKEN, token="abc")
    from_file = parse_credentials(TOKEN_CLASS, f"file://{token_file}")
    assert from_file == Credentials(TOKEN, token_file=str(token_file))
    assert from_file is not None and from_file.http_headers() == {"Authorization": "Bearer from-file"}
    token_file.write_text("rotated")  # re-read at each use, as the Java client does
    assert from_file.token_value() == "rotated"
    assert isinstance(from_file.pulsar_authentication(), pulsar.AuthenticationToken)


def test_basic_and_tls_params() -> None:
    expected = Credentials(BASIC, user_id="superuser", password="p:w")
    assert parse_credentials(BASIC_CLASS, '{"userId": "superuser", "password": "p:w"}') == expected
    assert parse_credentials("basic", "userId:superuser,password:p:w") == expected
    header = expected.http_headers()["Authorization"]
    assert base64.b64decode(header.removeprefix("Basic ")) == b"superuser:p:w"
    assert isinstance(expected.pulsar_authentication(), pulsar.AuthenticationBasic)
    tls = parse_credentials(TLS_CLASS, "tlsCertFile:/c.pem,tlsKeyFile:file:///k.pem")
    assert tls == Credentials(TLS, cert_file="/c.pem", key_file="/k.pem")
    assert parse_credentials("tls", '{"tlsCertFile": "/c.pem", "tlsKeyFile": "/k.pem"}') == tls
    assert tls.http_headers() == {}
    assert parse_credentials(None, None) is None
    assert parse_credentials("org.apache.pulsar.client.impl.auth.AuthenticationDisabled", "") is None


@pytest.mark.parametrize(
    ("plugin", "params", "message"),
    [
        ("org.example.Kerberos", "x", "unsupported authentication plugin 'org.example.Kerberos'"),
        (TOKEN_CLASS, "", "needs authParams"),
        (TOKEN_CLASS, "token:", "expected token:<jwt>"),
        (BASIC_CLASS, "userId:u", "AuthenticationBasic: expected"),
        (BASIC_CLASS, "{not json", "invalid JSON"),
        (BASIC_CLASS, "userId", "expected key:value pairs"),
        (TLS_CLASS, "tlsCertFile:/c.pem", "AuthenticationTls: expected tlsCertFile"),
        (None, "token:abc", "authParams given without authPlugin"),
    ],
)
def test_bad_params_are_clear_errors(plugin: str | None, params: str, message: str) -> None:
    with pytest.raises(AuthConfigError, match=message):
        parse_credentials(plugin, params)


def test_security_checks_files_and_maps_to_client_kwargs(pki: Pki, tmp_path: Path) -> None:
    with pytest.raises(AuthConfigError, match="tlsTrustCertsFilePath: no such file"):
        ClientSecurity.from_settings(tls_trust_certs_file=str(tmp_path / "missing.pem"))
    with pytest.raises(AuthConfigError, match="tlsCertFile: no such file"):
        ClientSecurity.from_settings(TLS_CLASS, f"tlsCertFile:{tmp_path}/c.pem,tlsKeyFile:{pki.client.key}")
    with pytest.raises(AuthConfigError, match="tlsAllowInsecureConnection: expected true or false"):
        ClientSecurity.from_settings(tls_allow_insecure="maybe")
    sec = ClientSecurity.from_settings(TOKEN_CLASS, "token:abc", f"file://{pki.ca_cert}", "false", "true")
    kwargs = sec.pulsar_client_kwargs()
    assert isinstance(kwargs.pop("authentication"), pulsar.AuthenticationToken)
    assert kwargs == {"tls_trust_certs_file_path": str(pki.ca_cert), "tls_validate_hostname": True}
    pulsar.Client("pulsar+ssl://127.0.0.1:1", **sec.pulsar_client_kwargs()).close()  # the client takes them
    conf = security_from_conf(
        {"authPlugin": BASIC_CLASS, "authParams": "userId:u,password:p", "tlsAllowInsecureConnection": "true"}
    )
    assert conf.credentials == Credentials(BASIC, user_id="u", password="p") and conf.tls.allow_insecure
    assert ClientSecurity().is_default and not sec.is_default


def test_admin_client_sends_bearer_and_basic_over_https(pki: Pki) -> None:
    recorder = Recorder(expect_authorization="Bearer good")
    with https_server(pki, recorder) as url:
        trust = str(pki.ca_cert)
        good = AdminClient(url, 5, ClientSecurity.from_settings(TOKEN_CLASS, "token:good", trust))
        assert good.get("/admin/v2/clusters") == {"ok": True}
        bad = AdminClient(url, 5, ClientSecurity.from_settings(TOKEN_CLASS, "token:bad", trust))
        with pytest.raises(AdminError) as err:
            bad.get("/admin/v2/clusters")
        assert (err.value.status, err.value.reason) == (401, "Authentication required")
        recorder.expect_authorization = None
        AdminClient(url, 5, ClientSecurity.from_settings("basic", "userId:u,password:p", trust)).get("/x")
        # Pickled (Spark ships it to executors) and used again: the SSL context is rebuilt there.
        pickle.loads(pickle.dumps(good)).get("/y")
    seen = [(r["path"], r["authorization"]) for r in recorder.requests]
    basic = "Basic " + base64.b64encode(b"u:p").decode()
    assert seen == [
        ("/admin/v2/clusters", "Bearer good"),
        ("/admin/v2/clusters", "Bearer bad"),
        ("/x", basic),
        ("/y", "Bearer good"),
    ]


def test_admin_client_tls_trust_settings(pki: Pki, tmp_path: Path) -> None:
    other = make_pki(tmp_path)  # another CA
    with https_server(pki, Recorder()) as url:
        with pytest.raises(AdminConnectionError, match="CERTIFICATE_VERIFY_FAILED"):
            AdminClient(url, 5).get("/untrusted")  # system CAs do not know the test CA
        with pytest.raises(AdminConnectionError, match="CERTIFICATE_VERIFY_FAILED"):
            AdminClient(url, 5, ClientSecurity.from_settings(tls_trust_certs_file=str(other.ca_cert))).get("/")
        insecure = ClientSecurity.from_settings(tls_allow_insecure="true")
        assert AdminClient(url, 5, insecure).get("/insecure") == {"ok": True}
        trusted = ClientSecurity.from_settings(tls_trust_certs_file=str(pki.ca_cert), tls_hostname_verification="true")
        assert AdminClient(url, 5, trusted).get("/verified") == {"ok": True}


def test_hostname_verification_on_and_off(tmp_path: Path) -> None:
    ca = make_ca(tmp_path)
    server = issue(ca, tmp_path, "server", "broker.example", server=True, hosts=("broker.example",))
    pki = Pki(ca, server, server)  # the server certificate does not name 127.0.0.1
    with https_server(pki, Recorder()) as url:
        off = ClientSecurity.from_settings(tls_trust_certs_file=str(pki.ca_cert))
        assert AdminClient(url, 5, off).get("/") == {"ok": True}  # Pulsar's default: no hostname check
        on = ClientSecurity.from_settings(tls_trust_certs_file=str(pki.ca_cert), tls_hostname_verification=True)
        with pytest.raises(AdminConnectionError, match=r"match|mismatch"):
            AdminClient(url, 5, on).get("/")


def test_admin_client_presents_client_certificate(pki: Pki) -> None:
    recorder = Recorder()
    with https_server(pki, recorder, require_client_cert=True) as url:
        with pytest.raises(AdminConnectionError):
            AdminClient(url, 5, ClientSecurity.from_settings(tls_trust_certs_file=str(pki.ca_cert))).get("/none")
        mtls = ClientSecurity.from_settings(
            TLS_CLASS, f"tlsCertFile:{pki.client.cert},tlsKeyFile:{pki.client.key}", str(pki.ca_cert)
        )
        assert AdminClient(url, 5, mtls).get("/cert") == {"ok": True}
    assert [(r["path"], r["client_cn"], r["authorization"]) for r in recorder.requests] == [
        ("/cert", "client-role", None)
    ]
