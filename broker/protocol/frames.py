"""Pulsar frame codec: splitting a byte stream into commands, checksums, and building frames.

A frame is ``[total_size u32][command_size u32][BaseCommand]``; SEND and MESSAGE frames are
followed by the *entry bytes* ``[0x0e01][crc32c u32][metadata_size u32][MessageMetadata][payload]``.
The broker stores those entry bytes unchanged and sends them back unchanged in MESSAGE frames,
so the hot path never re-encodes messages.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import NamedTuple

from crc32c import crc32c

from magnetar.broker.protocol import pulsar_api_pb2 as pb
from magnetar.broker.protocol.validate import ScratchMessage, max_batch_messages

MAGIC_CRC32C = 0x0E01
MAGIC_BROKER_ENTRY_METADATA = 0x0E02
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U32X2 = struct.Struct(">II")
_HEADER = struct.Struct(">HI")  # magic, checksum

#: Room Pulsar reserves in a frame beyond the message size for command and metadata.
FRAME_OVERHEAD = 10 * 1024


class FrameError(Exception):
    """The stream is not a valid Pulsar frame sequence; the connection must be closed."""


class ChecksumMismatchError(Exception):
    """A message's crc32c does not match; only that message is rejected."""


class SendFields(NamedTuple):
    """What the broker reads of a SEND's CommandSend (defaults as in the protocol)."""

    producer_id: int
    sequence_id: int
    num_messages: int
    highest_sequence_id: int
    is_chunk: bool


@dataclass(slots=True)
class Frame:
    """One decoded frame: the command and, for SEND/MESSAGE, the entry bytes that follow it.

    The entry is the one copy of those bytes the broker keeps (journal, bookie write cache, entry
    cache): ``bytes`` copied out of the shared read buffer, or the ``bytearray`` a big entry was read
    into, handed on as it is and never written again.
    """

    command: pb.BaseCommand
    entry: bytes | None  # bytes or bytearray (typed bytes: the two are used alike downstream)
    #: A plain SEND's fields, read straight off the wire (see :func:`plain_send`); ``command`` is then
    #: :data:`PLAIN_SEND`, shared and empty. None for every other frame.
    send: SendFields | None = None


#: The command of every frame decoded by :func:`plain_send` (its fields are the frame's ``send``).
PLAIN_SEND = pb.BaseCommand(type=pb.BaseCommand.SEND)


#: Reads at a frame boundary land in one buffer shared by every connection of the process: a read is
#: made and decoded in one go on the event loop's thread, and nothing decoded keeps a view of it (commands
#: are parsed out, entries copied), so idle connections hold no read buffer of their own.
_SCRATCH = memoryview(bytearray(256 * 1024))
#: Room for the frame header of a frame cut before its first four bytes arrived.
_HEADER_ROOM = 64


