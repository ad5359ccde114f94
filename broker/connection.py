"""One client connection: frames in, commands dispatched, responses out (coalesced).

Each connection is an :class:`asyncio.Protocol`. Per-message commands (SEND, ACK, FLOW) are
handled synchronously in ``data_received``; commands that need the metadata store or storage
run as tasks and always answer with the request id they carried. Outgoing frames are
collected and written once per event-loop turn, so a burst of MESSAGE frames or receipts
costs one socket write.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from magnetar.broker.consumer import Consumer
from magnetar.broker.errors import (
    BrokerError,
    ConsumerBusyError,
    InvalidTopicNameError,
    NotAllowedError,
    ProducerBusyError,
    ServiceNotReadyError,
)
from magnetar.broker.producer import Producer
from magnetar.broker.protocol import commands
from magnetar.broker.protocol import pulsar_api_pb2 as pb
from magnetar.broker.protocol.frames import ChecksumMismatchError, Frame, FrameDecoder, FrameError, verify_entry
from magnetar.broker.protocol.validate import InvalidMetadataError, check_message_metadata, invalid_string_field
from magnetar.broker.system_topics import without_system_topics
from magnetar.broker.topic import wire_position
from magnetar.broker.topic_list import (
    ALL_TOPICS_PATTERN,
    TopicListWatcher,
    compile_topics_pattern,
    filter_topics,
    topics_hash,
)
from magnetar.broker.topic_name import TopicName
from magnetar.common.tasks import TaskSet
from magnetar.ledger.api import LedgerError
from magnetar.managed_ledger.api import (
    EARLIEST,
    LATEST,
    CursorNotFoundError,
    ManagedLedgerClosedError,
    ManagedLedgerError,
    ManagedLedgerFencedError,
    Position,
)
from magnetar.metadata.api import MetadataError as StoreMetadataError

if TYPE_CHECKING:
    from magnetar.broker.service import BrokerService

log = logging.getLogger(__name__)

T = pb.BaseCommand
SERVER_VERSION = "Magnetar 0.1.0"
MAX_PROTOCOL_VERSION = 21
_ALL_ONES = -1


class ServerConnection(asyncio.Protocol):
    """Protocol handler for one client connection on the binary port."""

    def __init__(self, service: BrokerService, listener_name: str = "") -> None:
        self.service = service
        #: Listener of the socket this connection came in on (``bindAddresses``): lookups naming none use it.
        self.listener_name = listener_name
        self.config = service.config
        self.decoder = FrameDecoder(self.config.max_frame_size)
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.handshake_done = False
        self.client_version = ""
        self.protocol_version = 0
        self.producers: dict[int, Producer] = {}
        self.consumers: dict[int, Consumer] = {}
        self.topic_list_watchers: dict[int, TopicListWatcher] = {}
        self.writable = True
        self.closed = False
        self._out: list[bytes] = []
        self._flush_handle: asyncio.Handle | None = None
        self.tasks = TaskSet("connection")
        self._awaiting_pong = False
        self._keepalive: asyncio.TimerHandle | None = None
        # Publish back-pressure (see broker/publish_buffer.py).
        self._pending_sends = 0
        self._too_many_sends = False
        self._reading_paused = False

    # ------------------------------------------------------------------ transport
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports are not asyncio.Transport
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.tasks.name = f"connection {self.peer}"
        self.service.connections.add(self)
        self._schedule_keepalive()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.service.connections.discard(self)
        if self._keepalive is not None:
            self._keepalive.cancel()
        self.tasks.cancel()
        for watcher in self.topic_list_watchers.values():
            self.service.topic_lists.remove(watcher)
        self.topic_list_watchers.clear()
        producers, consumers = list(self.producers.values()), list(self.consumers.values())
        self.producers.clear()
        self.consumers.clear()
        for p in producers:
            p.closed = True
            p.topic.remove_producer(p)
        if consumers:
            # The connection's own tasks are cancelled: the service outlives it.
            self.service.tasks.spawn(self._detach_consumers(consumers), name=f"detach consumers {self.peer}")

    @staticmethod
    async def _detach_consumers(consumers: list[Consumer]) -> None:
        for c in consumers:
            try:
                await c.subscription.remove_consumer(c)
            except Exception:
                log.exception("failed to detach consumer %s", c.name)

    def pause_writing(self) -> None:
        self.writable = False

    def resume_writing(self) -> None:
        self.writable = True
        for c in self.consumers.values():
            c.subscription.wakeup()

    # ------------------------------------------------------------------ publish back-pressure
    def publish_started(self, size: int) -> None:
        """A SEND of ``size`` bytes awaits persistence: stop reading past the per-connection limit."""
        self._pending_sends += 1
        buffer = self.service.publish_buffer
        buffer.add(size)
        limit = self.config.max_pending_publish_requests_per_connection
        if not self._too_many_sends and 0 < limit <= self._pending_sends:
            self._too_many_sends = True
            self.update_reading()
        elif buffer.throttled and not self._reading_paused:  # e.g. connected after throttling began
            self.update_reading()

    def publish_done(self, size: int) -> None:
        """A SEND was answered: read again once half of the per-connection limit is free."""
        self._pending_sends -= 1
        self.service.publish_buffer.release(size)
        if self._too_many_sends and self._pending_sends <= self.config.max_pending_publish_requests_per_connection // 2:
            self._too_many_sends = False
            self.update_reading()

    def update_reading(self) -> None:
        """Pause or resume reading the socket as the publish limits say."""
        want = self._too_many_sends or (self.service.publish_buffer.throttled and bool(self.producers))
        if want == self._reading_paused or self.transport is None or self.closed:
            return
        self._reading_paused = want
        if want:
            self.transport.pause_reading()
        else:
            self.transport.resume_reading()

    def write(self, *parts: bytes) -> None:
        """Queue frames; they are written together at the end of this event-loop turn."""
        if self.closed:
            return
        self._out.extend(parts)
        if self._flush_handle is None:
            self._flush_handle = self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_handle = None
        out, self._out = self._out, []
        if out and self.transport is not None and not self.closed:
            self.transport.writelines(out)

    def close(self) -> None:
        """Close after sending what is queued."""
        if self.transport is not None and not self.closed:
            self._flush()
            self.transport.close()
        self.closed = True

    # ------------------------------------------------------------------ keep-alive
    def _schedule_keepalive(self) -> None:
        interval = self.config.keep_alive_interval_seconds
        if interval > 0:
            self._keepalive = self.loop.call_later(interval, self._on_keepalive)

    def _on_keepalive(self) -> None:
        if self.closed:
            return
        if self._reading_paused:  # its PONG may be unread behind the sends we hold back
            self._awaiting_pong = False
            self._schedule_keepalive()
            return
        if self._awaiting_pong or not self.handshake_done:
            log.info("closing connection from %s: no response to keep-alive (or no CONNECT) in time", self.peer)
            self.close()
            return
        self._awaiting_pong = True
        self.write(commands.ping())
        self._schedule_keepalive()

    # ------------------------------------------------------------------ frames in
    def data_received(self, data: bytes) -> None:
        try:
            frames = self.decoder.feed(data)
        except FrameError as exc:
            log.warning("closing connection from %s: %s", self.peer, exc)
            self.write(commands.error(0, pb.UnknownError, f"Invalid frame: {exc}"))
            self.close()
            return
        if frames:
            self._awaiting_pong = False
        for frame in frames:
            if self.closed:
                return
            self._handle(frame)

    def _handle(self, frame: Frame) -> None:
        cmd = frame.command
        if not cmd.HasField("type"):
            # A command type this broker does not know (newer protocol): refuse it, keep the connection.
            self.write(commands.error(_request_id(cmd), pb.NotAllowedError, "Unknown command type"))
            return
        kind = cmd.type
        if not self.handshake_done and kind != T.CONNECT:
            log.warning("closing connection from %s: %s before CONNECT", self.peer, T.Type.Name(kind))
            self.write(commands.error(_request_id(cmd), pb.NotAllowedError, "Received command before CONNECT"))
            self.close()
            return
        handler = _HANDLERS.get(kind)
        if handler is None:
            name = T.Type.Name(kind) if kind in T.Type.values() else str(kind)
            self.write(commands.error(_request_id(cmd), pb.NotAllowedError, f"Command {name} is not supported"))
            return
        if kind not in _HOT_COMMANDS:
            # Every string from the wire is checked here, once: nothing behind this meets a bytes "string".
            bad = invalid_string_field(cmd)
            if bad is not None:
                self._refuse_invalid_utf8(cmd, bad)
                return
        try:
            handler(self, cmd, frame)
        except BrokerError as exc:
            self.write(commands.error(_request_id(cmd), exc.code, exc.message))
        except Exception as exc:
            log.exception("error handling %s from %s", T.Type.Name(kind), self.peer)
            self.write(commands.error(_request_id(cmd), pb.UnknownError, str(exc)))

    def _refuse_invalid_utf8(self, cmd: T, field: str) -> None:
        """Answer a command holding invalid UTF-8 in ``field`` with the error its response kind carries."""
        leaf = field.rsplit(".", 1)[-1]
        code = pb.InvalidTopicName if leaf in _NAME_FIELDS else pb.NotAllowedError
        message = f"Invalid UTF-8 in {field}"
        log.info("refused %s from %s: %s", T.Type.Name(cmd.type), self.peer, message)
        request_id = _request_id(cmd)
        if cmd.type == T.ACK:
            if cmd.ack.HasField("request_id"):
                self.write(commands.ack_response(cmd.ack.consumer_id, request_id, code, message))
            return
        if cmd.type == T.REDELIVER_UNACKNOWLEDGED_MESSAGES:
            return  # no response exists for it
        builder = _ERROR_RESPONSES.get(cmd.type, commands.error)
        self.write(builder(request_id, code, message))

    def _spawn(
        self,
        request_id: int,
        work: Awaitable[None],
        on_error: Callable[[int, pb.ServerError, str], bytes] | None = None,
    ) -> None:
        """Run ``work``; a failure is answered with an ERROR (or ``on_error``) for ``request_id``."""
        builder = on_error or commands.error

        async def guarded() -> None:
            try:
                await work
            except asyncio.CancelledError:
                raise
            except BrokerError as exc:
                self.write(builder(request_id, exc.code, exc.message))
            except Exception as exc:
                code = _storage_error_code(exc)
                if code is None:  # a bug: keep the traceback
                    log.exception("request %s from %s failed", request_id, self.peer)
                    code = pb.UnknownError
                else:  # storage or metadata refused (fenced, closed, timed out): one line, no traceback
                    log.warning("request %s from %s failed: %s: %s", request_id, self.peer, type(exc).__name__, exc)
                self.write(builder(request_id, code, str(exc)))

        self.tasks.spawn(guarded())

    def forget_producer(self, producer_id: int) -> None:
        self.producers.pop(producer_id, None)

    def forget_consumer(self, consumer_id: int) -> None:
        self.consumers.pop(consumer_id, None)

    # ------------------------------------------------------------------ handshake and liveness
    def on_connect(self, cmd: T, frame: Frame) -> None:
        c = cmd.connect
        self.client_version = c.client_version
        self.protocol_version = min(c.protocol_version, MAX_PROTOCOL_VERSION)
        self.handshake_done = True
        self.write(
            commands.connected(
                SERVER_VERSION,
                self.protocol_version,
                self.config.max_message_size,
                self.config.enable_broker_topic_list_watcher,
            )
        )
        log.debug("connection from %s: %s protocol v%d", self.peer, self.client_version, c.protocol_version)

    def on_ping(self, cmd: T, frame: Frame) -> None:
        self.write(commands.pong())

    def on_pong(self, cmd: T, frame: Frame) -> None:
        pass

    def on_auth_response(self, cmd: T, frame: Frame) -> None:
        pass  # authentication is not enabled

    # ------------------------------------------------------------------ lookups
    def on_partitioned_metadata(self, cmd: T, frame: Frame) -> None:
        r = cmd.partitionMetadata

        async def work() -> None:
            topic = TopicName.parse(r.topic)
            partitions = await self.service.partitioned_metadata(topic, r.metadata_auto_creation_enabled)
            self.write(commands.partitioned_metadata(r.request_id, partitions))

        self._spawn(r.request_id, work(), commands.partitioned_metadata_error)

    def on_lookup(self, cmd: T, frame: Frame) -> None:
        r = cmd.lookupTopic

        async def work() -> None:
            topic = TopicName.parse(r.topic)
            # As Pulsar: the client's listener name, else the one of the socket it came in on.
            name = r.advertised_listener_name if r.advertised_listener_name.strip() else self.listener_name
            answer = await self.service.lookup(topic, r.authoritative, name)
            if answer.redirect:
                self.write(commands.lookup_redirect(r.request_id, answer.broker_url, answer.broker_url_tls,
                                                    answer.authoritative))  # fmt: skip
            else:
                self.write(commands.lookup_connect(r.request_id, answer.broker_url, answer.broker_url_tls))

        self._spawn(r.request_id, work(), commands.lookup_error)

    def on_get_topics_of_namespace(self, cmd: T, frame: Frame) -> None:
        r = cmd.getTopicsOfNamespace

        async def work() -> None:
            topics = without_system_topics(await self.service.list_topics(r.namespace, r.mode))
            filtered = False
            if r.HasField("topics_pattern") and r.topics_pattern:
                topics = filter_topics(topics, compile_topics_pattern(r.topics_pattern))
                filtered = True
            digest = topics_hash(topics)
            changed = not (r.HasField("topics_hash") and r.topics_hash == digest)
            self.write(commands.topics_of_namespace(r.request_id, topics, digest, changed, filtered))

        self._spawn(r.request_id, work())

    def on_watch_topic_list(self, cmd: T, frame: Frame) -> None:
        r = cmd.watchTopicList
        config = self.config
        if not config.enable_broker_topic_list_watcher:
            raise NotAllowedError("Topic list watcher is disabled")
        if not config.enable_broker_side_subscription_pattern_evaluation:
            raise NotAllowedError("Unable to create topic list watcher: Evaluating subscription patterns is disabled.")
        if len(r.topics_pattern) > config.subscription_pattern_max_length:
            raise NotAllowedError(
                "Unable to create topic list watcher: Pattern longer than maximum: "
                f"{config.subscription_pattern_max_length}"
            )
        existing = self.topic_list_watchers.get(r.watcher_id)
        if existing is not None:
            if not existing.started:
                raise ServiceNotReadyError("Topic list watcher is already present on the connection")
            current = sorted(existing.matching)
            self.write(commands.watch_topic_list_success(r.request_id, r.watcher_id, current, topics_hash(current)))
            return
        pattern = compile_topics_pattern(r.topics_pattern or ALL_TOPICS_PATTERN)
        watcher = TopicListWatcher(r.watcher_id, r.namespace, pattern, self._send_topic_list_update)
        self.topic_list_watchers[r.watcher_id] = watcher

        async def work() -> None:
            try:
                # Watch before listing: a topic created meanwhile is reported once the list is in.
                self.service.topic_lists.add(watcher)
                topics = await self.service.list_topics(r.namespace, pb.CommandGetTopicsOfNamespace.PERSISTENT)
            except BaseException:
                self._forget_topic_list_watcher(watcher)
                raise
            if watcher.closed:
                # Closed (WATCH_TOPIC_LIST_CLOSE) while listing: the request is still answered.
                raise ServiceNotReadyError("Topic list watcher was closed before its list was ready")
            digest = topics_hash(filter_topics(topics, pattern))
            listed = [] if r.HasField("topics_hash") and r.topics_hash == digest else filter_topics(topics, pattern)
            self.write(commands.watch_topic_list_success(r.request_id, r.watcher_id, listed, digest))
            watcher.start(topics)

        self._spawn(r.request_id, work())

    def on_watch_topic_list_close(self, cmd: T, frame: Frame) -> None:
        r = cmd.watchTopicListClose
        watcher = self.topic_list_watchers.get(r.watcher_id)
        if watcher is not None:
            self._forget_topic_list_watcher(watcher)
        self.write(commands.success(r.request_id))

    def _forget_topic_list_watcher(self, watcher: TopicListWatcher) -> None:
        if self.topic_list_watchers.get(watcher.watcher_id) is watcher:
            del self.topic_list_watchers[watcher.watcher_id]
        self.service.topic_lists.remove(watcher)

    def _send_topic_list_update(self, watcher_id: int, new: list[str], deleted: list[str], digest: str) -> None:
        self.write(commands.watch_topic_update(watcher_id, new, deleted, digest))

    # ------------------------------------------------------------------ producers
    def on_producer(self, cmd: T, frame: Frame) -> None:
        r = cmd.producer

        async def work() -> None:
            existing = self.producers.get(r.producer_id)
            if existing is not None:
                if not existing.ready:  # still queued (WaitForExclusive): as Pulsar, not a second grant
                    raise BrokerError("Producer is already present on the connection", pb.ServiceNotReady)
                if str(existing.topic.name) == str(TopicName.parse(r.topic)):
                    self.write(
                        commands.producer_success(
                            r.request_id,
                            existing.name,
                            existing.topic.dedup.last_sequence_id(existing.name),
                            topic_epoch=existing.topic.topic_epoch if existing.access_mode else None,
                        )
                    )
                    return
                raise ProducerBusyError("Producer id is already used on this connection")
            name = TopicName.parse(r.topic)
            topic = await self.service.get_topic(name, create=True)
            schema_version = await self.service.schemas.for_producer(name, r.schema if r.HasField("schema") else None)
            user_named = r.HasField("producer_name") and bool(r.producer_name)
            producer_name = r.producer_name if user_named else self.service.new_producer_name()
            await topic.check_new_producer()
            producer = Producer(
                topic, self, r.producer_id, producer_name, user_named, {kv.key: kv.value for kv in r.metadata}
            )
            producer.access_mode = r.producer_access_mode
            if r.producer_id in self.producers:
                # Another request for this id registered while this one awaited: one producer per id.
                raise ProducerBusyError("Producer id is already used on this connection")
            # Registered before a WaitForExclusive producer is granted, so it can be closed while queued.
            self.producers[r.producer_id] = producer

            def queued() -> None:
                self.write(commands.producer_success(r.request_id, producer_name, -1, schema_version, ready=False))

            try:
                epoch = await topic.add_producer(
                    producer,
                    r.producer_access_mode,
                    r.topic_epoch if r.HasField("topic_epoch") else None,
                    queued,
                )
            except BaseException:
                if self.producers.get(r.producer_id) is producer:
                    del self.producers[r.producer_id]
                producer.closed = True
                raise
            if self.closed or producer.closed:
                topic.remove_producer(producer)
                # Closed (CLOSE_PRODUCER) while being created: the request is still answered.
                raise ServiceNotReadyError("Producer was closed while it was being created")
            producer.ready = True
            last_sequence_id = topic.dedup.last_sequence_id(producer_name)
            self.write(commands.producer_success(r.request_id, producer_name, last_sequence_id, schema_version, epoch))

        self._spawn(r.request_id, work())

    def on_send(self, cmd: T, frame: Frame) -> None:
        s = cmd.send
        producer = self.producers.get(s.producer_id)
        if producer is None or not producer.ready:
            # As Pulsar does: a SEND for an unknown producer, or one not granted yet (a queued
            # WaitForExclusive one), means the client is confused; make it reconnect.
            log.warning("closing connection from %s: SEND for producer %d, not ready", self.peer, s.producer_id)
            self.close()
            return
        if frame.entry is None:
            self.write(commands.send_error(s.producer_id, s.sequence_id, pb.UnknownError, "Message has no payload"))
            return
        try:
            data = verify_entry(frame.entry)
        except ChecksumMismatchError as exc:
            log.warning("checksum error from %s on %s: %s", self.peer, producer.topic.name, exc)
            self.write(commands.send_error(s.producer_id, s.sequence_id, pb.ChecksumError, str(exc)))
            return
        except FrameError as exc:
            self.write(commands.send_error(s.producer_id, s.sequence_id, pb.UnknownError, f"Invalid message: {exc}"))
            return
        try:
            # As the entry will be dispatched and read back: it must decode (one parse per entry).
            check_message_metadata(data)
        except InvalidMetadataError as exc:
            log.info("refused a message from %s on %s: %s", self.peer, producer.topic.name, exc)
            self.write(commands.send_error(s.producer_id, s.sequence_id, pb.NotAllowedError, str(exc)))
            return
        if len(data) - 6 > self.config.max_message_size and not s.is_chunk:
            self.write(
                commands.send_error(s.producer_id, s.sequence_id, pb.NotAllowedError, "Exceed maximum message size")
            )
            return
        highest = s.highest_sequence_id
        if not highest and s.num_messages > 1:
            # Clients that batch without highest_sequence_id (the C++ client) number a batch's messages
            # upwards from sequence_id; first + n - 1 never exceeds the true highest, so it is a safe
            # bound for deduplication and for the last_sequence_id a reconnecting producer resumes after.
            highest = s.sequence_id + s.num_messages - 1
        producer.topic.publish(producer, s.sequence_id, highest, s.num_messages, data)

    def on_close_producer(self, cmd: T, frame: Frame) -> None:
        r = cmd.close_producer
        producer = self.producers.pop(r.producer_id, None)
        if producer is not None:
            producer.closed = True
            producer.topic.remove_producer(producer)
        self.write(commands.success(r.request_id))

    # ------------------------------------------------------------------ consumers
    def on_subscribe(self, cmd: T, frame: Frame) -> None:
        r = cmd.subscribe

        async def work() -> None:
            existing = self.consumers.get(r.consumer_id)
            if existing is not None:
                if existing.subscription.name == r.subscription:
                    self.write(commands.success(r.request_id))
                    return
                raise ConsumerBusyError("Consumer id is already used on this connection")
            if not r.subscription:
                raise InvalidTopicNameError("Empty subscription name")
            name = TopicName.parse(r.topic)
            topic = await self.service.get_topic(name, create=r.force_topic_creation)
            await self.service.schemas.for_consumer(name, r.schema if r.HasField("schema") else None)
            if r.read_compacted:
                await self.service.compaction.prepare_read(topic, r.subType)
            start = r.start_message_id if r.HasField("start_message_id") else None
            sub = await topic.subscribe(r.subscription, r.durable, r.initialPosition, start)
            if r.start_message_rollback_duration_sec > 0 and name.persistent:
                # As Pulsar does on every such subscribe: reset to that long ago, by publish time.
                since_ms = int(time.time() * 1000) - r.start_message_rollback_duration_sec * 1000
                await sub.reset(await topic.find_position_by_publish_time(since_ms))
            consumer = Consumer(
                sub,
                self,
                r.consumer_id,
                r.consumer_name,
                r.subType,
                r.priority_level,
                self.config.max_unacked_messages_per_consumer,
                {kv.key: kv.value for kv in r.metadata},
            )
            if r.HasField("keySharedMeta"):
                consumer.key_shared_meta = r.keySharedMeta
            if self.closed:
                return
            if r.consumer_id in self.consumers:
                # Another request for this id registered while this one awaited: one consumer per id.
                raise ConsumerBusyError("Consumer id is already used on this connection")
            sub.add_consumer(consumer)
            self.consumers[r.consumer_id] = consumer
            if r.read_compacted:
                await self.service.compaction.attach(sub)
            self.write(commands.success(r.request_id))

        self._spawn(r.request_id, work())

    def _consumer(self, consumer_id: int) -> Consumer:
        consumer = self.consumers.get(consumer_id)
        if consumer is None:
            raise BrokerError(f"Consumer {consumer_id} not found", pb.ConsumerNotFound)
        return consumer

    def on_flow(self, cmd: T, frame: Frame) -> None:
        f = cmd.flow
        consumer = self.consumers.get(f.consumer_id)
        if consumer is not None:
            consumer.flow(f.messagePermits)
            consumer.subscription.wakeup()

    def on_ack(self, cmd: T, frame: Frame) -> None:
        a = cmd.ack
        has_request = a.HasField("request_id")
        consumer = self.consumers.get(a.consumer_id)
        if consumer is None:
            if has_request:
                self.write(
                    commands.ack_response(a.consumer_id, a.request_id, pb.ConsumerNotFound, "Consumer not found")
                )
            return
        sub = consumer.subscription
        try:
            if a.ack_type == pb.CommandAck.Cumulative:
                if a.message_id:
                    sub.ack_cumulative(consumer, Position(a.message_id[0].ledgerId, a.message_id[0].entryId))
            else:
                positions = []
                partial = []
                for m in a.message_id:
                    if any(m.ack_set):  # some messages of this batch are still unacked
                        partial.append((Position(m.ledgerId, m.entryId), list(m.ack_set)))
                    else:
                        positions.append(Position(m.ledgerId, m.entryId))
                if positions:
                    sub.ack_individual(consumer, positions)
                if partial:
                    sub.ack_batch_indexes(consumer, partial)
        except BrokerError as exc:
            if has_request:
                self.write(commands.ack_response(a.consumer_id, a.request_id, exc.code, exc.message))
            else:
                log.info("ack refused on %s/%s: %s", sub.topic.name, sub.name, exc)
            return
        if has_request:

            async def work() -> None:
                await sub.cursor.flush()  # the receipt promises the ack is stored
                self.write(commands.ack_response(a.consumer_id, a.request_id))

            self._spawn(
                a.request_id, work(), lambda rid, code, msg: commands.ack_response(a.consumer_id, rid, code, msg)
            )

    def on_redeliver(self, cmd: T, frame: Frame) -> None:
        r = cmd.redeliverUnacknowledgedMessages
        consumer = self.consumers.get(r.consumer_id)
        if consumer is None:
            return
        ids = [Position(m.ledgerId, m.entryId) for m in r.message_ids] or None
        self._spawn(0, consumer.subscription.redeliver(consumer, ids))

    def on_unsubscribe(self, cmd: T, frame: Frame) -> None:
        r = cmd.unsubscribe

        async def work() -> None:
            consumer = self._consumer(r.consumer_id)
            await consumer.subscription.unsubscribe(consumer, r.force)
            self.consumers.pop(r.consumer_id, None)
            self.write(commands.success(r.request_id))

        self._spawn(r.request_id, work())

    def on_close_consumer(self, cmd: T, frame: Frame) -> None:
        r = cmd.close_consumer

        async def work() -> None:
            consumer = self.consumers.pop(r.consumer_id, None)
            if consumer is not None:
                await consumer.subscription.remove_consumer(consumer)
            self.write(commands.success(r.request_id))

        self._spawn(r.request_id, work())

    def on_seek(self, cmd: T, frame: Frame) -> None:
        r = cmd.seek

        async def work() -> None:
            consumer = self._consumer(r.consumer_id)
            sub = consumer.subscription
            topic = sub.topic
            if not topic.name.persistent:
                raise NotAllowedError("Seek is not supported on non-persistent topics")
            if r.HasField("message_publish_time"):
                position = await topic.find_position_by_publish_time(r.message_publish_time)
            elif r.HasField("message_id"):
                position = wire_position(r.message_id)
                if position == EARLIEST:
                    position = topic.ledger.first_position
                elif position == LATEST:
                    position = topic.ledger.next_position(topic.ledger.last_confirmed_entry)
            else:
                raise BrokerError("Seek needs a message id or a publish time", pb.UnknownError)
            await sub.reset(position)
            self.write(commands.success(r.request_id))

        self._spawn(r.request_id, work())

    def on_get_last_message_id(self, cmd: T, frame: Frame) -> None:
        r = cmd.getLastMessageId

        async def work() -> None:
            consumer = self._consumer(r.consumer_id)
            topic = consumer.subscription.topic
            position, batch_index = await self.service.compaction.last_message_id(consumer.subscription)
            md = consumer.subscription.cursor.mark_delete_position
            self.write(
                commands.last_message_id(
                    r.request_id,
                    position.ledger_id,
                    position.entry_id,
                    topic.name.partition_index,
                    batch_index,
                    (md.ledger_id, md.entry_id) if md.ledger_id >= 0 else None,
                )
            )

        self._spawn(r.request_id, work())

    def on_consumer_stats(self, cmd: T, frame: Frame) -> None:
        r = cmd.consumerStats
        consumer = self._consumer(r.consumer_id)
        self.write(
            commands.consumer_stats_response(
                r.request_id,
                consumerName=consumer.name,
                availablePermits=max(consumer.permits, 0),
                unackedMessages=consumer.unacked_messages,
                blockedConsumerOnUnackedMsgs=consumer.blocked,
                address=self.peer,
                connectedSince=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(consumer.connected_since)),
                type=pb.CommandSubscribe.SubType.Name(consumer.sub_type),
                msgBacklog=consumer.subscription.backlog(),
            )
        )

    # ------------------------------------------------------------------ schemas
    def on_get_schema(self, cmd: T, frame: Frame) -> None:
        r = cmd.getSchema

        async def work() -> None:
            name = TopicName.parse(r.topic)
            version = r.schema_version if r.HasField("schema_version") else None
            found = await self.service.schemas.get_schema(name, version)
            if found is None:
                self.write(
                    commands.get_schema_response(
                        r.request_id, None, None, pb.TopicNotFound, "Topic not found or no-schema"
                    )
                )
            else:
                self.write(commands.get_schema_response(r.request_id, found[0], found[1]))

        self._spawn(
            r.request_id, work(), lambda rid, code, msg: commands.get_schema_response(rid, None, None, code, msg)
        )

    def on_get_or_create_schema(self, cmd: T, frame: Frame) -> None:
        r = cmd.getOrCreateSchema

        async def work() -> None:
            version = await self.service.schemas.add_schema(TopicName.parse(r.topic), r.schema)
            self.write(commands.get_or_create_schema_response(r.request_id, version))

        self._spawn(
            r.request_id, work(), lambda rid, code, msg: commands.get_or_create_schema_response(rid, None, code, msg)
        )


def _storage_error_code(exc: Exception) -> pb.ServerError | None:
    """Pulsar's error code for a failure of storage or metadata a request can meet in normal operation
    (the topic fenced or closed under it, a timeout), or None for anything else."""
    if isinstance(exc, CursorNotFoundError):
        return pb.SubscriptionNotFound
    if isinstance(exc, (ManagedLedgerFencedError, ManagedLedgerClosedError, TimeoutError)):
        return pb.ServiceNotReady
    if isinstance(exc, (ManagedLedgerError, LedgerError)):
        return pb.PersistenceError
    if isinstance(exc, StoreMetadataError):
        return pb.MetadataError
    return None


def _request_id(cmd: T) -> int:
    """The request id carried by ``cmd``'s payload message, if any (0 otherwise)."""
    for _field, value in cmd.ListFields():
        if hasattr(value, "request_id"):
            with contextlib.suppress(AttributeError, ValueError):
                return int(value.request_id)
    return 0


