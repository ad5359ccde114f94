"""A minimal raw Pulsar-protocol client for tests that must send what the official client never would."""

from __future__ import annotations

import socket
import struct

from magnetar.broker.protocol import pulsar_api_pb2 as pb
from magnetar.broker.protocol.frames import build_entry, encode_command

T = pb.BaseCommand


class RawClient:
    """Blocking socket speaking frames; ``recv_command`` returns decoded BaseCommands."""

    def __init__(self, port: int, timeout: float = 5.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self._buf = b""

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
        """Skip PINGs and other frames until one of type ``kind``."""
        while True:
            cmd, _ = self.recv_command()
            if cmd.type == kind:
                return cmd
            if cmd.type == T.PING:
                self.send(T(type=T.PONG, pong=pb.CommandPong()))

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