class FrameDecoder:
    """Incremental decoder with the read buffer of an :class:`asyncio.BufferedProtocol`: the socket is read
    straight into :meth:`get_buffer`, :meth:`buffer_updated` returns the frames completed.

    A read starts in the shared scratch buffer; a frame it leaves unfinished moves (its bytes so far) to a
    buffer of this decoder, and the following reads fill exactly that frame. When its command is already
    all there (the usual case: commands are small), the command is decoded at once and the buffer is the
    entry alone, handed on as the frame's entry once full: a big SEND is read into the one buffer the
    broker keeps of it, with no copy at all. Otherwise the buffer holds the whole frame and the entry is
    copied out of it on completion, as from the scratch buffer.
    """

    __slots__ = ("_filled", "_head", "_pending", "_sized", "max_frame_size")

    def __init__(self, max_frame_size: int) -> None:
        self.max_frame_size = max_frame_size
        self._pending: memoryview | None = None  # the unfinished frame's buffer (or its entry's)
        self._filled = 0  # bytes of it received
        self._sized = False  # the buffer fits the frame exactly (else it waits for the frame's length)
        self._head: Frame | None = None  # set: the buffer is the entry of this frame (decoded without it)

    def get_buffer(self) -> memoryview:
        """Where the next read goes (never empty)."""
        pending = self._pending
        if pending is None:
            return _SCRATCH
        return pending[self._filled :]

    def buffer_updated(self, nbytes: int) -> list[Frame]:
        """``nbytes`` were read into :meth:`get_buffer`: return every frame now complete. Raises :class:`FrameError`."""
        pending = self._pending
        if pending is None:
            view = _SCRATCH[:nbytes]
            frames, used = self._split(view)
            if used < nbytes:
                self._keep(view[used:])
            return frames
        filled = self._filled = self._filled + nbytes
        if self._sized and filled < len(pending):
            return []  # the frame is still incomplete (no work per partial read)
        frame = self._head
        if frame is not None:  # the entry's own buffer is full: it is the entry (no copy)
            self._pending, self._filled, self._head = None, 0, None
            frame.entry = pending.obj  # type: ignore[assignment]  # a bytearray made by _keep
            return [frame]
        frames, used = self._split(pending[:filled])
        self._pending, self._filled = None, 0
        if used < filled:  # only a header buffer ends before its frame does: now sized to the frame
            self._keep(pending[used:filled])
        return frames

    def feed(self, data: bytes) -> list[Frame]:
        """Decode ``data`` as if it had been read into the buffers (tests and tools)."""
        frames: list[Frame] = []
        view = memoryview(data)
        while view:
            buf = self.get_buffer()
            n = min(len(buf), len(view))
            buf[:n] = view[:n]
            frames += self.buffer_updated(n)
            view = view[n:]
        return frames

    def _keep(self, head: memoryview) -> None:
        """Keep the first bytes of an unfinished frame: its entry's in a buffer of the entry's size when the
        command is complete, else all of them in a buffer that fits the whole frame."""
        size = _HEADER_ROOM
        sized = len(head) >= 4
        if sized:
            (total,) = _U32.unpack_from(head, 0)
            self._check_size(total)
            size = 4 + total
            if len(head) >= 8:
                start = 8 + _U32.unpack_from(head, 4)[0]  # where the entry starts
                if start < size and start <= len(head):
                    self._head = _decode_frame(head[4:start])  # the frame without its entry
                    entry = memoryview(bytearray(size - start))
                    got = len(head) - start
                    entry[:got] = head[start:]
                    self._pending, self._filled, self._sized = entry, got, True
                    return
        buf = memoryview(bytearray(size))
        buf[: len(head)] = head
        self._pending, self._filled, self._sized = buf, len(head), sized

    def _check_size(self, total: int) -> None:
        if total < 4 or total > self.max_frame_size:
            raise FrameError(f"invalid frame size {total} (max {self.max_frame_size})")

    def _split(self, view: memoryview) -> tuple[list[Frame], int]:
        """Decode the complete frames at the start of ``view``; returns them and the bytes consumed."""
        frames: list[Frame] = []
        offset = 0
        end = len(view)
        while end - offset >= 4:
            (total,) = _U32.unpack_from(view, offset)
            if total < 4 or total > self.max_frame_size:
                self._check_size(total)
            if end - offset - 4 < total:
                break
            # The command is decoded from the view; the entry is the frame's one copy (batches are big).
            frames.append(_decode_frame(view[offset + 4 : offset + 4 + total]))
            offset += 4 + total
        return frames, offset


def _decode_frame(frame: memoryview) -> Frame:
    (cmd_size,) = _U32.unpack_from(frame, 0)
    if cmd_size == 0 or cmd_size > len(frame) - 4:
        raise FrameError(f"invalid command size {cmd_size} in frame of {len(frame)} bytes")
    rest = len(frame) - 4 - cmd_size
    entry = bytes(frame[4 + cmd_size :]) if rest else None
    if frame[4] == 0x08 and cmd_size > 3 and frame[5] == _SEND:
        send = plain_send(frame[4 : 4 + cmd_size])
        if send is not None:
            return Frame(PLAIN_SEND, entry, send)
    command = pb.BaseCommand()
    try:
        # Merge, not Parse: a command of a type we do not know still decodes (with ``type`` unset)
        # and is answered with an error instead of tearing down the connection.
        command.MergeFromString(frame[4 : 4 + cmd_size])
    except Exception as exc:  # protobuf raises DecodeError; any parse failure is a framing error
        raise FrameError(f"cannot decode command: {exc}") from exc
    return Frame(command, entry)


