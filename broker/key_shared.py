"""Key_Shared dispatch (being implemented): messages with the same key go to the same consumer."""

from __future__ import annotations

from magnetar.broker.dispatcher import SharedDispatcher
from magnetar.broker.errors import NotAllowedError


class KeySharedDispatcher(SharedDispatcher):
    """Placeholder until the key-to-consumer selectors land: refuses consumers."""

    def add_consumer(self, consumer) -> None:  # type: ignore[no-untyped-def]
        raise NotAllowedError("Key_Shared subscriptions are not supported yet")
