"""Managed ledger and cursor behaviour over a metadata store and a ledger client."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import pytest

from magnetar.ledger.api import LedgerClient, NoSuchLedgerError
from magnetar.managed_ledger.api import (
    EARLIEST,
    LATEST,
    CursorNotFoundError,
    InitialPosition,
    ManagedLedgerClosedError,
    ManagedLedgerFencedError,
    Position,
)
from magnetar.managed_ledger.factory import ManagedLedgerFactoryImpl
from magnetar.managed_ledger.ledger import ManagedLedgerImpl
from magnetar.managed_ledger.metadata import cursor_path, ledger_path
from magnetar.metadata.embedded import EmbeddedMetadataStore
from tests.managed_ledger.conftest import config
from tests.managed_ledger.ml_memory_ledger import MemoryLedgerClient
from tests.waiting import eventually

NAME = "public/default/persistent/topic-1"

MakeFactory = Callable[..., ManagedLedgerFactoryImpl]


async def open_ml(factory: ManagedLedgerFactoryImpl, name: str = NAME, **cfg: object) -> ManagedLedgerImpl:
    ml = await factory.open(name, config(**cfg))
    assert isinstance(ml, ManagedLedgerImpl)
    return ml


async def add(ml: ManagedLedgerImpl, n: int, prefix: str = "m") -> list[Position]:
    return [await ml.add_entry(f"{prefix}{i}".encode()) for i in range(n)]


async def ledger_exists(client: LedgerClient, ledger_id: int) -> bool:
    try:
        handle = await client.open_ledger(ledger_id, recovery=False)
    except NoSuchLedgerError:
        return False
    await handle.close()
    return True


async def test_add_and_read_across_rollover(factory: ManagedLedgerFactoryImpl) -> None:
    ml = await open_ml(factory, max_entries_per_ledger=3)
    cursor = await ml.open_cursor("sub", InitialPosition.EARLIEST)
    positions = await add(ml, 4)
    # concurrent appends: pipelined, completed in order, none lost across rollovers
    positions += await asyncio.gather(*(ml.add_entry(f"m{i}".encode()) for i in range(4, 20)))
    assert positions == sorted(positions) and len(set(positions)) == 20
    assert len({p.ledger_id for p in positions}) >= 6
    assert ml.number_of_entries == 20
    assert ml.total_size == sum(len(f"m{i}") for i in range(20))
    assert ml.last_confirmed_entry == positions[-1]
    assert ml.first_position == positions[0]
    got = []
    while cursor.has_more_entries():
        got += await cursor.read_entries(7)
    assert [e.data for e in got] == [f"m{i}".encode() for i in range(20)]
    assert [e.position for e in got] == positions
    assert not cursor.has_more_entries()
    assert ml.entries_between(positions[2], positions[10]) == 9
    assert ml.next_position(positions[2]) == positions[3]  # crosses a ledger boundary
    assert ml.previous_position(positions[3]) == positions[2]
    assert (await ml.read_entry(positions[5])).data == b"m5"


async def test_order_kept_when_adds_arrive_during_rollover(factory: ManagedLedgerFactoryImpl) -> None:
    ml = await open_ml(factory, max_entries_per_ledger=5)
    cursor = await ml.open_cursor("sub", InitialPosition.EARLIEST)
    tasks = []
    for i in range(200):
        tasks.append(asyncio.ensure_future(ml.add_entry(str(i).encode())))
        if i % 17 == 0:
            await asyncio.sleep(0)  # let some rollovers start while adds keep coming
    positions = await asyncio.gather(*tasks)
    assert positions == sorted(positions)
    entries = await cursor.read_entries(1000)
    assert [int(e.data) for e in entries] == list(range(200))


async def test_write_failure_continues_on_new_ledger(
    memory_factory: ManagedLedgerFactoryImpl, memory_client: MemoryLedgerClient
) -> None:
    ml = await open_ml(memory_factory)
    cursor = await ml.open_cursor("sub", InitialPosition.EARLIEST)
    await add(ml, 3)
    first_ledger = ml.ledger_ids[-1]
    memory_client.fail_appends = 1
    positions = await asyncio.gather(*(ml.add_entry(f"x{i}".encode()) for i in range(5)))
    assert positions == sorted(positions)
    assert all(p.ledger_id > first_ledger for p in positions)
    entries = await cursor.read_entries(100)
    assert [e.data for e in entries] == [b"m0", b"m1", b"m2"] + [f"x{i}".encode() for i in range(5)]


async def test_cursor_recovery_after_close(make_factory: MakeFactory, store: EmbeddedMetadataStore) -> None:
    f1 = make_factory()
    ml = await open_ml(f1, max_entries_per_ledger=4)
    c = await ml.open_cursor("sub/with%odd chars", InitialPosition.EARLIEST, {"k": "v"})
    positions = await add(ml, 10)
    await c.read_entries(10)
    c.delete([positions[0], positions[1], positions[3], positions[6], positions[7]])
    assert c.mark_delete_position == positions[1]
    c.set_property("k2", "v2")
    assert c.backlog_entries() == 5
    await f1.close()
    node = await store.get(cursor_path(NAME, "sub/with%odd chars"))
    assert node is not None and "sub%2Fwith%25odd%20chars" in node.stat.path

    f2 = make_factory()
    ml2 = await open_ml(f2, max_entries_per_ledger=4)
    assert "sub/with%odd chars" in ml2.cursors  # recovered at open, before open_cursor
    c2 = await ml2.open_cursor("sub/with%odd chars")
    assert c2.mark_delete_position == positions[1]
    assert c2.properties == {"k": "v", "k2": "v2"}
    assert c2.backlog_entries() == 5
    assert c2.is_acked(positions[3]) and not c2.is_acked(positions[2])
    entries = await c2.read_entries(100)
    assert [e.position for e in entries] == [positions[i] for i in (2, 4, 5, 8, 9)]
    assert ml2.number_of_entries == 10
    await f2.close()


async def test_crash_then_new_owner_fences_old(make_factory: MakeFactory, store: EmbeddedMetadataStore, client) -> None:
    f1 = make_factory()
    ml1 = await open_ml(f1)
    c1 = await ml1.open_cursor("sub", InitialPosition.EARLIEST)
    positions = await add(ml1, 5)
    c1.mark_delete(positions[1])
    await c1.flush()
    # "crash": f1 is never closed; a second broker takes over the same stores
    f2 = make_factory()
    ml2 = await open_ml(f2)
    assert ml2.number_of_entries == 5
    assert ml2.last_confirmed_entry == positions[-1]
    c2 = await ml2.open_cursor("sub")
    assert c2.mark_delete_position == positions[1]
    with pytest.raises(ManagedLedgerFencedError):
        await ml1.add_entry(b"late")
    with pytest.raises(ManagedLedgerFencedError):
        await ml1.add_entry(b"later")
    # the new owner writes on; the old owner's cursor writes cannot win any more
    p = await ml2.add_entry(b"new")
    assert p > positions[-1]
    c1.mark_delete(positions[4])
    with pytest.raises(ManagedLedgerFencedError):
        await c1.flush()
    c2.mark_delete(positions[2])
    await c2.flush()
    entries = await c2.read_entries(10)
    assert [e.data for e in entries] == [b"m3", b"m4", b"new"]
    await f1.close()
    await f2.close()
    f3 = make_factory()
    ml3 = await open_ml(f3)
    c3 = await ml3.open_cursor("sub")
    assert c3.mark_delete_position == positions[2]
    assert ml3.number_of_entries == 6
    await f3.close()


async def test_individual_acks_and_backlog(factory: ManagedLedgerFactoryImpl) -> None:
    ml = await open_ml(factory, max_entries_per_ledger=3)
    c = await ml.open_cursor("sub", InitialPosition.EARLIEST)
    p = await add(ml, 10)
    assert c.backlog_entries() == 10
    c.delete([p[2], p[4], p[5], p[9]])
    assert c.backlog_entries() == 6
    assert c.mark_delete_position == ml.previous_position(p[0])
    entries = await c.read_entries(100)
    assert [e.position for e in entries] == [p[0], p[1], p[3], p[6], p[7], p[8]]
    c.delete([p[0]])
    assert c.mark_delete_position == p[0]
    c.delete([p[1]])  # contiguous with the acked p[2] (across a ledger boundary)
    assert c.mark_delete_position == p[2]
    c.delete([p[3]])
    assert c.mark_delete_position == p[5]
    assert c.backlog_entries() == 3
    c.delete([p[3], p[0]])  # already acked: no-op
    assert c.backlog_entries() == 3
    c.mark_delete(p[7])
    assert c.mark_delete_position == p[7]
    assert c.backlog_entries() == 1
    c.delete([p[8]])
    assert c.mark_delete_position == p[9]
    assert c.backlog_entries() == 0
    # LATEST cursor starts after what exists
    late = await ml.open_cursor("late")
    assert late.backlog_entries() == 0 and not late.has_more_entries()
    q = await ml.add_entry(b"after")
    assert late.backlog_entries() == 1
    assert [e.position for e in await late.read_entries(5)] == [q]


async def test_rewind_seek_reset_replay(factory: ManagedLedgerFactoryImpl) -> None:
    # Retained: a background trim of the consumed first ledger must not race the reset to EARLIEST.
    ml = await open_ml(factory, max_entries_per_ledger=4, retention_time_seconds=-1, retention_size_bytes=-1)
    c = await ml.open_cursor("sub", InitialPosition.EARLIEST)
    p = await add(ml, 10)
    assert len(await c.read_entries(6)) == 6
    c.delete([p[0], p[1], p[3]])
    c.rewind()
    assert [e.position for e in await c.read_entries(3)] == [p[2], p[4], p[5]]
    c.seek(p[8])
    assert [e.position for e in await c.read_entries(10)] == [p[8], p[9]]
    assert c.mark_delete_position == p[1]
    replay = await c.replay_entries([p[5], p[3], p[0], p[2], p[2]])
    assert [e.position for e in replay] == [p[2], p[5]]
    await c.reset(p[6])
    assert c.mark_delete_position == p[5]
    assert c.backlog_entries() == 4
    assert [e.position for e in await c.read_entries(100)] == p[6:]
    await c.reset(EARLIEST)
    assert c.backlog_entries() == 10 and not c.is_acked(p[3])
    await c.reset(LATEST)
    assert c.backlog_entries() == 0 and not c.has_more_entries()
    c.seek(EARLIEST)  # acked entries are still skipped
    assert await c.read_entries(5) == []


async def test_non_durable_cursors(factory: ManagedLedgerFactoryImpl, store: EmbeddedMetadataStore) -> None:
    ml = await open_ml(factory, max_entries_per_ledger=3)
    await ml.open_cursor("keep", InitialPosition.EARLIEST)  # without cursors the data would be trimmed
    p = await add(ml, 5)
    r1 = ml.new_non_durable_cursor("reader-1", EARLIEST)
    r2 = ml.new_non_durable_cursor("reader-2", p[2], inclusive=False)
    r3 = ml.new_non_durable_cursor("reader-3", LATEST)
    r4 = ml.new_non_durable_cursor("reader-4", p[1])
    assert [e.data for e in await r1.read_entries(10)] == [b"m0", b"m1", b"m2", b"m3", b"m4"]
    assert [e.position for e in await r2.read_entries(10)] == [p[3], p[4]]
    assert [e.position for e in await r4.read_entries(1)] == [p[1]]
    assert await r3.read_entries(10) == []
    q = await ml.add_entry(b"x")
    assert [e.position for e in await r3.read_entries(10)] == [q]
    r1.delete([p[0]])
    await r1.flush()
    await asyncio.sleep(0.05)
    assert await store.get_children(ledger_path(NAME)) == ["keep"]  # readers are never persisted
    await r1.close()
    assert "reader-1" not in ml.cursors
    with pytest.raises(ManagedLedgerClosedError):
        await r1.read_entries(1)


async def test_group_flush(factory: ManagedLedgerFactoryImpl, store: EmbeddedMetadataStore) -> None:
    mls = [
        await open_ml(factory, f"public/default/persistent/t{i}", cursor_flush_interval_seconds=0.05) for i in range(5)
    ]
    cursors = [await ml.open_cursor(f"s{j}", InitialPosition.EARLIEST) for ml in mls for j in range(4)]
    for ml in mls:
        await add(ml, 50)
    flushes_before, commits_before = factory.cursor_flushes, store.stats.commits
    for c in cursors:
        for e in await c.read_entries(50):
            c.delete([e.position])  # 1000 acks
    await asyncio.sleep(0.2)
    assert factory.cursor_flushes - flushes_before <= 2
    assert store.stats.commits - commits_before <= 4
    v = await store.get(cursor_path("public/default/persistent/t3", "s2"))
    assert v is not None
    assert json.loads(v.data)["markDelete"] == list(mls[3].last_confirmed_entry)


async def test_no_cursor_flush_is_scheduled_after_the_factory_closed(factory: ManagedLedgerFactoryImpl) -> None:
    """An ack arriving while the process shuts down must not start a flush on the closed factory (its
    task set is closed: the task would be cancelled unstarted and reported as destroyed while pending).
    Closing a ledger already flushed its cursors."""
    ml = await open_ml(factory, cursor_flush_interval_seconds=0.01)
    c = await ml.open_cursor("sub", InitialPosition.EARLIEST)
    await add(ml, 3)
    await factory.close()
    flushes = factory.cursor_flushes
    factory.schedule_cursor_flush(c, 0.0)
    await asyncio.sleep(0.05)
    assert factory.cursor_flushes == flushes


async def test_trimming_without_retention(factory: ManagedLedgerFactoryImpl, store, client) -> None:
    ml = await open_ml(factory, max_entries_per_ledger=3)
    c = await ml.open_cursor("sub", InitialPosition.EARLIEST)
    p = await add(ml, 10)  # ledgers of 3,3,3,1(current)
    assert len(ml.ledger_ids) == 4
    assert await ml.trim() == []  # nothing consumed yet
    c.mark_delete(p[4])
    await eventually(lambda: len(ml.ledger_ids) == 3)  # the first ledger goes (debounced trim)
    async with asyncio.timeout(2):  # the ledger itself is deleted after the list update
        while await ledger_exists(client, p[0].ledger_id):  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    info = json.loads((await store.get(ledger_path(NAME))).data)
    assert [li["id"] for li in info["ledgers"]] == ml.ledger_ids
    assert ml.number_of_entries == 7 and ml.first_position == p[3]
    c.mark_delete(p[9])
    await eventually(lambda: len(ml.ledger_ids) == 1)  # the current ledger is never trimmed
    assert ml.ledger_ids == [p[9].ledger_id]
    assert ml.number_of_entries == 1
    await ml.delete_cursor("sub")
    with pytest.raises(CursorNotFoundError):
        await ml.delete_cursor("sub")


async def test_no_cursors_means_consumed(factory: ManagedLedgerFactoryImpl) -> None:
    ml = await open_ml(factory, max_entries_per_ledger=2)
    reader = ml.new_non_durable_cursor("r", EARLIEST)
    p = await add(ml, 5)
    await eventually(lambda: len(ml.ledger_ids) == 1)
    assert ml.number_of_entries == 1
    # the reader's position moved to what is left
    assert [e.position for e in await reader.read_entries(10)] == [p[4]]


async def test_retention(make_factory: MakeFactory) -> None:
    f = make_factory()
    forever = await open_ml(
        f,
        "public/default/persistent/forever",
        max_entries_per_ledger=2,
        retention_time_seconds=-1,
        retention_size_bytes=-1,
    )
    by_size = await open_ml(
        f,
        "public/default/persistent/by-size",
        max_entries_per_ledger=2,
        retention_time_seconds=-1,
        retention_size_bytes=60,
    )
    by_time = await open_ml(
        f,
        "public/default/persistent/by-time",
        max_entries_per_ledger=2,
        retention_time_seconds=1.0,
        retention_size_bytes=-1,
    )
    for ml in (forever, by_size, by_time):
        await add(ml, 9, prefix="0123456789-")  # 12 bytes each, ledgers of 2 entries + 1 in the current
        await ml.trim()
    assert forever.number_of_entries == 9
    assert by_time.number_of_entries == 9
    # size: drop the oldest consumed ledgers while the stored total exceeds 60 bytes (108 -> 84 -> 60)
    assert by_size.total_size == 60 and by_size.number_of_entries == 5
    await asyncio.sleep(1.05)
    await by_time.trim()
    assert by_time.number_of_entries == 1
    await f.close()


async def test_read_entries_or_wait(factory: ManagedLedgerFactoryImpl) -> None:
    ml = await open_ml(factory)
    c = await ml.open_cursor("sub")
    waiter = asyncio.ensure_future(c.read_entries_or_wait(10))
    await asyncio.sleep(0.02)
    assert not waiter.done()
    p = await ml.add_entry(b"hello")
    entries = await asyncio.wait_for(waiter, 1)
    assert [e.position for e in entries] == [p]
    # cancellation leaves nothing behind
    waiter = asyncio.ensure_future(c.read_entries_or_wait(10))
    await asyncio.sleep(0.01)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert not ml._waiting
    q = await ml.add_entry(b"again")
    assert [e.position for e in await c.read_entries_or_wait(10)] == [q]
    # closing the cursor wakes a waiter with an error
    waiter = asyncio.ensure_future(c.read_entries_or_wait(10))
    await asyncio.sleep(0.01)
    await c.close()
    with pytest.raises(ManagedLedgerClosedError):
        await asyncio.wait_for(waiter, 1)
    c2 = await ml.open_cursor("sub")  # a closed durable cursor can be opened again
    assert c2 is not c and c2.mark_delete_position == c.mark_delete_position


async def test_find_newest_matching(factory: ManagedLedgerFactoryImpl) -> None:
    ml = await open_ml(factory, max_entries_per_ledger=4)
    assert await ml.find_newest_matching(lambda e: True) is None
    await ml.open_cursor("keep", InitialPosition.EARLIEST)  # without cursors the data would be trimmed
    p = await add(ml, 23)

    def upto(k: int) -> Callable[..., bool]:
        return lambda e: int(e.data[1:]) <= k

    assert await ml.find_newest_matching(upto(0)) == p[0]
    assert await ml.find_newest_matching(upto(13)) == p[13]
    assert await ml.find_newest_matching(upto(99)) == p[22]
    assert await ml.find_newest_matching(lambda e: False) is None

    async def async_pred(e) -> bool:  # type: ignore[no-untyped-def]
        return int(e.data[1:]) <= 7

    assert await ml.find_newest_matching(async_pred) == p[7]
    assert await ml.find_newest_matching(upto(13), start=p[10]) == p[13]


async def test_close_and_reopen_and_delete(make_factory: MakeFactory, store, client) -> None:
    f = make_factory()
    ml = await open_ml(f, max_entries_per_ledger=3)
    await ml.open_cursor("sub", InitialPosition.EARLIEST)
    await add(ml, 7)
    await ml.close()
    with pytest.raises(ManagedLedgerClosedError):
        await ml.add_entry(b"x")
    ml = await open_ml(f, max_entries_per_ledger=3)
    assert ml.number_of_entries == 7
    await ml.close()
    ml = await open_ml(f, max_entries_per_ledger=3)  # empty ledgers of the previous opens are gone
    assert len(ml.ledger_ids) == 4
    ids = ml.ledger_ids
    assert all([await ledger_exists(client, lid) for lid in ids])
    await ml.delete()
    assert not await f.exists(NAME)
    assert not any([await ledger_exists(client, lid) for lid in range(ids[0] - 3, ids[-1] + 1)])
    assert await store.get_children("/managed-ledgers/public/default/persistent") == []
    await f.close()


async def test_cache_serves_tailing_reads(
    memory_factory: ManagedLedgerFactoryImpl, memory_client: MemoryLedgerClient
) -> None:
    ml = await open_ml(memory_factory)
    c = await ml.open_cursor("sub")
    await add(ml, 50)
    reads = memory_client.reads
    assert len(await c.read_entries(100)) == 50
    assert memory_client.reads == reads  # all from the cache


async def test_adds_are_cached_only_while_a_cursor_may_read_them(
    memory_factory: ManagedLedgerFactoryImpl, memory_client: MemoryLedgerClient
) -> None:
    """As Pulsar's OpAddEntry: no cursor, no caching (nobody reads the entry from memory; a cursor opened
    later reads it from the ledger)."""
    ml = await open_ml(memory_factory)
    await add(ml, 20)
    assert memory_factory.cache.size == 0
    c = await ml.open_cursor("sub", InitialPosition.EARLIEST)
    await add(ml, 30)
    assert memory_factory.cache.size > 0
    reads = memory_client.reads
    assert len(await c.read_entries(100)) == 50  # the first 20 from the ledger, the rest from the cache
    assert memory_client.reads > reads
    reads = memory_client.reads
    await add(ml, 10)
    assert len(await c.read_entries(100)) == 10
    assert memory_client.reads == reads


async def test_time_based_rollover(factory: ManagedLedgerFactoryImpl) -> None:
    ml = await open_ml(factory, max_ledger_rollover_seconds=0.05)
    await ml.open_cursor("sub", InitialPosition.EARLIEST)  # keeps the data from being trimmed
    await asyncio.sleep(0.08)
    assert len(ml.ledger_ids) == 1  # an empty ledger is not rolled over
    p = await ml.add_entry(b"a")
    await eventually(lambda: len(ml.ledger_ids) == 2)
    q = await ml.add_entry(b"b")
    assert q.ledger_id > p.ledger_id


async def test_min_rollover_time_defers_rollover(factory: ManagedLedgerFactoryImpl) -> None:
    ml = await open_ml(factory, max_entries_per_ledger=2, min_ledger_rollover_seconds=0.1)
    await ml.open_cursor("sub", InitialPosition.EARLIEST)
    p = await add(ml, 5)
    assert {x.ledger_id for x in p} == {p[0].ledger_id}
    await asyncio.sleep(0.12)
    q = await ml.add_entry(b"x")
    r = await ml.add_entry(b"y")
    assert q.ledger_id == p[0].ledger_id and r.ledger_id > q.ledger_id


async def test_close_during_adds_keeps_every_acknowledged_entry(make_factory: MakeFactory) -> None:
    f = make_factory()
    ml = await open_ml(f, max_entries_per_ledger=3)
    await ml.open_cursor("sub", InitialPosition.EARLIEST)
    adds = [asyncio.ensure_future(ml.add_entry(str(i).encode())) for i in range(50)]
    await asyncio.sleep(0)
    await ml.close()
    results = await asyncio.gather(*adds, return_exceptions=True)
    ok = [r for r in results if isinstance(r, Position)]
    assert all(isinstance(r, Position | ManagedLedgerClosedError) for r in results)
    assert ok == sorted(ok)
    ml2 = await open_ml(f, max_entries_per_ledger=3)
    assert ml2.number_of_entries == len(ok)
    c = await ml2.open_cursor("sub")
    assert [e.position for e in await c.read_entries(100)] == ok
    await f.close()


async def test_factory_open_is_shared_and_delete_when_closed(make_factory: MakeFactory, client) -> None:
    f = make_factory()
    a, b = await asyncio.gather(f.open(NAME, config()), f.open(NAME, config()))
    assert a is b
    await a.add_entry(b"x")
    await a.open_cursor("sub")
    ids = a.ledger_ids
    await a.close()
    assert await f.exists(NAME)
    await f.delete(NAME)
    assert not await f.exists(NAME)
    assert not any([await ledger_exists(client, lid) for lid in ids])
    await f.close()


async def test_trim_moves_lagging_reader_and_absorbs_its_acks(factory: ManagedLedgerFactoryImpl) -> None:
    ml = await open_ml(factory, max_entries_per_ledger=2)
    sub = await ml.open_cursor("sub", InitialPosition.EARLIEST)
    reader = ml.new_non_durable_cursor("reader", EARLIEST)
    p = await add(ml, 7)  # ledgers [0,1] [2,3] [4,5] [6]
    reader.delete([p[4], p[6]])
    sub.mark_delete(p[3])
    await eventually(lambda: ml.first_position == p[4])
    # the reader's mark-delete moved to the first remaining ledger and took its ack of p[4]
    assert reader.mark_delete_position == p[4]
    assert reader.backlog_entries() == 1
    assert [e.position for e in await reader.read_entries(10)] == [p[5]]


async def test_properties_persist_and_ledgers_info(make_factory: MakeFactory) -> None:
    factory = make_factory()
    ml = await open_ml(factory, max_entries_per_ledger=2)
    await ml.open_cursor("holds-data", InitialPosition.EARLIEST)  # without a cursor, consumed ledgers are trimmed
    await add(ml, 5)
    await ml.set_properties({"a": "1", "b": "2"})
    await ml.set_properties({"b": None})
    info = ml.ledgers_info()
    assert sum(li["entries"] for li in info) == 5 and len(info) >= 3
    assert sum(li["size"] for li in info) == ml.total_size
    await factory.close()
    reopened = await open_ml(make_factory())
    assert reopened.properties == {"a": "1"}


async def test_batch_index_state_persists(make_factory: MakeFactory) -> None:
    factory = make_factory()
    ml = await open_ml(factory)
    cursor = await ml.open_cursor("sub", InitialPosition.EARLIEST)
    positions = await add(ml, 3)
    cursor.set_batch_unacked(positions[1], [0b1010])
    cursor.set_batch_unacked(positions[2], [0b1])
    cursor.delete([positions[2]])  # fully acked later: its batch state is dropped
    await cursor.flush()
    await factory.close()
    reopened = await open_ml(make_factory())
    again = reopened.cursors["sub"]
    assert again.batch_unacked(positions[1]) == [0b1010]
    assert again.batch_unacked(positions[2]) is None
    await again.reset(positions[0])
    assert again.batch_unacked(positions[1]) is None


async def test_persisted_batch_index_state_is_capped(make_factory: MakeFactory, store: EmbeddedMetadataStore) -> None:
    """The batch-index ack state persisted in the cursor's metadata value is bounded (Pulsar's
    managedLedgerMaxBatchDeletedIndexToPersist): past the cap the oldest partly acked batches are
    kept; the rest is tracked in memory only (redelivered after a crash) and persisting never stops."""
    factory = make_factory()
    ml = await open_ml(factory, max_batch_deleted_index_to_persist=3, max_unacked_ranges_to_persist=2)
    cursor = await ml.open_cursor("sub", InitialPosition.EARLIEST)
    positions = await add(ml, 12)
    for p in positions[:10]:
        cursor.set_batch_unacked(p, [0b110])
    cursor.delete([positions[1], positions[3], positions[5], positions[7]])  # 4 ack holes
    await cursor.flush()
    stored = await store.get(cursor_path(NAME, "sub"))
    assert stored is not None
    doc = json.loads(stored.data)
    assert [item[:2] for item in doc["batchIndexes"]] == [list(p) for p in (positions[0], positions[2], positions[4])]
    assert len(doc["individuallyDeleted"]) == 2
    assert cursor.batch_unacked(positions[9]) == [0b110]  # still tracked in memory
    await factory.close()