_SEND = pb.BaseCommand.SEND
#: CommandSend's varint fields the broker reads, by their tag byte (field number << 3, wire type 0).
_PRODUCER_ID, _SEQUENCE_ID, _NUM_MESSAGES, _HIGHEST_SEQUENCE_ID, _IS_CHUNK = 0x08, 0x10, 0x18, 0x30, 0x38


def plain_send(command: memoryview) -> SendFields | None:
    """The fields of a serialized BaseCommand that is a SEND and nothing more, or None when it is anything
    else (then the protobuf decoder reads it, which also reports malformed input).

    One SEND per non-batched message: decoding it into protobuf objects (a BaseCommand, its arena, the
    CommandSend wrapper, one C call per field) cost ~0.3 µs more than reading its few varints here. Only
    the common layout is read: ``type`` first, then ``send`` (a length below 128), holding the required
    ``producer_id`` and ``sequence_id`` and at most ``num_messages``, ``highest_sequence_id`` and
    ``is_chunk``, each a varint of at most 9 bytes. Transactions, markers and anything unknown go the
    protobuf way.
    """
    if len(command) < 4 or command[2] != 0x32 or command[3] >= 0x80 or command[3] + 4 != len(command):
        return None
    pos, end = 4, len(command)
    producer_id = sequence_id = -1
    num_messages, highest, is_chunk = 1, 0, False
    try:
        while pos < end:
            tag = command[pos]
            value = command[pos + 1]
            pos += 2
            if value >= 0x80:
                value &= 0x7F
                shift = 7
                while True:
                    byte = command[pos]
                    pos += 1
                    value |= (byte & 0x7F) << shift
                    if byte < 0x80:
                        break
                    shift += 7
                    if shift > 56:
                        return None
            if tag == _SEQUENCE_ID:
                sequence_id = value
            elif tag == _PRODUCER_ID:
                producer_id = value
            elif tag == _NUM_MESSAGES:
                if value >= 0x80000000:  # a negative int32: as protobuf reads it
                    return None
                num_messages = value
            elif tag == _HIGHEST_SEQUENCE_ID:
                highest = value
            elif tag == _IS_CHUNK:
                is_chunk = value != 0
            else:
                return None
    except IndexError:  # a varint cut off by the end of the command
        return None
    if pos != end or producer_id < 0 or sequence_id < 0:
        return None
    return SendFields(producer_id, sequence_id, num_messages, highest, is_chunk)


def verify_entry(entry: bytes) -> bytes:
    """Check an entry's crc32c and return the bytes to store (``0x0e01`` header included).

    Entries sent without a checksum (protocol < v6) get one computed, so stored entries are
    uniform. Raises :class:`ChecksumMismatchError` or :class:`FrameError` for malformed headers.
    """
    if len(entry) >= 6 and _U16.unpack_from(entry, 0)[0] == MAGIC_CRC32C:
        if len(entry) < 10:
            raise FrameError("truncated message header")
        (expected,) = _U32.unpack_from(entry, 2)
        body = memoryview(entry)[6:]
        _check_metadata_size(body)
        if crc32c(body) != expected:
            raise ChecksumMismatchError(f"checksum mismatch: expected {expected:#010x}")
        return entry  # stored as it came: no copy
    _check_metadata_size(memoryview(entry))
    return _HEADER.pack(MAGIC_CRC32C, crc32c(entry)) + entry


def _check_metadata_size(body: memoryview) -> None:
    if len(body) < 4:
        raise FrameError("truncated message metadata")
    (size,) = _U32.unpack_from(body, 0)
    if size == 0 or size > len(body) - 4:
        raise FrameError(f"invalid metadata size {size}")


def parse_metadata(entry: bytes | memoryview) -> tuple[pb.MessageMetadata, memoryview]:
    """Decode a stored entry's MessageMetadata and return it with the payload view."""
    view = memoryview(entry)
    offset = 6 if len(view) >= 6 and _U16.unpack_from(view, 0)[0] == MAGIC_CRC32C else 0
    (size,) = _U32.unpack_from(view, offset)
    metadata = pb.MessageMetadata()
    metadata.ParseFromString(view[offset + 4 : offset + 4 + size])
    return metadata, view[offset + 4 + size :]


