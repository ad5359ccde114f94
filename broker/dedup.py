"""Message deduplication: drop a producer's re-sent messages by sequence id, across reconnects and crashes.

As in Pulsar, the broker keeps per producer name the highest sequence id *pushed* (accepted into
the write pipeline) and *persisted* (durable). A SEND whose sequence id is not above the pushed
one is a duplicate: if it is also not above the persisted one it is acknowledged without being
stored again; otherwise its fate is still unknown and the producer is asked to retry. The
persisted map is snapshotted into the properties of a hidden durable cursor (``pulsar.dedup``)
every ``brokerDeduplicationEntriesInterval`` entries; on load the snapshot is read back and the
entries written after it are replayed, so the state survives a broker crash exactly.

The snapshot is bounded, as in Pulsar: it holds at most ``brokerDeduplicationMaxNumberOfProducers``
names (connected producers first, then the most recently active), and a producer disconnected for
``brokerDeduplicationProducerInactivityTimeoutMinutes`` is forgotten (:meth:`purge_inactive`).
"""

from __future__ import annotations

import logging
import time
from enum import Enum
from typing import TYPE_CHECKING

from magnetar.broker.protocol.frames import parse_metadata
from magnetar.managed_ledger.api import InitialPosition, ManagedCursor, Position

if TYPE_CHECKING:
    from magnetar.broker.topic import PersistentTopic

log = logging.getLogger(__name__)

CURSOR_NAME = "pulsar.dedup"


class Verdict(Enum):
    NEW = "new"
    DUPLICATE = "duplicate"
    UNKNOWN = "unknown"


#: ``frozenset()`` makes a new 216-byte object on every call (no empty singleton since Python 3.10).
_NONE_SNAPSHOTTED: frozenset[str] = frozenset()


