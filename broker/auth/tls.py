"""``tls`` authentication (Pulsar's ``AuthenticationProviderTls``): the role is the common name (CN) of the
client certificate the TLS handshake verified (``tlsTrustCertsFilePath`` decides which are trusted)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from magnetar.broker.auth.provider import Authenticated, AuthenticationData, AuthenticationProvider
from magnetar.broker.config import BrokerConfig
from magnetar.broker.errors import AuthenticationError


class TlsAuthenticationProvider(AuthenticationProvider):
    """Verified client certificates."""

    method: ClassVar[str] = "tls"

    @classmethod
    def from_config(cls, config: BrokerConfig) -> TlsAuthenticationProvider:
        return cls()

    def accepts(self, data: AuthenticationData) -> bool:
        return bool(data.peer_certificate)

    async def authenticate(self, data: AuthenticationData) -> Authenticated:
        if not data.peer_certificate:
            raise AuthenticationError("Failed to get TLS certificates from client")
        role = common_name(data.peer_certificate)
        if not role:
            raise AuthenticationError("Client unable to authenticate with TLS certificate")
        return Authenticated(role)


def common_name(certificate: Mapping[str, Any]) -> str | None:
    """The subject's CN of a ``getpeercert()`` dict (the last one if several, as Java's DN parsing sees it)."""
    names = [value for rdn in certificate.get("subject", ()) for key, value in rdn if key == "commonName"]
    return names[-1] if names else None
