"""Payload codecs Pulsar clients use, for the few places the broker must look inside a message.

The hot path never decompresses: entries are stored and dispatched as the producer sent them. What
is decoded here came from a client, so every codec must give exactly the ``uncompressed_size`` the
message declares, never more than the caller's limit, and fail with :class:`CorruptPayloadError`
(never the codec library's own exception) on anything else.
"""

from __future__ import annotations

import functools
import zlib
from typing import TYPE_CHECKING

from magnetar.broker.protocol import pulsar_api_pb2 as pb

if TYPE_CHECKING:
    import zstandard

# The codec libraries (lz4, snappy over cramjam, zstandard: ~2 MiB resident together) are imported by the
# first payload of their codec, not by every broker.


@functools.cache
def _zstd() -> zstandard.ZstdDecompressor:
    import zstandard

    return zstandard.ZstdDecompressor()


class CorruptPayloadError(ValueError):
    """A payload does not decode with its codec to its declared size."""


def decompress(codec: int, payload: bytes | memoryview, uncompressed_size: int, limit: int) -> bytes:
    """Decode ``payload`` compressed with ``codec`` (a ``CompressionType``) to ``uncompressed_size`` bytes.

    Raises :class:`CorruptPayloadError` when the payload is corrupt, decodes to another size, or declares
    more than ``limit`` bytes.
    """
    if codec == pb.NONE:
        return bytes(payload)
    if uncompressed_size > limit:
        raise CorruptPayloadError(f"declared uncompressed size {uncompressed_size} exceeds the limit of {limit}")
    try:
        body = _decode(codec, bytes(payload), uncompressed_size)
    except CorruptPayloadError:
        raise
    except Exception as exc:  # each library has its own error types (and some raise ValueError/MemoryError)
        raise CorruptPayloadError(f"corrupt {_name(codec)} payload: {exc}") from exc
    if len(body) != uncompressed_size:
        raise CorruptPayloadError(
            f"{_name(codec)} payload decodes to {len(body)} bytes, not the declared {uncompressed_size}"
        )
    return body


def _decode(codec: int, payload: bytes, size: int) -> bytes:
    if codec == pb.LZ4:
        import lz4.block

        # Pulsar's LZ4 is the raw block format, without a frame or size prefix.
        return lz4.block.decompress(payload, uncompressed_size=size)
    if codec == pb.ZLIB:
        inflater = zlib.decompressobj()
        body = inflater.decompress(payload, size + 1)  # one byte more than declared shows a lie
        if not inflater.eof:
            raise CorruptPayloadError("truncated or oversized ZLIB payload")
        return body
    if codec == pb.ZSTD:
        return _zstd().decompress(payload, max_output_size=size)
    if codec == pb.SNAPPY:
        # A raw snappy block starts with its uncompressed length (varint): check it before decoding.
        declared = _snappy_length(payload)
        if declared != size:
            raise CorruptPayloadError(f"SNAPPY payload holds {declared} bytes, not the declared {size}")
        import snappy

        return bytes(snappy.uncompress(payload))
    raise CorruptPayloadError(f"unknown compression codec {codec}")


def _snappy_length(payload: bytes) -> int:
    value = shift = 0
    for byte in payload[:5]:
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value
        shift += 7
    raise CorruptPayloadError("corrupt SNAPPY payload: no length header")


def _name(codec: int) -> str:
    return pb.CompressionType.Name(codec) if codec in pb.CompressionType.values() else str(codec)
