"""Subscription administration: create/delete, skip, reset, expire, peek and examine messages."""

from __future__ import annotations

import json
import re
import time

from aiohttp import web

from magnetar.broker.admin.api import (
    RestError,
    Routes,
    json_body,
    json_response,
    no_content,
    not_found,
    query_bool,
    query_int,
    service_of,
)
from magnetar.broker.admin.topics import TOPIC, MessageIdBody, existing_topic, topic_from
from magnetar.broker.protocol.compression import CorruptPayloadError, decompress
from magnetar.broker.protocol.frames import parse_metadata
from magnetar.broker.service import BrokerService
from magnetar.broker.subscription import Subscription
from magnetar.broker.topic import PersistentTopic, wire_position
from magnetar.broker.topic_name import TopicName
from magnetar.managed_ledger.api import EARLIEST, LATEST, Entry, InitialPosition, Position

routes = Routes("subscriptions")
SUB = f"{TOPIC}/subscription/{{subscription}}"


async def _targets(request: web.Request) -> list[TopicName]:
    """The topic itself, or every partition of a partitioned topic (Pulsar applies sub ops to each)."""
    name = topic_from(request)
    service = service_of(request)
    partitions = await service.resources.get_partitions(name) if name.partition_index < 0 else 0
    return await service.existing_partitions(name) if partitions else [name]


async def _subscription(service: BrokerService, name: TopicName, sub_name: str) -> Subscription:
    topic = await existing_topic(service, name)
    sub = topic.subscriptions.get(sub_name)
    if sub is None:
        raise not_found("Subscription not found")
    return sub


def _position(topic: PersistentTopic, body: MessageIdBody) -> Position:
    from magnetar.broker.protocol import pulsar_api_pb2 as pb

    position = wire_position(pb.MessageIdData(ledgerId=body.ledgerId & (2**64 - 1), entryId=body.entryId & (2**64 - 1)))
    if position == EARLIEST:
        return topic.ledger.first_position
    if position == LATEST:
        return topic.ledger.next_position(topic.ledger.last_confirmed_entry)
    return topic.ledger.next_position(position) if body.isExcluded else position


@routes.get(f"{TOPIC}/subscriptions", summary="List subscriptions", responses={200: "names"})
async def list_subscriptions(request: web.Request) -> web.Response:
    service = service_of(request)
    names: set[str] = set()
    for name in await _targets(request):
        if await service.topic_exists(name):
            names.update((await existing_topic(service, name)).subscriptions)
        elif name == topic_from(request):
            raise not_found("Topic not found")
    return json_response(sorted(names))


@routes.put(
    SUB,
    summary="Create a durable subscription at a position (default: latest)",
    body=MessageIdBody,
    query={"replicated": bool},
    responses={204: "created", 409: "exists"},
)
async def create_subscription(request: web.Request) -> web.Response:
    service = service_of(request)
    sub_name = request.match_info["subscription"]
    body = await json_body(request, MessageIdBody, required=False)
    for name in await _targets(request):
        topic = await service.get_topic(name, create=True)
        if sub_name in topic.subscriptions:
            raise RestError(409, "Subscription already exists for topic")
        start = InitialPosition.LATEST
        if body is not None and body.ledgerId < 0 and body.entryId < 0:
            start = InitialPosition.EARLIEST
        cursor = await topic.ledger.open_cursor(sub_name, start)
        if body is not None and not (body.ledgerId < 0 and body.entryId < 0):
            await cursor.reset(_position(topic, body))
        await topic.initialize()
    return no_content()


@routes.delete(
    SUB,
    summary="Delete a subscription",
    query={"force": bool},
    responses={204: "deleted", 404: "not found", 412: "consumers connected"},
)
async def delete_subscription(request: web.Request) -> web.Response:
    service = service_of(request)
    force = query_bool(request, "force")
    for name in await _targets(request):
        sub = await _subscription(service, name, request.match_info["subscription"])
        if sub.consumers and not force:
            raise RestError(412, "Subscription has active connected consumers")
        await sub.unsubscribe(None, force=True)
    return no_content()


