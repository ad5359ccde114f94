"""Client credentials and TLS trust from Pulsar's client settings, for the official client and for admin calls.

Pulsar clients are configured with an authentication plugin class and one parameter string
(``authPlugin``/``authPluginClassName`` + ``authParams`` in ``client.conf``, pulsar-admin's ``--auth-plugin`` /
``--auth-params``, the Spark connector's ``pulsar.client.authPluginClassName``...) plus TLS trust settings
(``tlsTrustCertsFilePath``, ``tlsAllowInsecureConnection``, ``tlsEnableHostnameVerification``).
:func:`parse_credentials` turns the pair into :class:`Credentials`; :class:`ClientSecurity` bundles them with
:class:`TlsTrust` and gives what each transport needs: ``pulsar.Client`` keyword arguments (binary protocol),
``Authorization`` headers and an ``ssl.SSLContext`` (admin REST API).

Everything here is plain data (picklable: Spark ships it to executors); the ``pulsar`` objects and SSL
contexts are made on demand.
"""

from __future__ import annotations

import base64
import json
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TOKEN, BASIC, TLS = "token", "basic", "tls"

_PACKAGE = "org.apache.pulsar.client.impl.auth."
#: Plugin names accepted for each method: the Java client's class names, the short names, and the C++/Python
#: clients' spellings (``AuthenticationTLS``); matched case-insensitively.
PLUGINS: dict[str, str] = {
    **{name.lower(): TOKEN for name in (f"{_PACKAGE}AuthenticationToken", "AuthenticationToken", TOKEN)},
    **{name.lower(): BASIC for name in (f"{_PACKAGE}AuthenticationBasic", "AuthenticationBasic", BASIC)},
    **{name.lower(): TLS for name in (f"{_PACKAGE}AuthenticationTls", "AuthenticationTls", TLS)},
}
#: Plugin names meaning "no authentication" (Pulsar's default plugin).
NO_AUTH = frozenset({"", f"{_PACKAGE}AuthenticationDisabled".lower(), "authenticationdisabled", "none"})


class AuthConfigError(ValueError):
    """Authentication or TLS settings that cannot work (unknown plugin, malformed or missing params)."""


@dataclass(frozen=True)
class Credentials:
    """One authentication method with its parameters (a token may live in a file, read at each use)."""

    method: str
    token: str | None = None
    token_file: str | None = None
    user_id: str | None = None
    password: str | None = None
    cert_file: str | None = None
    key_file: str | None = None

    def token_value(self) -> str:
        """The token now (re-read from ``token_file``, so a rotated file is picked up)."""
        if self.token is not None:
            return self.token
        assert self.token_file is not None
        try:
            return Path(self.token_file).read_text().strip()
        except OSError as exc:
            raise AuthConfigError(f"cannot read the token file {self.token_file}: {exc.strerror or exc}") from None

    def pulsar_authentication(self) -> Any:
        """The official client's ``pulsar.Authentication`` for these credentials."""
        import pulsar

        if self.method == TOKEN:
            # A supplier re-reads the file on every (re)connection, as the Java client's file tokens do.
            return pulsar.AuthenticationToken(self.token if self.token is not None else self.token_value)
        if self.method == BASIC:
            return pulsar.AuthenticationBasic(self.user_id, self.password)
        return pulsar.AuthenticationTLS(self.cert_file, self.key_file)

    def http_headers(self) -> dict[str, str]:
        """``Authorization`` for admin calls (TLS credentials go into the SSL context instead)."""
        if self.method == TOKEN:
            return {"Authorization": f"Bearer {self.token_value()}"}
        if self.method == BASIC:
            pair = f"{self.user_id}:{self.password}".encode()
            return {"Authorization": "Basic " + base64.b64encode(pair).decode()}
        return {}


def _split_params(params: str) -> dict[str, str]:
    """``{"k": "v"}`` JSON or Pulsar's ``k1:v1,k2:v2`` (a value may contain ``:``, e.g. a path)."""
    text = params.strip()
    if text.startswith("{"):
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise AuthConfigError(f"authParams: invalid JSON: {exc}") from None
        if not isinstance(doc, dict):
            raise AuthConfigError("authParams: expected a JSON object")
        return {str(k): str(v) for k, v in doc.items()}
    out: dict[str, str] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition(":")
        if not sep:
            raise AuthConfigError(f"authParams: expected key:value pairs separated by commas, got {item.strip()!r}")
        out[key.strip()] = value.strip()
    return out


def _file_path(value: str) -> str:
    """``file:///path`` or ``file:/path`` -> ``/path``; plain paths unchanged."""
    if value.startswith("file://"):
        return value[len("file://") :]
    if value.startswith("file:"):
        return value[len("file:") :]
    return value


def _token_credentials(params: str) -> Credentials:
    text = params.strip()
    if text.startswith("token:"):
        token = text[len("token:") :].strip()
    elif text.startswith("file:"):
        return Credentials(TOKEN, token_file=_file_path(text))
    elif text.startswith("{"):
        doc = _split_params(text)
        if doc.get("file"):
            return Credentials(TOKEN, token_file=_file_path(doc["file"]))
        token = doc.get("token", "")
    else:
        token = text  # the Java client takes a bare token too
    if not token:
        raise AuthConfigError('authParams of AuthenticationToken: expected token:<jwt>, file:///path or {"token": ...}')
    return Credentials(TOKEN, token=token)


def _basic_credentials(params: str) -> Credentials:
    doc = _split_params(params)
    if not doc.get("userId") or "password" not in doc:
        raise AuthConfigError(
            'authParams of AuthenticationBasic: expected {"userId": ..., "password": ...} or userId:...,password:...'
        )
    return Credentials(BASIC, user_id=doc["userId"], password=doc["password"])


