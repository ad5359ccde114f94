"""The authentication service (Pulsar's ``AuthenticationService``): the configured providers, and who a
binary connection or an HTTP request is.

``authenticationProviders`` lists Pulsar class names or the short method names. A binary CONNECT names
its method (``auth_method_name``); a method no provider serves (``none`` from a client without
authentication) gets ``anonymousUserRole`` if set, else is refused. An HTTP request is offered to the
providers whose kind of credentials it carries (``X-Pulsar-Auth-Method-Name`` picks one); one carrying none
gets ``anonymousUserRole`` or 401. Unlike Pulsar, HTTP credentials that are presented and wrong are
refused even with an anonymous role (Pulsar falls back to the anonymous role there).
"""

from __future__ import annotations

import importlib
import logging

from magnetar.broker.auth.provider import Authenticated, AuthenticationData, AuthenticationProvider
from magnetar.broker.config import BrokerConfig
from magnetar.broker.errors import AuthenticationError

log = logging.getLogger(__name__)

_PULSAR_PACKAGE = "org.apache.pulsar.broker.authentication."
_TOKEN = ("magnetar.broker.auth.token", "TokenAuthenticationProvider")
_BASIC = ("magnetar.broker.auth.basic", "BasicAuthenticationProvider")
_TLS = ("magnetar.broker.auth.tls", "TlsAuthenticationProvider")
#: Provider classes (module, class name) by the names ``authenticationProviders`` may use. A provider's
#: module is imported only once it is configured: the token provider's PyJWT and cryptography and the basic
#: provider's passlib and bcrypt would otherwise cost every broker ~10 MiB of memory for nothing.
PROVIDERS: dict[str, tuple[str, str]] = {
    "token": _TOKEN,
    "AuthenticationProviderToken": _TOKEN,
    "basic": _BASIC,
    "AuthenticationProviderBasic": _BASIC,
    "tls": _TLS,
    "AuthenticationProviderTls": _TLS,
}


def provider_class(name: str) -> type[AuthenticationProvider] | None:
    """The provider class ``name`` (short or Pulsar class name) stands for, imported now; None if unknown."""
    where = PROVIDERS.get(name.removeprefix(_PULSAR_PACKAGE))
    if where is None:
        return None
    cls = getattr(importlib.import_module(where[0]), where[1])
    assert issubclass(cls, AuthenticationProvider)
    return cls


#: The HTTP header naming the method of an HTTP request's credentials (Pulsar's).
METHOD_HEADER = "X-Pulsar-Auth-Method-Name"


class AuthenticationService:
    """The providers by method, and the anonymous role."""

    def __init__(self, providers: list[AuthenticationProvider], anonymous_role: str = "") -> None:
        self.providers = {p.method: p for p in providers}
        self.anonymous_role = anonymous_role

    @classmethod
    def from_config(cls, config: BrokerConfig) -> AuthenticationService | None:
        """The service ``authenticationEnabled`` asks for (None: off); ``ValueError`` on a bad setting."""
        if not config.authentication_enabled:
            return None
        providers: list[AuthenticationProvider] = []
        for name in (n.strip() for n in config.authentication_providers.split(",")):
            if not name:
                continue
            provider_type = provider_class(name)
            if provider_type is None:
                raise ValueError(f"authentication provider {name} is not supported (known: token, basic, tls)")
            if any(isinstance(p, provider_type) for p in providers):
                continue
            providers.append(provider_type.from_config(config))
        if not providers and not config.anonymous_user_role:
            log.warning("authentication is enabled without providers or anonymousUserRole: every client is refused")
        return cls(providers, config.anonymous_user_role.strip())

    def provider(self, method: str) -> AuthenticationProvider | None:
        return self.providers.get(method)

    async def authenticate_command(self, method: str, data: AuthenticationData) -> Authenticated:
        """Who a binary client is: ``method`` is CONNECT's ``auth_method_name`` (``none`` if absent)."""
        provider = self.providers.get(method)
        if provider is None:
            if self.anonymous_role:
                return Authenticated(self.anonymous_role)
            raise AuthenticationError("No anonymous role, and no authentication provider configured")
        return await provider.authenticate(data)

    async def authenticate_http(self, data: AuthenticationData) -> Authenticated:
        """Who an HTTP request is (see the module docstring)."""
        method = (data.http_headers or {}).get(METHOD_HEADER)
        if method:
            provider = self.providers.get(method)
            if provider is None:
                raise AuthenticationError(f"Authentication method {method} is not enabled")
            candidates = [provider]
        else:
            candidates = [p for p in self.providers.values() if p.accepts(data)]
        if not candidates:
            if self.anonymous_role:
                return Authenticated(self.anonymous_role)
            raise AuthenticationError("Authentication required")
        error: AuthenticationError | None = None
        for provider in candidates:
            try:
                return await provider.authenticate(data)
            except AuthenticationError as exc:
                error = exc
        assert error is not None
        raise error

    async def close(self) -> None:
        for provider in self.providers.values():
            await provider.close()
