"""Compaction over the admin API: ``PUT|GET /admin/v2/persistent/{t}/{ns}/{topic}/compaction`` and the
namespace ``compactionThreshold`` policy.

``PUT`` starts a compaction (204; 409 while one runs), ``GET`` answers Pulsar's
``LongRunningProcessStatus`` (``{"status": "NOT_RUN|RUNNING|SUCCESS|ERROR", "lastError": ...}``).
On a partitioned topic both act on every partition (the status is the least advanced one).
"""

from __future__ import annotations

from aiohttp import web

from magnetar.broker.admin.api import Routes, bad_request, json_body, json_response, no_content, not_found, service_of
from magnetar.broker.admin.topics import existing_topic
from magnetar.broker.service import BrokerService
from magnetar.broker.topic import PersistentTopic
from magnetar.broker.topic_name import TopicName

routes = Routes("compaction")
TOPIC = "/admin/v2/persistent/{tenant}/{namespace}/{topic}"
NS = "/admin/v2/namespaces/{tenant}/{namespace}"
_ORDER = ["ERROR", "RUNNING", "NOT_RUN", "SUCCESS"]


async def _topics(service: BrokerService, name: TopicName) -> list[PersistentTopic]:
    partitions = await service.resources.get_partitions(name) if name.partition_index < 0 else 0
    if partitions:
        return [await existing_topic(service, name.partition(i)) for i in range(partitions)]
    return [await existing_topic(service, name)]


def _name(request: web.Request) -> TopicName:
    m = request.match_info
    return TopicName.parse(f"persistent://{m['tenant']}/{m['namespace']}/{m['topic']}")


@routes.put(f"{TOPIC}/compaction", summary="Trigger compaction", responses={204: "started", 409: "already running"})
async def trigger_compaction(request: web.Request) -> web.Response:
    service = service_of(request)
    for topic in await _topics(service, _name(request)):
        service.compaction.trigger(topic)
    return no_content()


@routes.get(f"{TOPIC}/compaction", summary="Compaction status", responses={200: "LongRunningProcessStatus"})
async def compaction_status(request: web.Request) -> web.Response:
    service = service_of(request)
    statuses = [service.compaction.status(t) for t in await _topics(service, _name(request))]
    return json_response(min(statuses, key=lambda s: _ORDER.index(s["status"])))


# ------------------------------------------------------------------ namespace compactionThreshold
def _ns(request: web.Request) -> str:
    m = request.match_info
    TopicName.parse(f"persistent://{m['tenant']}/{m['namespace']}/x")  # validates the names
    return f"{m['tenant']}/{m['namespace']}"


@routes.get(f"{NS}/compactionThreshold", summary="The namespace's compaction threshold (bytes)", responses={200: "n"})
async def get_threshold(request: web.Request) -> web.Response:
    policies = await service_of(request).policies.namespace(_ns(request))
    if policies is None:
        raise not_found("Namespace does not exist")
    return no_content() if policies.compaction_threshold is None else json_response(policies.compaction_threshold)


@routes.put(f"{NS}/compactionThreshold", summary="Set the compaction threshold", body=int, responses={204: "set"})
async def set_threshold(request: web.Request) -> web.Response:
    value = await json_body(request, int)
    if not 0 <= value < 2**63:
        raise bad_request("compactionThreshold must be 0 or more")
    await _set(request, value)
    return no_content()


@routes.delete(f"{NS}/compactionThreshold", summary="Remove the compaction threshold", responses={204: "removed"})
async def remove_threshold(request: web.Request) -> web.Response:
    await _set(request, None)
    return no_content()


async def _set(request: web.Request, value: int | None) -> None:
    await service_of(request).policies.update_namespace(
        _ns(request), lambda p: setattr(p, "compaction_threshold", value)
    )
