"""Authentication providers in-process: token (HS/RS/ES, expiry, audience, claims), basic (htpasswd hashes),
tls (CN), key values, and the service's choice of provider and anonymous role. No broker needed."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import time
from pathlib import Path

import bcrypt
import jwt
import pytest
from passlib.hash import apr_md5_crypt, des_crypt, md5_crypt, sha512_crypt

from magnetar.broker.auth import jwt_tokens
from magnetar.broker.auth.basic import BasicAuthenticationProvider, parse_htpasswd
from magnetar.broker.auth.keys import read_key_value
from magnetar.broker.auth.provider import AuthenticationData
from magnetar.broker.auth.service import AuthenticationService
from magnetar.broker.auth.tls import TlsAuthenticationProvider
from magnetar.broker.auth.token import TokenAuthenticationProvider
from magnetar.broker.config import BrokerConfig
from magnetar.broker.errors import AuthenticationError

SECRET = b"k" * 32


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


def command(data: str) -> AuthenticationData:
    return AuthenticationData(command_data=data.encode())


def http(authorization: str) -> AuthenticationData:
    return AuthenticationData(http_headers={"Authorization": authorization})


# ------------------------------------------------------------------------------------------- keys
def test_key_values_in_every_form_pulsar_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    raw = bytes(range(32))
    path = tmp_path / "secret.key"
    path.write_bytes(raw)
    b64 = base64.b64encode(raw).decode()
    monkeypatch.setenv("MY_KEY", "text-key")
    assert read_key_value(f"file://{path}") == raw
    assert read_key_value(str(path)) == raw
    assert read_key_value(f"data:;base64,{b64}") == raw
    assert read_key_value(f"data:application/octet-stream;base64,{b64}") == raw
    assert read_key_value(b64) == raw
    assert read_key_value("env:MY_KEY") == b"text-key"
    with pytest.raises(ValueError):
        read_key_value(f"file://{tmp_path}/missing.key")
    with pytest.raises(ValueError):
        read_key_value("/no/such/file and not base64!")


# ------------------------------------------------------------------------------------------- token
def test_token_role_expiry_and_http_bearer() -> None:
    provider = TokenAuthenticationProvider(SECRET)
    exp = time.time() + 60
    token = jwt_tokens.create_token(SECRET, "alice", exp)
    result = run(provider.authenticate(command(token)))
    assert (result.role, result.expires_at) == ("alice", float(int(exp)))
    assert run(provider.authenticate(http(f"Bearer {token}"))).role == "alice"
    assert run(provider.authenticate(command(jwt_tokens.create_token(SECRET, "bob")))).expires_at is None
    with pytest.raises(AuthenticationError, match="Invalid HTTP Authorization header"):
        run(provider.authenticate(http(f"Basic {token}")))


def test_expired_token_message_is_pulsars() -> None:
    provider = TokenAuthenticationProvider(SECRET)
    token = jwt_tokens.create_token(SECRET, "alice", time.time() - 5)
    with pytest.raises(AuthenticationError) as info:
        run(provider.authenticate(command(token)))
    assert str(info.value).startswith("Failed to authentication token: JWT expired at ")
    assert "Allowed clock skew: 0 milliseconds." in str(info.value)


@pytest.mark.parametrize(
    "token",
    [
        jwt_tokens.create_token(b"x" * 32, "alice"),  # another key
        jwt.encode({"sub": "alice"}, None, algorithm="none"),  # unsigned
        "not-a-jwt",
        "",
    ],
)
def test_bad_tokens_refused(token: str) -> None:
    with pytest.raises(AuthenticationError):
        run(TokenAuthenticationProvider(SECRET).authenticate(command(token)))


def test_public_keys_rs256_es256_and_no_algorithm_confusion() -> None:
    for alg in ("RS256", "ES256", "PS512"):
        private_der, public_der = jwt_tokens.create_key_pair(alg)
        private = jwt_tokens.decode_private_key(private_der)
        public = jwt_tokens.decode_public_key(public_der)
        provider = TokenAuthenticationProvider(public)
        token = jwt_tokens.create_token(private, "carol", algorithm=alg if alg.startswith(("RS", "PS")) else None)
        assert jwt.get_unverified_header(token)["alg"] == alg
        assert run(provider.authenticate(command(token))).role == "carol"
        # An HMAC token "signed" with the public key's bytes must not pass (the classic confusion attack).
        forged = _hs256(b'{"alg":"HS256"}', b'{"sub":"mallory"}', public_der)
        with pytest.raises(AuthenticationError):
            run(provider.authenticate(command(forged)))


def _hs256(header: bytes, payload: bytes, key: bytes) -> str:
    def b64(data: bytes) -> bytes:
        return base64.urlsafe_b64encode(data).rstrip(b"=")

    signing_input = b64(header) + b"." + b64(payload)
    return (signing_input + b"." + b64(hmac.new(key, signing_input, hashlib.sha256).digest())).decode()


def test_role_claim_and_audience() -> None:
    token = jwt.encode({"sub": "x", "roles": ["admin", "other"], "aud": ["b1", "b2"]}, SECRET, algorithm="HS256")
    assert run(TokenAuthenticationProvider(SECRET, role_claim="roles").authenticate(command(token))).role == "admin"
    assert run(TokenAuthenticationProvider(SECRET, audience_claim="aud", audience="b2").authenticate(command(token)))
    with pytest.raises(AuthenticationError, match="not contains this broker: b3"):
        run(TokenAuthenticationProvider(SECRET, audience_claim="aud", audience="b3").authenticate(command(token)))
    with pytest.raises(AuthenticationError, match="no role"):
        run(TokenAuthenticationProvider(SECRET, role_claim="missing").authenticate(command(token)))
    with pytest.raises(ValueError):
        TokenAuthenticationProvider(SECRET, audience_claim="aud")


def test_secret_key_too_short_refused() -> None:
    with pytest.raises(ValueError):
        jwt_tokens.decode_secret_key(b"short")


# ------------------------------------------------------------------------------------------- basic
def test_basic_hashes_pulsar_accepts_and_bcrypt() -> None:
    users = {
        "apr": apr_md5_crypt.hash("pw-apr"),
        "md5": md5_crypt.hash("pw-md5"),
        "sha": sha512_crypt.using(rounds=5000).hash("pw-sha"),
        "des": des_crypt.hash("pwdes"),
        "bc": bcrypt.hashpw(b"pw-bc", bcrypt.gensalt(4)).decode().replace("$2b$", "$2y$"),
    }
    htpasswd = "# users\n" + "\n".join(f"{user}:{hashed}" for user, hashed in users.items())
    provider = BasicAuthenticationProvider(parse_htpasswd(htpasswd))
    for user, password in (("apr", "pw-apr"), ("md5", "pw-md5"), ("sha", "pw-sha"), ("des", "pwdes"), ("bc", "pw-bc")):
        assert run(provider.authenticate(command(f"{user}:{password}"))).role == user
        assert run(provider.authenticate(command(f"{user}:{password}"))).role == user  # remembered
        with pytest.raises(AuthenticationError, match="Unknown user or invalid password"):
            run(provider.authenticate(command(f"{user}:wrong")))
    header = "Basic " + base64.b64encode(b"apr:pw-apr").decode()
    assert run(provider.authenticate(http(header))).role == "apr"
    with pytest.raises(AuthenticationError, match="Unknown user"):
        run(provider.authenticate(command("nobody:pw")))
    with pytest.raises(ValueError):
        parse_htpasswd("no-colon-line")


# ------------------------------------------------------------------------------------------- tls
def test_tls_role_is_the_common_name() -> None:
    cert = {"subject": ((("countryName", "US"),), (("organizationName", "acme"),), (("commonName", "svc-1"),))}
    provider = TlsAuthenticationProvider()
    assert run(provider.authenticate(AuthenticationData(peer_certificate=cert))).role == "svc-1"
    with pytest.raises(AuthenticationError):
        run(provider.authenticate(AuthenticationData(peer_certificate={"subject": ((("organizationName", "x"),),)})))
    with pytest.raises(AuthenticationError):
        run(provider.authenticate(AuthenticationData()))


# ------------------------------------------------------------------------------------------- service
def _service(**settings: str) -> AuthenticationService:
    config = BrokerConfig()
    config.apply({"authenticationEnabled": "true", **settings})
    service = AuthenticationService.from_config(config)
    assert service is not None
    return service


def test_service_from_pulsar_class_names_and_anonymous_role(tmp_path: Path) -> None:
    secret = tmp_path / "s.key"
    secret.write_bytes(SECRET)
    htpasswd = base64.b64encode(f"dave:{apr_md5_crypt.hash('pw')}\n".encode()).decode()
    service = _service(
        authenticationProviders="org.apache.pulsar.broker.authentication.AuthenticationProviderToken,basic",
        tokenSecretKey=f"file://{secret}",
        basicAuthConf=f"data:;base64,{htpasswd}",
    )
    assert sorted(service.providers) == ["basic", "token"]
    token = jwt_tokens.create_token(SECRET, "erin")
    assert run(service.authenticate_command("token", command(token))).role == "erin"
    assert run(service.authenticate_http(http(f"Bearer {token}"))).role == "erin"
    basic = "Basic " + base64.b64encode(b"dave:pw").decode()
    assert run(service.authenticate_http(http(basic))).role == "dave"
    with pytest.raises(AuthenticationError, match="No anonymous role"):
        run(service.authenticate_command("none", AuthenticationData(command_data=b"")))
    with pytest.raises(AuthenticationError, match="Authentication required"):
        run(service.authenticate_http(AuthenticationData(http_headers={})))
    with pytest.raises(AuthenticationError):  # presented and wrong: refused even with an anonymous role
        run(service.authenticate_http(http("Bearer nonsense")))

    anonymous = _service(authenticationProviders="token", tokenSecretKey=f"file://{secret}", anonymousUserRole="anon")
    assert run(anonymous.authenticate_command("none", AuthenticationData(command_data=b""))).role == "anon"
    assert run(anonymous.authenticate_http(AuthenticationData(http_headers={}))).role == "anon"
    with pytest.raises(AuthenticationError):
        run(anonymous.authenticate_http(http("Bearer nonsense")))


def test_service_refuses_bad_settings() -> None:
    assert AuthenticationService.from_config(BrokerConfig()) is None  # authentication off
    with pytest.raises(ValueError, match="not supported"):
        _service(authenticationProviders="org.example.Kerberos")
    with pytest.raises(ValueError, match="No secret key"):
        _service(authenticationProviders="token")
    with pytest.raises(ValueError, match="basicAuthConf"):
        _service(authenticationProviders="basic")
    with pytest.raises(ValueError):
        _service(authenticationProviders="token", tokenPublicKey="data:;base64,AAAA")


def test_remembered_token_still_expires() -> None:
    """A token checked once is remembered, but its expiry is checked at every use."""
    provider = TokenAuthenticationProvider(SECRET)
    token = jwt_tokens.create_token(SECRET, "alice", time.time() + 1.5)
    assert run(provider.authenticate(command(token))).role == "alice"
    assert run(provider.authenticate(http(f"Bearer {token}"))).role == "alice"  # from memory
    time.sleep(2)
    with pytest.raises(AuthenticationError, match="JWT expired at"):
        run(provider.authenticate(command(token)))