@routes.post(f"{SUB}/skip/{{count}}", summary="Skip messages", responses={204: "skipped"})
async def skip(request: web.Request) -> web.Response:
    count = _int_path(request, "count", minimum=0)
    service = service_of(request)
    for name in await _targets(request):
        (await _subscription(service, name, request.match_info["subscription"])).skip_entries(count)
    return no_content()


@routes.post(f"{SUB}/skip_all", summary="Skip the whole backlog", responses={204: "cleared"})
async def skip_all(request: web.Request) -> web.Response:
    service = service_of(request)
    for name in await _targets(request):
        (await _subscription(service, name, request.match_info["subscription"])).clear_backlog()
    return no_content()


@routes.post(f"{SUB}/resetcursor/{{timestamp}}", summary="Reset to a publish time", responses={204: "reset"})
async def reset_cursor_time(request: web.Request) -> web.Response:
    timestamp = _int_path(request, "timestamp", minimum=0)
    service = service_of(request)
    for name in await _targets(request):
        sub = await _subscription(service, name, request.match_info["subscription"])
        await sub.reset(await sub.topic.find_position_by_publish_time(timestamp))
    return no_content()


@routes.post(
    f"{SUB}/resetcursor",
    summary="Reset to a message id",
    body=MessageIdBody,
    query={"isExcluded": bool},
    responses={204: "reset"},
)
async def reset_cursor_id(request: web.Request) -> web.Response:
    service = service_of(request)
    body = await json_body(request, MessageIdBody)
    if query_bool(request, "isExcluded"):
        body.isExcluded = True
    for name in await _targets(request):
        sub = await _subscription(service, name, request.match_info["subscription"])
        await sub.reset(_position(sub.topic, body))
    return no_content()


@routes.post(f"{SUB}/expireMessages/{{seconds}}", summary="Expire messages older than N seconds")
async def expire(request: web.Request) -> web.Response:
    seconds = _int_path(request, "seconds", minimum=0)
    service = service_of(request)
    for name in await _targets(request):
        await (await _subscription(service, name, request.match_info["subscription"])).expire_older_than(seconds)
    return no_content()


@routes.post(f"{TOPIC}/all_subscription/expireMessages/{{seconds}}", summary="Expire on every subscription")
async def expire_all(request: web.Request) -> web.Response:
    seconds = _int_path(request, "seconds", minimum=0)
    service = service_of(request)
    for name in await _targets(request):
        if not await service.topic_exists(name):
            continue
        for sub in list((await existing_topic(service, name)).subscriptions.values()):
            await sub.expire_older_than(seconds)
    return no_content()


@routes.get(f"{SUB}/position/{{position}}", summary="Peek the Nth unacknowledged message", responses={200: "message"})
async def peek(request: web.Request) -> web.StreamResponse:
    nth = _int_path(request, "position", minimum=1)
    name = topic_from(request)
    service = service_of(request)
    if name.partition_index < 0 and await service.resources.get_partitions(name) > 0:
        raise RestError(405, "Peek messages on a partitioned topic is not allowed")
    sub = await _subscription(service, name, request.match_info["subscription"])
    entry = await sub.peek(nth)
    if entry is None:
        raise not_found("Message not found")
    return message_response(entry, service.config.max_uncompressed_message_size)


@routes.get(
    f"{TOPIC}/examinemessage",
    summary="Examine the Nth message from the earliest or latest",
    query={"initialPosition": str, "messagePosition": int},
    responses={200: "message", 404: "no such message"},
)
async def examine(request: web.Request) -> web.StreamResponse:
    name = topic_from(request)
    service = service_of(request)
    topic = await existing_topic(service, name)
    initial = request.query.get("initialPosition", "latest").lower()
    if initial not in ("latest", "earliest"):
        raise RestError(412, "initialPosition must be latest or earliest")
    nth = query_int(request, "messagePosition", 1) or 1
    if nth < 1:
        raise RestError(412, "messagePosition must be at least 1")
    ml = topic.ledger
    if ml.number_of_entries < nth:
        raise not_found("Message not found: the topic has fewer entries")
    if initial == "earliest":
        position = ml.first_position
        for _ in range(nth - 1):
            position = ml.next_position(position)
    else:
        position = ml.last_confirmed_entry
        for _ in range(nth - 1):
            position = ml.previous_position(position)
    return message_response(await ml.read_entry(position), service.config.max_uncompressed_message_size)


