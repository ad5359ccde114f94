"""Key_Shared's classic dispatcher (Pulsar before 4.0, "recently joined consumers").

Selected with ``subscriptionKeySharedUseClassicPersistentImplementation=true``. A consumer that joins
while entries are outstanding records the read position: until the mark-delete position reaches it, it
only receives entries read before it joined (unless out-of-order delivery is allowed) -- whatever their
keys, so one slow consumer holds back every key of a newcomer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from magnetar.broker.key_shared import StickyKeyDispatcher

if TYPE_CHECKING:
    from magnetar.broker.consumer import Consumer
    from magnetar.broker.subscription import Subscription
    from magnetar.managed_ledger.api import Position


class ClassicKeySharedDispatcher(StickyKeyDispatcher):
    """Key_Shared with Pulsar 3.x's read-position barrier for recently joined consumers."""

    def __init__(self, subscription: Subscription, max_read_batch: int) -> None:
        super().__init__(subscription, max_read_batch)
        #: Consumers that joined while entries were outstanding -> the read position when they joined,
        #: ordered by that position.
        self.recently_joined: dict[Consumer, Position] = {}

    def _consumer_added(self, consumer: Consumer) -> None:
        if len(self.consumers) == 1:
            self.recently_joined.clear()
        elif not self.allow_out_of_order:
            # Entries were read but not all acknowledged: keys this consumer takes over may have older
            # messages in flight elsewhere, so it gets only entries before this point until they are acked.
            read = self.cursor.read_position
            if read > self.subscription.topic.ledger.next_position(self.cursor.mark_delete_position):
                joined = self.recently_joined
                joined[consumer] = read
                if len(joined) > 1 and read < max(joined.values()):
                    self.recently_joined = dict(sorted(joined.items(), key=lambda kv: kv[1]))

    def _consumer_removed(self, consumer: Consumer) -> None:
        self.recently_joined.pop(consumer, None)
        if len(self.consumers) <= 1:
            self.recently_joined.clear()

    def _release_recently_joined(self) -> None:
        """Drop recently joined consumers whose join position the mark-delete position has reached."""
        joined = self.recently_joined
        if not joined:
            return
        limit = self.subscription.topic.ledger.next_position(self.cursor.mark_delete_position)
        for c in [c for c, p in joined.items() if p <= limit]:
            del joined[c]

    def _budget(self) -> int:
        self._release_recently_joined()
        return super()._budget()

    def _limit(self, consumer: Consumer, replay: bool) -> Position | None:
        joined = self.recently_joined
        limit = joined.get(consumer)
        if limit is not None and replay:
            # Replayed entries are older than any read position, so they must also be older than the
            # earliest join: they may belong to a key an earlier newcomer is still waiting on.
            limit = min(limit, next(iter(joined.values())))
        return limit

    def _may_read(self) -> bool:
        """Someone not restricted to older entries can take new ones."""
        joined = self.recently_joined
        return super()._may_read() and any(c not in joined and self._permits(c) > 0 for c in self.consumers)

    def stats(self, consumers: list[tuple[Consumer, dict[str, Any]]]) -> dict[str, Any]:
        out = super().stats(consumers)
        out["consumersAfterMarkDeletePosition"] = {c.name: str(p) for c, p in self.recently_joined.items()}
        return out
