"""Admin calls about a topic go to the broker that owns it: others answer ``307 Temporary Redirect``.

As Pulsar's ``validateTopicOwnership``: the call runs a lookup (which may assign the bundle); when the
topic is served elsewhere, the answer is a 307 to the same path and query on the owner's web service
URL (``authoritative=true`` added when the lookup chose that broker). Partitioned-topic level calls
(``/partitions``, partitioned stats, a partitioned topic's base name) are answered by any broker.
"""

from __future__ import annotations

import re

from aiohttp import web
from aiohttp.typedefs import Handler
from yarl import URL

from magnetar.broker.admin.api import service_of
from magnetar.broker.errors import BrokerError
from magnetar.broker.topic_name import TopicName

_TOPIC_PATH = re.compile(r"^/admin/v2/(persistent|non-persistent)/([^/]+)/([^/]+)/([^/]+)(/.*)?$")
_ANY_BROKER = ("/partitions", "/partitioned-stats", "/partitioned-internalStats", "/createMissedPartitions")


def pick_web_url(request: web.Request, http_url: str, http_url_tls: str) -> str:
    """The broker URL a redirect sends ``request`` to: HTTPS when it came over HTTPS (or the broker has
    no plain HTTP), else HTTP."""
    if http_url_tls and (request.secure or not http_url):
        return http_url_tls
    return http_url or http_url_tls


def redirect_target(request: web.Request, http_url: str, authoritative: bool) -> str:
    """The same request on another broker's web service URL."""
    query = dict(request.query)
    if authoritative:
        query["authoritative"] = "true"
    return str(URL(http_url).with_path(request.path).with_query(query))


@web.middleware
async def ownership_redirect(request: web.Request, handler: Handler) -> web.StreamResponse:
    service = service_of(request)
    namespaces = service.namespaces
    m = _TOPIC_PATH.match(request.path) if namespaces is not None else None
    if namespaces is None or m is None or (m.group(5) or "").startswith(_ANY_BROKER):
        return await handler(request)
    try:
        topic = TopicName.parse(f"{m.group(1)}://{m.group(2)}/{m.group(3)}/{m.group(4)}")
        if topic.partition_index < 0 and await service.resources.get_partitions(topic) > 0:
            return await handler(request)
        authoritative = request.query.get("authoritative", "false").lower() == "true"
        answer = await service.lookup(topic, authoritative, "")
    except (BrokerError, ValueError):
        return await handler(request)  # the handler reports the problem (404, 412, ...)
    if not answer.redirect and (answer.http_url, answer.http_url_tls) == (
        service.web_service_url,
        service.web_service_url_tls,
    ):
        return await handler(request)
    target = pick_web_url(request, answer.http_url, answer.http_url_tls)
    raise web.HTTPTemporaryRedirect(redirect_target(request, target, answer.redirect and answer.authoritative))