def _tls_credentials(params: str) -> Credentials:
    doc = _split_params(params)
    cert, key = doc.get("tlsCertFile"), doc.get("tlsKeyFile")
    if not cert or not key:
        raise AuthConfigError("authParams of AuthenticationTls: expected tlsCertFile:<path>,tlsKeyFile:<path>")
    return Credentials(TLS, cert_file=_file_path(cert), key_file=_file_path(key))


def parse_credentials(plugin: str | None, params: str | None) -> Credentials | None:
    """Pulsar's ``authPlugin`` + ``authParams`` -> :class:`Credentials` (None: no authentication).

    Raises :class:`AuthConfigError` naming what is wrong (unknown plugin, params it cannot use).
    """
    name = (plugin or "").strip()
    if name.lower() in NO_AUTH:
        if params and params.strip():
            raise AuthConfigError(
                "authParams given without authPlugin (e.g. org.apache.pulsar.client.impl.auth.AuthenticationToken)"
            )
        return None
    method = PLUGINS.get(name.lower())
    if method is None:
        known = ", ".join(f"{_PACKAGE}{c}" for c in ("AuthenticationToken", "AuthenticationBasic", "AuthenticationTls"))
        raise AuthConfigError(f"unsupported authentication plugin {name!r}: one of {known} (or token, basic, tls)")
    if not params or not params.strip():
        raise AuthConfigError(f"authentication plugin {name} needs authParams")
    if method == TOKEN:
        return _token_credentials(params)
    if method == BASIC:
        return _basic_credentials(params)
    return _tls_credentials(params)


def parse_bool(value: object, name: str) -> bool:
    """``true``/``false`` (also ``1``/``0``, ``yes``/``no``) or a bool."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no", ""):
        return False
    raise AuthConfigError(f"{name}: expected true or false, got {value!r}")


@dataclass(frozen=True)
class TlsTrust:
    """How a client checks the server's certificate (Pulsar's defaults: system CAs, no hostname check)."""

    trust_certs_file: str | None = None
    allow_insecure: bool = False
    hostname_verification: bool = False


@dataclass(frozen=True)
class ClientSecurity:
    """Credentials and TLS trust of one client (binary protocol and admin API alike)."""

    credentials: Credentials | None = None
    tls: TlsTrust = TlsTrust()

    @classmethod
    def from_settings(
        cls,
        auth_plugin: str | None = None,
        auth_params: str | None = None,
        tls_trust_certs_file: str | None = None,
        tls_allow_insecure: object = False,
        tls_hostname_verification: object = False,
    ) -> ClientSecurity:
        """From Pulsar's client settings; files named are checked to exist (a typo fails here, not at connect)."""
        credentials = parse_credentials(auth_plugin, auth_params)
        trust = (
            _file_path(tls_trust_certs_file.strip()) if tls_trust_certs_file and tls_trust_certs_file.strip() else None
        )
        for label, path in (
            ("tlsTrustCertsFilePath", trust),
            ("tlsCertFile", credentials.cert_file if credentials else None),
            ("tlsKeyFile", credentials.key_file if credentials else None),
        ):
            if path is not None and not Path(path).is_file():
                raise AuthConfigError(f"{label}: no such file: {path}")
        tls = TlsTrust(
            trust,
            parse_bool(tls_allow_insecure, "tlsAllowInsecureConnection"),
            parse_bool(tls_hostname_verification, "tlsEnableHostnameVerification"),
        )
        return cls(credentials, tls)

    @property
    def is_default(self) -> bool:
        """No credentials and Pulsar's default trust: nothing to configure."""
        return self.credentials is None and self.tls == TlsTrust()

    def pulsar_client_kwargs(self) -> dict[str, Any]:
        """``pulsar.Client`` keyword arguments (TLS itself follows from a ``pulsar+ssl://`` service URL)."""
        out: dict[str, Any] = {}
        if self.credentials is not None:
            out["authentication"] = self.credentials.pulsar_authentication()
        if self.tls.trust_certs_file:
            out["tls_trust_certs_file_path"] = self.tls.trust_certs_file
        if self.tls.allow_insecure:
            out["tls_allow_insecure_connection"] = True
        if self.tls.hostname_verification:
            out["tls_validate_hostname"] = True
        return out

    def http_headers(self) -> dict[str, str]:
        return self.credentials.http_headers() if self.credentials is not None else {}

    def ssl_context(self) -> ssl.SSLContext:
        """For ``https`` admin URLs: the trusted CAs, the insecure/hostname switches and a client certificate."""
        from magnetar.broker.tls import TlsConfigError, client_context  # only for https: it loads asyncio

        creds = self.credentials or Credentials(TLS)  # only TLS credentials carry a certificate
        try:
            return client_context(
                self.tls.trust_certs_file or "",
                creds.cert_file or "",
                creds.key_file or "",
                allow_insecure=self.tls.allow_insecure,
                verify_hostname=self.tls.hostname_verification,
            )
        except TlsConfigError as exc:
            raise AuthConfigError(str(exc)) from None


def security_from_conf(conf: Mapping[str, str]) -> ClientSecurity:
    """From pulsar-admin's ``client.conf`` keys (``authPlugin``, ``authParams``, ``tlsTrustCertsFilePath``...)."""
    return ClientSecurity.from_settings(
        conf.get("authPlugin") or conf.get("authPluginClassName"),
        conf.get("authParams"),
        conf.get("tlsTrustCertsFilePath"),
        conf.get("tlsAllowInsecureConnection", "false"),
        conf.get("tlsEnableHostnameVerification", "false"),
    )
