"""Structure-aware frame generator for the protocol fuzz test (tests/broker/test_fuzz.py).

Commands are filled field by field from their protobuf descriptors, with values drawn from pools of
odd but plausible values (boundary integers, odd topic names, invalid UTF-8), so most frames reach
deep into the broker instead of failing to decode. A share of frames is then mutated at byte level,
and a few are garbage. Everything is drawn from one ``random.Random``: a seed replays a run.
"""

from __future__ import annotations

import random
import struct
from dataclasses import dataclass

from crc32c import crc32c
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from magnetar.broker.protocol import pulsar_api_pb2 as pb

T = pb.BaseCommand

#: Stands for invalid UTF-8 in strings: replaced by ``BAD_UTF8`` after serialization.
INVALID_UTF8_MARK = "ZQZQ"
BAD_UTF8 = b"\xff\xfe\xc0\x80"

NAMESPACE = "public/default"
#: Topics the fuzzer uses that a valid request may create: checked for leaked producers/consumers.
VALID_TOPICS = [f"persistent://{NAMESPACE}/fz-{i}" for i in range(4)] + [
    f"non-persistent://{NAMESPACE}/fz-np",
    f"persistent://{NAMESPACE}/fz-part-partition-1",
    f"persistent://{NAMESPACE}/fz-partition-99999999999",
]
ODD_TOPICS = [
    "",
    "fz-short",
    f"{NAMESPACE}/fz-0",
    f"persistent://{NAMESPACE}/{INVALID_UTF8_MARK}",
    f"persistent://{NAMESPACE}/" + "a" * 300,
    f"persistent://{NAMESPACE}/t\x01\x7f",
    f"persistent://{NAMESPACE}/t\r\nX",
    "persistent://no-such/ns/t",
    "persistent://public/no-such-ns/t",
    "bogus://public/default/t",
    f"persistent://{NAMESPACE}/fz-partition-\u00b2",
    f"persistent://{NAMESPACE}/a/b/c",
]
STRINGS = ["", "s", "sub-0", "sub-1", INVALID_UTF8_MARK, "x" * 1000, "\x00", "\u2603", "a\r\nb", "%00", "../.."]
PATTERNS = [
    f"persistent://{NAMESPACE}/fz-.*",
    "^(.+)+#$",
    "(a*)*b",
    r"(a)\1",
    "(?=x)",
    "[",
    ".*",
    "persistent://bogus-domain/x",
    INVALID_UTF8_MARK,
]
UINT64 = [0, 1, 2, 3, 7, 255, 2**31 - 1, 2**31, 2**32 - 1, 2**63 - 1, 2**63, 2**64 - 1]
INT32 = [0, 1, -1, 2, 1000, 2**31 - 1, -(2**31)]
INT64 = [0, 1, -1, 2**63 - 1, -(2**63), 1_000_000_000_000]
UINT32 = [0, 1, 2, 10, 1000, 2**31, 2**32 - 1]

#: Requests the broker must answer, with how to find which request an answer is for.
ANSWERED = {
    T.PARTITIONED_METADATA,
    T.LOOKUP,
    T.GET_TOPICS_OF_NAMESPACE,
    T.WATCH_TOPIC_LIST,
    T.WATCH_TOPIC_LIST_CLOSE,
    T.PRODUCER,
    T.CLOSE_PRODUCER,
    T.SUBSCRIBE,
    T.UNSUBSCRIBE,
    T.CLOSE_CONSUMER,
    T.SEEK,
    T.GET_LAST_MESSAGE_ID,
    T.CONSUMER_STATS,
    T.GET_SCHEMA,
    T.GET_OR_CREATE_SCHEMA,
}
#: Commands generated, with their weight.
KINDS = {
    T.PARTITIONED_METADATA: 3,
    T.LOOKUP: 3,
    T.GET_TOPICS_OF_NAMESPACE: 2,
    T.WATCH_TOPIC_LIST: 2,
    T.WATCH_TOPIC_LIST_CLOSE: 1,
    T.PRODUCER: 6,
    T.SEND: 8,
    T.CLOSE_PRODUCER: 2,
    T.SUBSCRIBE: 6,
    T.FLOW: 4,
    T.ACK: 4,
    T.REDELIVER_UNACKNOWLEDGED_MESSAGES: 2,
    T.UNSUBSCRIBE: 2,
    T.CLOSE_CONSUMER: 2,
    T.SEEK: 2,
    T.GET_LAST_MESSAGE_ID: 2,
    T.CONSUMER_STATS: 1,
    T.GET_SCHEMA: 1,
    T.GET_OR_CREATE_SCHEMA: 1,
    T.PING: 1,
    T.CONNECT: 1,
}


