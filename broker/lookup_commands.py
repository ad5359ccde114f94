"""A connection's metadata requests: partitioned metadata, lookups, namespace topic lists and their
watchers (PIP-145), schemas.

Each handler takes the :class:`~magnetar.broker.connection.ServerConnection` the command came in on
and answers on it; the connection's dispatch table maps command types to them."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from magnetar.broker.auth.authorization import NamespaceOperation, TopicOperation
from magnetar.broker.errors import (
    NotAllowedError,
    ServiceNotReadyError,
)
from magnetar.broker.protocol import commands
from magnetar.broker.protocol import pulsar_api_pb2 as pb
from magnetar.broker.protocol.frames import Frame
from magnetar.broker.system_topics import without_system_topics
from magnetar.broker.topic_list import (
    ALL_TOPICS_PATTERN,
    TopicListWatcher,
    compile_topics_pattern,
    filter_topics,
    topics_hash,
)
from magnetar.broker.topic_name import TopicName

if TYPE_CHECKING:
    from magnetar.broker.connection import ServerConnection

T = pb.BaseCommand


async def _checked_topic(conn: ServerConnection, name: str, operation: TopicOperation, denied: str) -> TopicName:
    """Parse a topic the client asks about and check that its role may do ``operation`` (``denied`` if not)."""
    topic = TopicName.parse(name)
    await conn.service.authorization.check_topic(topic, conn.role, operation, message=denied)
    return topic


def on_partitioned_metadata(conn: ServerConnection, cmd: T, frame: Frame) -> None:
    r = cmd.partitionMetadata

    async def work() -> None:
        topic = await _checked_topic(
            conn, r.topic, TopicOperation.LOOKUP, "Client is not authorized to Get Partition Metadata"
        )
        partitions = await conn.service.partitioned_metadata(topic, r.metadata_auto_creation_enabled)
        conn.write(commands.partitioned_metadata(r.request_id, partitions))

    conn.spawn_request(r.request_id, work(), commands.partitioned_metadata_error)


def on_lookup(conn: ServerConnection, cmd: T, frame: Frame) -> None:
    r = cmd.lookupTopic

    async def work() -> None:
        topic = await _checked_topic(conn, r.topic, TopicOperation.LOOKUP, "Client is not authorized to Lookup")
        # As Pulsar: the client's listener name, else the one of the socket it came in on.
        name = r.advertised_listener_name if r.advertised_listener_name.strip() else conn.listener_name
        answer = await conn.service.lookup(topic, r.authoritative, name)
        if answer.redirect:
            conn.write(commands.lookup_redirect(r.request_id, answer.broker_url, answer.broker_url_tls,
                                                answer.authoritative))  # fmt: skip
        else:
            conn.write(commands.lookup_connect(r.request_id, answer.broker_url, answer.broker_url_tls))

    conn.spawn_request(r.request_id, work(), commands.lookup_error)


def on_get_topics_of_namespace(conn: ServerConnection, cmd: T, frame: Frame) -> None:
    r = cmd.getTopicsOfNamespace

    async def work() -> None:
        await _check_namespace_listing(conn, r.namespace)
        topics = without_system_topics(await conn.service.list_topics(r.namespace, r.mode))
        filtered = False
        if r.HasField("topics_pattern") and r.topics_pattern:
            topics = filter_topics(topics, compile_topics_pattern(r.topics_pattern))
            filtered = True
        digest = topics_hash(topics)
        changed = not (r.HasField("topics_hash") and r.topics_hash == digest)
        conn.write(commands.topics_of_namespace(r.request_id, topics, digest, changed, filtered))

    conn.spawn_request(r.request_id, work())


def on_watch_topic_list(conn: ServerConnection, cmd: T, frame: Frame) -> None:
    r = cmd.watchTopicList
    config = conn.config
    if not config.enable_broker_topic_list_watcher:
        raise NotAllowedError("Topic list watcher is disabled")
    if not config.enable_broker_side_subscription_pattern_evaluation:
        raise NotAllowedError("Unable to create topic list watcher: Evaluating subscription patterns is disabled.")
    if len(r.topics_pattern) > config.subscription_pattern_max_length:
        raise NotAllowedError(
            "Unable to create topic list watcher: Pattern longer than maximum: "
            f"{config.subscription_pattern_max_length}"
        )
    existing = conn.topic_list_watchers.get(r.watcher_id)
    if existing is not None:
        if not existing.started:
            raise ServiceNotReadyError("Topic list watcher is already present on the connection")
        current = sorted(existing.matching)
        conn.write(commands.watch_topic_list_success(r.request_id, r.watcher_id, current, topics_hash(current)))
        return
    pattern = compile_topics_pattern(r.topics_pattern or ALL_TOPICS_PATTERN)
    watcher = TopicListWatcher(r.watcher_id, r.namespace, pattern, functools.partial(_send_topic_list_update, conn))
    conn.topic_list_watchers[r.watcher_id] = watcher

    async def work() -> None:
        try:
            await _check_namespace_listing(conn, r.namespace)
            # Watch before listing: a topic created meanwhile is reported once the list is in.
            conn.service.topic_lists.add(watcher)
            topics = await conn.service.list_topics(r.namespace, pb.CommandGetTopicsOfNamespace.PERSISTENT)
        except BaseException:
            _forget_topic_list_watcher(conn, watcher)
            raise
        if watcher.closed:
            # Closed (WATCH_TOPIC_LIST_CLOSE) while listing: the request is still answered.
            raise ServiceNotReadyError("Topic list watcher was closed before its list was ready")
        digest = topics_hash(filter_topics(topics, pattern))
        listed = [] if r.HasField("topics_hash") and r.topics_hash == digest else filter_topics(topics, pattern)
        conn.write(commands.watch_topic_list_success(r.request_id, r.watcher_id, listed, digest))
        watcher.start(topics)

    conn.spawn_request(r.request_id, work())


def on_watch_topic_list_close(conn: ServerConnection, cmd: T, frame: Frame) -> None:
    r = cmd.watchTopicListClose
    watcher = conn.topic_list_watchers.get(r.watcher_id)
    if watcher is not None:
        _forget_topic_list_watcher(conn, watcher)
    conn.write(commands.success(r.request_id))


async def _check_namespace_listing(conn: ServerConnection, namespace: str) -> None:
    await conn.service.authorization.check_namespace(
        namespace, conn.role, NamespaceOperation.GET_TOPICS, message="Client is not authorized to GetTopicsOfNamespace"
    )


def _forget_topic_list_watcher(conn: ServerConnection, watcher: TopicListWatcher) -> None:
    if conn.topic_list_watchers.get(watcher.watcher_id) is watcher:
        del conn.topic_list_watchers[watcher.watcher_id]
    conn.service.topic_lists.remove(watcher)


def _send_topic_list_update(
    conn: ServerConnection, watcher_id: int, new: list[str], deleted: list[str], digest: str
) -> None:
    conn.write(commands.watch_topic_update(watcher_id, new, deleted, digest))


def on_get_schema(conn: ServerConnection, cmd: T, frame: Frame) -> None:
    r = cmd.getSchema

    async def work() -> None:
        name = await _checked_topic(conn, r.topic, TopicOperation.GET_SCHEMA, "Client is not authorized to GetSchema")
        version = r.schema_version if r.HasField("schema_version") else None
        found = await conn.service.schemas.get_schema(name, version)
        if found is None:
            conn.write(
                commands.get_schema_response(r.request_id, None, None, pb.TopicNotFound, "Topic not found or no-schema")
            )
        else:
            conn.write(commands.get_schema_response(r.request_id, found[0], found[1]))

    conn.spawn_request(
        r.request_id, work(), lambda rid, code, msg: commands.get_schema_response(rid, None, None, code, msg)
    )


def on_get_or_create_schema(conn: ServerConnection, cmd: T, frame: Frame) -> None:
    r = cmd.getOrCreateSchema

    async def work() -> None:
        name = await _checked_topic(
            conn, r.topic, TopicOperation.PRODUCE, "Client is not authorized to GetOrCreateSchema"
        )
        version = await conn.service.schemas.add_schema(name, r.schema)
        conn.write(commands.get_or_create_schema_response(r.request_id, version))

    conn.spawn_request(
        r.request_id, work(), lambda rid, code, msg: commands.get_or_create_schema_response(rid, None, code, msg)
    )
