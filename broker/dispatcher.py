"""Dispatchers: move entries from a subscription's cursor to its consumers within their permits.

At most one asyncio task per subscription reads from the cursor, only when some consumer can take
messages; the topic wakes it when entries are added, consumers wake it with FLOW permits, and
redeliveries wake it too. Entries go out exactly as stored. A loop with nothing to do sleeps for up
to :data:`IDLE_EXIT_DELAY` and then ends; the next wakeup starts a new one. An idle subscription so
holds no suspended task (its coroutine frames cost ~2 KiB, which adds up at 10,000 topics), while a
busy one keeps its loop instead of creating a task per published entry.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import mmh3

from magnetar.broker.consumer import Consumer
from magnetar.broker.delayed_delivery import DelayedDeliveryTracker
from magnetar.broker.protocol.frames import EntryMeta, entry_meta
from magnetar.common.backoff import Backoff
from magnetar.common.tasks import TaskSet
from magnetar.managed_ledger.api import Entry, ManagedLedgerError, Position

if TYPE_CHECKING:
    from magnetar.broker.subscription import Subscription

log = logging.getLogger(__name__)


def _murmur(data: bytes) -> int:
    """Pulsar's Murmur3_32Hash: murmur3 x86 32-bit, seed 0, as a non-negative int."""
    return mmh3.hash(data, 0, signed=False) & 0x7FFFFFFF


#: Seconds an idle read loop waits for a wakeup before ending (a wakeup after that starts a new loop).
IDLE_EXIT_DELAY = 2.0

#: Entries given to one Shared consumer before moving to the next (Pulsar's dispatcherMaxRoundRobinBatchSize).
ROUND_ROBIN_BATCH = 20


