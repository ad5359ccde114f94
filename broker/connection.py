"""One client connection: frames in, commands dispatched, responses out (coalesced).

Each connection is an :class:`asyncio.BufferedProtocol` (the socket is read straight into the frame
decoder's buffer, see :class:`FrameDecoder`). Per-message commands (SEND, ACK, FLOW) are
handled synchronously in ``buffer_updated``; commands that need the metadata store or storage
run as tasks and always answer with the request id they carried. Outgoing frames are
collected and written once per event-loop turn, so a burst of MESSAGE frames or receipts
costs one socket write.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from magnetar.broker import consumer_commands, lookup_commands, producer_commands
from magnetar.broker.auth.provider import Authenticated, AuthenticationData
from magnetar.broker.consumer import Consumer
from magnetar.broker.errors import AuthenticationError, BrokerError, storage_error_code
from magnetar.broker.producer import Producer, Send
from magnetar.broker.protocol import commands
from magnetar.broker.protocol import pulsar_api_pb2 as pb
from magnetar.broker.protocol.frames import Frame, FrameDecoder, FrameError
from magnetar.broker.protocol.validate import invalid_string_field
from magnetar.broker.tls import peer_certificate
from magnetar.broker.topic_list import TopicListWatcher
from magnetar.common.tasks import TaskSet

if TYPE_CHECKING:
    from magnetar.broker.service import BrokerService

log = logging.getLogger(__name__)

T = pb.BaseCommand
SERVER_VERSION = "Magnetar 0.1.0"
MAX_PROTOCOL_VERSION = 21
#: Frames a client may send between CONNECT and the end of its authentication (held, then handled).
MAX_HELD_FRAMES = 1000
#: Request id of errors that answer no request (Pulsar sends -1: all ones on the wire).
NO_REQUEST = 2**64 - 1
#: AUTH_CHALLENGE data asking the client for fresh credentials (Pulsar's AuthData.REFRESH_AUTH_DATA).
REFRESH_AUTH_DATA = b"refresh"


class ServerConnection(asyncio.BufferedProtocol):
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
        #: Role the client authenticated as (``None``: authentication is disabled); see broker/auth/.
        self.role: str | None = None
        # Authentication (broker/auth/): CONNECT's method, frames held while it runs, credential expiry.
        self._auth_method = ""
        self._authenticating = False
        self._held: list[Frame] = []
        self._supports_auth_refresh = False
        self._credentials_expire_at: float | None = None
        self._challenge_pending = False
        self._auth_refresh: asyncio.TimerHandle | None = None
        self.client_version = ""
        self.protocol_version = 0
        self.producers: dict[int, Producer] = {}
        #: Producer ids whose PRODUCER is still in progress -> whether a CLOSE_PRODUCER came meanwhile.
        self.producers_in_creation: dict[int, bool] = {}
        self.consumers: dict[int, Consumer] = {}
        #: Consumer ids whose SUBSCRIBE is still in progress -> whether a CLOSE_CONSUMER came meanwhile.
        self.consumers_in_creation: dict[int, bool] = {}
        self.topic_list_watchers: dict[int, TopicListWatcher] = {}
        self.writable = True
        self.closed = False
        self._out: list[bytes] = []
        # SENDs of one producer awaiting publication with the rest of their socket read (queue_send).
        self._sends: list[Send] = []
        self._sending: Producer | None = None
        self._flush_handle: asyncio.Handle | None = None
        self.tasks = TaskSet("connection")
        self._awaiting_pong = False
        self._keepalive: asyncio.TimerHandle | None = None
        # Publish back-pressure (see broker/publish_buffer.py).
        self._pending_sends = 0
        self._too_many_sends = False
        self._reading_paused = False

    @property
    def peer_certificate(self) -> Mapping[str, Any] | None:
        """The client's verified TLS certificate (``getpeercert()`` dict, for TLS authentication); ``None`` on
        a plaintext connection or when the client presented none."""
        return peer_certificate(self.transport)

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
        if self._auth_refresh is not None:
            self._auth_refresh.cancel()
        self._held.clear()
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
    def publish_started(self, count: int, size: int) -> None:
        """``count`` SENDs of ``size`` bytes await persistence: stop reading past the per-connection limit."""
        self._pending_sends += count
        buffer = self.service.publish_buffer
        buffer.add(size)
        limit = self.config.max_pending_publish_requests_per_connection
        if not self._too_many_sends and 0 < limit <= self._pending_sends:
            self._too_many_sends = True
            self.update_reading()
        elif buffer.throttled and not self._reading_paused:  # e.g. connected after throttling began
            self.update_reading()

    def publish_done(self, count: int, size: int) -> None:
        """``count`` SENDs of ``size`` bytes were answered: read again once half of the per-connection limit
        is free."""
        self._pending_sends -= count
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
    def get_buffer(self, sizehint: int) -> memoryview:
        return self.decoder.get_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        try:
            frames = self.decoder.buffer_updated(nbytes)
        except FrameError as exc:
            log.warning("closing connection from %s: %s", self.peer, exc)
            self.write(commands.error(0, pb.UnknownError, f"Invalid frame: {exc}"))
            self.close()
            return
        if frames:
            self._awaiting_pong = False
            self._handle_frames(frames)

    def _handle_frames(self, frames: list[Frame]) -> None:
        """Handle ``frames`` in order. A SEND is validated as it comes but published with the SENDs of the same
        producer right behind it (:meth:`queue_send`): a socket read's worth goes down the write path as one
        run, with one callback per stored run instead of one per message."""
        try:
            for frame in frames:
                if self.closed:
                    return
                if self._sends and frame.command.type != T.SEND:
                    self.flush_sends()  # commands after a SEND see it issued, as before
                self._handle(frame)
        finally:
            if self._sends:
                self.flush_sends()

    def queue_send(self, producer: Producer, send: Send) -> None:
        """A valid SEND of ``producer``: published with the rest of its run (see :meth:`_handle_frames`)."""
        if self._sends and self._sending is not producer:
            self.flush_sends()
        self._sending = producer
        self._sends.append(send)

    def flush_sends(self) -> None:
        """Publish the queued run of SENDs."""
        sends, self._sends = self._sends, []
        producer, self._sending = self._sending, None
        if not sends or producer is None:
            return
        try:
            producer.topic.publish(producer, sends)
        except Exception:
            # A bug: the run's receipts can no longer leave in order, and the client must not wait for them.
            log.exception("publishing %d messages from %s failed; closing the connection", len(sends), self.peer)
            self.close()

    def _handle(self, frame: Frame) -> None:
        cmd = frame.command
        kind = cmd.type
        # An unset type reads as the enum's first value, CONNECT: only then is presence worth checking.
        if kind == T.CONNECT and not cmd.HasField("type"):
            # A command type this broker does not know (newer protocol): refuse it, keep the connection.
            self.write(commands.error(_request_id(cmd), pb.NotAllowedError, "Unknown command type"))
            return
        if not self.handshake_done and kind != T.CONNECT:
            if self._authenticating:  # sent right behind CONNECT: handled once authentication completes
                self._hold(frame)
                return
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

    def spawn_request(
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
                code = storage_error_code(exc)
                if code is None:  # a bug: keep the traceback
                    log.exception("request %s from %s failed", request_id, self.peer)
                    code = pb.UnknownError
                else:  # storage or metadata refused (fenced, closed, timed out): one line, no traceback
                    log.warning("request %s from %s failed: %s: %s", request_id, self.peer, type(exc).__name__, exc)
                self.write(builder(request_id, code, str(exc)))

        self.tasks.spawn(guarded())

    def begin_create(
        self, in_creation: dict[int, bool], registered: bool, entity_id: int, request_id: int, what: str
    ) -> bool | None:
        """Start a SUBSCRIBE or PRODUCER for ``entity_id``: ``None`` when one is still in progress (answered
        ServiceNotReady, as Pulsar's ServerCnx: clients retry it, and then find the first one done), else
        whether this request creates (the id is not registered yet).

        The id is marked before any await, so a close request read right after this one finds it; the
        caller removes the mark when its request ends."""
        if entity_id in in_creation:
            self.write(commands.error(request_id, pb.ServiceNotReady, f"{what} is already present on the connection"))
            return None
        if registered:
            return False
        in_creation[entity_id] = False
        return True

    def forget_producer(self, producer_id: int) -> None:
        self.producers.pop(producer_id, None)

    def forget_consumer(self, consumer_id: int) -> None:
        self.consumers.pop(consumer_id, None)

    # ------------------------------------------------------------------ handshake and liveness
    def on_connect(self, cmd: T, frame: Frame) -> None:
        authentication = self.service.authentication
        if authentication is not None and (self.handshake_done or self._authenticating):
            self.write(commands.error(NO_REQUEST, pb.NotAllowedError, "The connection is already established"))
            return
        c = cmd.connect
        self.client_version = c.client_version
        self.protocol_version = min(c.protocol_version, MAX_PROTOCOL_VERSION)
        if authentication is None:
            self._complete_connect()
            return
        # As Pulsar's ServerCnx: nothing else is handled until the credentials are checked.
        self._authenticating = True
        self._supports_auth_refresh = c.feature_flags.supports_auth_refresh
        if c.HasField("auth_method_name"):
            self._auth_method = c.auth_method_name
        elif c.HasField("auth_method"):  # legacy clients send the enum (AuthMethodYcaV1 -> "ycav1")
            self._auth_method = pb.AuthMethod.Name(c.auth_method)[len("AuthMethod") :].lower()
        else:
            self._auth_method = "none"
        data = self._authentication_data(c.auth_data if c.HasField("auth_data") else b"")
        self.tasks.spawn(self._authenticate_connect(data), name=f"authenticate {self.peer}")

    def _complete_connect(self) -> None:
        self.handshake_done = True
        self.write(
            commands.connected(
                SERVER_VERSION,
                self.protocol_version,
                self.config.max_message_size,
                self.config.enable_broker_topic_list_watcher,
            )
        )
        log.debug("connection from %s: %s protocol v%d", self.peer, self.client_version, self.protocol_version)

    def _authentication_data(self, command_data: bytes) -> AuthenticationData:
        return AuthenticationData(
            command_data=command_data, peer_certificate=self.peer_certificate, peer_address=self.peer
        )

    async def _authenticate_connect(self, data: AuthenticationData) -> None:
        authentication = self.service.authentication
        assert authentication is not None
        try:
            result = await authentication.authenticate_command(self._auth_method, data)
        except Exception as exc:
            self._authentication_failed("connect", exc)
            return
        self._authenticating = False
        self.role = result.role
        self._credentials_expire_at = result.expires_at
        log.info("connection from %s authenticated as role %s (%s)", self.peer, result.role, self._auth_method)
        self._complete_connect()
        if authentication.provider(self._auth_method) is not None:
            self._schedule_auth_refresh()
        held, self._held = self._held, []
        self._handle_frames(held)

    def _hold(self, frame: Frame) -> None:
        if len(self._held) >= MAX_HELD_FRAMES:
            log.warning("closing connection from %s: too many commands before authentication completed", self.peer)
            self.close()
            return
        self._held.append(frame)

    def _authentication_failed(self, operation: str, exc: Exception) -> None:
        """ERROR AuthenticationError and close (Pulsar 4.x tells the client no more than that; the log does)."""
        if isinstance(exc, AuthenticationError):
            log.warning("%s of %s (method %s) failed: %s", operation, self.peer, self._auth_method, exc)
        else:
            log.error("%s of %s (method %s) failed", operation, self.peer, self._auth_method, exc_info=exc)
        self.write(commands.error(NO_REQUEST, pb.AuthenticationError, "Failed to authenticate"))
        self.close()

    # ------------------------------------------------------------------ credential refresh (AUTH_CHALLENGE)
    def _schedule_auth_refresh(self) -> None:
        interval = self.config.authentication_refresh_check_seconds
        if interval > 0 and not self.closed:
            self._auth_refresh = self.loop.call_later(interval, self._check_credentials)

    def _check_credentials(self) -> None:
        """Pulsar's refreshAuthenticationCredentials: challenge expired credentials, close on no answer."""
        if self.closed:
            return
        self._schedule_auth_refresh()
        expires_at = self._credentials_expire_at
        if expires_at is None or time.time() < expires_at:
            return
        if not self._supports_auth_refresh:
            log.warning("closing connection from %s: credentials expired, client cannot refresh them", self.peer)
            self.close()
        elif self._challenge_pending:
            log.warning("closing connection from %s after timeout on refreshing auth credentials", self.peer)
            self.close()
        else:
            log.info("refreshing authentication credentials of %s (role %s)", self.peer, self.role)
            self._challenge_pending = True
            self.write(
                commands.auth_challenge(SERVER_VERSION, self._auth_method, REFRESH_AUTH_DATA, self.protocol_version)
            )

    def on_auth_response(self, cmd: T, frame: Frame) -> None:
        authentication = self.service.authentication
        if authentication is None:
            return  # nothing was asked
        self._challenge_pending = False
        response = cmd.authResponse.response
        data = self._authentication_data(response.auth_data)
        self.tasks.spawn(self._authenticate_refresh(data), name=f"refresh authentication {self.peer}")

    async def _authenticate_refresh(self, data: AuthenticationData) -> None:
        authentication = self.service.authentication
        assert authentication is not None
        try:
            result: Authenticated = await authentication.authenticate_command(self._auth_method, data)
        except Exception as exc:
            self._authentication_failed("authentication refresh", exc)
            return
        if result.role != self.role:
            log.warning(
                "closing connection from %s: principal cannot change during an authentication refresh "
                "(expected %s, got %s)",
                self.peer,
                self.role,
                result.role,
            )
            self.close()
            return
        self._credentials_expire_at = result.expires_at
        log.info("refreshed authentication credentials of %s for role %s", self.peer, self.role)

    def on_ping(self, cmd: T, frame: Frame) -> None:
        self.write(commands.pong())

    def on_pong(self, cmd: T, frame: Frame) -> None:
        pass


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
    T.PARTITIONED_METADATA: lookup_commands.on_partitioned_metadata,
    T.LOOKUP: lookup_commands.on_lookup,
    T.GET_TOPICS_OF_NAMESPACE: lookup_commands.on_get_topics_of_namespace,
    T.WATCH_TOPIC_LIST: lookup_commands.on_watch_topic_list,
    T.WATCH_TOPIC_LIST_CLOSE: lookup_commands.on_watch_topic_list_close,
    T.PRODUCER: producer_commands.on_producer,
    T.SEND: producer_commands.on_send,
    T.CLOSE_PRODUCER: producer_commands.on_close_producer,
    T.SUBSCRIBE: consumer_commands.on_subscribe,
    T.FLOW: consumer_commands.on_flow,
    T.ACK: consumer_commands.on_ack,
    T.REDELIVER_UNACKNOWLEDGED_MESSAGES: consumer_commands.on_redeliver,
    T.UNSUBSCRIBE: consumer_commands.on_unsubscribe,
    T.CLOSE_CONSUMER: consumer_commands.on_close_consumer,
    T.SEEK: consumer_commands.on_seek,
    T.GET_LAST_MESSAGE_ID: consumer_commands.on_get_last_message_id,
    T.CONSUMER_STATS: consumer_commands.on_consumer_stats,
    T.GET_SCHEMA: lookup_commands.on_get_schema,
    T.GET_OR_CREATE_SCHEMA: lookup_commands.on_get_or_create_schema,
}
