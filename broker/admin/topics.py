"""``/admin/v2/{persistent|non-persistent}/...``: topic lifecycle, partitions, stats and termination."""

from __future__ import annotations

from aiohttp import web
from pydantic import BaseModel, ConfigDict

from magnetar.broker.admin.api import (
    RestError,
    Routes,
    json_body,
    json_response,
    no_content,
    not_found,
    query_bool,
    service_of,
)
from magnetar.broker.errors import TopicNotFoundError
from magnetar.broker.service import BrokerService
from magnetar.broker.stats import aggregate_partitioned, internal_stats, topic_stats
from magnetar.broker.system_topics import without_system_topics
from magnetar.broker.topic import PersistentTopic
from magnetar.broker.topic_name import TopicName

routes = Routes("topics")
DOMAIN = "{domain:persistent|non-persistent}"
NS = f"/admin/v2/{DOMAIN}/{{tenant}}/{{namespace}}"
TOPIC = f"{NS}/{{topic}}"


class MessageIdBody(BaseModel):
    """Pulsar's MessageIdImpl JSON (``ledgerId``/``entryId``; ``-1,-1`` = earliest)."""

    model_config = ConfigDict(extra="forbid")
    ledgerId: int
    entryId: int
    partitionIndex: int = -1
    batchIndex: int = -1
    isExcluded: bool = False
    properties: dict[str, int] | None = None


def topic_from(request: web.Request) -> TopicName:
    m = request.match_info
    return TopicName.parse(f"{m['domain']}://{m['tenant']}/{m['namespace']}/{m['topic']}")


def namespace_from(request: web.Request) -> str:
    m = request.match_info
    TopicName.parse(f"{m['domain']}://{m['tenant']}/{m['namespace']}/x")  # validates the names
    return f"{m['tenant']}/{m['namespace']}"


async def existing_topic(service: BrokerService, name: TopicName) -> PersistentTopic:
    """The (loaded) topic; 404 when it does not exist."""
    try:
        return await service.get_topic(name, create=False)
    except TopicNotFoundError:
        raise not_found(f"Topic {name} not found") from None


def message_id_json(ledger_id: int, entry_id: int, partition: int = -1, batch_index: int = -1) -> dict[str, int]:
    out = {"ledgerId": ledger_id, "entryId": entry_id, "partitionIndex": partition}
    if batch_index >= 0:
        out["batchIndex"] = batch_index
    return out


# ---------------------------------------------------------------------------------------------- listing
@routes.get(
    NS,
    summary="List topics of a namespace (partitions listed individually)",
    query={"includeSystemTopic": bool},
    responses={200: "names"},
)
async def list_topics(request: web.Request) -> web.Response:
    from magnetar.broker.protocol import pulsar_api_pb2 as pb

    service = service_of(request)
    namespace = namespace_from(request)
    if not await service.resources.namespace_exists(namespace):
        raise not_found("Namespace does not exist")
    mode = (
        pb.CommandGetTopicsOfNamespace.PERSISTENT
        if request.match_info["domain"] == "persistent"
        else pb.CommandGetTopicsOfNamespace.NON_PERSISTENT
    )
    topics = await service.list_topics(namespace, mode)
    return json_response(topics if query_bool(request, "includeSystemTopic") else without_system_topics(topics))


@routes.get(f"{NS}/partitioned", summary="List partitioned topics of a namespace", responses={200: "names"})
async def list_partitioned(request: web.Request) -> web.Response:
    service = service_of(request)
    namespace = namespace_from(request)
    if not await service.resources.namespace_exists(namespace):
        raise not_found("Namespace does not exist")
    return json_response(
        sorted(await service.resources.list_partitioned_topics(namespace, request.match_info["domain"]))
    )


# ---------------------------------------------------------------------------------------------- lifecycle
@routes.put(TOPIC, summary="Create a non-partitioned topic", responses={204: "created", 409: "exists"})
async def create_topic(request: web.Request) -> web.Response:
    await service_of(request).create_topic(topic_from(request))
    return no_content()


@routes.delete(
    TOPIC,
    summary="Delete a topic",
    query={"force": bool, "deleteSchema": bool},
    responses={204: "deleted", 404: "not found", 412: "clients connected"},
)
async def delete_topic(request: web.Request) -> web.Response:
    name = topic_from(request)
    service = service_of(request)
    if name.partition_index < 0 and await service.resources.get_partitions(name) > 0:
        raise RestError(409, "Topic is a partitioned topic: use the partitions endpoint to delete it")
    await service.delete_topic(name, force=query_bool(request, "force"))
    return no_content()


