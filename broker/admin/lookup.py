"""HTTP lookup (``/lookup/v2/topic/...``), used by clients configured with an ``http://`` service URL."""

from __future__ import annotations

from aiohttp import web

from magnetar.broker.admin.api import Routes, json_response, not_found, service_of
from magnetar.broker.errors import BrokerError
from magnetar.broker.topic_name import TopicName

routes = Routes("lookup")


@routes.get(
    "/lookup/v2/topic/{domain}/{tenant}/{namespace}/{topic}",
    summary="Find the broker serving a topic",
    responses={200: "lookup data", 404: "namespace not found", 412: "invalid topic name"},
)
async def lookup_topic(request: web.Request) -> web.Response:
    service = service_of(request)
    m = request.match_info
    topic = TopicName.parse(f"{m['domain']}://{m['tenant']}/{m['namespace']}/{m['topic']}")
    try:
        await service.check_namespace(topic)
    except BrokerError as exc:
        raise not_found(exc.message) from None
    return json_response(
        {
            "brokerUrl": service.broker_service_url,
            "brokerUrlTls": "",
            "httpUrl": service.web_service_url,
            "httpUrlTls": "",
            "nativeUrl": service.broker_service_url,
        }
    )
