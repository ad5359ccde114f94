"""Checks on what a client sends, done once at the edge so nothing behind it meets bad input.

protobuf (upb) hands a ``string`` field holding invalid UTF-8 over as ``bytes``; code that expects ``str``
then fails far from the wire (a stored producer name breaks ``/metrics``, a partition key breaks
dispatch). :func:`invalid_string_field` finds such a field in a decoded command, and
:func:`check_message_metadata` validates a SEND's ``MessageMetadata`` before the entry is stored, so
every stored entry decodes.
"""

from __future__ import annotations

import struct

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


def check_message_metadata(entry: bytes) -> pb.MessageMetadata:
    """Decode and validate the MessageMetadata of a checksummed entry (``0x0e01`` header first).

    Raises :class:`InvalidMetadataError` when it does not decode, lacks a required field, holds a string
    that is not UTF-8, or is a batch claiming fewer than one message or more than its uncompressed bytes
    can hold. What a batch's messages themselves contain is not read (that would be per-message work on
    the hot path); dispatch delivers such entries as they are.
    """
    (size,) = _U32.unpack_from(entry, 6)
    metadata = pb.MessageMetadata()
    try:
        metadata.ParseFromString(memoryview(entry)[10 : 10 + size])
    except Exception as exc:  # DecodeError, or anything else upb raises on garbage
        raise InvalidMetadataError(f"Invalid message metadata: {exc}") from exc
    if not metadata.IsInitialized():
        missing = ", ".join(metadata.FindInitializationErrors())
        raise InvalidMetadataError(f"Invalid message metadata: missing {missing}")
    bad = invalid_string_field(metadata)
    if bad is not None:
        raise InvalidMetadataError(f"Invalid message metadata: {bad} is not valid UTF-8")
    if metadata.HasField("num_messages_in_batch"):
        count = metadata.num_messages_in_batch
        limit = max_batch_messages(metadata, len(entry) - 10 - size)
        if not 1 <= count <= limit:
            raise InvalidMetadataError(f"Invalid batch: {count} messages in {limit * MIN_BATCHED_MESSAGE_SIZE} bytes")
    return metadata


def max_batch_messages(metadata: pb.MessageMetadata, payload_size: int) -> int:
    """Most messages a batch with ``metadata`` and a payload of ``payload_size`` bytes can hold."""
    uncompressed = metadata.uncompressed_size if metadata.compression != pb.NONE else payload_size
    return max(uncompressed, payload_size) // MIN_BATCHED_MESSAGE_SIZE
