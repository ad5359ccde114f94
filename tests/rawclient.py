"""A minimal raw Pulsar-protocol client for tests that must send what the official client never would."""

from __future__ import annotations

import socket
import ssl
import struct

from magnetar.broker.protocol import pulsar_api_pb2 as pb
from magnetar.broker.protocol.frames import build_entry, encode_command

T = pb.BaseCommand


class RawClient:
    """Blocking socket speaking frames; ``recv_command`` returns decoded BaseCommands."""

    def __init__(self, port: int, timeout: float = 5.0, ssl_context: ssl.SSLContext | None = None) -> None:
        sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        #: The socket, TLS-wrapped when ``ssl_context`` is given (a ``pulsar+ssl://`` port).
        self.sock = ssl_context.wrap_socket(sock, server_hostname="127.0.0.1") if ssl_context else sock
        self._buf = b""
        #: Frames read while waiting for something else, returned first by the ``recv_until*`` helpers.
        self._skipped: list[tuple[T, bytes]] = []

    def close(self) -> None:
        self.sock.close()

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send(self, cmd: T, entry: bytes | None = None) -> None:
        if entry is None:
            self.send_raw(encode_command(cmd))
        else:
            body = cmd.SerializeToString()
            self.send_raw(struct.pack(">II", 4 + len(body) + len(entry), len(body)) + body + entry)

    def recv_command(self) -> tuple[T, bytes]:
        """Next frame: the command and any bytes after it. Raises ConnectionError on EOF."""
        while True:
            if len(self._buf) >= 4:
                (total,) = struct.unpack_from(">I", self._buf)
                if len(self._buf) >= 4 + total:
                    frame, self._buf = self._buf[4 : 4 + total], self._buf[4 + total :]
                    (size,) = struct.unpack_from(">I", frame)
                    return T.FromString(frame[4 : 4 + size]), frame[4 + size :]
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed by broker")
            self._buf += chunk

    def recv_until(self, kind: int) -> T:
        """The next frame of type ``kind``; other frames are kept for later calls, PINGs answered."""
        return self.recv_until_any({kind})

    def recv_until_any(self, kinds: set[int]) -> T:
        for i, (cmd, _) in enumerate(self._skipped):
            if cmd.type in kinds:
                del self._skipped[i]
                return cmd
        while True:
            cmd, rest = self.recv_command()
            if cmd.type in kinds:
                return cmd
            if cmd.type == T.PING:
                self.send(T(type=T.PONG, pong=pb.CommandPong()))
            else:
                self._skipped.append((cmd, rest))

    def is_closed(self, timeout: float = 3.0) -> bool:
        """Whether the broker closes the connection within ``timeout`` (frames received meanwhile are dropped)."""
        self.sock.settimeout(timeout)
        try:
            while True:
                if not self.sock.recv(65536):
                    return True
        except TimeoutError:
            return False
        except OSError:
            return True

    # conveniences
    def connect(self, protocol_version: int = 20) -> T:
        cmd = T(type=T.CONNECT)
        cmd.connect.client_version = "raw-test"
        cmd.connect.protocol_version = protocol_version
        self.send(cmd)
        return self.recv_until(T.CONNECTED)

    def lookup(self, topic: str, request_id: int = 1000, listener: str | None = None) -> T:
        """LOOKUP ``topic`` (for ``listener``, if given); a cluster broker serves a topic only after a lookup
        assigned its bundle."""
        cmd = T(type=T.LOOKUP)
        cmd.lookupTopic.topic = topic
        cmd.lookupTopic.request_id = request_id
        if listener is not None:
            cmd.lookupTopic.advertised_listener_name = listener
        self.send(cmd)
        return self.recv_until(T.LOOKUP_RESPONSE)

    def create_producer(self, topic: str, producer_id: int = 1, request_id: int = 1) -> T:
        cmd = T(type=T.PRODUCER)
        cmd.producer.topic = topic
        cmd.producer.producer_id = producer_id
        cmd.producer.request_id = request_id
        self.send(cmd)
        return self.recv_command()[0]

    def send_message(self, producer_id: int, sequence_id: int, payload: bytes, entry: bytes | None = None) -> None:
        cmd = T(type=T.SEND)
        cmd.send.producer_id = producer_id
        cmd.send.sequence_id = sequence_id
        if entry is None:
            meta = pb.MessageMetadata(producer_name="raw", sequence_id=sequence_id, publish_time=1)
            entry = build_entry(meta, payload)
        self.send(cmd, entry)

    def subscribe(
        self,
        topic: str,
        subscription: str,
        consumer_id: int = 1,
        request_id: int = 1,
        sub_type: int = pb.CommandSubscribe.Exclusive,
        name: str = "",
        earliest: bool = True,
    ) -> T:
        cmd = T(type=T.SUBSCRIBE)
        s = cmd.subscribe
        s.topic, s.subscription, s.subType = topic, subscription, sub_type
        s.consumer_id, s.request_id = consumer_id, request_id
        if name:
            s.consumer_name = name
        s.initialPosition = pb.CommandSubscribe.Earliest if earliest else pb.CommandSubscribe.Latest
        self.send(cmd)
        return self.recv_until_response(request_id)

    def recv_until_response(self, request_id: int) -> T:
        """Next SUCCESS/ERROR for ``request_id``."""
        while True:
            cmd = self.recv_until_any({T.SUCCESS, T.ERROR})
            inner = cmd.success if cmd.type == T.SUCCESS else cmd.error
            if inner.request_id == request_id:
                return cmd

    def flow(self, consumer_id: int, permits: int) -> None:
        cmd = T(type=T.FLOW)
        cmd.flow.consumer_id, cmd.flow.messagePermits = consumer_id, permits
        self.send(cmd)
