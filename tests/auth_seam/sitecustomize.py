"""Test-only stand-in for authentication, loaded by brokers the authorization tests start (this directory is
put first on their ``PYTHONPATH``): the role is the token itself. CONNECT ``auth_method_name="token"`` with
``auth_data=<role>`` (the official client's ``AuthenticationToken(role)``) sets ``ServerConnection.role``;
HTTP ``Authorization: Bearer <role>`` sets the request's role. Never used outside those tests.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from magnetar.broker import connection as _connection
from magnetar.broker.admin import app as _app
from magnetar.broker.auth.provider import ROLE_KEY

_on_connect = _connection.ServerConnection.on_connect


def _connect_with_role(self: Any, cmd: Any, frame: Any) -> None:
    if cmd.connect.auth_method_name == "token":
        self.role = cmd.connect.auth_data.decode()
    _on_connect(self, cmd, frame)


@web.middleware
async def _role_from_bearer(request: web.Request, handler: Any) -> web.StreamResponse:
    scheme, _, credential = request.headers.get("Authorization", "").partition(" ")
    if scheme == "Bearer" and credential:
        request[ROLE_KEY] = credential
    return await handler(request)


_build_app = _app.build_app


def _build_app_with_roles(service: Any) -> web.Application:
    application = _build_app(service)
    application.middlewares.insert(1, _role_from_bearer)  # after the error middleware, before authorization
    return application


_connection.ServerConnection.on_connect = _connect_with_role  # type: ignore[method-assign]
_connection._HANDLERS[_connection.T.CONNECT] = _connect_with_role  # the dispatch table holds the function
_app.build_app = _build_app_with_roles