@routes.get(
    f"{TOPIC}/ledger/{{ledgerId}}/entry/{{entryId}}",
    summary="Get a message by its ledger and entry id",
    responses={200: "message", 404: "no such message"},
)
async def get_message_by_id(request: web.Request) -> web.StreamResponse:
    service = service_of(request)
    topic = await existing_topic(service, topic_from(request))
    position = Position(_int_path(request, "ledgerId", minimum=0), _int_path(request, "entryId", minimum=0))
    ml = topic.ledger
    if not (ml.first_position <= position <= ml.last_confirmed_entry) or position.entry_id < 0:
        raise not_found(f"Message not found: {position}")
    try:
        entry = await ml.read_entry(position)
    except Exception:
        raise not_found(f"Message not found: {position}") from None
    return message_response(entry, service.config.max_uncompressed_message_size)


def message_response(entry: Entry, max_uncompressed: int) -> web.Response:
    """A stored message as Pulsar's admin API returns it: payload body, metadata in ``X-Pulsar-*`` headers.

    A stored entry that does not decode (metadata, or payload under its codec and declared size) is 409
    with the reason; text from the client goes into headers with control characters escaped.
    """
    try:
        metadata, payload = parse_metadata(entry.data)
    except Exception as exc:
        raise RestError(409, f"Message {entry.position} has corrupt metadata: {exc}") from None
    headers = {"X-Pulsar-Message-ID": str(entry.position)}
    props = {_text(kv.key): _text(kv.value) for kv in metadata.properties}
    if props:
        headers["X-Pulsar-PROPERTY"] = json.dumps(props)
        for key, value in props.items():
            if _HEADER_TOKEN.fullmatch(key):  # others are only in the JSON header
                headers[f"X-Pulsar-PROPERTY-{key}"] = _header_value(value)
    headers["X-Pulsar-publish-time"] = _iso_ms(metadata.publish_time)
    if metadata.event_time:
        headers["X-Pulsar-event-time"] = _iso_ms(metadata.event_time)
    if metadata.HasField("deliver_at_time"):
        headers["X-Pulsar-deliver-at-time"] = _iso_ms(metadata.deliver_at_time)
    if metadata.HasField("num_messages_in_batch"):
        headers["X-Pulsar-num-batch-message"] = str(metadata.num_messages_in_batch)
        headers["X-Pulsar-batch-size"] = str(len(payload))
    headers["X-Pulsar-producer-name"] = _header_value(_text(metadata.producer_name))
    headers["X-Pulsar-sequence-id"] = str(metadata.sequence_id)
    if metadata.HasField("partition_key"):
        headers["X-Pulsar-partition-key"] = _header_value(_text(metadata.partition_key))
    if metadata.null_value:
        headers["X-Pulsar-null-value"] = "true"
    if metadata.HasField("replicated_from"):
        headers["X-Pulsar-replicated-from"] = _header_value(_text(metadata.replicated_from))
    try:
        body = decompress(metadata.compression, payload, metadata.uncompressed_size, max_uncompressed)
    except CorruptPayloadError as exc:
        raise RestError(409, f"Message {entry.position} cannot be decompressed: {exc}") from None
    return web.Response(body=body, headers=headers, content_type="application/octet-stream")


_HEADER_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _text(value: str | bytes) -> str:
    """A metadata string (upb gives bytes for invalid UTF-8, e.g. in an entry stored before validation)."""
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def _header_value(value: str) -> str:
    """``value`` safe in an HTTP header: control characters (CR, LF, ...) percent-escaped."""
    return _CONTROL.sub(lambda m: f"%{ord(m.group()):02X}", value)


def _iso_ms(ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}Z"


def _int_path(request: web.Request, name: str, minimum: int) -> int:
    raw = request.match_info[name]
    try:
        value = int(raw)
    except ValueError:
        raise RestError(400, f"Invalid {name}: {raw!r}") from None
    if value < minimum:
        raise RestError(412, f"{name} must be at least {minimum}")
    return value