class Dispatcher:
    """Common read loop; subclasses decide who gets what."""

    # Slots: one of these per idle topic, ~60 bytes less each than an instance dict (CPython 3.11).
    __slots__ = (
        "_closed",
        "_idle_timer",
        "_read_backoff",
        "_reading",
        "_sleeper",
        "_slept_at",
        "_started",
        "_task",
        "_woken",
        "consumers",
        "cursor",
        "max_read_batch",
        "redelivery",
        "subscription",
        "tasks",
    )

    def __init__(self, subscription: Subscription, max_read_batch: int) -> None:
        self.subscription = subscription
        self.cursor = subscription.cursor
        self.consumers: list[Consumer] = []
        self.max_read_batch = max_read_batch
        #: Positions to send again (nacked, or unacked by a departed consumer), read before new entries.
        self.redelivery: set[Position] = set()
        # A flag and a future made only while the loop sleeps, not an asyncio.Event: an Event holds a
        # 760-byte deque for the whole life of every subscription, which adds up at 10,000 topics.
        self._woken = False
        self._sleeper: asyncio.Future[None] | None = None
        self.tasks = TaskSet("dispatcher", owner=subscription.name)
        #: The read loop while it runs (never two at once); None while stopped or idle.
        self._task: asyncio.Task[None] | None = None
        #: Between start() and stop(): a wakeup (re)starts the loop if it ended idle.
        self._started = False
        #: The pending idle-exit timer (one per IDLE_EXIT_DELAY at most, not one per sleep).
        self._idle_timer: asyncio.TimerHandle | None = None
        self._slept_at = 0.0
        self._closed = False
        #: Made by the first failed read and dropped after a successful one (a fresh back-off is a reset
        #: one): most subscriptions never fail a read, and a Backoff with its floats is ~160 bytes.
        self._read_backoff: Backoff | None = None
        self._reading = False

    # lifecycle
    def start(self) -> None:
        """Run the read loop when there is work (from now on, wakeups start one whenever there is)."""
        if self._closed:
            return
        self._started = True
        if self._task is None and self._has_work():
            self._task = self.tasks.spawn(self._run(), name=f"dispatch {self.subscription.name}")

    def _has_work(self) -> bool:
        """Whether a loop could have something to do: entries to replay or read, or an end of topic to
        announce. Checked only when no loop runs, so a new subscription on an idle topic starts none."""
        return bool(self.redelivery) or self.cursor.has_more_entries() or self.subscription.topic.terminated

    @property
    def running(self) -> bool:
        """Whether a read loop task exists now (it ends after :data:`IDLE_EXIT_DELAY` idle)."""
        return self._task is not None

    @property
    def reading(self) -> bool:
        """Whether a read (or replay) from the managed ledger is in flight now."""
        return self._reading

    @property
    def waiting_for_entries(self) -> bool:
        """Whether the loop sleeps with permits to spare, waiting for new entries (Pulsar's waitingReadOp)."""
        return self._sleeper is not None and self._budget() > 0

    async def stop(self) -> None:
        """Stop the read loop (cancelling any read in flight); wakeups do not restart it until :meth:`start`."""
        self._started = False
        self._cancel_idle_timer()
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(task, return_exceptions=True)  # a failed loop must not fail seek/close

    async def close(self) -> None:
        self._closed = True
        await self.stop()
        await self.tasks.close()

    def wakeup(self) -> None:
        self._woken = True
        sleeper = self._sleeper
        if sleeper is not None:
            if not sleeper.done():
                sleeper.set_result(None)
        elif self._task is None and self._started:
            self.start()

    async def _sleep_until_woken(self) -> bool:
        """Wait for :meth:`wakeup` (at once if one came since the last wait), then consume it.

        False when none came within the idle delay: the loop should end (a wakeup restarts it)."""
        if not self._woken:
            loop = asyncio.get_running_loop()
            self._slept_at = loop.time()
            if self._idle_timer is None:
                self._idle_timer = loop.call_at(self._slept_at + IDLE_EXIT_DELAY, self._idle_expired)
            self._sleeper = loop.create_future()
            try:
                await self._sleeper
            finally:
                self._sleeper = None
            if not self._woken:
                return False
        self._woken = False
        return True

    def _idle_expired(self) -> None:
        """End a loop asleep for the whole delay; one that woke since sleeps less: check again when
        its delay is up (a busy one arms the timer again at its next sleep)."""
        self._idle_timer = None
        sleeper = self._sleeper
        if sleeper is None or sleeper.done():
            return
        loop = asyncio.get_running_loop()
        due = self._slept_at + IDLE_EXIT_DELAY
        if loop.time() >= due - 0.001:
            sleeper.set_result(None)
        else:
            self._idle_timer = loop.call_at(due, self._idle_expired)

    def _cancel_idle_timer(self) -> None:
        timer, self._idle_timer = self._idle_timer, None
        if timer is not None:
            timer.cancel()

    # consumers
    def add_consumer(self, consumer: Consumer) -> None:
        self.consumers.append(consumer)
        self.start()
        self.wakeup()

    async def remove_consumer(self, consumer: Consumer) -> None:
        if consumer in self.consumers:
            self.consumers.remove(consumer)

    # the loop, and the hooks subclasses fill in
    def _budget(self) -> int:
        """How many entries to read now (0: nobody can receive)."""
        raise NotImplementedError

    def _replay_positions(self, budget: int) -> list[Position]:
        """Positions of ``redelivery`` to read again this round, ahead of new entries (none: read new ones)."""
        return sorted(self.redelivery)[:budget] if self.redelivery else []

    def _replay_failed(self, positions: list[Position]) -> None:
        """A replay of ``positions`` failed or was cancelled: keep them for later."""
        self.redelivery.update(positions)

    def _may_read(self) -> bool:
        """Whether to read new entries when there is nothing to replay."""
        return True

    def _dispatch(self, entries: list[Entry], replay: bool) -> None:
        """Hand ``entries`` (replayed ones when ``replay``) to the consumers."""
        raise NotImplementedError

    async def _run(self) -> None:
        try:
            await self._loop()
        finally:
            if self._task is asyncio.current_task():
                self._task = None  # ended (idle, or failed): the next wakeup starts a new loop
                self._cancel_idle_timer()

    async def _loop(self) -> None:
        cursor = self.cursor
        while True:
            budget = self._budget()
            if budget <= 0:
                if not await self._sleep_until_woken():
                    return
                continue
            positions = self._replay_positions(budget)
            try:
                if positions:
                    self.redelivery.difference_update(positions)
                    self._reading = True
                    try:
                        entries = await cursor.replay_entries(positions)
                    except BaseException:
                        self._replay_failed(positions)  # not lost on failure or cancellation
                        raise
                    finally:
                        self._reading = False
                    replay = True
                elif self._may_read() and cursor.has_more_entries():
                    self._reading = True
                    try:
                        entries = await cursor.read_entries(budget)
                    finally:
                        self._reading = False
                    replay = False
                else:
                    if self.subscription.topic.terminated and not self.redelivery and not cursor.has_more_entries():
                        for consumer in self.consumers:
                            consumer.notify_end_of_topic()
                    if not await self._sleep_until_woken():
                        return
                    continue
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                await self._read_failed(exc)
                continue
            self._read_backoff = None
            if entries:
                try:
                    self._dispatch(entries, replay)
                except Exception:
                    # A bug or an entry nothing foresaw must not end the subscription: skip these entries
                    # (they stay unacknowledged) and go on with the next ones.
                    log.exception(
                        "dispatch failed on subscription %s; skipped entries %s..%s",
                        self.subscription.name,
                        entries[0].position,
                        entries[-1].position,
                    )
            # Let other tasks (publishers, acks) run between batches.
            await asyncio.sleep(0)

    async def _read_failed(self, exc: Exception) -> None:
        """Log a failed read and wait before the retry, longer after each failure (Pulsar's readFailureBackoff)."""
        if self._read_backoff is None:
            c = self.subscription.topic.service.config
            self._read_backoff = Backoff(
                c.dispatcher_read_failure_backoff_initial_time_in_ms / 1000,
                c.dispatcher_read_failure_backoff_max_time_in_ms / 1000,
                c.dispatcher_read_failure_backoff_mandatory_stop_time_in_ms / 1000,
            )
        delay = self._read_backoff.next()
        name = self.subscription.name
        if isinstance(exc, ManagedLedgerError):  # storage said no: one line, no traceback
            log.warning("read failed on subscription %s: %s; retrying in %.1fs", name, exc, delay)
        else:
            log.error("read failed on subscription %s; retrying in %.1fs", name, delay, exc_info=exc)
        await asyncio.sleep(delay)


