"""Credentials a broker presents when it calls another broker's HTTP API (unloading a bundle it does not
own, load shedding): Pulsar's ``brokerClientAuthenticationPlugin`` + ``brokerClientAuthenticationParameters``.

Plugins and parameters are read by the client-side parser (:func:`magnetar.admin_client.auth.parse_credentials`),
as every Pulsar client takes them: ``...AuthenticationToken`` with ``token:<jwt>``, ``file:///path`` (read at
every call, so a rotated token file is picked up), a JSON ``{"token": ...}`` / ``{"file": ...}`` or the token
itself; ``...AuthenticationBasic`` with JSON ``{"userId": ..., "password": ...}`` or ``userId:...,password:...``.
The role should be one of ``superUserRoles``.
"""

from __future__ import annotations

from magnetar.admin_client.auth import PLUGINS, TLS, parse_credentials
from magnetar.broker.config import BrokerConfig


def broker_client_headers(config: BrokerConfig) -> dict[str, str]:
    """HTTP headers carrying this broker's own credentials (empty when no plugin is configured).

    Raises :class:`~magnetar.admin_client.auth.AuthConfigError` (a ``ValueError``) for an unknown plugin or
    parameters it cannot use."""
    plugin = config.broker_client_authentication_plugin
    if PLUGINS.get(plugin.strip().lower()) == TLS:
        return {}  # TLS authenticates with the client certificate, not a header
    credentials = parse_credentials(plugin, config.broker_client_authentication_parameters)
    return credentials.http_headers() if credentials is not None else {}
