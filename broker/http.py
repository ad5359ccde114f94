"""HTTP service on the web port: health, readiness and HTTP lookup (the full admin API builds on this app)."""

from __future__ import annotations

import logging

from aiohttp import web

from magnetar.broker.errors import BrokerError
from magnetar.broker.service import BrokerService
from magnetar.broker.topic_name import TopicName

log = logging.getLogger(__name__)
SERVICE_KEY = web.AppKey("service", BrokerService)


def _error(status: int, reason: str) -> web.Response:
    return web.json_response({"reason": reason}, status=status)


async def health(request: web.Request) -> web.Response:
    """``GET /admin/v2/brokers/health``: ``ok`` when the broker serves requests."""
    return web.Response(text="ok")


async def ready(request: web.Request) -> web.Response:
    return web.Response(text="ok")


async def lookup(request: web.Request) -> web.Response:
    """``GET /lookup/v2/topic/{domain}/{tenant}/{namespace}/{topic}``: this broker serves every topic."""
    service = request.app[SERVICE_KEY]
    m = request.match_info
    try:
        topic = TopicName.parse(f"{m['domain']}://{m['tenant']}/{m['namespace']}/{m['topic']}")
        await service.check_namespace(topic)
    except BrokerError as exc:
        return _error(404 if exc.code == 11 else 412, exc.message)
    return web.json_response(
        {
            "brokerUrl": service.broker_service_url,
            "httpUrl": service.web_service_url,
            "nativeUrl": service.broker_service_url,
            "brokerUrlTls": "",
            "httpUrlTls": "",
        }
    )


def build_app(service: BrokerService) -> web.Application:
    """The aiohttp application served on ``webServicePort``."""
    app = web.Application(client_max_size=service.config.max_frame_size)
    app[SERVICE_KEY] = service
    app.router.add_get("/admin/v2/brokers/health", health)
    app.router.add_get("/admin/v2/brokers/ready", ready)
    app.router.add_get("/lookup/v2/topic/{domain}/{tenant}/{namespace}/{topic}", lookup)
    return app
