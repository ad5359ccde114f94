"""Authentication end to end: a real standalone with token and basic providers, the official client, the raw
protocol client for AUTH_CHALLENGE details, the admin API and HTTP lookup, and the ``magnetar tokens`` CLI."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import bcrypt
import pulsar
import pytest
from passlib.hash import apr_md5_crypt

from magnetar.broker.auth import jwt_tokens
from magnetar.broker.protocol import pulsar_api_pb2 as pb
from tests.conftest import StandaloneProcess, _quiet_logger
from tests.rawclient import RawClient

T = pb.BaseCommand


def tokens_cli(*args: str) -> str:
    """Run ``magnetar tokens ARGS``; its stdout."""
    done = subprocess.run(
        [sys.executable, "-m", "magnetar.cli.main", "tokens", *args], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


class AuthBroker:
    def __init__(self, node: StandaloneProcess, secret: Path) -> None:
        self.node = node
        self.secret = secret

    def token(self, subject: str, expiry: str | None = None) -> str:
        return tokens_cli(
            "create",
            "--secret-key",
            f"file://{self.secret}",
            "--subject",
            subject,
            *(["--expiry-time", expiry] if expiry else []),
        )

    def client(self, authentication: object | None = None, timeout: int = 10) -> pulsar.Client:
        return pulsar.Client(
            self.node.service_url,
            authentication=authentication,
            operation_timeout_seconds=timeout,
            logger=_quiet_logger(),
        )

    def http(self, path: str, authorization: str | None = None) -> tuple[int, dict[str, str], bytes]:
        request = urllib.request.Request(self.node.http_url + path)
        if authorization:
            request.add_header("Authorization", authorization)
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, dict(response.headers), response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, dict(exc.headers), exc.read()


@pytest.fixture(scope="module")
def auth_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuthBroker]:
    base = tmp_path_factory.mktemp("authn")
    secret = base / "secret.key"
    tokens_cli("create-secret-key", "--output", str(secret))  # the CLI round trip starts here
    htpasswd = base / "htpasswd"
    htpasswd.write_text(
        f"bcrypt-user:{bcrypt.hashpw(b'bc-pass', bcrypt.gensalt(4)).decode()}\n"
        f"apr-user:{apr_md5_crypt.hash('apr-pass')}\n"
    )
    node = StandaloneProcess(
        base / "data",
        {
            "authenticationEnabled": "true",
            "authenticationProviders": "org.apache.pulsar.broker.authentication.AuthenticationProviderToken,"
            "org.apache.pulsar.broker.authentication.AuthenticationProviderBasic",
            "tokenSecretKey": f"file://{secret}",
            "basicAuthConf": str(htpasswd),
            "authenticationRefreshCheckSeconds": "1",
        },
    )
    node.start()
    yield AuthBroker(node, secret)
    assert node.stop() == 0, node.log()


def produce_consume(client: pulsar.Client, topic: str) -> None:
    """Send and receive one message on ``topic``, then close ``client``."""
    try:
        consumer = client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
        producer = client.create_producer(topic)
        producer.send(b"hello")
        assert consumer.receive(timeout_millis=10_000).data() == b"hello"
    finally:
        client.close()


def producer_refused(client: pulsar.Client, topic: str) -> None:
    """Creating a producer on ``topic`` fails (the credentials are refused), then close ``client``."""
    try:
        with pytest.raises(pulsar.PulsarException):
            client.create_producer(topic)
    finally:
        client.close()


# ------------------------------------------------------------------------------------------- tokens
def test_valid_token_produces_and_consumes(auth_broker: AuthBroker, topic_name: str) -> None:
    client = auth_broker.client(pulsar.AuthenticationToken(auth_broker.token("alice", "1h")))
    produce_consume(client, topic_name)


@pytest.mark.parametrize("kind", ["none", "expired", "wrong-key", "garbage"])
def test_bad_or_missing_token_refused(auth_broker: AuthBroker, topic_name: str, tmp_path: Path, kind: str) -> None:
    if kind == "none":
        authentication = None
    elif kind == "expired":
        authentication = pulsar.AuthenticationToken(_expired_token(auth_broker.secret))
    elif kind == "wrong-key":
        other = tmp_path / "other.key"
        tokens_cli("create-secret-key", "--output", str(other))
        authentication = pulsar.AuthenticationToken(
            tokens_cli("create", "--secret-key", f"file://{other}", "--subject", "alice")
        )
    else:
        authentication = pulsar.AuthenticationToken("not-a-jwt")
    client = auth_broker.client(authentication, timeout=3)
    producer_refused(client, topic_name)


def _expired_token(secret: Path) -> str:
    return jwt_tokens.create_token(secret.read_bytes(), "alice", time.time() - 10)


def _raw_connect(port: int, method: str, data: bytes, refresh: bool = True) -> RawClient:
    raw = RawClient(port)
    cmd = T(type=T.CONNECT)
    cmd.connect.client_version = "raw-test"
    cmd.connect.protocol_version = 20
    cmd.connect.auth_method_name = method
    cmd.connect.auth_data = data
    cmd.connect.feature_flags.supports_auth_refresh = refresh
    raw.send(cmd)
    return raw


def _answer_challenge(raw: RawClient, token: str) -> None:
    response = T(type=T.AUTH_RESPONSE)
    response.authResponse.response.auth_method_name = "token"
    response.authResponse.response.auth_data = token.encode()
    raw.send(response)


def test_refused_connect_gets_authentication_error_and_close(auth_broker: AuthBroker) -> None:
    raw = _raw_connect(auth_broker.node.port, "token", _expired_token(auth_broker.secret).encode())
    try:
        answer = raw.recv_until_any({T.CONNECTED, T.ERROR})
        assert answer.type == T.ERROR
        assert answer.error.error == pb.AuthenticationError
        assert raw.is_closed()
    finally:
        raw.close()
    # The detail is logged, not sent (Pulsar 4.x).
    assert "JWT expired at" in auth_broker.node.log_path.read_text(errors="replace")


def test_commands_sent_behind_connect_wait_for_authentication(auth_broker: AuthBroker) -> None:
    """A LOOKUP pipelined right behind CONNECT is answered after CONNECTED, not refused."""
    raw = _raw_connect(auth_broker.node.port, "basic", b"bcrypt-user:bc-pass")  # bcrypt: slow on purpose
    try:
        lookup = T(type=T.LOOKUP)
        lookup.lookupTopic.topic = "persistent://public/default/pipelined"
        lookup.lookupTopic.request_id = 7
        raw.send(lookup)
        first = raw.recv_until_any({T.CONNECTED, T.LOOKUP_RESPONSE, T.ERROR})
        assert first.type == T.CONNECTED
        response = raw.recv_until(T.LOOKUP_RESPONSE)
        assert response.lookupTopicResponse.request_id == 7
        assert response.lookupTopicResponse.response == pb.CommandLookupTopicResponse.Connect
    finally:
        raw.close()


# ------------------------------------------------------------------------------------------- refresh
def test_challenge_on_expiry_and_refresh_with_fresh_token(auth_broker: AuthBroker) -> None:
    fresh = auth_broker.token("alice", "1h")  # ready before the challenge: it must be answered within 1 s
    raw = _raw_connect(auth_broker.node.port, "token", auth_broker.token("alice", "2s").encode())
    try:
        assert raw.recv_until(T.CONNECTED)
        raw.sock.settimeout(8)
        challenge = raw.recv_until(T.AUTH_CHALLENGE).authChallenge
        assert challenge.challenge.auth_method_name == "token"
        assert challenge.challenge.auth_data == b"refresh"
        _answer_challenge(raw, fresh)
        assert not raw.is_closed(timeout=3)  # several refresh checks pass: still connected
    finally:
        raw.close()


def test_role_change_on_refresh_closes(auth_broker: AuthBroker) -> None:
    other_role = auth_broker.token("mallory", "1h")
    raw = _raw_connect(auth_broker.node.port, "token", auth_broker.token("alice", "2s").encode())
    try:
        assert raw.recv_until(T.CONNECTED)
        raw.sock.settimeout(8)
        raw.recv_until(T.AUTH_CHALLENGE)
        _answer_challenge(raw, other_role)
        assert raw.is_closed()  # the principal cannot change during a refresh
    finally:
        raw.close()


def test_expired_answer_to_challenge_closes(auth_broker: AuthBroker) -> None:
    token = auth_broker.token("alice", "2s")
    raw = _raw_connect(auth_broker.node.port, "token", token.encode())
    try:
        assert raw.recv_until(T.CONNECTED)
        raw.sock.settimeout(8)
        raw.recv_until(T.AUTH_CHALLENGE)
        _answer_challenge(raw, token)  # the same, now expired
        error = raw.recv_until(T.ERROR)
        assert error.error.error == pb.AuthenticationError
        assert raw.is_closed()
    finally:
        raw.close()


def test_no_answer_to_challenge_closes(auth_broker: AuthBroker) -> None:
    raw = _raw_connect(auth_broker.node.port, "token", auth_broker.token("alice", "2s").encode())
    try:
        assert raw.recv_until(T.CONNECTED)
        raw.sock.settimeout(8)
        raw.recv_until(T.AUTH_CHALLENGE)
        assert raw.is_closed(timeout=5)  # closed by the next check (1 s)
    finally:
        raw.close()


def test_client_without_refresh_support_closed_on_expiry(auth_broker: AuthBroker) -> None:
    raw = _raw_connect(auth_broker.node.port, "token", auth_broker.token("alice", "2s").encode(), refresh=False)
    try:
        assert raw.recv_until(T.CONNECTED)
        assert raw.is_closed(timeout=8)
    finally:
        raw.close()


def test_official_client_refreshes_through_token_supplier(auth_broker: AuthBroker, topic_name: str) -> None:
    calls = []
    lock = threading.Lock()

    def supplier() -> str:  # quick: a refresh must be answered before the next check (1 s here)
        with lock:
            calls.append(time.monotonic())
        return jwt_tokens.create_token(auth_broker.secret.read_bytes(), "alice", time.time() + 2)

    client = auth_broker.client(pulsar.AuthenticationToken(supplier))
    try:
        producer = client.create_producer(topic_name)
        deadline = time.monotonic() + 7  # the first token expires after 2 s: at least two refreshes follow
        sent = 0
        while time.monotonic() < deadline:
            producer.send(f"m{sent}".encode())
            sent += 1
            time.sleep(0.2)
        assert len(calls) >= 3, calls
        assert _publishers(auth_broker, topic_name) == 1  # the same connection, never dropped
        consumer = client.subscribe(topic_name, "s", initial_position=pulsar.InitialPosition.Earliest)
        assert consumer.receive(timeout_millis=10_000).data() == b"m0"
    finally:
        client.close()


def test_official_client_with_stale_supplier_is_disconnected(auth_broker: AuthBroker, topic_name: str) -> None:
    token = auth_broker.token("alice", "2s")
    client = auth_broker.client(pulsar.AuthenticationToken(lambda: token), timeout=3)
    try:
        client.create_producer(topic_name)
        assert _publishers(auth_broker, topic_name) == 1
        deadline = time.monotonic() + 15
        while _publishers(auth_broker, topic_name) != 0:
            assert time.monotonic() < deadline, "the producer's connection was not closed"
            time.sleep(0.5)
    finally:
        client.close()
    log = auth_broker.node.log_path.read_text(errors="replace")  # all of it: log() is only the tail
    # Refused when it answered with the expired token (or, on a loaded machine, closed for answering late).
    assert "authentication refresh of" in log or "after timeout on refreshing auth credentials" in log


def _publishers(broker: AuthBroker, topic: str) -> int:
    path = "/admin/v2/" + topic.replace("://", "/") + "/stats"
    status, _, body = broker.http(path, "Bearer " + broker.token("admin"))
    assert status == 200, body
    return len(json.loads(body)["publishers"])


# ------------------------------------------------------------------------------------------- basic
def test_basic_right_password(auth_broker: AuthBroker, topic_name: str) -> None:
    for user, password in (("bcrypt-user", "bc-pass"), ("apr-user", "apr-pass")):
        client = auth_broker.client(pulsar.AuthenticationBasic(user, password))
        produce_consume(client, f"{topic_name}-{user}")


def test_basic_wrong_password(auth_broker: AuthBroker, topic_name: str) -> None:
    client = auth_broker.client(pulsar.AuthenticationBasic("apr-user", "wrong"), timeout=3)
    producer_refused(client, topic_name)


# ------------------------------------------------------------------------------------------- HTTP
def test_admin_api_needs_credentials(auth_broker: AuthBroker) -> None:
    status, headers, body = auth_broker.http("/admin/v2/tenants")
    assert status == 401
    assert json.loads(body) == {"reason": "Authentication required"}
    assert "Bearer" in headers.get("WWW-Authenticate", "")
    assert auth_broker.http("/admin/v2/tenants", "Bearer nonsense")[0] == 401
    assert auth_broker.http("/admin/v2/tenants", "Bearer " + _expired_token(auth_broker.secret))[0] == 401
    assert auth_broker.http("/admin/v2/tenants", "Basic " + base64.b64encode(b"apr-user:bad").decode())[0] == 401
    status, _, body = auth_broker.http("/admin/v2/tenants", "Bearer " + auth_broker.token("admin"))
    assert (status, "public" in json.loads(body)) == (200, True)
    basic = "Basic " + base64.b64encode(b"apr-user:apr-pass").decode()
    assert auth_broker.http("/admin/v2/tenants", basic)[0] == 200
    assert auth_broker.http("/admin/v2/brokers/health")[0] == 401  # as Pulsar: every admin endpoint


def test_http_lookup_protected(auth_broker: AuthBroker) -> None:
    path = "/lookup/v2/topic/persistent/public/default/http-lookup"
    assert auth_broker.http(path)[0] == 401
    status, _, body = auth_broker.http(path, "Bearer " + auth_broker.token("alice"))
    assert status == 200, body
    assert json.loads(body)["brokerUrl"] == auth_broker.node.service_url


def test_probe_and_metrics_open(auth_broker: AuthBroker) -> None:
    assert auth_broker.http("/status.html")[:1] == (200,)
    assert auth_broker.http("/status.html")[2] == b"OK"
    assert auth_broker.http("/metrics")[0] == 200  # authenticateMetricsEndpoint=false (Pulsar 4.x default)


# ------------------------------------------------------------------------------------------- key pair + CLI
def test_key_pair_broker_anonymous_role_and_cli_round_trip(tmp_path: Path, topic_name: str) -> None:
    private, public = tmp_path / "private.key", tmp_path / "public.key"
    tokens_cli("create-key-pair", "--output-private-key", str(private), "--output-public-key", str(public))
    token = tokens_cli("create", "--private-key", f"file://{private}", "--subject", "svc", "--expiry-time", "1h")
    assert tokens_cli("show", token).splitlines()[0] == '{"alg":"RS256"}'
    assert tokens_cli("validate", "--public-key", f"file://{public}", token).startswith("{sub=svc, exp=")
    other_private, other_public = tmp_path / "other-private.key", tmp_path / "other-public.key"
    tokens_cli("create-key-pair", "--output-private-key", str(other_private), "--output-public-key", str(other_public))
    forged = tokens_cli("create", "--private-key", f"file://{other_private}", "--subject", "svc")
    node = StandaloneProcess(
        tmp_path / "data",
        {
            "authenticationEnabled": "true",
            "authenticationProviders": "token",
            "tokenPublicKey": "data:;base64," + base64.b64encode(public.read_bytes()).decode(),
            "anonymousUserRole": "anonymous",
            "authenticateMetricsEndpoint": "true",
        },
    )
    node.start()
    try:
        broker = AuthBroker(node, tmp_path / "unused")
        client = broker.client(pulsar.AuthenticationToken(token))
        produce_consume(client, topic_name)
        client = broker.client()  # no credentials: the anonymous role
        produce_consume(client, topic_name + "-anonymous")
        log = node.log_path.read_text(errors="replace")
        assert "authenticated as role svc (token)" in log
        assert "authenticated as role anonymous (none)" in log
        assert broker.http("/admin/v2/tenants")[0] == 200
        assert broker.http("/metrics", f"Bearer {forged}")[0] == 401  # authenticateMetricsEndpoint=true
        assert broker.http("/metrics", f"Bearer {token}")[0] == 200
        client = broker.client(pulsar.AuthenticationToken(forged), timeout=3)
        producer_refused(client, topic_name)
        assert broker.http("/admin/v2/tenants", f"Bearer {forged}")[0] == 401
        assert broker.http("/admin/v2/tenants", f"Bearer {token}")[0] == 200
    finally:
        assert node.stop() == 0, node.log()


def test_tokens_cli_secret_key_base64_and_validate_failure(tmp_path: Path) -> None:
    encoded = tokens_cli("create-secret-key", "--base64")
    assert len(base64.b64decode(encoded)) == 32
    token = tokens_cli("create", "--secret-key", f"data:;base64,{encoded}", "-s", "x", "--headers", "kid=one")
    assert tokens_cli("show", token).splitlines()[0] == '{"alg":"HS256","kid":"one"}'
    assert tokens_cli("validate", "--secret-key", encoded, token) == "{sub=x}"
    other = tokens_cli("create-secret-key", "--base64")
    done = subprocess.run(
        [sys.executable, "-m", "magnetar.cli.main", "tokens", "validate", "--secret-key", other, token],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert "signature does not match" in done.stderr


# ------------------------------------------------------------------------------------------- broker's own client
def test_broker_client_credentials_accepted(auth_broker: AuthBroker, tmp_path: Path) -> None:
    """What a broker sends other brokers (bundle unloads, shedding) passes the HTTP authentication."""
    from magnetar.broker.auth.broker_client import broker_client_headers
    from magnetar.broker.config import BrokerConfig

    token_file = tmp_path / "broker.jwt"
    token_file.write_text(auth_broker.token("broker") + "\n")
    token = auth_broker.token("broker")
    cases = [
        ("org.apache.pulsar.client.impl.auth.AuthenticationToken", f"file://{token_file}"),
        ("org.apache.pulsar.client.impl.auth.AuthenticationToken", f"token:{token}"),
        ("org.apache.pulsar.client.impl.auth.AuthenticationToken", json.dumps({"token": token})),
        ("org.apache.pulsar.client.impl.auth.AuthenticationBasic", '{"userId":"apr-user","password":"apr-pass"}'),
        ("org.apache.pulsar.client.impl.auth.AuthenticationBasic", "userId:apr-user,password:apr-pass"),
    ]
    for plugin, params in cases:
        config = BrokerConfig()
        config.apply({"brokerClientAuthenticationPlugin": plugin, "brokerClientAuthenticationParameters": params})
        authorization = broker_client_headers(config)["Authorization"]
        assert auth_broker.http("/admin/v2/tenants", authorization)[0] == 200, (plugin, params)
    assert broker_client_headers(BrokerConfig()) == {}