class SingleActiveConsumerDispatcher(Dispatcher):
    """Exclusive and Failover: one active consumer gets everything, in order.

    Consumers are ranked by priority level, then name; on a partitioned topic partition ``i`` picks
    consumer ``i mod n`` so partitions spread over the consumers. When the active consumer changes,
    unacknowledged entries are rewound so the new one receives them, in order.
    """

    # Slots: one of these per idle topic, ~60 bytes less each than an instance dict (CPython 3.11).
    __slots__ = (
        "active",
        "partition_index",
    )

    def __init__(self, subscription: Subscription, max_read_batch: int, partition_index: int) -> None:
        super().__init__(subscription, max_read_batch)
        self.partition_index = partition_index
        self.active: Consumer | None = None

    def _pick_active(self) -> Consumer | None:
        """Pulsar's choice: among the highest-priority consumers ranked by name, partition ``i`` takes
        consumer ``i mod n``; a non-partitioned topic hashes its name onto a ring of the consumers
        (100 points each), so many topics spread over the consumers."""
        if not self.consumers:
            return None
        ranked = sorted(self.consumers, key=lambda c: (c.priority, c.name))
        size = sum(1 for c in ranked if c.priority == ranked[0].priority)
        if self.partition_index >= 0:
            return ranked[self.partition_index % size]
        ring = sorted((_murmur(f"{c.name}{j}".encode()), i) for i, c in enumerate(ranked[:size]) for j in range(100))
        point = _murmur(str(self.subscription.topic.name).encode())
        at = bisect.bisect_left(ring, (point, -1))
        return ranked[ring[at][1] if at < len(ring) else ring[0][1]]

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
            self.tasks.spawn(self.rewind_after(lambda: None), name=f"rewind {self.subscription.name}")
        for c in self.consumers:
            if changed or c is initial:
                c.notify_active(c is new)

    async def rewind_after(self, change: Callable[[], object]) -> None:
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

    def _dispatch(self, entries: list[Entry], replay: bool) -> None:
        active = self.active
        if active is None or active.closed:
            # Nobody to give them to: put the read position back so they are read again.
            self.cursor.seek(entries[0].position)
            return
        active.send(entries, self.subscription.redelivery_counts)


