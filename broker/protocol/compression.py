"""Payload codecs Pulsar clients use, for the few places the broker must look inside a message.

The hot path never decompresses: entries are stored and dispatched as the producer sent them.
"""

from __future__ import annotations

import zlib

import lz4.block
import snappy
import zstandard

from magnetar.broker.protocol import pulsar_api_pb2 as pb

_ZSTD = zstandard.ZstdDecompressor()


def decompress(codec: int, payload: bytes | memoryview, uncompressed_size: int) -> bytes:
    """Decode ``payload`` compressed with ``codec`` (a ``CompressionType``) to ``uncompressed_size`` bytes."""
    if codec == pb.NONE:
        return bytes(payload)
    if codec == pb.LZ4:
        # Pulsar's LZ4 is the raw block format, without a frame or size prefix.
        return lz4.block.decompress(bytes(payload), uncompressed_size=uncompressed_size)
    if codec == pb.ZLIB:
        return zlib.decompress(payload)
    if codec == pb.ZSTD:
        return _ZSTD.decompress(bytes(payload), max_output_size=uncompressed_size)
    if codec == pb.SNAPPY:
        return snappy.decompress(bytes(payload))
    raise ValueError(f"unknown compression codec {codec}")
