"""Compaction on a broker: running it (admin trigger, ``compactionThreshold``), its status, and the
compacted view ``read_compacted`` consumers and readers get.

A read-compacted subscription's dispatcher reads through a :class:`CompactedView` of its cursor:
below the horizon it serves the compacted ledger (entries keep their original message ids, so acks
and seeks work on the topic's positions), then it continues on the live topic after the horizon.
As in Pulsar, only Exclusive and Failover subscriptions may read compacted. The topic itself is
never changed by compaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from magnetar.broker.compactor import (
    COMPACTION_SUBSCRIPTION,
    HORIZON_PROPERTY,
    LEDGER_PROPERTY,
    CompactedLedger,
    TwoPhaseCompactor,
    messages_of,
    parse_position,
)
from magnetar.broker.consumer import SubType
from magnetar.broker.errors import BrokerError, NotAllowedError
from magnetar.broker.protocol import pulsar_api_pb2 as pb
from magnetar.broker.protocol.frames import parse_metadata
from magnetar.common.tasks import TaskSet
from magnetar.ledger.api import LedgerConfig
from magnetar.managed_ledger.api import Entry, ManagedCursor, ManagedLedger, Position

if TYPE_CHECKING:
    from magnetar.broker.service import BrokerService
    from magnetar.broker.subscription import Subscription
    from magnetar.broker.topic import PersistentTopic

log = logging.getLogger(__name__)


class CompactionInProgressError(BrokerError):
    """A compaction of the topic is already running (the admin API's 409)."""

    http_status = 409


class CompactedView(ManagedCursor):
    """A cursor that reads the compacted ledger below the horizon and the topic above it.

    Acks go to the wrapped cursor; seeks and rewinds move it too. The view keeps its own position
    inside the compacted part, as those positions may lie in ledgers retention already deleted.
    A cursor at the oldest stored entry (a new subscription or reader from the earliest message)
    starts with the whole compacted part.
    """

    def __init__(
        self,
        cursor: ManagedCursor,
        ledger: ManagedLedger,
        compacted: Callable[[], CompactedLedger | None],
        read: Callable[[CompactedLedger, int, int], Any],
    ) -> None:
        self.cursor = cursor
        self.name = cursor.name
        self.durable = cursor.durable
        self._ledger = ledger
        self._compacted = compacted
        self._read = read
        #: Next original position to read in the compacted part (None: decide from the cursor).
        self._pos: Position | None = None
        #: Id of the compacted ledger whose part has been read since the last seek.
        self._done: int | None = None

    def _next(self) -> tuple[CompactedLedger, int] | None:
        """The compacted ledger and index to read next, or ``None`` when reading the topic."""
        compacted = self._compacted()
        if compacted is None or self._done == compacted.ledger_id:
            return None
        if self._pos is None:
            read = self.cursor.read_position
            if read <= compacted.horizon:
                self._pos = read
            elif compacted.positions and read <= self._ledger.first_position:
                self._pos = compacted.positions[0]
            else:
                self._done = compacted.ledger_id
                return None
        index = compacted.index_from(self._pos)
        if index >= len(compacted.positions):
            self._finish(compacted)
            return None
        return compacted, index

    def _finish(self, compacted: CompactedLedger) -> None:
        self._done, self._pos = compacted.ledger_id, None
        self.cursor.seek(self._ledger.next_position(compacted.horizon))

    def has_more_entries(self) -> bool:
        return self._next() is not None or self.cursor.has_more_entries()

    async def read_entries(self, max_entries: int) -> list[Entry]:
        found = self._next()
        if found is None:
            return await self.cursor.read_entries(max_entries)
        compacted, index = found
        entries: list[Entry] = await self._read(compacted, index, max_entries)
        after = index + len(entries)
        if after < len(compacted.positions):
            self._pos = compacted.positions[after]
        else:
            self._finish(compacted)
        if self.cursor.mark_delete_position > compacted.horizon:
            return entries  # a cursor started at the oldest stored entry: nothing below it was acked
        return [e for e in entries if not self.cursor.is_acked(e.position)]

    async def read_entries_or_wait(self, max_entries: int) -> list[Entry]:
        if self._next() is not None:
            return await self.read_entries(max_entries)
        return await self.cursor.read_entries_or_wait(max_entries)

    # -- everything else is the wrapped cursor's
    @property
    def mark_delete_position(self) -> Position:
        return self.cursor.mark_delete_position

    @property
    def read_position(self) -> Position:
        return self.cursor.read_position

    @property
    def properties(self) -> dict[str, str]:
        return self.cursor.properties

    async def replay_entries(self, positions: Iterable[Position]) -> list[Entry]:
        return await self.cursor.replay_entries(positions)

    def delete(self, positions: Iterable[Position]) -> None:
        self.cursor.delete(positions)

    def mark_delete(self, position: Position) -> None:
        self.cursor.mark_delete(position)

    def is_acked(self, position: Position) -> bool:
        return self.cursor.is_acked(position)

    def batch_unacked(self, position: Position) -> list[int] | None:
        return self.cursor.batch_unacked(position)

    def set_batch_unacked(self, position: Position, words: list[int] | None) -> None:
        self.cursor.set_batch_unacked(position, words)

    def acked_ranges(self) -> list[tuple[Position, Position]]:
        return self.cursor.acked_ranges()

    async def reset(self, position: Position) -> None:
        await self.cursor.reset(position)
        self._done = self._pos = None

    def backlog_entries(self) -> int:
        return self.cursor.backlog_entries()

    def set_property(self, key: str, value: str | None) -> None:
        self.cursor.set_property(key, value)

    async def flush(self) -> None:
        await self.cursor.flush()

    async def close(self) -> None:
        await self.cursor.close()

    def seek(self, read_position: Position) -> None:
        self.cursor.seek(read_position)
        compacted = self._compacted()
        self._done = None
        self._pos = read_position if compacted is not None and read_position <= compacted.horizon else None

    def rewind(self) -> None:
        self.cursor.rewind()
        self._done = self._pos = None


class CompactionService:
    """Compaction of the topics this broker serves."""

    def __init__(self, service: BrokerService) -> None:
        self.service = service
        self._status: dict[str, tuple[str, str]] = {}
        #: Running compactions by topic name (the tasks themselves are kept in ``tasks``).
        self._running: dict[str, asyncio.Task[None]] = {}
        self.tasks = TaskSet("compaction", logger=log)
        self._results: dict[str, CompactedLedger | None] = {}

    @property
    def _client(self) -> Any:
        return self.service.ledgers.client  # type: ignore[attr-defined]  # the factory's ledger client

    # ------------------------------------------------------------------ running
    def status(self, topic: PersistentTopic) -> dict[str, Any]:
        """Pulsar's ``LongRunningProcessStatus`` of the topic's last compaction."""
        state, error = self._status.get(str(topic.name), ("NOT_RUN", ""))
        return {"status": state, "lastError": error}

    def trigger(self, topic: PersistentTopic) -> None:
        """Start compacting ``topic`` in the background; :class:`CompactionInProgressError` if it runs."""
        key = str(topic.name)
        if key in self._running:
            raise CompactionInProgressError("Compaction already in progress")
        self._status[key] = ("RUNNING", "")
        task = self.tasks.spawn(self._run(topic), name=f"compact {key}")
        self._running[key] = task
        task.add_done_callback(lambda _: self._running.pop(key, None))

    async def _run(self, topic: PersistentTopic) -> None:
        key = str(topic.name)
        try:
            await self.compact(topic)
        except asyncio.CancelledError:
            self._status[key] = ("ERROR", "cancelled")
            raise
        except Exception as exc:
            log.exception("compaction of %s failed", key)
            self._status[key] = ("ERROR", str(exc) or type(exc).__name__)
        else:
            self._status[key] = ("SUCCESS", "")

    async def compact(self, topic: PersistentTopic) -> CompactedLedger | None:
        """Compact ``topic`` now (the caller keeps the task); returns the current compacted ledger."""
        sub = await topic.subscribe(COMPACTION_SUBSCRIPTION, True, pb.CommandSubscribe.Earliest, None)
        previous = await self.compacted(topic)
        config = topic.ledger.config
        compactor = TwoPhaseCompactor(
            self._client,
            LedgerConfig(config.ensemble_size, config.write_quorum, config.ack_quorum),
            self.service.config.topic_compaction_retain_null_key,
            self.service.config.max_uncompressed_message_size,
        )
        result = await compactor.compact(topic.ledger, sub.cursor, previous)
        if result is not None:
            self._results[str(topic.name)] = result
            for s in topic.subscriptions.values():
                s.wakeup()
        return result or previous

    async def check_thresholds(self) -> None:
        """Compact topics whose backlog after the horizon exceeds their ``compactionThreshold``."""
        for topic in self.service.loaded_topics():
            if str(topic.name) in self._running or not topic.name.persistent:
                continue
            tp = await self.service.policies.topic(topic.name)
            ns = await self.service.policies.namespace(topic.name.namespace)
            threshold = tp.compactionThreshold if tp is not None else None
            if threshold is None and ns is not None:
                threshold = ns.compaction_threshold
            if threshold is None:
                threshold = self.service.config.broker_service_compaction_threshold_in_bytes
            if threshold <= 0:
                continue
            sub = topic.subscriptions.get(COMPACTION_SUBSCRIPTION)
            backlog = sub.backlog_size() if sub is not None else topic.ledger.total_size
            if backlog > threshold:
                log.info("compacting %s: backlog %d bytes over the threshold %d", topic.name, backlog, threshold)
                self.trigger(topic)

    # ------------------------------------------------------------------ the compacted view
    async def compacted(self, topic: PersistentTopic) -> CompactedLedger | None:
        """The topic's current compacted ledger (loaded from the ``__compaction`` cursor once)."""
        key = str(topic.name)
        if key in self._results:
            return self._results[key]
        cursor = topic.ledger.cursors.get(COMPACTION_SUBSCRIPTION)
        result = None
        if cursor is not None and cursor.properties.get(LEDGER_PROPERTY):
            horizon = parse_position(cursor.properties.get(HORIZON_PROPERTY))
            if horizon is not None:
                result = await CompactedLedger.load(self._client, int(cursor.properties[LEDGER_PROPERTY]), horizon)
        self._results[key] = result
        return result

    def ledger_stats(self, topic: PersistentTopic) -> dict[str, Any]:
        """``compactedLedger`` of the topic's internal stats (``-1`` when none is loaded)."""
        compacted = self._results.get(str(topic.name))
        if compacted is None:
            return {"ledgerId": -1, "entries": -1, "size": -1, "offloaded": False, "underReplicated": False}
        return {
            "ledgerId": compacted.ledger_id,
            "entries": len(compacted.positions),
            "size": compacted.size,
            "offloaded": False,
            "underReplicated": False,
        }

    async def prepare_read(self, topic: PersistentTopic, sub_type: int) -> None:
        """Check a ``read_compacted`` subscribe and load the topic's compacted ledger."""
        if sub_type not in (SubType.Exclusive, SubType.Failover):
            raise NotAllowedError("readCompacted only allowed on failover or exclusive subscriptions")
        if topic.name.persistent:  # a non-persistent topic has nothing compacted: the flag is moot
            await self.compacted(topic)

    async def attach(self, sub: Subscription) -> None:
        """Make ``sub``'s dispatcher read the compacted view (after :meth:`prepare_read`)."""
        dispatcher = sub.dispatcher
        if dispatcher is None or not sub.topic.name.persistent:
            return
        key = str(sub.topic.name)
        await dispatcher.stop()  # restarted below so its read loop takes the view
        # A fresh view on every subscribe: a seek (consumers resubscribe after it) starts it anew.
        dispatcher.cursor = CompactedView(sub.cursor, sub.topic.ledger, lambda: self._results.get(key), self._read)
        dispatcher.start()
        dispatcher.wakeup()

    async def _read(self, compacted: CompactedLedger, index: int, count: int) -> list[Entry]:
        return await compacted.read(self._client, index, count)

    @staticmethod
    def reads_compacted(sub: Subscription) -> bool:
        return sub.dispatcher is not None and isinstance(sub.dispatcher.cursor, CompactedView)

    async def last_message_id(self, sub: Subscription) -> tuple[Position, int]:
        """GET_LAST_MESSAGE_ID: for a compacted reader with nothing after the horizon, the last
        message of the compacted view (``entry_id == -1`` when it is empty)."""
        topic = sub.topic
        compacted = self._results.get(str(topic.name)) if self.reads_compacted(sub) else None
        last = topic.ledger.last_confirmed_entry
        if compacted is None or (last.entry_id >= 0 and last > compacted.horizon):
            return await topic.last_message_id()
        if not compacted.positions:
            return Position(compacted.horizon.ledger_id, -1), -1
        (entry,) = await compacted.read(self._client, len(compacted.positions) - 1, 1)
        if not parse_metadata(entry.data)[0].HasField("num_messages_in_batch"):
            return entry.position, -1
        msgs = messages_of(entry.data, self.service.config.max_uncompressed_message_size)
        return entry.position, max(i for i, m in enumerate(msgs) if not m.compacted_out)

    # ------------------------------------------------------------------ lifecycle
    async def forget(self, topic: PersistentTopic | None, name: str) -> None:
        """A topic is being deleted: stop compacting it and delete its compacted ledger."""
        task = self._running.pop(name, None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._status.pop(name, None)
        result = self._results.pop(name, None)
        if result is None and topic is not None:
            with contextlib.suppress(Exception):
                result = await self.compacted(topic)
                self._results.pop(name, None)
        if result is not None:
            await result.close()
            await self._client.delete_ledger(result.ledger_id)

    async def unloaded(self, name: str) -> None:
        """A topic was unloaded: drop its cached compacted ledger (reloaded from the cursor on demand)."""
        result = self._results.pop(name, None)
        if result is not None:
            await result.close()

    async def close(self) -> None:
        await self.tasks.close()
        for result in self._results.values():
            if result is not None:
                with contextlib.suppress(Exception):
                    await result.close()
        self._results.clear()
