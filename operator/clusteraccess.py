"""How the operator reaches a secured MagnetarCluster, and the Secrets such a cluster needs.

A cluster with ``spec.security`` names Secrets (the TLS Secret, token keys, an htpasswd file, the
operator's own admin token). Before the brokers are created or updated every referenced Secret key is
checked: a missing Secret (``SecretNotFound``), a missing key (``SecretKeyMissing``) or a Secret the
operator may not read (``SecretUnreadable``) becomes the cluster's status, retried with backoff, never an
exception loop. :class:`ClusterAccess` (kept in kopf's ``cluster_index``) tells Tenant, TopicNamespace and
Topic reconcilers with a ``clusterRef`` to use HTTPS (trusting the TLS Secret's ``ca.crt``) and the
operator's token.
"""

from __future__ import annotations

import functools
import json
import ssl
from dataclasses import asdict, dataclass
from typing import Any

import aiohttp

from magnetar.broker.auth.jwt_tokens import decode_unverified
from magnetar.operator.clusterspec import MagnetarClusterSpec
from magnetar.operator.config import OperatorConfig
from magnetar.operator.kube import KubeClient, KubeError, secret_key

SECRET_NOT_FOUND = "SecretNotFound"
SECRET_KEY_MISSING = "SecretKeyMissing"
SECRET_UNREADABLE = "SecretUnreadable"
SECRET_REASONS = (SECRET_NOT_FOUND, SECRET_KEY_MISSING, SECRET_UNREADABLE)
#: Key of the CA certificate in a kubernetes.io/tls Secret (cert-manager writes it for CA-based issuers).
CA_KEY = "ca.crt"


class SecretProblem(Exception):
    """A referenced Secret or key is missing or unreadable; ``reason`` is the status condition's reason."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class ClusterAccess:
    """What a caller of a cluster's admin API needs besides its URL."""

    ready: bool
    tls: bool = False
    #: the operator's admin token: Secret name and key (None: authentication off)
    token_secret: str | None = None
    token_key: str = "token"
    #: Secret whose ``ca.crt`` the operator trusts (the cluster's TLS Secret)
    ca_secret: str | None = None

    @classmethod
    def of(cls, spec: MagnetarClusterSpec, ready: bool, config: OperatorConfig) -> ClusterAccess:
        sec = spec.security
        token = operator_token_ref(spec, config)
        return cls(
            ready=ready,
            tls=sec.tls is not None,
            token_secret=token[0] if token else None,
            token_key=token[1] if token else "token",
            ca_secret=sec.tls.secretName if sec.tls is not None else None,
        )

    def as_index(self) -> dict[str, Any]:
        """A plain value for kopf's index."""
        return asdict(self)

    @classmethod
    def from_index(cls, value: Any) -> ClusterAccess:
        if isinstance(value, dict):
            return cls(**{k: v for k, v in value.items() if k in cls.__dataclass_fields__})
        return cls(ready=bool(value))


def operator_token_ref(spec: MagnetarClusterSpec, config: OperatorConfig) -> tuple[str, str] | None:
    """(Secret, key) of the operator's admin token for a cluster with authentication on, else None."""
    auth = spec.security.authentication
    if auth is None or not auth.enabled:
        return None
    if auth.operatorTokenSecretRef is not None:
        return auth.operatorTokenSecretRef.name, auth.operatorTokenSecretRef.key
    return config.operator_token_secret, config.operator_token_key


def broker_client_token_ref(spec: MagnetarClusterSpec, config: OperatorConfig) -> tuple[str, str] | None:
    """(Secret, key) of the token brokers present to each other, for a cluster with authentication on."""
    auth = spec.security.authentication
    if auth is not None and auth.enabled and auth.brokerClientTokenSecretRef is not None:
        return auth.brokerClientTokenSecretRef.name, auth.brokerClientTokenSecretRef.key
    return operator_token_ref(spec, config)


def required_secret_keys(spec: MagnetarClusterSpec, config: OperatorConfig) -> list[tuple[str, str, str]]:
    """Every (Secret, key, purpose) the brokers and the operator need for ``spec.security``."""
    sec = spec.security
    out: list[tuple[str, str, str]] = []
    if sec.tls is not None:
        out += [(sec.tls.secretName, "tls.crt", "TLS certificate"), (sec.tls.secretName, "tls.key", "TLS key")]
        if sec.tls.requireClientCert:
            out.append((sec.tls.secretName, CA_KEY, "CA of client certificates"))
        if sec.tls.bookieSecretName:
            name = sec.tls.bookieSecretName
            out += [(name, "tls.crt", "bookie TLS certificate"), (name, "tls.key", "bookie TLS key"),
                    (name, CA_KEY, "CA of the bookie certificates")]  # fmt: skip
    auth = sec.authentication
    if auth is not None and auth.enabled:
        if auth.token is not None:
            for ref, what in ((auth.token.secretKey, "token secret key"), (auth.token.publicKey, "token public key")):
                if ref is not None:
                    out.append((ref.name, ref.key, what))
        if auth.basic is not None:
            out.append((auth.basic.htpasswd.name, auth.basic.htpasswd.key, "htpasswd file"))
        token = operator_token_ref(spec, config)
        if token is not None:
            out.append((token[0], token[1], "operator admin token"))
        broker = broker_client_token_ref(spec, config)
        if broker is not None and broker != token:
            out.append((broker[0], broker[1], "broker client token"))
    return out


async def read_secret_key(kube: KubeClient, namespace: str, name: str, key: str, what: str = "") -> str:
    """One Secret key's value; raises :class:`SecretProblem` with the status reason when it cannot be had."""
    label = f"Secret {namespace}/{name}" + (f" ({what})" if what else "")
    try:
        secret = await kube.secret(namespace, name)
    except KubeError as exc:
        raise SecretProblem(SECRET_UNREADABLE, f"{label} cannot be read: {exc}") from exc
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise SecretProblem(SECRET_UNREADABLE, f"{label} cannot be read: {exc!r}") from exc
    if secret is None:
        raise SecretProblem(SECRET_NOT_FOUND, f"{label} not found")
    value = secret_key(secret, key)
    if value is None:
        raise SecretProblem(SECRET_KEY_MISSING, f"{label} has no key {key!r}")
    return value


async def check_secrets(
    kube: KubeClient, namespace: str, spec: MagnetarClusterSpec, config: OperatorConfig
) -> dict[tuple[str, str], str]:
    """Every referenced Secret key's value by (Secret, key); raises :class:`SecretProblem` for the first one
    that is missing or unreadable."""
    return {
        (name, key): await read_secret_key(kube, namespace, name, key, what)
        for name, key, what in required_secret_keys(spec, config)
    }


def token_subject(token: str) -> str | None:
    """The ``sub`` claim of a JWT, read without verifying it (only to warn about a misconfiguration)."""
    try:
        payload = json.loads(decode_unverified(token)[1])
    except ValueError:  # not a JWT, bad base64 (binascii.Error), not UTF-8 or not JSON
        return None
    sub = payload.get("sub") if isinstance(payload, dict) else None
    return sub if isinstance(sub, str) else None


@functools.lru_cache(maxsize=64)
def ssl_context(ca_pem: str | None) -> ssl.SSLContext:
    """A client context trusting ``ca_pem`` (the system's CAs when None), hostname checked."""
    return ssl.create_default_context(cadata=ca_pem) if ca_pem else ssl.create_default_context()
