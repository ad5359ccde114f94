"""The bookie wire protocol: compact length-prefixed binary frames over TCP.

Every frame (big endian)::

    u32 length      bytes after this field (header + body), at most MAX_FRAME
    u8  version     PROTOCOL_VERSION
    u8  op          request op code; responses set the RESPONSE bit (0x80)
    u32 request_id  chosen by the client, echoed by the server (0 = connection-level error)
    ... body

Request bodies:

====================  ==========================================================================
ADD        (1)        ``i64 ledger, i64 entry, i64 lac, u8 flags, u16 key_len``, key, then the
                      entry data (rest of the frame); flags: 1 = recovery, 2 = the client takes
                      ADD_ACKS (below) for its successful adds
READ       (2)        ``i64 ledger, i64 first, i64 last``
READ_LAC   (3)        ``i64 ledger``
FENCE      (4)        ``i64 ledger, u16 key_len``, key
DELETE     (5)        ``i64 ledger``
====================  ==========================================================================

Response bodies start with ``u8 status``; on an error the rest is a UTF-8 message. On success:
ADD and DELETE have nothing more, READ has ``u8 flags, u32 count`` then per entry
``i64 entry, u32 len`` and the data (flag 1 = truncated to bound the frame size: the client
asks again from the next entry), READ_LAC and FENCE have ``i64 lac, i64 last_entry``.

ADD_ACKS (op 6, a response only, 0x86) answers many successful adds in one frame: its request id
field holds the count ``n`` and the body is ``n`` x ``u32 request_id``. The server sends it only
for adds flagged 2 (older clients keep getting one ADD response per add); errors always go as
single ADD responses.

A frame whose body does not parse gets a BAD_REQUEST response and the connection goes on (the
framing is intact); an oversized or impossible length, or a version the peer does not speak,
gets an error with request id 0 and the connection is closed.
"""

from __future__ import annotations

import struct

from .api import (
    BookieError,
    BookieFencedError,
    BookieNoSuchEntryError,
    BookieReadOnlyError,
    BookieTooManyRequestsError,
    BookieUnauthorizedError,
    BookieUnavailableError,
)

PROTOCOL_VERSION = 1
#: Largest frame accepted (a read response batches entries up to about MAX_READ_RESPONSE_BYTES).
MAX_FRAME = 64 * 1024 * 1024
#: A read response stops adding entries once it holds this many bytes (the client asks again).
MAX_READ_RESPONSE_BYTES = 16 * 1024 * 1024

OP_ADD = 1
OP_READ = 2
OP_READ_LAC = 3
OP_FENCE = 4
OP_DELETE = 5
OP_ADD_ACKS = 6  # response only: see the module docstring
RESPONSE = 0x80
OPS = frozenset((OP_ADD, OP_READ, OP_READ_LAC, OP_FENCE, OP_DELETE))

FLAG_RECOVERY = 1
FLAG_ACKS = 2

# Status codes of responses.
OK = 0
E_UNAVAILABLE = 1
E_FENCED = 2
E_READ_ONLY = 3
E_NO_SUCH_ENTRY = 4
E_UNAUTHORIZED = 5
E_BOOKIE = 6  # any other BookieError
E_BAD_REQUEST = 7  # the frame did not parse
E_BAD_VERSION = 8  # protocol version not spoken here
E_INTERNAL = 9  # an unexpected server failure
E_TOO_MANY_REQUESTS = 10  # write cache full past its throttle time (BookKeeper's ETOOMANYREQUESTS)

LEN = struct.Struct(">I")
HEADER = struct.Struct(">IBBI")  # length, version, op, request id
HEADER_SIZE = HEADER.size  # 10
#: Bytes the length field counts besides the body.
HEADER_REST = HEADER_SIZE - LEN.size  # 6
ADD_FIXED = struct.Struct(">qqqBH")
READ_REQ = struct.Struct(">qqq")
LEDGER = struct.Struct(">q")
FENCE_FIXED = struct.Struct(">qH")
LAC_RESP = struct.Struct(">Bqq")
READ_COUNT = struct.Struct(">BBI")  # status, flags, count
READ_MORE = 1
READ_ENTRY = struct.Struct(">qI")

_EXC_OF_CODE: dict[int, type[BookieError]] = {
    E_UNAVAILABLE: BookieUnavailableError,
    E_FENCED: BookieFencedError,
    E_READ_ONLY: BookieReadOnlyError,
    E_NO_SUCH_ENTRY: BookieNoSuchEntryError,
    E_UNAUTHORIZED: BookieUnauthorizedError,
    E_TOO_MANY_REQUESTS: BookieTooManyRequestsError,
}
# Most specific classes first: isinstance order matters for subclasses.
_CODE_OF_EXC: list[tuple[type[BaseException], int]] = [(cls, code) for code, cls in _EXC_OF_CODE.items()]


class ProtocolError(Exception):
    """A frame that does not follow this protocol."""


def code_of(exc: BaseException) -> int:
    """The status code reporting ``exc`` to a client."""
    for cls, code in _CODE_OF_EXC:
        if isinstance(exc, cls):
            return code
    return E_BOOKIE if isinstance(exc, BookieError) else E_INTERNAL