#: Commands sent per message: no string field is read from them, so they skip the UTF-8 check.
_HOT_COMMANDS = frozenset({T.SEND, T.FLOW, T.ACK, T.PING, T.PONG})
#: String fields naming a topic, namespace or subscription: invalid UTF-8 there is InvalidTopicName.
_NAME_FIELDS = frozenset({"topic", "namespace", "subscription", "topics_pattern"})
#: Requests whose failure is answered by their own response kind rather than ERROR.
_ERROR_RESPONSES: dict[int, Callable[[int, pb.ServerError, str], bytes]] = {
    T.LOOKUP: commands.lookup_error,
    T.PARTITIONED_METADATA: commands.partitioned_metadata_error,
    T.GET_SCHEMA: lambda rid, code, msg: commands.get_schema_response(rid, None, None, code, msg),
    T.GET_OR_CREATE_SCHEMA: lambda rid, code, msg: commands.get_or_create_schema_response(rid, None, code, msg),
}

_HANDLERS: dict[int, Callable[[ServerConnection, T, Frame], None]] = {
    T.CONNECT: ServerConnection.on_connect,
    T.PING: ServerConnection.on_ping,
    T.PONG: ServerConnection.on_pong,
    T.AUTH_RESPONSE: ServerConnection.on_auth_response,
    T.PARTITIONED_METADATA: ServerConnection.on_partitioned_metadata,
    T.LOOKUP: ServerConnection.on_lookup,
    T.GET_TOPICS_OF_NAMESPACE: ServerConnection.on_get_topics_of_namespace,
    T.WATCH_TOPIC_LIST: ServerConnection.on_watch_topic_list,
    T.WATCH_TOPIC_LIST_CLOSE: ServerConnection.on_watch_topic_list_close,
    T.PRODUCER: ServerConnection.on_producer,
    T.SEND: ServerConnection.on_send,
    T.CLOSE_PRODUCER: ServerConnection.on_close_producer,
    T.SUBSCRIBE: ServerConnection.on_subscribe,
    T.FLOW: ServerConnection.on_flow,
    T.ACK: ServerConnection.on_ack,
    T.REDELIVER_UNACKNOWLEDGED_MESSAGES: ServerConnection.on_redeliver,
    T.UNSUBSCRIBE: ServerConnection.on_unsubscribe,
    T.CLOSE_CONSUMER: ServerConnection.on_close_consumer,
    T.SEEK: ServerConnection.on_seek,
    T.GET_LAST_MESSAGE_ID: ServerConnection.on_get_last_message_id,
    T.CONSUMER_STATS: ServerConnection.on_consumer_stats,
    T.GET_SCHEMA: ServerConnection.on_get_schema,
    T.GET_OR_CREATE_SCHEMA: ServerConnection.on_get_or_create_schema,
}
