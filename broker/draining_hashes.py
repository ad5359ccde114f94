"""Key_Shared "draining hashes" (Pulsar 4, PIP-379).

When consumers join or leave, some sticky-key hashes change owner. A hash whose previous owner still
has unacknowledged entries of it is *draining*: it stays with that consumer (reference-counted by its
pending entries) and the new owner gets none of its messages until the count reaches zero, so a key is
never unacknowledged at two consumers at once. Unrelated hashes are not affected. Hashes here are the
selectors' key hashes (Pulsar's slot values, 1..65535 for the range selectors).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from magnetar.broker.consumer import Consumer


class DrainingHash:
    """One draining hash: the consumer it drains from, its pending entries and blocked dispatch attempts."""

    __slots__ = ("blocked", "consumer", "ref_count")

    def __init__(self, consumer: Consumer) -> None:
        self.consumer = consumer
        self.ref_count = 0
        self.blocked = 0


class DrainingHashesTracker:
    """Draining hashes of one dispatcher, with Pulsar's per-consumer statistics.

    ``on_unblocked`` is called when a hash that blocked a dispatch attempt stops draining.
    """

    def __init__(self, on_unblocked: Callable[[], None]) -> None:
        self._hashes: dict[int, DrainingHash] = {}
        #: Per draining consumer: its draining hashes and how many it has cleared (stats).
        self._of_consumer: dict[Consumer, set[int]] = {}
        self._cleared: dict[Consumer, int] = {}
        self._on_unblocked = on_unblocked

    def __len__(self) -> int:
        return len(self._hashes)

    def get(self, key_hash: int) -> DrainingHash | None:
        return self._hashes.get(key_hash)

    def add(self, consumer: Consumer, key_hash: int, entries: int = 1) -> None:
        """``consumer`` lost ``key_hash`` while holding ``entries`` unacknowledged entries of it."""
        entry = self._hashes.get(key_hash)
        if entry is None:
            entry = self._hashes[key_hash] = DrainingHash(consumer)
            self._of_consumer.setdefault(consumer, set()).add(key_hash)
        elif entry.consumer is not consumer:
            return  # cannot happen: nothing is dispatched to another consumer while a hash drains
        entry.ref_count += entries

    def release(self, consumer: Consumer, key_hash: int) -> None:
        """One pending entry of ``key_hash`` left ``consumer`` (acknowledged, redelivered or the consumer left)."""
        entry = self._hashes.get(key_hash)
        if entry is None or entry.consumer is not consumer:
            return
        entry.ref_count -= 1
        if entry.ref_count <= 0:
            self._drop(key_hash, entry)
            if entry.blocked:
                self._on_unblocked()

    def reassigned(self, consumer: Consumer, key_hash: int) -> None:
        """``key_hash`` went back to the consumer it drains from: nothing to wait for any more."""
        entry = self._hashes.get(key_hash)
        if entry is not None and entry.consumer is consumer:
            self._drop(key_hash, entry)

    def should_block(self, consumer: Consumer, key_hash: int) -> bool:
        """Whether an entry of ``key_hash`` must not go to ``consumer`` now (counts the blocked attempt)."""
        entry = self._hashes.get(key_hash)
        if entry is None:
            return False
        if entry.consumer is consumer:
            self._drop(key_hash, entry)
            return False
        entry.blocked += 1
        return True

    def _drop(self, key_hash: int, entry: DrainingHash) -> None:
        del self._hashes[key_hash]
        consumer = entry.consumer
        hashes = self._of_consumer.get(consumer)
        if hashes is not None:
            hashes.discard(key_hash)
            self._cleared[consumer] = self._cleared.get(consumer, 0) + 1

    def consumer_removed(self, consumer: Consumer) -> None:
        """Forget a departed consumer's statistics."""
        self._of_consumer.pop(consumer, None)
        self._cleared.pop(consumer, None)

    def clear(self) -> None:
        self._hashes.clear()
        self._of_consumer.clear()
        self._cleared.clear()

    def consumer_stats(self, consumer: Consumer) -> dict[str, Any]:
        """Pulsar's ``drainingHashes*`` fields of ``ConsumerStats`` for ``consumer``."""
        hashes = sorted(self._of_consumer.get(consumer, ()))
        details = [
            {"hash": h, "unackMsgs": e.ref_count, "blockedAttempts": e.blocked}
            for h in hashes
            if (e := self._hashes.get(h)) is not None
        ]
        return {
            "drainingHashesCount": len(details),
            "drainingHashesClearedTotal": self._cleared.get(consumer, 0),
            "drainingHashesUnackedMessages": sum(d["unackMsgs"] for d in details),
            "drainingHashes": details,
        }