def error_of(code: int, message: str) -> BookieError:
    """The exception a client raises for an error response."""
    cls = _EXC_OF_CODE.get(code, BookieError)
    return cls(message)


# ---------------------------------------------------------------------- encoding


def _frame(op: int, request_id: int, body: bytes) -> bytes:
    return HEADER.pack(HEADER_REST + len(body), PROTOCOL_VERSION, op, request_id) + body


def encode_add(
    request_id: int, ledger_id: int, entry_id: int, master_key: bytes, lac: int, data: bytes, recovery: bool = False
) -> bytes:
    """One ADD request frame without the ADD_ACKS flag (as an older client sends it)."""
    body = encode_add_body(ledger_id, entry_id, master_key, lac, data, recovery, acks=False)
    return add_header(request_id, len(body)) + body


def encode_add_body(
    ledger_id: int,
    entry_id: int,
    master_key: bytes,
    lac: int,
    data: bytes,
    recovery: bool = False,
    acks: bool = True,
) -> bytes:
    """An ADD request without its frame header (:func:`encode_add_parts` joined)."""
    return b"".join(encode_add_parts(ledger_id, entry_id, master_key, lac, b"", data, recovery, acks))


def encode_add_parts(
    ledger_id: int,
    entry_id: int,
    master_key: bytes,
    lac: int,
    head: bytes,
    data: bytes,
    recovery: bool = False,
    acks: bool = True,
) -> tuple[bytes, bytes]:
    """The body of an ADD request of the stored entry ``head + data``, as ``(fields + key + head, data)``:
    ``data`` is not copied into the request. Encoded once per entry, shared by all its replicas (each
    request then costs only :func:`add_header`); ``acks``: the client takes ADD_ACKS."""
    flags = (FLAG_RECOVERY if recovery else 0) | (FLAG_ACKS if acks else 0)
    return ADD_FIXED.pack(ledger_id, entry_id, lac, flags, len(master_key)) + master_key + head, data


_HEADER_PACK = HEADER.pack


def add_header(request_id: int, body_size: int) -> bytes:
    """The frame header of an ADD request whose body (:func:`encode_add_parts`) has ``body_size`` bytes."""
    return _HEADER_PACK(HEADER_REST + body_size, PROTOCOL_VERSION, OP_ADD, request_id)


def encode_read(request_id: int, ledger_id: int, first: int, last: int) -> bytes:
    return _frame(OP_READ, request_id, READ_REQ.pack(ledger_id, first, last))


def encode_read_lac(request_id: int, ledger_id: int) -> bytes:
    return _frame(OP_READ_LAC, request_id, LEDGER.pack(ledger_id))


def encode_fence(request_id: int, ledger_id: int, master_key: bytes) -> bytes:
    return _frame(OP_FENCE, request_id, FENCE_FIXED.pack(ledger_id, len(master_key)) + master_key)


def encode_delete(request_id: int, ledger_id: int) -> bytes:
    return _frame(OP_DELETE, request_id, LEDGER.pack(ledger_id))


OK_RESPONSE = struct.Struct(">IBBIB")


def encode_ok(op: int, request_id: int) -> bytes:
    """A success response without payload (ADD, DELETE)."""
    return OK_RESPONSE.pack(HEADER_REST + 1, PROTOCOL_VERSION, op | RESPONSE, request_id, OK)


_RIDS: dict[int, struct.Struct] = {}


def rids_struct(count: int) -> struct.Struct:
    """``count`` x ``u32`` (cached for small counts: the usual sizes of an ADD_ACKS body)."""
    st = _RIDS.get(count)
    if st is None:
        st = struct.Struct(f">{count}I")
        if count <= 1024:
            _RIDS[count] = st
    return st


def encode_add_acks(request_ids: list[int]) -> bytes:
    """One ADD_ACKS frame answering the successful adds ``request_ids``."""
    n = len(request_ids)
    return HEADER.pack(HEADER_REST + 4 * n, PROTOCOL_VERSION, OP_ADD_ACKS | RESPONSE, n) + rids_struct(n).pack(
        *request_ids
    )


def encode_error(op: int, request_id: int, code: int, message: str) -> bytes:
    body = bytes((code,)) + message.encode("utf-8", "replace")[:4096]
    return _frame(op | RESPONSE, request_id, body)


def encode_lac(op: int, request_id: int, lac: int, last_entry: int) -> bytes:
    return _frame(op | RESPONSE, request_id, LAC_RESP.pack(OK, lac, last_entry))


def encode_entries(request_id: int, entries: list[tuple[int, bytes]], more: bool = False) -> bytes:
    parts = [b"", READ_COUNT.pack(OK, READ_MORE if more else 0, len(entries))]
    pack = READ_ENTRY.pack
    size = READ_COUNT.size
    for eid, data in entries:
        parts.append(pack(eid, len(data)))
        parts.append(data)
        size += READ_ENTRY.size + len(data)
    parts[0] = HEADER.pack(HEADER_REST + size, PROTOCOL_VERSION, OP_READ | RESPONSE, request_id)
    return b"".join(parts)


