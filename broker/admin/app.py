"""The aiohttp application on ``webServicePort``: admin API v2, HTTP lookup, OpenAPI document."""

from __future__ import annotations

from aiohttp import web

from magnetar.broker.admin import (
    brokers,
    bundles,
    clusters,
    compaction,
    lookup,
    metrics,
    namespaces,
    permissions,
    schemas,
    subscriptions,
    tenants,
    topic_policies,
    topics,
)
from magnetar.broker.admin.access import authorization_middleware
from magnetar.broker.admin.api import SERVICE_KEY, error_middleware, json_response, openapi_document
from magnetar.broker.admin.auth import authentication_middleware
from magnetar.broker.admin.redirects import ownership_redirect
from magnetar.broker.service import BrokerService

#: Modules whose ``routes`` are served; each owns one part of the API.
MODULES = [
    brokers,
    bundles,
    lookup,
    topics,
    subscriptions,
    metrics,
    clusters,
    tenants,
    namespaces,
    topic_policies,
    permissions,
    schemas,
    compaction,
]


async def openapi(request: web.Request) -> web.Response:
    """The OpenAPI 3 document of everything implemented."""
    return json_response(openapi_document())


def build_app(service: BrokerService) -> web.Application:
    """The web application, bound to ``service``."""
    app = web.Application(
        client_max_size=service.config.max_frame_size,
        # Authentication first: nothing (not even a redirect to the owner) is answered to an unknown client;
        # authorization before redirects: a refused request learns nothing about where a topic lives.
        middlewares=[authentication_middleware, error_middleware, authorization_middleware, ownership_redirect],
    )
    app[SERVICE_KEY] = service
    for module in MODULES:
        app.router.add_routes(module.routes.table)
    app.router.add_get("/admin/v2/openapi.json", openapi)
    return app
