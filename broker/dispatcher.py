"""Dispatchers: move entries from a subscription's cursor to its consumers within their permits.

One asyncio task per subscription reads from the cursor only when some consumer can take
messages, and sleeps on an event otherwise; the topic wakes it when entries are added, consumers
wake it with FLOW permits, and redeliveries wake it too. Entries go out exactly as stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

from magnetar.broker.consumer import Consumer
from magnetar.managed_ledger.api import Entry, Position

if TYPE_CHECKING:
    from magnetar.broker.subscription import Subscription

log = logging.getLogger(__name__)

#: Entries given to one Shared consumer before moving to the next (Pulsar's dispatcherMaxRoundRobinBatchSize).
ROUND_ROBIN_BATCH = 20


class Dispatcher:
    """Common read loop; subclasses decide who gets what."""

    def __init__(self, subscription: Subscription, max_read_batch: int) -> None:
        self.subscription = subscription
        self.cursor = subscription.cursor
        self.consumers: list[Consumer] = []
        self.max_read_batch = max_read_batch
        #: Positions to send again (nacked, or unacked by a departed consumer), read before new entries.
        self.redelivery: set[Position] = set()
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    # lifecycle
    def start(self) -> None:
        if self._task is None and not self._closed:
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"dispatch {self.subscription.name}")

    async def stop(self) -> None:
        """Stop the read loop (cancelling any read in flight)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def close(self) -> None:
        self._closed = True
        await self.stop()

    def wakeup(self) -> None:
        self._wakeup.set()

    # consumers
    def add_consumer(self, consumer: Consumer) -> None:
        self.consumers.append(consumer)
        self.start()
        self.wakeup()

    async def remove_consumer(self, consumer: Consumer) -> None:
        if consumer in self.consumers:
            self.consumers.remove(consumer)

    # the loop
    def _budget(self) -> int:
        """How many entries to read now (0: nobody can receive)."""
        raise NotImplementedError

    def _dispatch(self, entries: list[Entry]) -> None:
        raise NotImplementedError

    async def _run(self) -> None:
        cursor = self.cursor
        while True:
            budget = self._budget()
            if budget <= 0:
                await self._wakeup.wait()
                self._wakeup.clear()
                continue
            try:
                if self.redelivery:
                    batch = sorted(self.redelivery)[:budget]
                    self.redelivery.difference_update(batch)
                    entries = await cursor.replay_entries(batch)
                elif cursor.has_more_entries():
                    entries = await cursor.read_entries(budget)
                else:
                    if self.subscription.topic.terminated:
                        for consumer in self.consumers:
                            consumer.notify_end_of_topic()
                    await self._wakeup.wait()
                    self._wakeup.clear()
                    continue
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("read failed on subscription %s; retrying", self.subscription.name)
                await asyncio.sleep(0.5)
                continue
            if entries:
                self._dispatch(entries)
            # Let other tasks (publishers, acks) run between batches.
            await asyncio.sleep(0)


class SingleActiveConsumerDispatcher(Dispatcher):
    """Exclusive and Failover: one active consumer gets everything, in order.

    Consumers are ranked by priority level, then name; on a partitioned topic partition ``i`` picks
    consumer ``i mod n`` so partitions spread over the consumers. When the active consumer changes,
    unacknowledged entries are rewound so the new one receives them, in order.
    """

    def __init__(self, subscription: Subscription, max_read_batch: int, partition_index: int) -> None:
        super().__init__(subscription, max_read_batch)
        self.partition_index = partition_index
        self.active: Consumer | None = None

    def _pick_active(self) -> Consumer | None:
        if not self.consumers:
            return None
        ranked = sorted(self.consumers, key=lambda c: (c.priority, c.name))
        index = self.partition_index % len(ranked) if self.partition_index >= 0 else 0
        return ranked[index]

    def add_consumer(self, consumer: Consumer) -> None:
        self.consumers.append(consumer)
        self._elect(initial=consumer)
        self.start()
        self.wakeup()

    async def remove_consumer(self, consumer: Consumer) -> None:
        if consumer not in self.consumers:
            return
        self.consumers.remove(consumer)
        if consumer is self.active:
            await self.rewind_after(lambda: self._elect())
        else:
            self._elect()

    def _elect(self, initial: Consumer | None = None) -> None:
        new = self._pick_active()
        changed = new is not self.active
        old = self.active
        self.active = new
        if changed and old is not None and old in self.consumers:
            # The previous active consumer loses its stream: rewind so the new one starts from the
            # first unacknowledged entry.
            asyncio.get_running_loop().create_task(self.rewind_after(lambda: None))
        for c in self.consumers:
            if changed or c is initial:
                c.notify_active(c is new)

    async def rewind_after(self, change) -> None:  # type: ignore[no-untyped-def]
        """Stop reading, apply ``change``, move the cursor back to the first unacked entry, resume."""
        await self.stop()
        change()
        for c in self.consumers:
            for p in c.take_pending():
                self.subscription.count_redelivery(p)
        self.cursor.rewind()
        self.redelivery.clear()
        self.start()
        self.wakeup()

    async def redeliver_all(self, consumer: Consumer) -> None:
        if consumer is self.active:
            await self.rewind_after(lambda: None)

    def _budget(self) -> int:
        active = self.active
        if active is None or not active.available:
            return 0
        return min(active.permits, self.max_read_batch)

    def _dispatch(self, entries: list[Entry]) -> None:
        active = self.active
        if active is None or active.closed:
            # Nobody to give them to: put the read position back so they are read again.
            self.cursor.seek(entries[0].position)
            return
        active.send(entries, self.subscription.redelivery_counts)


class SharedDispatcher(Dispatcher):
    """Shared: entries go round-robin to consumers with permits; a consumer's unacked entries are
    redelivered to the others when it leaves or asks for redelivery."""

    def __init__(self, subscription: Subscription, max_read_batch: int) -> None:
        super().__init__(subscription, max_read_batch)
        self._next = 0

    async def remove_consumer(self, consumer: Consumer) -> None:
        if consumer not in self.consumers:
            return
        self.consumers.remove(consumer)
        self.redeliver(consumer.take_pending())

    def redeliver(self, positions: list[Position]) -> None:
        for p in positions:
            self.subscription.count_redelivery(p)
        self.redelivery.update(positions)
        self.wakeup()

    def _budget(self) -> int:
        total = sum(c.permits for c in self.consumers if c.available)
        return min(total, self.max_read_batch)

    def _dispatch(self, entries: list[Entry]) -> None:
        counts = self.subscription.redelivery_counts
        index = 0
        n = len(entries)
        while index < n:
            consumer = self._next_available()
            if consumer is None:
                # Out of permits mid-batch: keep the rest for later, ahead of new entries.
                self.redelivery.update(e.position for e in entries[index:])
                return
            # Give this consumer a run of entries bounded by its permits (at least one entry).
            take = max(1, min(consumer.permits, ROUND_ROBIN_BATCH, n - index))
            consumer.send(entries[index : index + take], counts)
            index += take

    def _next_available(self) -> Consumer | None:
        consumers = self.consumers
        for _ in range(len(consumers)):
            self._next = (self._next + 1) % len(consumers)
            c = consumers[self._next]
            if c.available:
                return c
        return None
