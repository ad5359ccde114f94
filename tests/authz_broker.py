"""A standalone broker with token authentication and authorization on, for the authorization tests, and
helpers to act as a role (a JWT signed with the broker's HS256 secret key, ``sub`` = the role)."""

from __future__ import annotations

import base64
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jwt

from tests.admin.rest import Reply, call
from tests.conftest import StandaloneProcess

SUPERUSER = "root"


class AuthzBroker(StandaloneProcess):
    """A standalone with ``authenticationProviders=token``, ``authorizationEnabled`` and ``superUserRoles=root``."""

    def __init__(self, data_dir: Path, extra: dict[str, str] | None = None) -> None:
        self.secret = os.urandom(32)
        super().__init__(
            data_dir,
            {
                "authenticationEnabled": "true",
                "authenticationProviders": "org.apache.pulsar.broker.authentication.AuthenticationProviderToken",
                "tokenSecretKey": "data:;base64," + base64.b64encode(self.secret).decode(),
                "authorizationEnabled": "true",
                "superUserRoles": SUPERUSER,
                **(extra or {}),
            },
        )

    def token(self, role: str) -> str:
        return jwt.encode({"sub": role}, self.secret, algorithm="HS256")

    def rest(self, role: str | None, method: str, path: str, body: Any = None) -> Reply:
        """An admin call as ``role`` (``None``: no credentials)."""
        headers = {"Authorization": f"Bearer {self.token(role)}"} if role else {}
        return call(method, self.http_url + path, body, headers=headers)

    def client(self, role: str, **kwargs: Any) -> Any:
        import pulsar

        return pulsar.Client(
            self.service_url,
            authentication=pulsar.AuthenticationToken(self.token(role)),
            operation_timeout_seconds=kwargs.pop("operation_timeout_seconds", 5),
            logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
            **kwargs,
        )


def running_with_tenants(data_dir: Path, *, topic: bool = False) -> Iterator[AuthzBroker]:
    """For a fixture: a started :class:`AuthzBroker` with tenants ``acme`` and ``globex`` (admins
    ``<tenant>-admin``), each with namespace ``ns`` (and topic ``t`` if ``topic``); stopped after."""
    node = AuthzBroker(data_dir)
    node.start()
    for tenant in ("acme", "globex"):
        info = {"adminRoles": [f"{tenant}-admin"], "allowedClusters": ["standalone"]}
        assert node.rest(SUPERUSER, "PUT", f"/admin/v2/tenants/{tenant}", info).status == 204
        assert node.rest(SUPERUSER, "PUT", f"/admin/v2/namespaces/{tenant}/ns").status == 204
        if topic:
            assert node.rest(SUPERUSER, "PUT", f"/admin/v2/persistent/{tenant}/ns/t").status == 204
    yield node
    assert node.stop() == 0, node.log()
