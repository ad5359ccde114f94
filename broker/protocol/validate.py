"""Checks on what a client sends, done once at the edge so nothing behind it meets bad input.

protobuf (upb) hands a ``string`` field holding invalid UTF-8 over as ``bytes``; code that expects ``str``
then fails far from the wire (a stored producer name breaks ``/metrics``, a partition key breaks
dispatch). :func:`invalid_string_field` finds such a field in a decoded command, and
:func:`check_message_metadata` validates a SEND's ``MessageMetadata`` before the entry is stored, so
every stored entry decodes.
"""

from __future__ import annotations

import struct
from typing import cast

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from magnetar.broker.protocol import pulsar_api_pb2 as pb

_U32 = struct.Struct(">I")
_STRING = FieldDescriptor.TYPE_STRING
_MESSAGE = FieldDescriptor.TYPE_MESSAGE
#: Fewest bytes one message of a batch takes once uncompressed: a 4-byte size and a
#: SingleMessageMetadata holding at least ``payload_size`` (2 bytes).
MIN_BATCHED_MESSAGE_SIZE = 6


class InvalidMetadataError(ValueError):
    """A SEND's MessageMetadata cannot be stored (undecodable, invalid UTF-8, a batch that lies)."""


def invalid_string_field(message: Message) -> str | None:
    """The dotted name of the first ``string`` field of ``message`` (or a message inside it) whose value
    is not valid UTF-8, or ``None`` when every string is valid."""
    for field, value in message.ListFields():
        if field.type == _STRING:
            values = value if _is_repeated(field) else (value,)
            if any(isinstance(v, bytes) for v in values):
                return field.name
        elif field.type == _MESSAGE:
            if field.message_type.GetOptions().map_entry:
                continue  # no map fields in Pulsar's protocol; never walked
            for item in value if _is_repeated(field) else (value,):
                inner = invalid_string_field(item)
                if inner is not None:
                    return f"{field.name}.{inner}"
    return None


def _is_repeated(field: FieldDescriptor) -> bool:
    return bool(field.is_repeated)


def _strict_message_metadata() -> type[Message]:
    """``MessageMetadata`` of a copy of the protocol schema that upb itself validates while parsing.

    The copy is the same schema restated as an edition-2023 file (same field numbers, types, defaults,
    required fields and closed enums) whose strings are ``utf8_validation = VERIFY``: upb then refuses
    invalid UTF-8 in any string field, nested ones included, in C during the one parse, instead of a
    Python walk over the decoded fields after it (the publish hot path parses every SEND's metadata).
    """
    features = descriptor_pb2.FeatureSet
    fdp = descriptor_pb2.FileDescriptorProto()
    pb.DESCRIPTOR.CopyToProto(fdp)
    old, new = f".{fdp.package}.", ".magnetar.strict."
    fdp.name, fdp.package = f"magnetar_strict_{fdp.name}", new.strip(".")
    fdp.syntax, fdp.edition = "editions", descriptor_pb2.EDITION_2023
    fdp.options.features.enum_type = features.CLOSED
    fdp.options.features.repeated_field_encoding = features.EXPANDED
    fdp.options.features.utf8_validation = features.VERIFY

    def restate(messages: list[descriptor_pb2.DescriptorProto]) -> None:
        for m in messages:
            for f in m.field:
                if f.label == descriptor_pb2.FieldDescriptorProto.LABEL_REQUIRED:
                    f.label = descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL
                    f.options.features.field_presence = features.LEGACY_REQUIRED
                if f.type_name.startswith(old):
                    f.type_name = new + f.type_name[len(old) :]
            restate(list(m.nested_type))

    restate(list(fdp.message_type))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("magnetar.strict.MessageMetadata"))


#: Same fields and accessors as ``pb.MessageMetadata`` (hence typed as it); only the parse is stricter.
_StrictMessageMetadata = cast("type[pb.MessageMetadata]", _strict_message_metadata())
#: Parses into one reused message before a fresh one replaces it. A reused message saves an allocation per
#: parse (~0.3 µs); upb keeps each parse's data in the message's arena until the message is freed, so
#: reuse is bounded (at most this many metadata copies held).
SCRATCH_PARSES = 256


class ScratchMessage:
    """One reused message of ``cls`` to parse into (see :data:`SCRATCH_PARSES`), for per-entry hot paths that read
    what they need from each parse at once and keep nothing of it."""

    __slots__ = ("_cls", "_message", "_parses")

    def __init__(self, cls: type[pb.MessageMetadata]) -> None:
        self._cls = cls
        self._message = cls()
        self._parses = 0

    def parse(self, raw: bytes | memoryview) -> pb.MessageMetadata:
        """``raw`` parsed (raises what protobuf raises); valid until the next call."""
        self._parses += 1
        if self._parses >= SCRATCH_PARSES:
            self._message, self._parses = self._cls(), 0
        message = self._message
        message.ParseFromString(raw)
        return message


_strict = ScratchMessage(_StrictMessageMetadata)


def check_message_metadata(entry: bytes) -> None:
    """Decode and validate the MessageMetadata of a checksummed entry (``0x0e01`` header first).

    Raises :class:`InvalidMetadataError` when it does not decode, lacks a required field, holds a string
    that is not UTF-8, or is a batch claiming fewer than one message or more than its uncompressed bytes
    can hold. What a batch's messages themselves contain is not read (that would be per-message work on
    the hot path); dispatch delivers such entries as they are.
    One C-level parse with the strict schema copy checks decoding and UTF-8 at once; only a refused
    entry is decoded again, with the protocol's own class, to name what is wrong.
    """
    (size,) = _U32.unpack_from(entry, 6)
    raw = entry[10 : 10 + size]  # a copy of a few dozen bytes costs less than a memoryview and its slice
    try:
        metadata = _strict.parse(raw)
    except Exception as exc:  # DecodeError (garbage or invalid UTF-8), or anything else upb raises
        raise InvalidMetadataError(_why_invalid(raw, exc)) from exc
    if not metadata.IsInitialized():
        missing = ", ".join(metadata.FindInitializationErrors())
        raise InvalidMetadataError(f"Invalid message metadata: missing {missing}")
    if metadata.HasField("num_messages_in_batch"):
        count = metadata.num_messages_in_batch
        limit = max_batch_messages(metadata, len(entry) - 10 - size)
        if not 1 <= count <= limit:
            raise InvalidMetadataError(f"Invalid batch: {count} messages in {limit * MIN_BATCHED_MESSAGE_SIZE} bytes")


def _why_invalid(raw: bytes, exc: Exception) -> str:
    """The message for metadata the strict parse refused: the string field holding invalid UTF-8, if that was it."""
    metadata = pb.MessageMetadata()
    try:
        metadata.ParseFromString(raw)
    except Exception as plain:
        return f"Invalid message metadata: {plain}"
    bad = invalid_string_field(metadata)
    if bad is not None:
        return f"Invalid message metadata: {bad} is not valid UTF-8"
    return f"Invalid message metadata: {exc}"


def max_batch_messages(metadata: pb.MessageMetadata, payload_size: int) -> int:
    """Most messages a batch with ``metadata`` and a payload of ``payload_size`` bytes can hold."""
    uncompressed = metadata.uncompressed_size if metadata.compression != pb.NONE else payload_size
    return max(uncompressed, payload_size) // MIN_BATCHED_MESSAGE_SIZE
