"""Delayed delivery: entries whose ``deliver_at_time`` is in the future wait here (Shared and
Key_Shared subscriptions only, as in Pulsar).

Positions wait in a heap; a timer hands the due ones back to the dispatcher, which sends them
ahead of new reads. Nothing is persisted: held entries are unacknowledged, so after a restart
the cursor reads them again and they come back here.

Settings resolve topic > namespace > broker (``delayedDeliveryEnabled``,
``delayedDeliveryTickTimeMillis``) through the topic's effective policies; with
``isDelayedDeliveryDeliverAtTimeStrict=false`` (the default) an entry may go out up to one tick
early, as in Pulsar.
"""

from __future__ import annotations

import asyncio
import heapq
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from magnetar.broker.protocol.frames import EntryMeta
from magnetar.managed_ledger.api import Entry, Position

if TYPE_CHECKING:
    from magnetar.broker.topic import PersistentTopic


class DelayedDeliveryTracker:
    """Holds a subscription's not-yet-due entries and releases them through ``release`` when due."""

    def __init__(self, topic: PersistentTopic, release: Callable[[list[Position]], None]) -> None:
        self.topic = topic
        self.release = release
        self._heap: list[tuple[int, Position]] = []
        self._held: set[Position] = set()
        self._timer: asyncio.TimerHandle | None = None

    def __len__(self) -> int:
        return len(self._held)

    def _settings(self) -> tuple[bool, int, bool]:
        """(enabled, tick in ms, strict): read on every use, so policy changes apply at once."""
        eff = self.topic.effective
        config = self.topic.service.config
        enabled = eff.delayed_delivery_enabled if eff is not None else config.delayed_delivery_enabled
        tick = eff.delayed_delivery_tick_ms if eff is not None else config.delayed_delivery_tick_time_millis
        return enabled, tick, config.is_delayed_delivery_deliver_at_time_strict

    def hold(self, entries: list[Entry], metas: list[EntryMeta]) -> tuple[list[Entry], list[EntryMeta]]:
        """Split off the entries that are not due yet; returns the ones to dispatch now."""
        if not any(m.deliver_at for m in metas):
            return entries, metas
        enabled, tick, strict = self._settings()
        if not enabled:
            return entries, metas
        now = int(time.time() * 1000)
        cutoff = now if strict else now + tick  # non-strict: up to one tick early, as Pulsar
        keep_e: list[Entry] = []
        keep_m: list[EntryMeta] = []
        for entry, meta in zip(entries, metas, strict=True):
            if meta.deliver_at > cutoff:
                if entry.position not in self._held:
                    self._held.add(entry.position)
                    heapq.heappush(self._heap, (meta.deliver_at, entry.position))
            else:
                keep_e.append(entry)
                keep_m.append(meta)
        self._arm(tick, strict)
        return keep_e, keep_m

    def _arm(self, tick: int, strict: bool) -> None:
        if not self._heap:
            return
        loop = asyncio.get_running_loop()
        delay = max(0.0, self._heap[0][0] / 1000 - time.time() - (0 if strict else tick / 1000))
        if self._timer is not None:
            self._timer.cancel()
        self._timer = loop.call_later(delay, self._release_due)

    def _release_due(self) -> None:
        self._timer = None
        _, tick, strict = self._settings()
        cutoff = int(time.time() * 1000) + (0 if strict else tick)
        due = []
        while self._heap and self._heap[0][0] <= cutoff:
            _, position = heapq.heappop(self._heap)
            self._held.discard(position)
            due.append(position)
        if due:
            self.release(due)
        self._arm(tick, strict)

    def close(self) -> None:
        """Cancel the timer; held entries stay unacknowledged and are read again by the next owner."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
