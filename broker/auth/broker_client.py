"""Credentials a broker presents when it calls another broker's HTTP API (unloading a bundle it does not
own, load shedding): Pulsar's ``brokerClientAuthenticationPlugin`` + ``brokerClientAuthenticationParameters``.

Plugins and parameters as Pulsar's client takes them: ``...AuthenticationToken`` with ``token:<jwt>``,
``file:///path`` (read at every call, so a rotated token file is picked up), a JSON ``{"token": ...}`` /
``{"file": ...}`` or the token itself; ``...AuthenticationBasic`` with JSON ``{"userId": ..., "password": ...}``
or ``userId:...,password:...``. The role should be one of ``superUserRoles``.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from urllib.parse import urlparse

from magnetar.broker.config import BrokerConfig

_CLIENT_PACKAGE = "org.apache.pulsar.client.impl.auth."


def broker_client_headers(config: BrokerConfig) -> dict[str, str]:
    """HTTP headers carrying this broker's own credentials (empty when no plugin is configured)."""
    plugin = config.broker_client_authentication_plugin.strip().removeprefix(_CLIENT_PACKAGE)
    params = config.broker_client_authentication_parameters.strip()
    if not plugin or plugin in ("AuthenticationDisabled", "AuthenticationTls"):  # TLS: the client certificate
        return {}
    if plugin in ("AuthenticationToken", "token"):
        return {"Authorization": f"Bearer {_token(params)}"}
    if plugin in ("AuthenticationBasic", "basic"):
        user, password = _basic(params)
        return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}
    raise ValueError(f"brokerClientAuthenticationPlugin {config.broker_client_authentication_plugin} is not supported")


def _token(params: str) -> str:
    if params.startswith("{"):
        values = json.loads(params)
        if "token" in values:
            return str(values["token"])
        params = "file:" + str(values.get("file", ""))
    if params.startswith("token:"):
        return params[len("token:") :]
    if params.startswith("file:"):
        return Path(urlparse(params).path or params[len("file:") :]).read_text().strip()
    return params


def _basic(params: str) -> tuple[str, str]:
    if params.startswith("{"):
        values = json.loads(params)
    else:
        values = dict(item.split(":", 1) for item in params.split(",") if ":" in item)
    return str(values.get("userId", "")), str(values.get("password", ""))
