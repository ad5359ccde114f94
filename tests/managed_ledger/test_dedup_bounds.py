"""The deduplication snapshot (a hidden cursor's properties, one per producer name ever seen) must
stay bounded: at most ``brokerDeduplicationMaxNumberOfProducers`` names are persisted, and names of
producers gone longer than ``brokerDeduplicationProducerInactivityTimeoutMinutes`` are forgotten.
Runs Deduplication over a real managed ledger (embedded metadata store, in-memory ledgers)."""

from __future__ import annotations

import time
from types import SimpleNamespace

from magnetar.broker.config import BrokerConfig
from magnetar.broker.dedup import CURSOR_NAME, Deduplication, Verdict
from magnetar.managed_ledger.factory import ManagedLedgerFactoryImpl
from tests.managed_ledger.conftest import config


async def _dedup(store, memory_client, **settings):  # type: ignore[no-untyped-def]
    factory = ManagedLedgerFactoryImpl(store, memory_client, trim_delay_seconds=0.01)
    ml = await factory.open("public/default/persistent/dedup", config())
    cfg = BrokerConfig(broker_deduplication_entries_interval=1, **settings)
    topic = SimpleNamespace(service=SimpleNamespace(config=cfg), ledger=ml, name="dedup")
    dedup = Deduplication(topic)  # type: ignore[arg-type]
    await dedup.enable()
    return factory, ml, dedup


async def _publish(ml, dedup: Deduplication, name: str, seq: int) -> None:  # type: ignore[no-untyped-def]
    assert dedup.check(name, seq, seq) is Verdict.NEW
    dedup.on_persisted(name, seq, seq, await ml.add_entry(f"{name}:{seq}".encode()))


async def test_snapshot_keeps_at_most_the_configured_producers(store, memory_client) -> None:  # type: ignore[no-untyped-def]
    factory, ml, dedup = await _dedup(store, memory_client, broker_deduplication_max_number_of_producers=3)
    for i in range(10):
        await _publish(ml, dedup, f"p{i}", 0)
        dedup.producer_disconnected(f"p{i}")
    await _publish(ml, dedup, "live", 5)
    props = ml.cursors[CURSOR_NAME].properties
    assert len(props) <= 3, props
    assert props.get("live") == "5"  # connected producers first, then the most recently active
    await factory.close()


async def test_inactive_producers_are_purged(store, memory_client) -> None:  # type: ignore[no-untyped-def]
    factory, ml, dedup = await _dedup(store, memory_client, broker_deduplication_producer_inactivity_timeout_minutes=1)
    await _publish(ml, dedup, "gone", 0)
    await _publish(ml, dedup, "stays", 0)
    dedup.producer_disconnected("gone")
    dedup.purge_inactive(now=time.monotonic() + 30)  # not yet
    assert dedup.last_sequence_id("gone") == 0
    dedup.purge_inactive(now=time.monotonic() + 61)
    assert dedup.last_sequence_id("gone") == -1
    assert dedup.last_sequence_id("stays") == 0
    await _publish(ml, dedup, "stays", 1)  # the next snapshot drops the purged name
    assert set(ml.cursors[CURSOR_NAME].properties) == {"stays"}
    await factory.close()
