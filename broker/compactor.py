"""Two-phase topic compaction (Pulsar's TwoPhaseCompactor) and the compacted ledger it writes.

Phase one reads the topic up to a *horizon* (its last entry when compaction starts) and records,
per key, the latest message (entry position and index inside a batch; compressed batches are
decompressed to see their keys). Phase two reads the same entries again and writes those that hold
a latest message to a new ledger, each prefixed with its original message id. Batches are rewritten
with only their latest messages (uncompressed). A key
whose latest message is a tombstone (empty payload or ``null_value``) disappears. Messages without a
key are dropped unless ``topicCompactionRetainNullKey`` (PIP-318). A later compaction starts from
the previous compacted ledger and the entries after the previous horizon.

The result is stored as Pulsar does, in the ``__compaction`` cursor: its properties name the
compacted ledger (``CompactedTopicLedger``) and the horizon, and its mark-delete position is the
horizon, so retention may trim what the compacted ledger now holds. The new ledger is recorded as
pending before it is written; the switch (ledger, horizon, mark-delete) is one cursor write. A
broker killed mid-way leaves the previous state intact and the pending ledger is deleted on the
next run: compaction restarts, it never corrupts.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import struct
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.message import DecodeError

from magnetar.broker.protocol import pulsar_api_pb2 as pb
from magnetar.broker.protocol.compression import CorruptPayloadError, decompress
from magnetar.broker.protocol.frames import build_entry, parse_metadata
from magnetar.ledger.api import LedgerClient, LedgerConfig, ReadHandle
from magnetar.managed_ledger.api import Entry, ManagedCursor, ManagedLedger, Position

log = logging.getLogger(__name__)

COMPACTION_SUBSCRIPTION = "__compaction"
LEDGER_PROPERTY = "CompactedTopicLedger"
HORIZON_PROPERTY = "CompactedTopicHorizon"
PENDING_PROPERTY = "CompactedTopicPendingLedger"
_U32 = struct.Struct(">I")
_READ_BATCH = 200
#: Appends in flight while writing the compacted ledger (they group-commit).
_WRITE_WINDOW = 64


@dataclass(frozen=True, slots=True)
class Message:
    """What compaction needs of one message of an entry."""

    key: str | None
    tombstone: bool
    compacted_out: bool = False


# ------------------------------------------------------------------------------------------ entries
def messages_of(data: bytes, limit: int) -> list[Message]:
    """The messages of a stored entry, in batch order (one for a plain message); a batch may decompress
    to at most ``limit`` bytes (:class:`CorruptPayloadError` otherwise)."""
    meta, payload = parse_metadata(data)
    if not meta.HasField("num_messages_in_batch"):
        key = meta.partition_key if meta.HasField("partition_key") else None
        return [Message(key, meta.null_value or len(payload) == 0)]
    out = []
    for smm, body in _split_batch(meta, payload, limit):
        key = smm.partition_key if smm.HasField("partition_key") else None
        out.append(Message(key, smm.null_value or len(body) == 0, smm.compacted_out))
    return out


def _split_batch(
    meta: pb.MessageMetadata, payload: memoryview, limit: int
) -> list[tuple[pb.SingleMessageMetadata, bytes]]:
    raw = decompress(meta.compression, payload, meta.uncompressed_size, limit)
    out = []
    offset = 0
    for _ in range(meta.num_messages_in_batch):
        (size,) = _U32.unpack_from(raw, offset)
        smm = pb.SingleMessageMetadata()
        smm.ParseFromString(raw[offset + 4 : offset + 4 + size])
        offset += 4 + size
        out.append((smm, raw[offset : offset + smm.payload_size]))
        offset += smm.payload_size
    return out


def keep_only(data: bytes, keep: set[int], limit: int) -> bytes:
    """A batch entry holding only the messages whose index is in ``keep`` (uncompressed).

    The superseded messages are left out rather than flagged ``compacted_out``: the C++-based
    clients deliver flagged messages as empty ones.
    """
    meta, payload = parse_metadata(data)
    parts = []
    for i, (smm, body) in enumerate(_split_batch(meta, payload, limit)):
        if i in keep:
            encoded = smm.SerializeToString()
            parts.append(_U32.pack(len(encoded)) + encoded + body)
    raw = b"".join(parts)
    meta.compression = pb.NONE
    meta.uncompressed_size = len(raw)
    meta.num_messages_in_batch = len(parts)
    return build_entry(meta, raw)


def encode_record(position: Position, data: bytes) -> bytes:
    """A compacted-ledger entry: ``[u32 n][MessageIdData (n bytes)][entry]``."""
    mid = pb.MessageIdData(ledgerId=position.ledger_id, entryId=position.entry_id).SerializeToString()
    return _U32.pack(len(mid)) + mid + data


def decode_record(record: bytes) -> Entry:
    (n,) = _U32.unpack_from(record, 0)
    mid = pb.MessageIdData()
    mid.ParseFromString(record[4 : 4 + n])
    return Entry(Position(mid.ledgerId, mid.entryId), record[4 + n :])


def parse_position(text: str | None) -> Position | None:
    if not text:
        return None
    ledger, entry = text.split(":")
    return Position(int(ledger), int(entry))


# ------------------------------------------------------------------------------------------ the result
@dataclass(slots=True)
class CompactedLedger:
    """A finished compacted ledger: its id, horizon and the original position of each of its entries."""

    ledger_id: int
    horizon: Position
    positions: list[Position]
    #: Bytes of the compacted ledger's entries.
    size: int = 0
    _handle: ReadHandle | None = field(default=None, repr=False)

    @classmethod
    async def load(cls, client: LedgerClient, ledger_id: int, horizon: Position) -> CompactedLedger:
        """Open ``ledger_id`` and index the original positions of its entries."""
        result = cls(ledger_id, horizon, [])
        async for entry in result.scan(client):
            result.positions.append(entry.position)
        result.size = (await result._open(client)).length
        return result

    async def _open(self, client: LedgerClient) -> ReadHandle:
        if self._handle is None:
            self._handle = await client.open_ledger(self.ledger_id, recovery=False)
        return self._handle

    async def scan(self, client: LedgerClient) -> AsyncIterator[Entry]:
        """Every entry with its original position, in order."""
        handle = await self._open(client)
        last = handle.last_add_confirmed
        for first in range(0, last + 1, _READ_BATCH):
            for e in await handle.read(first, min(first + _READ_BATCH, last + 1) - 1):
                yield decode_record(e.data)

    def index_from(self, position: Position) -> int:
        """Index of the first entry at or after ``position``."""
        return bisect.bisect_left(self.positions, position)

    async def read(self, client: LedgerClient, index: int, count: int) -> list[Entry]:
        """Up to ``count`` entries from ``index``, with their original positions."""
        last = min(index + count, len(self.positions)) - 1
        if last < index:
            return []
        handle = await self._open(client)
        return [decode_record(e.data) for e in await handle.read(index, last)]

    async def close(self) -> None:
        handle, self._handle = self._handle, None
        if handle is not None:
            await handle.close()


# ------------------------------------------------------------------------------------------ compaction
class TwoPhaseCompactor:
    """Compacts one topic's managed ledger into a new compacted ledger (see the module docstring)."""

    def __init__(
        self, client: LedgerClient, ledger_config: LedgerConfig, retain_null_key: bool, max_uncompressed: int
    ) -> None:
        self.client = client
        self.ledger_config = ledger_config
        self.retain_null_key = retain_null_key
        self.max_uncompressed = max_uncompressed

    async def compact(
        self, ml: ManagedLedger, cursor: ManagedCursor, previous: CompactedLedger | None
    ) -> CompactedLedger | None:
        """Compact up to the current last entry; the new result (``None``: nothing new to compact)."""
        pending = cursor.properties.get(PENDING_PROPERTY)
        if pending:  # left by a broker that died mid-way
            await self.client.delete_ledger(int(pending))
            cursor.set_property(PENDING_PROPERTY, None)
            await cursor.flush()
        horizon = ml.last_confirmed_entry
        if horizon.entry_id < 0 or (previous is not None and horizon <= previous.horizon):
            return None
        start = ml.first_position if previous is None else ml.next_position(previous.horizon)
        start = max(start, ml.first_position)

        latest: dict[str, tuple[Position, int, bool]] = {}
        async for entry in self._source(ml, previous, start, horizon):
            for i, msg in enumerate(self._messages(entry)):
                if msg.key is not None and not msg.compacted_out:
                    latest[msg.key] = (entry.position, i, msg.tombstone)

        handle = await self.client.create_ledger(self.ledger_config)
        cursor.set_property(PENDING_PROPERTY, str(handle.ledger_id))
        await cursor.flush()
        positions: list[Position] = []
        window: list[Coroutine[Any, Any, int]] = []
        async for entry in self._source(ml, previous, start, horizon):
            msgs = self._messages(entry)
            keep = {i for i, msg in enumerate(msgs) if self._keeps(msg, latest, entry.position, i)}
            if not keep:
                continue
            data = entry.data if len(keep) == len(msgs) else keep_only(entry.data, keep, self.max_uncompressed)
            window.append(handle.append(encode_record(entry.position, data)))  # started in order by gather
            positions.append(entry.position)
            if len(window) >= _WRITE_WINDOW:
                await asyncio.gather(*window)
                window.clear()
        await asyncio.gather(*window)
        await handle.close()

        cursor.set_property(LEDGER_PROPERTY, str(handle.ledger_id))
        cursor.set_property(HORIZON_PROPERTY, str(horizon))
        cursor.set_property(PENDING_PROPERTY, None)
        cursor.mark_delete(horizon)
        await cursor.flush()  # the switch: one cursor write
        if previous is not None:
            await previous.close()
            await self.client.delete_ledger(previous.ledger_id)
        return CompactedLedger(handle.ledger_id, horizon, positions, handle.length)

    def _messages(self, entry: Entry) -> list[Message]:
        try:
            return messages_of(entry.data, self.max_uncompressed)
        except (CorruptPayloadError, ValueError, struct.error, DecodeError) as exc:
            # A payload the broker cannot read has no key it could keep: left out of the compacted view.
            log.warning("compaction skips entry %s: %s", entry.position, exc)
            return []

    def _keeps(self, msg: Message, latest: dict[str, tuple[Position, int, bool]], pos: Position, i: int) -> bool:
        if msg.compacted_out:
            return False
        if msg.key is None:
            return self.retain_null_key and not msg.tombstone
        position, index, tombstone = latest[msg.key]
        return position == pos and index == i and not tombstone

    async def _source(
        self, ml: ManagedLedger, previous: CompactedLedger | None, start: Position, horizon: Position
    ) -> AsyncIterator[Entry]:
        """The previous compacted entries, then the topic's entries from ``start`` to ``horizon``."""
        if previous is not None:
            async for entry in previous.scan(self.client):
                yield entry
        scan = ml.new_non_durable_cursor(f"{COMPACTION_SUBSCRIPTION}-scan", start)
        try:
            while scan.read_position <= horizon and scan.has_more_entries():
                entries = await scan.read_entries(_READ_BATCH)
                for entry in entries:
                    if entry.position > horizon:
                        return
                    yield entry
                if not entries:
                    return
        finally:
            await scan.close()