class Deduplication:
    """Deduplication state of one topic."""

    # Slots: one of these per idle topic, ~60 bytes less each than an instance dict (CPython 3.11).
    __slots__ = (
        "_cursor",
        "_inactive_since",
        "_inactivity_s",
        "_interval",
        "_max_producers",
        "_since_snapshot",
        "_snapshotted",
        "enabled",
        "persisted",
        "pushed",
        "topic",
    )

    def __init__(self, topic: PersistentTopic) -> None:
        self.topic = topic
        self.enabled = False
        self.pushed: dict[str, int] = {}
        self.persisted: dict[str, int] = {}
        self._cursor: ManagedCursor | None = None
        self._since_snapshot = 0
        config = topic.service.config
        self._interval = config.broker_deduplication_entries_interval
        self._max_producers = config.broker_deduplication_max_number_of_producers
        self._inactivity_s = config.broker_deduplication_producer_inactivity_timeout_minutes * 60
        #: Producer name -> when (monotonic) its last producer disconnected; absent while connected.
        self._inactive_since: dict[str, float] = {}
        #: Names written to the snapshot cursor's properties (to remove the ones no longer kept).
        # The shared empty frozenset until deduplication is enabled: most topics never enable it.
        self._snapshotted: set[str] | frozenset[str] = _NONE_SNAPSHOTTED

    async def enable(self) -> None:
        """Turn deduplication on: recover the snapshot and replay what was written after it."""
        if self.enabled:
            return
        ledger = self.topic.ledger
        cursor = await ledger.open_cursor(CURSOR_NAME, InitialPosition.EARLIEST)
        persisted = {name: int(value) for name, value in cursor.properties.items() if value.lstrip("-").isdigit()}
        replayed = 0
        while cursor.has_more_entries():
            for entry in await cursor.read_entries(500):
                metadata, _ = parse_metadata(entry.data)
                highest = max(metadata.sequence_id, metadata.highest_sequence_id)
                if highest > persisted.get(metadata.producer_name, -1):
                    persisted[metadata.producer_name] = highest
                replayed += 1
        self.persisted = persisted
        self.pushed = dict(persisted)
        self._cursor = cursor
        self._snapshotted = set(cursor.properties)
        now = time.monotonic()  # recovered names count as disconnected from now on
        self._inactive_since = dict.fromkeys(persisted, now)
        self.enabled = True
        if replayed:
            log.debug(
                "%s: deduplication recovered %d producers, replayed %d entries",
                self.topic.name,
                len(persisted),
                replayed,
            )

    async def disable(self) -> None:
        """Turn deduplication off and forget its state (as Pulsar does)."""
        if not self.enabled:
            return
        self.enabled = False
        self.pushed.clear()
        self.persisted.clear()
        self._cursor = None
        await self.topic.ledger.delete_cursor(CURSOR_NAME)

    def check(self, producer_name: str, sequence_id: int, highest_sequence_id: int) -> Verdict:
        """Classify a SEND by its first sequence id, as Pulsar does; a NEW one is recorded as pushed.

        Clients resend whole batches as they first sent them, so a batch is a duplicate exactly when
        its first message is one.
        """
        highest = max(sequence_id, highest_sequence_id)
        if self._inactive_since:
            self._inactive_since.pop(producer_name, None)
        if sequence_id <= self.pushed.get(producer_name, -1):
            if sequence_id <= self.persisted.get(producer_name, -1):
                return Verdict.DUPLICATE
            return Verdict.UNKNOWN
        self.pushed[producer_name] = highest
        return Verdict.NEW

    def on_persisted(self, producer_name: str, sequence_id: int, highest_sequence_id: int, position: Position) -> None:
        highest = max(sequence_id, highest_sequence_id)
        if highest > self.persisted.get(producer_name, -1):
            self.persisted[producer_name] = highest
        self._since_snapshot += 1
        if self._since_snapshot >= self._interval:
            self.snapshot(position)

    def on_failed(self, producer_name: str) -> None:
        """A pushed message failed to persist: the producer may resend it."""
        self.pushed[producer_name] = self.persisted.get(producer_name, -1)

    def producer_connected(self, producer_name: str) -> None:
        """A producer of that name is connected: its state is kept while it is."""
        self._inactive_since.pop(producer_name, None)

    def producer_disconnected(self, producer_name: str) -> None:
        """The producer of that name left: its state is purged after the inactivity timeout."""
        self._inactive_since[producer_name] = time.monotonic()

    def purge_inactive(self, now: float | None = None) -> None:
        """Forget producers disconnected longer than the inactivity timeout (the next snapshot drops them)."""
        if now is None:
            now = time.monotonic()
        expired = [n for n, since in self._inactive_since.items() if now - since >= self._inactivity_s]
        for name in expired:
            del self._inactive_since[name]
            self.pushed.pop(name, None)
            self.persisted.pop(name, None)

    def snapshot(self, position: Position) -> None:
        """Record the persisted map at ``position`` (everything up to it is covered), bounded."""
        cursor = self._cursor
        if cursor is None:
            return
        self._since_snapshot = 0
        names = list(self.persisted)
        if len(names) > self._max_producers:
            inactive = self._inactive_since
            # Connected producers first (inf), then the most recently active.
            names.sort(key=lambda n: inactive.get(n, float("inf")), reverse=True)
            names = names[: max(self._max_producers, 0)]
        kept = set(names)
        for name in self._snapshotted - kept:
            cursor.set_property(name, None)
        for name in names:
            cursor.set_property(name, str(self.persisted[name]))
        self._snapshotted = kept
        if position > cursor.mark_delete_position:
            cursor.mark_delete(position)

    def last_sequence_id(self, producer_name: str) -> int:
        """What PRODUCER_SUCCESS reports so a reconnecting producer resumes after it (-1 = none)."""
        return self.persisted.get(producer_name, -1) if self.enabled else -1

    async def close(self) -> None:
        if self.enabled and self._cursor is not None:
            self.snapshot(self.topic.ledger.last_confirmed_entry)
            await self._cursor.flush()
