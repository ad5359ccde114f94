"""A topic loaded again while its unload is still closing it (a client reconnecting at once after an unload
or a bundle move) must get a managed ledger of its own, opened after the old topic closed the old one:
never the instance the old topic is about to close under it.

In-process broker service over the embedded metadata store and the in-memory ledger double (no ports)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable

import pytest

from magnetar.broker.config import BrokerConfig
from magnetar.broker.protocol import pulsar_api_pb2 as pb
from magnetar.broker.resources import Resources, initialize_standalone
from magnetar.broker.service import BrokerService
from magnetar.broker.topic import PersistentTopic
from magnetar.broker.topic_name import TopicName
from magnetar.managed_ledger.factory import ManagedLedgerFactoryImpl
from magnetar.metadata.embedded import EmbeddedMetadataStore
from tests.managed_ledger.ml_memory_ledger import MemoryLedgerClient

NAME = TopicName.parse("persistent://public/default/reloaded")


@pytest.fixture
async def service() -> AsyncIterator[BrokerService]:
    store = EmbeddedMetadataStore(":memory:")
    await store.start()
    factory = ManagedLedgerFactoryImpl(store, MemoryLedgerClient(), trim_delay_seconds=0.01)
    config = BrokerConfig(broker_service_port=None, web_service_port=None)
    await initialize_standalone(Resources(store), config.cluster_name, "pulsar://127.0.0.1:1", "http://127.0.0.1:1")
    svc = BrokerService(config, store, factory)
    await svc.start()
    try:
        yield svc
    finally:
        await svc.close()
        await factory.close()
        await store.close()


async def _load_while_held(
    service: BrokerService, retire: Awaitable[None], started: asyncio.Event, held: asyncio.Event, why: str
) -> asyncio.Task[PersistentTopic]:
    """Run ``retire`` (an unload or a delete that sets ``started``, then waits for ``held``), start a load of
    the topic while it is held and check that the load waits; release it, and return the load."""
    retiring = asyncio.create_task(retire)
    await asyncio.wait_for(started.wait(), 5)
    load = asyncio.create_task(service.get_topic(NAME, create=False))
    await asyncio.sleep(0.2)
    assert not load.done(), why
    held.set()
    await asyncio.wait_for(retiring, 5)
    return load


async def test_a_load_during_an_unload_waits_for_the_close_and_opens_its_own_ledger(
    service: BrokerService, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = await service.get_topic(NAME, create=True)
    await old.subscribe("keep", True, pb.CommandSubscribe.Earliest, None)  # nothing is trimmed at the reload
    await old.ledger.add_entry(b"before the unload")
    held = asyncio.Event()
    closing = asyncio.Event()
    close = PersistentTopic.close

    async def slow_close(topic: PersistentTopic) -> None:  # the old topic's close takes a while (cursors, dedup)
        if topic is old:
            closing.set()
            await held.wait()
        await close(topic)

    monkeypatch.setattr(PersistentTopic, "close", slow_close)
    why = "the topic was loaded again while its old instance still had the ledger open"
    load = await _load_while_held(service, service.unload_topic(old), closing, held, why)
    new = await asyncio.wait_for(load, 5)
    assert new is not old and not new.closed
    assert new.ledger is not old.ledger
    # The new instance's ledger is open and holds what was written before the unload.
    await new.ledger.add_entry(b"after the reload")
    assert new.ledger.number_of_entries == 2
    assert "keep" in new.subscriptions


async def test_a_load_waits_at_most_the_topic_load_timeout_for_a_stuck_close(
    service: BrokerService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A close that never ends (a bookie gone silent) must not hang every later load: after
    ``topicLoadTimeoutSeconds`` the load fails with ServiceNotReady and the client retries."""
    from magnetar.broker.errors import BrokerError

    monkeypatch.setattr(service.config, "topic_load_timeout_seconds", 0.3)
    old = await service.get_topic(NAME, create=True)
    never = asyncio.Event()
    close = PersistentTopic.close

    async def stuck_close(topic: PersistentTopic) -> None:
        if topic is old:
            await never.wait()
        await close(topic)

    monkeypatch.setattr(PersistentTopic, "close", stuck_close)
    unload = asyncio.create_task(service.unload_topic(old))
    await asyncio.sleep(0)
    with pytest.raises(BrokerError) as err:
        await asyncio.wait_for(service.get_topic(NAME, create=False), 5)
    assert err.value.code == pb.ServiceNotReady
    unload.cancel()
    await asyncio.gather(unload, return_exceptions=True)


async def test_a_load_during_a_delete_waits_for_it_and_finds_no_topic(
    service: BrokerService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An admin call (stats) or a lookup while the topic is being deleted (the inactive-topic deleter)
    waits for the whole deletion, the managed ledger's included, then finds no topic: not an open racing
    the removal of the managed ledger (which failed as fenced: a 500)."""
    from magnetar.broker.errors import TopicNotFoundError

    await (await service.get_topic(NAME, create=True)).ledger.add_entry(b"doomed")
    held = asyncio.Event()
    deleting = asyncio.Event()
    delete_ledger = service.ledgers.delete

    async def slow_delete(name: str) -> None:  # the managed ledger's removal takes a while (bookies, metadata)
        deleting.set()
        await held.wait()
        await delete_ledger(name)

    monkeypatch.setattr(service.ledgers, "delete", slow_delete)
    why = "the topic was loaded while its managed ledger was being deleted"
    load = await _load_while_held(service, service.delete_topic(NAME), deleting, held, why)
    with pytest.raises(TopicNotFoundError):
        await asyncio.wait_for(load, 5)
