"""Framing of entries as stored on bookies, and the master key.

Each stored entry is ``total_length u64 | crc32c u32 | data``: ``total_length`` is the ledger's
length in bytes through this entry (so recovery learns the ledger length from the last entry
alone) and the CRC covers ledger id, entry id, total length and data, so an entry served for the
wrong position or damaged anywhere is detected by the reader.
"""

from __future__ import annotations

import functools
import hashlib
import struct

from crc32c import crc32c

from .errors import DigestError

_HEADER = struct.Struct("<QI")
_IDS = struct.Struct("<qqQ")
HEADER_SIZE = _HEADER.size


@functools.lru_cache(maxsize=64)
def master_key(password: bytes) -> bytes:
    """The key bookies check on adds and fences (derived, so the password itself never travels).

    Cached: every ledger of a broker usually has the same password, and each write handle keeps its key.
    """
    return hashlib.sha256(b"magnetar-ledger:" + password).digest()


def frame_header(ledger_id: int, entry_id: int, total_length: int, data: bytes) -> bytes:
    """The header :func:`frame` puts before ``data``. The add path keeps the two apart (the journal, the
    bookie's write cache, its entry log and the ADD request write header and data as separate buffers),
    so an entry's bytes are never copied just to be framed."""
    return _HEADER.pack(total_length, crc32c(data, crc32c(_IDS.pack(ledger_id, entry_id, total_length))))


def frame(ledger_id: int, entry_id: int, total_length: int, data: bytes) -> bytes:
    """The stored entry in one piece: :func:`frame_header` + ``data``."""
    return frame_header(ledger_id, entry_id, total_length, data) + data


def unframe(ledger_id: int, entry_id: int, stored: bytes) -> tuple[bytes, int]:
    """``(data, total_length)``; :class:`DigestError` if the entry is damaged or misplaced."""
    if len(stored) < HEADER_SIZE:
        raise DigestError(f"entry {ledger_id}:{entry_id} is too short")
    total_length, crc = _HEADER.unpack_from(stored)
    data = stored[HEADER_SIZE:]
    if crc32c(data, crc32c(_IDS.pack(ledger_id, entry_id, total_length))) != crc:
        raise DigestError(f"entry {ledger_id}:{entry_id} fails its checksum")
    return data, total_length