class SharedDispatcher(Dispatcher):
    """Shared: entries go round-robin to the consumers with permits, highest priority level (lowest
    number) first; a consumer's unacked entries go to the others when it leaves or asks for
    redelivery. All chunks of a chunked message go to one consumer. Entries with a future
    ``deliver_at_time`` wait in the delayed-delivery tracker until due."""

    def __init__(self, subscription: Subscription, max_read_batch: int) -> None:
        super().__init__(subscription, max_read_batch)
        self._next = 0
        #: Chunked messages in flight: uuid -> the consumer receiving its chunks.
        self._chunk_owner: dict[str, Consumer] = {}
        self.delayed = DelayedDeliveryTracker(subscription.topic, self.release_delayed)

    async def remove_consumer(self, consumer: Consumer) -> None:
        if consumer not in self.consumers:
            return
        self.consumers.remove(consumer)
        for uuid in [u for u, c in self._chunk_owner.items() if c is consumer]:
            del self._chunk_owner[uuid]
        self.redeliver(consumer.take_pending())

    async def close(self) -> None:
        self.delayed.close()
        await super().close()

    def redeliver(self, positions: list[Position]) -> None:
        for p in positions:
            self.subscription.count_redelivery(p)
        self.redelivery.update(positions)
        self.wakeup()

    def release_delayed(self, positions: list[Position]) -> None:
        """Delayed entries that became due go out ahead of new reads (not counted as redeliveries)."""
        self.redelivery.update(positions)
        self.wakeup()

    def _budget(self) -> int:
        total = sum(c.permits for c in self.consumers if c.available)
        return min(total, self.max_read_batch)

    def _dispatch(self, entries: list[Entry], replay: bool) -> None:
        metas = [entry_meta(e.data) for e in entries]
        entries, metas = self.delayed.hold(entries, metas)
        counts = self.subscription.redelivery_counts
        plan: dict[int, tuple[Consumer, list[Entry], list[EntryMeta]]] = {}
        spare: dict[int, int] = {}  # permits left per consumer while planning
        current: Consumer | None = None
        run = 0
        for i, (entry, meta) in enumerate(zip(entries, metas, strict=True)):
            if meta.chunk_uuid is not None:
                consumer = self._chunk_consumer(meta, spare)
            else:
                if current is None or run <= 0 or spare.get(id(current), current.permits) <= 0:
                    current = self._next_available(spare)
                    run = ROUND_ROBIN_BATCH
                consumer = current
                run -= 1
            if consumer is None:
                # Out of permits: keep the rest for later, ahead of new entries.
                self.redelivery.update(e.position for e in entries[i:])
                break
            spare[id(consumer)] = spare.get(id(consumer), consumer.permits) - meta.num_messages
            slot = plan.setdefault(id(consumer), (consumer, [], []))
            slot[1].append(entry)
            slot[2].append(meta)
        for consumer, chosen, chosen_metas in plan.values():
            consumer.send(chosen, counts, chosen_metas)

    def _chunk_consumer(self, meta: EntryMeta, spare: dict[int, int]) -> Consumer | None:
        """The consumer for a chunk: its message's owner once the first chunk went out."""
        assert meta.chunk_uuid is not None
        owner = self._chunk_owner.get(meta.chunk_uuid)
        if meta.chunk_id == 0 or owner is None or owner.closed:
            owner = self._next_available(spare)
            if owner is None:
                return None
            self._chunk_owner[meta.chunk_uuid] = owner
        if meta.chunk_id >= meta.num_chunks - 1:
            self._chunk_owner.pop(meta.chunk_uuid, None)
        return owner

    def _next_available(self, spare: dict[int, int] | None = None) -> Consumer | None:
        """Round-robin over the best priority level that has a consumer with permits."""
        consumers = self.consumers
        if not consumers:
            return None

        def has_room(c: Consumer) -> bool:
            return c.available and (spare is None or spare.get(id(c), c.permits) > 0)

        best = min((c.priority for c in consumers if has_room(c)), default=None)
        if best is None:
            return None
        for _ in range(len(consumers)):
            self._next = (self._next + 1) % len(consumers)
            c = consumers[self._next]
            if c.priority == best and has_room(c):
                return c
        return None