# ---------------------------------------------------------------------- decoding


def decode_add(body: bytes | memoryview) -> tuple[int, int, int, bool, bytes, bytes]:
    """``(ledger, entry, lac, recovery, key, data)`` of an ADD body; ProtocolError if malformed."""
    if len(body) < ADD_FIXED.size:
        raise ProtocolError("truncated add request")
    ledger_id, entry_id, lac, flags, key_len = ADD_FIXED.unpack_from(body)
    key_end = ADD_FIXED.size + key_len
    if key_end > len(body):
        raise ProtocolError("add request key exceeds the frame")
    return (
        ledger_id,
        entry_id,
        lac,
        bool(flags & FLAG_RECOVERY),
        bytes(body[ADD_FIXED.size : key_end]),
        bytes(body[key_end:]),
    )


def decode_read(body: bytes | memoryview) -> tuple[int, int, int]:
    if len(body) != READ_REQ.size:
        raise ProtocolError("bad read request size")
    return READ_REQ.unpack(body)


def decode_ledger(body: bytes | memoryview) -> int:
    if len(body) != LEDGER.size:
        raise ProtocolError("bad request size")
    return LEDGER.unpack(body)[0]


def decode_fence(body: bytes | memoryview) -> tuple[int, bytes]:
    if len(body) < FENCE_FIXED.size:
        raise ProtocolError("truncated fence request")
    ledger_id, key_len = FENCE_FIXED.unpack_from(body)
    if FENCE_FIXED.size + key_len != len(body):
        raise ProtocolError("fence request key does not fit the frame")
    return ledger_id, bytes(body[FENCE_FIXED.size :])


def decode_status(body: bytes | memoryview) -> BookieError | None:
    """The error a response body reports, or None for OK."""
    if not body:
        raise ProtocolError("empty response")
    code = body[0]
    if code == OK:
        return None
    return error_of(code, bytes(body[1:]).decode("utf-8", "replace"))


def decode_lac(body: bytes | memoryview) -> tuple[int, int]:
    if len(body) != LAC_RESP.size:
        raise ProtocolError("bad lac response size")
    _, lac, last = LAC_RESP.unpack(body)
    return lac, last


def decode_entries(body: bytes | memoryview) -> tuple[list[tuple[int, bytes]], bool]:
    """``(entries, more)``: ``more`` when the bookie cut the batch short to bound the frame."""
    if len(body) < READ_COUNT.size:
        raise ProtocolError("truncated read response")
    _, flags, count = READ_COUNT.unpack_from(body)
    off = READ_COUNT.size
    out: list[tuple[int, bytes]] = []
    unpack = READ_ENTRY.unpack_from
    n = len(body)
    for _ in range(count):
        if off + READ_ENTRY.size > n:
            raise ProtocolError("truncated read response entry")
        eid, size = unpack(body, off)
        off += READ_ENTRY.size
        if off + size > n:
            raise ProtocolError("read response entry exceeds the frame")
        out.append((eid, bytes(body[off : off + size])))
        off += size
    if off != n:
        raise ProtocolError("trailing bytes in read response")
    return out, bool(flags & READ_MORE)


class FrameReader:
    """Splits a byte stream into ``(version, op, request_id, body)`` frames.

    Feed it what ``data_received`` gets. A complete frame already at the start of the chunk is
    sliced straight out of it; only a partial tail is buffered (and not re-joined until the
    rest of that frame has arrived), so big entries arriving in pieces cost one copy.
    """

    __slots__ = ("_buf", "_need", "max_frame")

    def __init__(self, max_frame: int = MAX_FRAME) -> None:
        self._buf = bytearray()
        self._need = 0
        self.max_frame = max_frame

    def take(self, data: bytes) -> bytes | None:
        """``data`` joined to the buffered tail, or None while the pending frame is still incomplete."""
        buf = self._buf
        if not buf:
            return data
        buf += data
        if len(buf) < self._need:
            return None
        data = bytes(buf)
        buf.clear()
        return data

    def keep(self, data: bytes, off: int) -> None:
        """Buffer ``data[off:]``, the start of a frame that has not fully arrived."""
        n = len(data)
        if off >= n:
            return
        self._buf += data[off:]
        self._need = LEN.size + LEN.unpack_from(data, off)[0] if n - off >= HEADER_SIZE else HEADER_SIZE

    def feed(self, data: bytes) -> list[tuple[int, int, int, bytes]]:
        """Frames completed by ``data``; raises ProtocolError on an impossible length."""
        chunk = self.take(data)
        if chunk is None:
            return []
        frames: list[tuple[int, int, int, bytes]] = []
        off = 0
        n = len(chunk)
        unpack = HEADER.unpack_from
        max_frame = self.max_frame
        while n - off >= HEADER_SIZE:
            length, version, op, rid = unpack(chunk, off)
            if length < HEADER_REST or length > max_frame:
                raise ProtocolError(f"bad frame length {length}")
            end = off + LEN.size + length
            if end > n:
                break
            frames.append((version, op, rid, chunk[off + HEADER_SIZE : end]))
            off = end
        self.keep(chunk, off)
        return frames