@routes.put(
    f"{TOPIC}/partitions",
    summary="Create a partitioned topic",
    body=int,
    responses={204: "created", 406: "invalid partition count", 409: "exists"},
)
async def create_partitioned(request: web.Request) -> web.Response:
    partitions = await json_body(request, int)
    await service_of(request).create_partitioned_topic(topic_from(request), partitions)
    return no_content()


@routes.post(
    f"{TOPIC}/partitions",
    summary="Increase the number of partitions",
    body=int,
    query={"updateLocalTopicOnly": bool, "force": bool},
    responses={204: "updated", 404: "not partitioned", 422: "partitions can only grow"},
)
async def update_partitioned(request: web.Request) -> web.Response:
    partitions = await json_body(request, int)
    await service_of(request).update_partitions(topic_from(request), partitions)
    return no_content()


@routes.get(
    f"{TOPIC}/partitions",
    summary="Partitioned-topic metadata",
    query={"checkAllowAutoCreation": bool},
    responses={200: '{"partitions": N}'},
)
async def get_partitions(request: web.Request) -> web.Response:
    name = topic_from(request)
    partitions = await service_of(request).partitioned_metadata(name, query_bool(request, "checkAllowAutoCreation"))
    return json_response({"partitions": partitions})


@routes.delete(
    f"{TOPIC}/partitions",
    summary="Delete a partitioned topic and all its partitions",
    query={"force": bool, "deleteSchema": bool},
    responses={204: "deleted", 404: "not found", 412: "clients connected"},
)
async def delete_partitioned(request: web.Request) -> web.Response:
    name = topic_from(request)
    service = service_of(request)
    if await service.resources.get_partitions(name) == 0:
        raise not_found("Partitioned topic does not exist")
    await service.delete_topic(name, force=query_bool(request, "force"))
    return no_content()


@routes.put(f"{TOPIC}/unload", summary="Unload a topic (clients reconnect)", responses={204: "unloaded"})
async def unload(request: web.Request) -> web.Response:
    name = topic_from(request)
    service = service_of(request)
    partitions = await service.resources.get_partitions(name) if name.partition_index < 0 else 0
    names = await service.existing_partitions(name) if partitions else [name]
    for n in names:
        topic = service.loaded_topic(n)
        if topic is not None:
            await service.unload_topic(topic)
        elif not partitions and not await service.resources.topic_stored(n):
            raise not_found(f"Topic {n} not found")
    return no_content()


@routes.post(f"{TOPIC}/terminate", summary="Terminate a topic (no more publishing)", responses={200: "last id"})
async def terminate(request: web.Request) -> web.Response:
    name = topic_from(request)
    service = service_of(request)
    if name.partition_index < 0 and await service.resources.get_partitions(name) > 0:
        raise RestError(405, "Termination of a partitioned topic is not allowed")
    topic = await existing_topic(service, name)
    last = await topic.terminate()
    return json_response(message_id_json(last.ledger_id, last.entry_id, name.partition_index))


@routes.get(f"{TOPIC}/lastMessageId", summary="Id of the last message", responses={200: "message id"})
async def last_message_id(request: web.Request) -> web.Response:
    name = topic_from(request)
    topic = await existing_topic(service_of(request), name)
    position, batch_index = await topic.last_message_id()
    return json_response(message_id_json(position.ledger_id, position.entry_id, name.partition_index, batch_index))


# ---------------------------------------------------------------------------------------------- stats
@routes.get(
    f"{TOPIC}/stats",
    summary="Topic stats",
    query={"getPreciseBacklog": bool, "subscriptionBacklogSize": bool, "getEarliestTimeInBacklog": bool},
    responses={200: "TopicStats"},
)
async def stats(request: web.Request) -> web.Response:
    topic = await existing_topic(service_of(request), topic_from(request))
    return json_response(topic_stats(topic))


@routes.get(
    f"{TOPIC}/partitioned-stats",
    summary="Stats of a partitioned topic, summed over partitions",
    query={"perPartition": bool, "getPreciseBacklog": bool},
    responses={200: "PartitionedTopicStats"},
)
async def partitioned_stats(request: web.Request) -> web.Response:
    name = topic_from(request)
    service = service_of(request)
    partitions = await service.resources.get_partitions(name)
    if partitions == 0:
        raise not_found("Partitioned Topic not found")
    per = {}
    for part in await service.existing_partitions(name):
        per[str(part)] = topic_stats(await service.get_topic(part, create=False))
    result = aggregate_partitioned(per, partitions)
    if not query_bool(request, "perPartition", True):
        result.pop("partitions")
    return json_response(result)


@routes.get(f"{TOPIC}/internalStats", summary="Managed-ledger internal stats", responses={200: "internal stats"})
async def get_internal_stats(request: web.Request) -> web.Response:
    topic = await existing_topic(service_of(request), topic_from(request))
    return json_response(internal_stats(topic))
