"""``/admin/v2/brokers``: health, readiness and broker information."""

from __future__ import annotations

from aiohttp import web

from magnetar.broker.admin.api import Routes

routes = Routes("brokers")


@routes.get("/admin/v2/brokers/health", summary="Broker health check", responses={200: "ok"})
async def health(request: web.Request) -> web.Response:
    return web.Response(text="ok")


@routes.get("/admin/v2/brokers/ready", summary="Broker readiness", responses={200: "ok"})
async def ready(request: web.Request) -> web.Response:
    return web.Response(text="ok")
