"""``GET /metrics``: Prometheus text exposition (Pulsar's metric names)."""

from __future__ import annotations

from aiohttp import web

from magnetar.broker.admin.api import Routes, service_of
from magnetar.broker.metrics import render

routes = Routes("metrics")


@routes.get("/metrics", summary="Prometheus metrics", responses={200: "text exposition"})
async def metrics(request: web.Request) -> web.Response:
    return web.Response(
        text=render(service_of(request)),
        content_type="text/plain",
        charset="utf-8",
        headers={"X-Content-Type-Options": "nosniff"},
    )


@routes.get("/metrics/", summary="Prometheus metrics (trailing slash, as Pulsar serves it)")
async def metrics_slash(request: web.Request) -> web.StreamResponse:
    return await metrics(request)