def encode_command(command: pb.BaseCommand) -> bytes:
    """A frame holding just ``command``."""
    body = command.SerializeToString()
    return _U32X2.pack(len(body) + 4, len(body)) + body


def build_entry(metadata: pb.MessageMetadata, payload: bytes) -> bytes:
    """Entry bytes (with checksum) for ``metadata`` and ``payload``: used by tests and tools."""
    meta = metadata.SerializeToString()
    body = _U32.pack(len(meta)) + meta + payload
    return _HEADER.pack(MAGIC_CRC32C, crc32c(body)) + body


class EntryMeta(NamedTuple):
    """What dispatch needs from an entry's MessageMetadata, decoded once per entry."""

    num_messages: int
    #: Key_Shared routing key: ordering key, else partition key, else ``NONE_KEY`` (as Pulsar does).
    sticky_key: bytes
    publish_time: int
    #: ``deliver_at_time`` in ms since the epoch, 0 when not delayed.
    deliver_at: int
    #: Chunked messages: the message uuid, this chunk's id and the chunk count (``None``/0/0 otherwise).
    chunk_uuid: str | None
    chunk_id: int
    num_chunks: int
    is_batch: bool


NONE_KEY = b"NONE_KEY"


#: What dispatch assumes of an entry whose metadata does not decode: one message, delivered as it is.
_UNREADABLE = EntryMeta(1, NONE_KEY, 0, 0, None, 0, 0, False)


#: Dispatch decodes every entry's metadata it sends: into one reused message, not a new one per entry.
_metadata = ScratchMessage(pb.MessageMetadata)


def entry_meta(entry: bytes) -> EntryMeta:
    """Decode the per-entry facts the dispatchers use (one protobuf parse per entry, never per message).

    Never raises: entries are validated on publish, but one stored before that (or damaged) must not
    stop its subscription, so an undecodable entry counts as one message without a key, and a batch's
    message count is bounded by what its bytes can hold.
    """
    try:
        (size,) = _U32.unpack_from(entry, 6)
        m = _metadata.parse(entry[10 : 10 + size])
    except Exception:
        return _UNREADABLE
    if m.HasField("ordering_key"):
        key = m.ordering_key
    elif m.HasField("partition_key"):
        pk = m.partition_key  # bytes when it is invalid UTF-8 (upb hands the raw bytes over)
        if isinstance(pk, bytes):
            key = pk
        elif m.partition_key_b64_encoded:
            key = _b64decode(pk)
        else:
            key = pk.encode()
    else:
        key = NONE_KEY
    chunked = m.HasField("uuid") and m.num_chunks_from_msg > 1 and isinstance(m.uuid, str)
    return EntryMeta(
        _batch_count(m, len(entry) - 10 - size),
        key,
        m.publish_time,
        m.deliver_at_time if m.HasField("deliver_at_time") else 0,
        m.uuid if chunked else None,
        m.chunk_id if chunked else 0,
        m.num_chunks_from_msg if chunked else 0,
        m.HasField("num_messages_in_batch"),
    )


def entry_num_messages(entry: bytes) -> int:
    """Messages in a stored entry (``num_messages_in_batch``, 1 for a plain message); what :func:`entry_meta`
    counts, without building the rest (Exclusive and Failover dispatch need only this)."""
    try:
        (size,) = _U32.unpack_from(entry, 6)
        m = _metadata.parse(entry[10 : 10 + size])
    except Exception:
        return 1
    return _batch_count(m, len(entry) - 10 - size)


def _batch_count(m: pb.MessageMetadata, payload_size: int) -> int:
    if not m.HasField("num_messages_in_batch"):
        return 1
    return min(max(m.num_messages_in_batch, 1), max(max_batch_messages(m, payload_size), 1))


def _b64decode(text: str) -> bytes:
    import base64

    try:
        return base64.b64decode(text)
    except ValueError:
        return text.encode()
