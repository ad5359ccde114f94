"""A producer attached to a topic over one client connection."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING

from magnetar.broker.protocol import commands
from magnetar.broker.protocol import pulsar_api_pb2 as pb
from magnetar.broker.stats import Meter
from magnetar.managed_ledger.api import Position, make_position

if TYPE_CHECKING:
    from magnetar.broker.connection import ServerConnection
    from magnetar.broker.topic import PersistentTopic


#: One SEND as the publish path takes it: ``(sequence_id, highest_sequence_id, num_messages, entry)``.
Send = tuple[int, int, int, bytes]


class PublishSlot:
    """One SEND awaiting persistence; receipts leave strictly in SEND order."""

    __slots__ = ("error", "highest_sequence_id", "position", "sequence_id", "size")

    def __init__(self, sequence_id: int, highest_sequence_id: int, size: int) -> None:
        self.sequence_id = sequence_id
        self.highest_sequence_id = highest_sequence_id
        self.size = size
        self.position: Position | None = None
        self.error: tuple[pb.ServerError, str] | None = None


class Producer:
    """Per-producer state: identity, in-flight sends in order, counters for stats."""

    # Slots: one of these per idle topic, ~60 bytes less each than an instance dict (CPython 3.11).
    __slots__ = (
        "access_mode",
        "closed",
        "connected_since",
        "connection",
        "metadata",
        "meter",
        "name",
        "pending",
        "producer_id",
        "ready",
        "topic",
        "user_provided_name",
    )

    def __init__(
        self,
        topic: PersistentTopic,
        connection: ServerConnection,
        producer_id: int,
        name: str,
        user_provided_name: bool,
        metadata: dict[str, str],
    ) -> None:
        self.topic = topic
        self.connection = connection
        self.producer_id = producer_id
        self.name = name
        self.user_provided_name = user_provided_name
        self.metadata = metadata
        self.access_mode = 0  # pb.ProducerAccessMode.Shared
        #: SENDs awaiting their receipt, in order; made on the first SEND (an empty deque costs 760 bytes,
        #: and many producers are idle).
        self.pending: deque[PublishSlot] | None = None
        self.connected_since = time.time()
        self.meter = Meter()
        self.closed = False
        #: Granted by the topic (a WaitForExclusive producer is registered while still queued).
        self.ready = False

    def enqueue(self, sends: Sequence[Send]) -> list[PublishSlot]:
        """SENDs entered the pipeline, in order; each counts for back-pressure until it is answered."""
        slots = [PublishSlot(seq, highest, len(data)) for seq, highest, _, data in sends]
        pending = self.pending
        if pending is None:
            pending = self.pending = deque()
        pending.extend(slots)
        self.connection.publish_started(len(slots), sum(slot.size for slot in slots))
        return slots

    def complete(
        self, slot: PublishSlot, position: Position | None, error: tuple[pb.ServerError, str] | None = None
    ) -> None:
        """Record the outcome of ``slot`` and send every receipt that is now in order."""
        slot.position = position
        slot.error = error
        self._answer()

    def complete_run(self, slots: Sequence[PublishSlot], position: Position) -> None:
        """``slots`` were stored at consecutive entries of one ledger from ``position``: send every receipt
        that is now in order."""
        ledger_id, entry_id = position
        for slot in slots:
            slot.position = make_position((ledger_id, entry_id))
            entry_id += 1
        self._answer()

    def _answer(self) -> None:
        """Answer the SENDs at the head of the queue whose outcome is known, in order, in one write."""
        pending = self.pending
        assert pending is not None  # slots came from enqueue()
        pid = self.producer_id
        frames: list[bytes] = []
        count = size = 0
        while pending and (pending[0].position is not None or pending[0].error is not None):
            s = pending.popleft()
            count += 1
            size += s.size
            if s.error is not None:
                frames.append(commands.send_error(pid, s.sequence_id, *s.error))
            else:
                pos = s.position
                assert pos is not None
                frames.append(commands.send_receipt(pid, s.sequence_id, pos[0], pos[1], s.highest_sequence_id))
        if count:
            connection = self.connection
            connection.publish_done(count, size)
            if not self.closed:
                connection.write(*frames)

    def disconnect(self) -> None:
        """Ask the client to reconnect this producer (CLOSE_PRODUCER), e.g. when the topic unloads."""
        if not self.closed:
            self.closed = True
            self.connection.write(commands.close_producer(self.producer_id, 0))
            self.connection.forget_producer(self.producer_id)
