"""A consumer attached to a subscription over one client connection."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from magnetar.broker.protocol import commands
from magnetar.broker.protocol import pulsar_api_pb2 as pb
from magnetar.broker.protocol.frames import EntryMeta, entry_num_messages
from magnetar.broker.stats import IDLE_METER, Meter
from magnetar.managed_ledger.api import Entry, Position

if TYPE_CHECKING:
    from magnetar.broker.connection import ServerConnection
    from magnetar.broker.subscription import Subscription

SubType = pb.CommandSubscribe.SubType


class Consumer:
    """Flow-control permits and the unacknowledged entries sent to one client consumer."""

    # Slots: one of these per idle topic, ~60 bytes less each than an instance dict (CPython 3.11).
    __slots__ = (
        "blocked",
        "closed",
        "connected_since",
        "connection",
        "consumer_id",
        "entries_out",
        "key_shared_meta",
        "last_acked",
        "last_consumed",
        "max_unacked",
        "metadata",
        "meter",
        "meter_redeliver",
        "name",
        "on_pending_removed",
        "partition",
        "pending_acks",
        "permits",
        "priority",
        "reached_end",
        "sub_type",
        "subscription",
        "unacked_messages",
    )

    def __init__(
        self,
        subscription: Subscription,
        connection: ServerConnection,
        consumer_id: int,
        name: str,
        sub_type: int,
        priority: int,
        max_unacked: int,
        metadata: dict[str, str],
    ) -> None:
        self.subscription = subscription
        self.connection = connection
        self.consumer_id = consumer_id
        self.name = name
        self.sub_type = sub_type
        self.priority = priority
        self.metadata = metadata
        #: Partition index every delivered message id carries (-1 on a non-partitioned topic).
        self.partition = subscription.topic.name.partition_index
        #: Key_Shared settings the consumer subscribed with (mode, sticky ranges, out-of-order flag).
        self.key_shared_meta: pb.KeySharedMeta | None = None
        self.permits = 0
        #: Entries sent and not yet acknowledged: position -> number of messages in the entry.
        self.pending_acks: dict[Position, int] = {}
        #: Called for every entry leaving ``pending_acks`` (set by Key_Shared to track draining hashes).
        self.on_pending_removed: Callable[[Consumer, Position], None] | None = None
        self.unacked_messages = 0
        self.max_unacked = max_unacked if sub_type in (SubType.Shared, SubType.Key_Shared) else 0
        self.blocked = False
        self.connected_since = time.time()
        self.meter = Meter()
        self.meter_redeliver = IDLE_METER  # redeliveries are not metered yet: always zero
        self.entries_out = 0
        self.last_acked = 0.0
        self.last_consumed = 0.0
        self.reached_end = False
        self.closed = False

    @property
    def available(self) -> bool:
        """Whether the dispatcher may send to this consumer now: permits, and a connection whose
        socket takes more (a reader that does not drain it gets nothing more until it does)."""
        return self.permits > 0 and not self.blocked and not self.closed and self.connection.writable

    def flow(self, permits: int) -> None:
        self.permits += permits

    def send(
        self, entries: list[Entry], redelivery_counts: dict[Position, int], metas: list[EntryMeta] | None = None
    ) -> None:
        """Write MESSAGE frames for ``entries`` (entry bytes untouched) and track them for acks.

        ``metas`` are the entries' decoded metadata when the dispatcher already has them.
        """
        write = self.connection.write
        consumer_id = self.consumer_id
        partition = self.partition
        pending = self.pending_acks
        sent_messages = 0
        sent_bytes = 0
        cursor = self.subscription.cursor if self.subscription.batch_index_acks else None
        for i, (position, data) in enumerate(entries):
            count = metas[i].num_messages if metas is not None else entry_num_messages(data)
            header = commands.message_header(
                consumer_id,
                position.ledger_id,
                position.entry_id,
                len(data),
                redelivery_counts.get(position, 0),
                cursor.batch_unacked(position) if cursor is not None else None,
                partition,
            )
            write(header, data)
            pending[position] = count
            sent_messages += count
            sent_bytes += len(data)
        self.permits -= sent_messages
        self.unacked_messages += sent_messages
        self.meter.add(sent_messages, sent_bytes)
        self.subscription.meter_out.add(sent_messages, sent_bytes)
        self.entries_out += len(entries)
        self.last_consumed = time.time()
        if self.max_unacked and self.unacked_messages >= self.max_unacked:
            self.blocked = True

    def acked(self, position: Position) -> bool:
        """Forget an acknowledged entry; returns whether this consumer had it."""
        count = self.pending_acks.pop(position, None)
        if count is None:
            return False
        self._release(count)
        if self.on_pending_removed is not None:
            self.on_pending_removed(self, position)
        self.last_acked = time.time()
        return True

    def acked_up_to(self, position: Position) -> None:
        """Forget every pending entry at or before ``position`` (cumulative ack)."""
        done = [p for p in self.pending_acks if p <= position]
        for p in done:
            self._release(self.pending_acks.pop(p))
        self._removed(done)
        self.last_acked = time.time()

    def take_pending(self, positions: list[Position] | None = None) -> list[Position]:
        """Remove and return pending entries (all, or those among ``positions``) for redelivery."""
        if positions is None:
            taken = list(self.pending_acks)
            self.pending_acks.clear()
            self.unacked_messages = 0
            self.blocked = False
        else:
            taken = [p for p in positions if p in self.pending_acks]
            for p in taken:
                self._release(self.pending_acks.pop(p))
        self._removed(taken)
        return taken

    def _removed(self, positions: list[Position]) -> None:
        hook = self.on_pending_removed
        if hook is not None:
            for p in positions:
                hook(self, p)

    def _release(self, count: int) -> None:
        self.unacked_messages = max(0, self.unacked_messages - count)
        if self.blocked and self.unacked_messages <= self.max_unacked // 2:
            self.blocked = False

    def set_max_unacked(self, limit: int) -> None:
        """New ``maxUnackedMessagesPerConsumer`` (Shared/Key_Shared only; 0 = unlimited)."""
        if self.sub_type in (SubType.Shared, SubType.Key_Shared):
            self.max_unacked = limit
            self.blocked = bool(limit) and self.unacked_messages >= limit

    def notify_end_of_topic(self) -> None:
        """REACHED_END_OF_TOPIC, once: the topic is terminated and everything was delivered."""
        if not self.reached_end and not self.pending_acks:
            self.reached_end = True
            self.connection.write(commands.reached_end_of_topic(self.consumer_id))

    def notify_active(self, active: bool) -> None:
        self.connection.write(commands.active_consumer_change(self.consumer_id, active))

    def disconnect(self) -> None:
        """Ask the client to reconnect this consumer (CLOSE_CONSUMER), e.g. after a seek or unload."""
        if not self.closed:
            self.closed = True
            self.connection.write(commands.close_consumer(self.consumer_id, 0))
            self.connection.forget_consumer(self.consumer_id)
