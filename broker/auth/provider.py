"""The authentication seam: the credentials a client presents, and the providers that turn them into a role.

A provider is Pulsar's ``AuthenticationProvider``: it names its method (``token``, ``basic``, ``tls``:
the ``auth_method_name`` a client sends in CONNECT, the scheme on HTTP) and authenticates one set of
credentials. Binary connections and HTTP requests build an :class:`AuthenticationData` from what they
received and keep the resulting :class:`Authenticated` role; nothing else depends on how it was made.

The verified TLS client certificate (``peer_certificate``) of a binary connection is
``ServerConnection.peer_certificate``, of an HTTPS request ``magnetar.broker.tls.request_peer_certificate(request)``
(both ``None`` on plaintext or without a client certificate; see broker/tls.py for when one is asked for).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Self

from aiohttp import web

if TYPE_CHECKING:
    from magnetar.broker.config import BrokerConfig

#: Key of the authenticated role in an aiohttp request (set by the authentication middleware).
ROLE_KEY = "magnetar.auth.role"


@dataclass(frozen=True, slots=True)
class AuthenticationData:
    """What a client presented: command data (CONNECT/AUTH_RESPONSE ``auth_data``, or the credential
    part of an HTTP ``Authorization`` header), HTTP headers, and the verified TLS client certificate."""

    command_data: bytes | None = None
    http_headers: Mapping[str, str] | None = None
    #: ``ssl.SSLSocket.getpeercert()`` of a verified client certificate, if the connection is TLS with one.
    peer_certificate: Mapping[str, Any] | None = None
    peer_address: str = ""


@dataclass(frozen=True, slots=True)
class Authenticated:
    """A successful authentication: the role, and when the credentials stop being valid (epoch
    seconds; ``None``: never), after which a binary connection is challenged (AUTH_CHALLENGE)."""

    role: str
    expires_at: float | None = None


class AuthenticationProvider(ABC):
    """One authentication method (Pulsar's ``AuthenticationProvider``)."""

    #: The method name clients send (``auth_method_name`` in CONNECT) and the HTTP scheme it answers to.
    method: ClassVar[str]

    @classmethod
    @abstractmethod
    def from_config(cls, config: BrokerConfig) -> Self:
        """The provider the broker's settings describe (``ValueError`` on a bad setting)."""

    @abstractmethod
    async def authenticate(self, data: AuthenticationData) -> Authenticated:
        """The role ``data`` proves, or :class:`~magnetar.broker.errors.AuthenticationError`."""

    def accepts(self, data: AuthenticationData) -> bool:
        """Whether ``data`` carries this method's kind of credentials (an HTTP request is offered to the
        providers that accept it; one carrying none gets the anonymous role or 401)."""
        return True

    async def close(self) -> None:
        """Release what the provider holds (file watchers, key caches); most hold nothing."""
        return None


def request_role(request: web.Request) -> str | None:
    """The role an HTTP request authenticated as (``None``: authentication is disabled)."""
    role = request.get(ROLE_KEY)
    return role if isinstance(role, str) else None
