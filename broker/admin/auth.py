"""Authentication of HTTP requests (Pulsar's ``AuthenticationFilter``), the outermost admin middleware.

With ``authenticationEnabled`` every request but the open ones below must carry credentials the
configured providers accept: ``Authorization: Bearer <jwt>`` (token), ``Authorization: Basic`` (basic),
or a verified client certificate on HTTPS (tls). The role is kept under :data:`ROLE_KEY` for the
handlers (:func:`~magnetar.broker.auth.provider.request_role`). Missing or bad credentials: 401
``{"reason": "Authentication required"}`` with ``WWW-Authenticate``, the detail only in the log, as Pulsar.

Open without credentials, as in Pulsar: ``/status.html`` (what Pulsar's Helm chart points the kubelet's
probes at) and ``/metrics`` unless ``authenticateMetricsEndpoint``. ``/admin/v2/brokers/health`` and
``/ready`` need credentials, as every admin endpoint does in Pulsar.
"""

from __future__ import annotations

import logging

from aiohttp import web

from magnetar.broker.admin.api import SERVICE_KEY, Handler, json_response
from magnetar.broker.auth.provider import ROLE_KEY, AuthenticationData
from magnetar.broker.errors import AuthenticationError
from magnetar.broker.tls import request_peer_certificate

log = logging.getLogger(__name__)

#: Paths served without credentials.
OPEN_PATHS = frozenset({"/status.html"})
METRICS_PATHS = frozenset({"/metrics", "/metrics/"})
#: Challenge schemes offered in ``WWW-Authenticate`` by provider method.
_SCHEMES = {"token": 'Bearer realm="pulsar"', "basic": 'Basic realm="pulsar"'}


@web.middleware
async def authentication_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Authenticate ``request`` (see the module docstring) before any other middleware sees it."""
    service = request.app[SERVICE_KEY]
    authentication = service.authentication
    if authentication is None or _is_open(request.path, service.config.authenticate_metrics_endpoint):
        return await handler(request)
    data = AuthenticationData(
        http_headers=request.headers,
        peer_certificate=request_peer_certificate(request),
        peer_address=request.remote or "",
    )
    try:
        authenticated = await authentication.authenticate_http(data)
    except AuthenticationError as exc:
        log.info("[%s] failed to authenticate %s %s: %s", request.remote, request.method, request.path, exc)
        response = json_response({"reason": "Authentication required"}, 401)
        for method in authentication.providers:
            if method in _SCHEMES:
                response.headers.add("WWW-Authenticate", _SCHEMES[method])
        return response
    request[ROLE_KEY] = authenticated.role
    return await handler(request)


def _is_open(path: str, authenticate_metrics: bool) -> bool:
    return path in OPEN_PATHS or (path in METRICS_PATHS and not authenticate_metrics)
