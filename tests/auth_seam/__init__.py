"""A standalone broker with authorization on, for the authorization tests, and helpers to act as a role.

Until token authentication is on main, the brokers load this directory's ``sitecustomize`` (a test-only
stand-in where the token *is* the role); clients pass ``AuthenticationToken(role)`` / ``Bearer <role>``
exactly as they will with real tokens.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tests.admin.rest import Reply, call
from tests.conftest import StandaloneProcess

SEAM_DIR = str(Path(__file__).parent)
SUPERUSER = "root"


class AuthzBroker(StandaloneProcess):
    """A standalone with authentication and authorization on; ``superUserRoles=root``."""

    def __init__(self, data_dir: Path, extra: dict[str, str] | None = None) -> None:
        super().__init__(
            data_dir,
            {
                "authenticationEnabled": "true",
                "authorizationEnabled": "true",
                "superUserRoles": SUPERUSER,
                **(extra or {}),
            },
        )

    def start(self, timeout: float = 30.0) -> None:
        saved = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = SEAM_DIR + (os.pathsep + saved if saved else "")
        try:
            super().start(timeout)
        finally:
            if saved is None:
                del os.environ["PYTHONPATH"]
            else:
                os.environ["PYTHONPATH"] = saved

    def rest(self, role: str | None, method: str, path: str, body: Any = None) -> Reply:
        """An admin call as ``role`` (``None``: no credentials)."""
        headers = {"Authorization": f"Bearer {role}"} if role else {}
        return call(method, self.http_url + path, body, headers=headers)

    def client(self, role: str, **kwargs: Any) -> Any:
        import pulsar

        return pulsar.Client(
            self.service_url,
            authentication=pulsar.AuthenticationToken(role),
            operation_timeout_seconds=kwargs.pop("operation_timeout_seconds", 5),
            logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
            **kwargs,
        )
