"""HTTP lookup (``/lookup/v2/topic/...``), used by clients configured with an ``http://`` service URL."""

from __future__ import annotations

from aiohttp import web

from magnetar.broker.admin.api import RestError, Routes, bad_request, json_response, not_found, service_of
from magnetar.broker.admin.redirects import pick_web_url, redirect_target
from magnetar.broker.errors import BrokerError
from magnetar.broker.topic_name import TopicName

routes = Routes("lookup")


@routes.get(
    "/lookup/v2/topic/{domain}/{tenant}/{namespace}/{topic}",
    summary="Find the broker serving a topic (``listenerName`` query or ``X-Pulsar-ListenerName`` header: "
    "that advertised listener's URLs)",
    responses={200: "lookup data", 400: "unknown listener name", 404: "namespace not found", 412: "invalid topic name"},
)
async def lookup_topic(request: web.Request) -> web.Response:
    service = service_of(request)
    m = request.match_info
    topic = TopicName.parse(f"{m['domain']}://{m['tenant']}/{m['namespace']}/{m['topic']}")
    try:
        await service.check_namespace(topic)
    except BrokerError as exc:
        raise not_found(exc.message) from None
    # The query parameter wins over the header (PIP-95: the header is for gateways that cannot set queries).
    listener = request.query.get("listenerName") or request.headers.get("X-Pulsar-ListenerName") or ""
    authoritative = request.query.get("authoritative", "false").lower() == "true"
    try:
        answer = await service.lookup(topic, authoritative, listener.strip())
    except BrokerError as exc:
        if "listener" in exc.message:
            raise bad_request(exc.message) from None  # PIP-95: 400 for a listener name the broker does not have
        raise RestError(503, exc.message) from None
    if answer.redirect:  # as Pulsar: look up again at the chosen broker
        target = pick_web_url(request, answer.http_url, answer.http_url_tls)
        raise web.HTTPTemporaryRedirect(redirect_target(request, target, answer.authoritative))
    return json_response(
        {
            "brokerUrl": answer.broker_url,
            "brokerUrlTls": answer.broker_url_tls,
            "httpUrl": answer.http_url,
            "httpUrlTls": answer.http_url_tls,
            "nativeUrl": answer.broker_url,
        }
    )