@dataclass
class Frame:
    """One generated frame: its bytes, and the request id the broker must answer (None: no answer due)."""

    data: bytes
    awaits: int | None
    kind: int


def inner_field(kind: int) -> str:
    """Name of the BaseCommand field holding a command of type ``kind``."""
    for field in T.DESCRIPTOR.fields:
        if field.number == kind:
            return field.name
    raise KeyError(kind)


class FrameGenerator:
    """Draws frames for one connection from ``rng``."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self._next_request = 1
        #: Producer ids this connection asked for: most SENDs use one (else the broker closes at once).
        self._producer_ids: list[int] = []

    def structured(self) -> Frame:
        """A well-formed frame of a known command with odd values (possibly invalid UTF-8 strings)."""
        rng = self.rng
        kind = rng.choices(list(KINDS), weights=list(KINDS.values()))[0]
        if kind == T.SEND and not self._producer_ids and rng.random() < 0.9:
            kind = T.PRODUCER
        cmd = T(type=kind)
        inner = getattr(cmd, inner_field(kind))
        self._fill(inner, depth=0)
        inner.SetInParent()
        if kind == T.PRODUCER:
            self._producer_ids.append(inner.producer_id)
        elif kind == T.SEND and self._producer_ids and rng.random() < 0.9:
            inner.producer_id = rng.choice(self._producer_ids)
        awaits: int | None = None
        if hasattr(inner, "request_id") and (kind in ANSWERED or (kind == T.ACK and rng.random() < 0.3)):
            inner.request_id = self._next_request
            self._next_request += 1
            awaits = inner.request_id
            if kind == T.PRODUCER and inner.producer_access_mode == pb.WaitForExclusive:
                awaits = None  # may rightly wait for the topic
        body = cmd.SerializePartialToString()
        if kind == T.SEND:
            return Frame(_frame(body, self._entry()), None, kind)
        if INVALID_UTF8_MARK.encode() in body and rng.random() < 0.3:
            body = body.replace(INVALID_UTF8_MARK.encode(), BAD_UTF8)
        elif not cmd.IsInitialized():
            awaits = None  # a required field is missing: the frame does not decode as a request
        return Frame(_frame(body), awaits, kind)

    def mutated(self, frame: Frame) -> Frame:
        """``frame`` with a few bytes flipped, inserted, removed or the frame cut short."""
        rng = self.rng
        data = bytearray(frame.data)
        for _ in range(rng.randint(1, 4)):
            op = rng.random()
            at = rng.randrange(len(data)) if data else 0
            if op < 0.4 and data:
                data[at] = rng.randrange(256)
            elif op < 0.6:
                data[at:at] = rng.randbytes(rng.randint(1, 8))
            elif op < 0.8 and len(data) > 8:
                del data[at : at + rng.randint(1, 8)]
            elif len(data) > 8:
                data = data[: rng.randint(8, len(data))]
        if rng.random() < 0.7 and len(data) >= 4:
            struct.pack_into(">I", data, 0, len(data) - 4)  # keep the outer size right: reach the decoder
        return Frame(bytes(data), None, frame.kind)

    def garbage(self) -> Frame:
        rng = self.rng
        return Frame(rng.randbytes(rng.randint(1, 64)), None, -1)

    # ------------------------------------------------------------------ values
    def _fill(self, message: Message, depth: int) -> None:
        rng = self.rng
        for field in message.DESCRIPTOR.fields:
            required = not field.has_presence or _required(field)
            if not required and rng.random() < 0.5:
                continue
            if field.is_repeated:
                for _ in range(rng.randint(0, 3)):
                    self._add(message, field, depth)
            else:
                self._set(message, field, depth)

    def _set(self, message: Message, field: FieldDescriptor, depth: int) -> None:
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            if depth < 3:
                self._fill(getattr(message, field.name), depth + 1)
                getattr(message, field.name).SetInParent()
            return
        setattr(message, field.name, self._value(field))

    def _add(self, message: Message, field: FieldDescriptor, depth: int) -> None:
        container = getattr(message, field.name)
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            if depth < 3:
                self._fill(container.add(), depth + 1)
        else:
            container.append(self._value(field))

    def _value(self, field: FieldDescriptor) -> object:
        rng = self.rng
        name = field.name.lower()
        t = field.type
        if t == FieldDescriptor.TYPE_STRING:
            if name == "topic":
                return rng.choice(VALID_TOPICS * 3 + ODD_TOPICS)
            if name == "namespace":
                return rng.choice([NAMESPACE] * 4 + ["public/no-such", "", INVALID_UTF8_MARK, "a/b/c"])
            if name == "topics_pattern":
                return rng.choice(PATTERNS)
            return rng.choice(STRINGS)
        if t == FieldDescriptor.TYPE_BYTES:
            return rng.randbytes(rng.randint(0, 12))
        if t == FieldDescriptor.TYPE_BOOL:
            return rng.random() < 0.5
        if t == FieldDescriptor.TYPE_ENUM:
            return rng.choice([v.number for v in field.enum_type.values])
        if name in ("producer_id", "consumer_id", "watcher_id"):
            return rng.choice([0, 1, 1, 2, 2, 3, 2**64 - 1])
        if t in (FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_FIXED64):
            return rng.choice(UINT64)
        if t in (FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_SINT64, FieldDescriptor.TYPE_SFIXED64):
            return rng.choice(INT64)
        if t in (FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_FIXED32):
            return rng.choice(UINT32)
        if t in (FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_SINT32, FieldDescriptor.TYPE_SFIXED32):
            return rng.choice(INT32)
        if t in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
            return rng.choice([0.0, -1.0, 1e308])
        raise TypeError(f"no values for field {field.full_name}")

    def _entry(self) -> bytes:
        """A SEND's entry bytes: metadata with odd values; sometimes a bad checksum or metadata size."""
        rng = self.rng
        meta = pb.MessageMetadata(producer_name="fz", sequence_id=rng.choice(UINT64), publish_time=rng.choice(UINT64))
        if rng.random() < 0.3:
            self._fill(meta, depth=1)
        payload = rng.randbytes(rng.randint(0, 64))
        raw_meta = meta.SerializePartialToString().replace(INVALID_UTF8_MARK.encode(), BAD_UTF8)
        roll = rng.random()
        if roll < 0.1:
            raw_meta = rng.randbytes(len(raw_meta))
        body = struct.pack(">I", len(raw_meta)) + raw_meta + payload
        if roll > 0.95:
            body = struct.pack(">I", rng.choice([0, 2**32 - 1, len(body)])) + body[4:]
        checksum = crc32c(body) if rng.random() < 0.95 else rng.randrange(2**32)
        return struct.pack(">HI", 0x0E01, checksum) + body


def _required(field: FieldDescriptor) -> bool:
    return bool(getattr(field, "is_required", False))


def _frame(command: bytes, entry: bytes = b"") -> bytes:
    return struct.pack(">II", 4 + len(command) + len(entry), len(command)) + command + entry


def answered_request(cmd: T) -> int | None:
    """The request id a broker frame answers (any command carrying one), else None."""
    for _field, value in cmd.ListFields():
        if hasattr(value, "request_id") and value.HasField("request_id"):
            return int(value.request_id)
    return None
