"""The housekeeping loop stops at once on close, even when close meets the end of a check."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from magnetar.broker.config import BrokerConfig
from magnetar.broker.housekeeping import Housekeeper
from tests.waiting import eventually


async def test_close_meeting_the_end_of_a_check_stops_the_loop() -> None:
    """close() cancels a check's loop right as the check completes: the moment Python 3.11's wait_for loses
    a cancellation (the loop then slept on and close() waited out its 5 s grace, at every broker shutdown
    that met a check)."""
    config = BrokerConfig(
        message_expiry_check_interval_in_minutes=0.001,  # 0.06 s; the other checks off or hours away
        subscription_expiry_check_interval_in_minutes=600,
        broker_service_compaction_monitor_interval_in_seconds=0,
        backlog_quota_check_enabled=False,
        broker_delete_inactive_topics_enabled=False,
        broker_unload_inactive_topics_seconds=0,
    )
    closing: list[asyncio.Task[None]] = []

    def loaded_topics() -> list[Any]:  # the TTL check's only call: close right as the check ends
        if not closing:
            closing.append(asyncio.create_task(keeper.close()))
        return []

    # A stand-in for the broker service: the TTL check reads only its loaded topics.
    keeper = Housekeeper(SimpleNamespace(config=config, loaded_topics=loaded_topics))  # type: ignore[arg-type]
    keeper.start()
    await eventually(lambda: closing, within=2.0)  # the TTL check ran (and started the close)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await asyncio.wait_for(closing[0], 30)
    assert loop.time() - t0 < 2.0
