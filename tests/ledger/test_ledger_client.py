"""Ledger client over three real bookies: striping, quorums, ordering, reads with fallback."""

from __future__ import annotations

import asyncio

import pytest
from ledger_helpers import Cluster

from magnetar.ledger import digest
from magnetar.ledger.api import (
    LedgerClosedError,
    LedgerConfig,
    LedgerError,
    NoSuchEntryError,
    NoSuchLedgerError,
    NotEnoughBookiesError,
)
from magnetar.ledger.errors import LedgerUnauthorizedError
from magnetar.ledger.handles import LedgerWriteHandle
from magnetar.ledger.metadata import LedgerState

STRIPED = LedgerConfig(ensemble_size=3, write_quorum=2, ack_quorum=2)


def data(i: int) -> bytes:
    return f"entry-{i}-".encode() * (1 + i % 7)


async def append_all(handle, n: int, start: int = 0) -> list[int]:  # type: ignore[no-untyped-def]
    return list(await asyncio.gather(*(handle.append(data(i)) for i in range(start, start + n))))


async def test_striping_and_close(cluster: Cluster) -> None:
    client, _ = cluster.client()
    h = await client.create_ledger(STRIPED)
    assert await append_all(h, 30) == list(range(30))
    assert h.last_add_confirmed == 29
    assert h.length == sum(len(data(i)) for i in range(30))
    md = h.metadata  # type: ignore[attr-defined]
    ensemble = md.ensembles[0][1]
    assert len(set(ensemble)) == 3
    # Entry e lives exactly on bookies (e + i) % 3 for i < 2, and nowhere else.
    for idx, address in enumerate(ensemble):
        stored = cluster.bookie(address).entry_ids(h.ledger_id)
        assert stored == [e for e in range(30) if (idx - e) % 3 < 2]
    # What a bookie stores is the framed entry (running length + checksum + data).
    first = cluster.bookie(ensemble[0])
    (_, stored), *_ = await first.read_entries(h.ledger_id, 0, 0)
    assert digest.unframe(h.ledger_id, 0, stored) == (data(0), len(data(0)))
    got = await h.read(0, 29)
    assert [e.data for e in got] == [data(i) for i in range(30)]
    await h.close()
    md, _ = await client.manager.read(h.ledger_id)
    assert md.state is LedgerState.CLOSED and md.last_entry_id == 29 and md.length == h.length
    with pytest.raises(LedgerClosedError):
        await h.append(b"after close")
    r = await client.open_ledger(h.ledger_id)
    assert r.last_add_confirmed == 29 and r.length == h.length
    assert [e.data for e in await r.read(10, 20)] == [data(i) for i in range(10, 21)]
    with pytest.raises(NoSuchEntryError):
        await r.read(25, 30)


async def test_ack_after_ack_quorum(cluster: Cluster) -> None:
    client, faulty = cluster.client(faulty=True)
    h = await client.create_ledger(LedgerConfig(ensemble_size=3, write_quorum=3, ack_quorum=2))
    slow = faulty[h.metadata.ensembles[0][1][2]]  # type: ignore[attr-defined]
    slow.add_gate = asyncio.Event()
    # Two of three bookies suffice: the appends complete while the third holds them back.
    assert await asyncio.wait_for(append_all(h, 10), 5) == list(range(10))
    assert cluster.bookie(slow.address).entry_ids(h.ledger_id) == []
    slow.add_gate.set()
    await asyncio.sleep(0.05)
    for _ in range(50):
        if len(cluster.bookie(slow.address).entry_ids(h.ledger_id)) == 10:
            break
        await asyncio.sleep(0.02)
    assert cluster.bookie(slow.address).entry_ids(h.ledger_id) == list(range(10))
    await h.close()


async def test_no_ack_before_quorum_and_in_order_completion(cluster: Cluster) -> None:
    client, faulty = cluster.client(faulty=True)
    h = await client.create_ledger(STRIPED)
    ensemble = h.metadata.ensembles[0][1]  # type: ignore[attr-defined]
    # Hold back bookie 1: entries 0 and 1 need it (write sets {0,1} and {1,2}), entry 2 does not.
    gate = faulty[ensemble[1]].add_gate = asyncio.Event()
    done: list[int] = []
    futs = [asyncio.ensure_future(h.append(data(i))) for i in range(3)]
    for f in futs:
        f.add_done_callback(lambda f: done.append(f.result()))
    await asyncio.sleep(0.2)
    # Entry 2 reached its ack quorum but must not complete before 0 and 1.
    assert done == [] and h.last_add_confirmed == -1
    assert cluster.bookie(ensemble[2]).entry_ids(h.ledger_id) == [1, 2]
    gate.set()
    assert await asyncio.wait_for(asyncio.gather(*futs), 5) == [0, 1, 2]
    assert done == [0, 1, 2] and h.last_add_confirmed == 2
    # Later adds carry the LAC: the bookies learn that entry 2 is confirmed.
    await h.append(data(3))
    assert max([(await cluster.bookie(a).read_last_add_confirmed(h.ledger_id))[0] for a in ensemble]) == 2
    await h.close()


async def test_reads_fall_back_to_other_replicas(cluster: Cluster) -> None:
    client, _ = cluster.client()
    h = await client.create_ledger(STRIPED)
    await append_all(h, 40)
    await h.close()
    ensemble = h.metadata.ensembles[0][1]  # type: ignore[attr-defined]
    reader, rf = cluster.client(faulty=True)
    r = await reader.open_ledger(h.ledger_id)
    rf[ensemble[0]].fail_reads = True
    assert [e.data for e in await r.read(0, 39)] == [data(i) for i in range(40)]
    # Every entry has a second replica, but not a third: two failed bookies lose some entries.
    rf[ensemble[1]].fail_reads = True
    with pytest.raises(LedgerError):
        await r.read(0, 39)
    # Entries whose write set includes bookie 2 (e % 3 in {1, 2}) are still readable.
    assert [e.data for e in await r.read(1, 2)] == [data(1), data(2)]
    with pytest.raises(LedgerError):
        await r.read(3, 3)  # write set {0, 1}
    rf[ensemble[0]].fail_reads = rf[ensemble[1]].fail_reads = False
    # A replica with damaged bytes is detected by the checksum and skipped.
    victim = cluster.bookie(ensemble[0])
    key = digest.master_key(b"")
    await victim.add_entry(h.ledger_id, 0, key, -1, b"\0" * 20 + b"garbage", recovery=True)
    assert (await r.read(0, 0))[0].data == data(0)


async def test_reads_batch_per_bookie(cluster: Cluster) -> None:
    client, faulty = cluster.client(faulty=True)
    h = await client.create_ledger(LedgerConfig(ensemble_size=3, write_quorum=3, ack_quorum=2))
    await append_all(h, 300)
    before = sum(f.reads for f in faulty.values())
    got = await h.read(0, 299)
    assert [e.entry_id for e in got] == list(range(300))
    # E == Qw: every bookie has everything, so 300 entries take two requests (256 per batch).
    assert sum(f.reads for f in faulty.values()) - before == 2
    await h.close()


async def test_add_failure_below_ack_quorum_fails_handle(cluster: Cluster) -> None:
    client, faulty = cluster.client(faulty=True)
    h = await client.create_ledger(STRIPED)
    await append_all(h, 5)
    broken = h.metadata.ensembles[0][1][0]  # type: ignore[attr-defined]
    faulty[broken].fail_adds = True
    # Entry 5's write set is bookies {2, 0}: bookie 0 fails and Qa=2 cannot be reached.
    with pytest.raises(LedgerError):
        await h.append(data(5))
    with pytest.raises(LedgerError):
        await h.append(data(6))
    await h.close()  # sealed at the last confirmed entry
    md, _ = await client.manager.read(h.ledger_id)
    assert md.state is LedgerState.CLOSED and md.last_entry_id == 4


async def test_failure_within_tolerance_still_acks(cluster: Cluster) -> None:
    client, faulty = cluster.client(faulty=True)
    h = await client.create_ledger(LedgerConfig(ensemble_size=3, write_quorum=3, ack_quorum=2))
    faulty[h.metadata.ensembles[0][1][1]].fail_adds = True  # type: ignore[attr-defined]
    assert await append_all(h, 10) == list(range(10))
    await h.close()


async def test_placement_and_errors(cluster: Cluster) -> None:
    client, _ = cluster.client()
    with pytest.raises(NotEnoughBookiesError):
        await client.create_ledger(LedgerConfig(ensemble_size=4, write_quorum=2, ack_quorum=2))
    # Least used first: three single-bookie ledgers land on three different bookies.
    handles = [await client.create_ledger(LedgerConfig()) for _ in range(3)]
    assert len({h.metadata.ensembles[0][1][0] for h in handles}) == 3  # type: ignore[attr-defined]
    for h in handles:
        await h.close()
    with pytest.raises(NoSuchLedgerError):
        await client.open_ledger(10**9)
    secret = await client.create_ledger(LedgerConfig(password=b"pw"))
    await secret.append(b"x")
    await secret.close()
    with pytest.raises(LedgerUnauthorizedError):
        await client.open_ledger(secret.ledger_id, password=b"wrong")
    assert (await (await client.open_ledger(secret.ledger_id, password=b"pw")).read(0, 0))[0].data == b"x"


async def test_delete_ledger(cluster: Cluster) -> None:
    client, _ = cluster.client()
    h = await client.create_ledger(STRIPED)
    await append_all(h, 10)
    await h.close()
    await client.delete_ledger(h.ledger_id)
    with pytest.raises(NoSuchLedgerError):
        await client.open_ledger(h.ledger_id)
    for b in cluster.bookies:
        assert h.ledger_id not in b.ledger_ids()
    await client.delete_ledger(h.ledger_id)  # already gone: fine


async def test_open_without_recovery_sees_confirmed_prefix(cluster: Cluster) -> None:
    writer, _ = cluster.client()
    h = await writer.create_ledger(STRIPED)
    for i in range(10):
        await h.append(data(i))  # one at a time, so each add carries the previous one as LAC
    reader, _ = cluster.client()
    r = await reader.open_ledger(h.ledger_id, recovery=False)
    # The bookies learned LAC 8 from entry 9's add: the reader sees 0..8 and does not fence.
    assert r.last_add_confirmed == 8
    assert [e.entry_id for e in await r.read(0, 8)] == list(range(9))
    for i in range(10, 15):
        await h.append(data(i))
    assert [e.entry_id for e in await r.read(9, 13)] == list(range(9, 14))  # LAC refreshed
    with pytest.raises(NoSuchEntryError):
        await r.read(14, 14)
    assert r.length == sum(len(data(i)) for i in range(14))
    await h.append(data(15))  # the writer was not fenced
    await h.close()


async def test_ledger_ids_allocated_in_blocks(cluster: Cluster) -> None:
    a, _ = cluster.client(id_block_size=100)
    b, _ = cluster.client(id_block_size=100)
    ids_a = [(await a.create_ledger(LedgerConfig())).ledger_id for _ in range(5)]
    ids_b = [(await b.create_ledger(LedgerConfig())).ledger_id for _ in range(3)]
    assert ids_a == list(range(ids_a[0], ids_a[0] + 5))
    assert ids_b == list(range(ids_a[0] + 100, ids_a[0] + 103))
    value = await cluster.store.get("/ledgers/idgen")
    assert value is not None and int(value.data) == ids_a[0] + 200 and value.stat.version == 1
    children = await cluster.store.get_children("/ledgers")
    assert f"L{ids_a[0]:010d}" in children


async def test_data_survives_bookie_restart(cluster: Cluster) -> None:
    client, _ = cluster.client()
    h = await client.create_ledger(STRIPED)
    blobs = [bytes([i % 251]) * (i * 97 % 5000) for i in range(60)]
    await asyncio.gather(*(h.append(b) for b in blobs))
    for b in cluster.bookies[:2]:
        await b.checkpoint()  # some data in entry logs, some only in journals
    await h.close()
    await cluster.restart_bookies()
    reader, _ = cluster.client()
    r = await reader.open_ledger(h.ledger_id)
    assert [e.data for e in await r.read(0, 59)] == blobs


async def test_fast_path_handle_type(cluster: Cluster) -> None:
    client, _ = cluster.client()
    h = await client.create_ledger(LedgerConfig())
    assert isinstance(h, LedgerWriteHandle)
    assert all(n is not None for n in h._nowait)  # LocalBookieClient: no task per add
    futs = [h.append_nowait(b"%d" % i) for i in range(1000)]
    assert await asyncio.gather(*futs) == list(range(1000))
    await h.close()


async def test_append_async_tells_each_outcome_once_in_order(cluster: Cluster) -> None:
    """The publish hot path's append: callbacks (no future hop) with entry ids in order, then the error
    of a failed handle for the adds it could not complete."""
    client, faulty = cluster.client(faulty=True)
    h = await client.create_ledger(STRIPED)
    heard: list[tuple[int | None, BaseException | None]] = []
    for i in range(20):
        h.append_async(data(i), lambda eid, exc: heard.append((eid, exc)))
    assert heard == []  # never before append_async returns
    async with asyncio.timeout(10):
        while len(heard) < 20:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    assert heard == [(i, None) for i in range(20)]
    faulty[h.metadata.ensembles[0][1][2]].fail_adds = True  # type: ignore[attr-defined]
    failed: list[tuple[int | None, BaseException | None]] = []
    for i in range(20, 23):  # entry 20's write set is bookies {2, 0}: Qa=2 cannot be reached
        h.append_async(data(i), lambda eid, exc: failed.append((eid, exc)))
    async with asyncio.timeout(10):
        while len(failed) < 3:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)
    assert len(failed) == 3 and all(eid is None and isinstance(exc, LedgerError) for eid, exc in failed)
    await h.close()


async def test_a_cancelled_append_does_not_stall_the_adds_behind_it(cluster: Cluster) -> None:
    """A caller giving up on its append (cancelling the future) must not hold back the entries after it:
    they are confirmed in order as their acks arrive, well before the add timeout."""
    client, _ = cluster.client(faulty=True)
    h = await client.create_ledger(STRIPED)
    first = h.append_nowait(data(0))
    first.cancel()
    rest = [h.append_nowait(data(i)) for i in range(1, 6)]
    async with asyncio.timeout(5):
        ids = await asyncio.gather(*rest)
    assert ids == [1, 2, 3, 4, 5]
    await h.close()


async def test_an_append_reaches_the_bookies_without_a_copy(cluster: Cluster) -> None:
    """The write handle hands each bookie the appended bytes themselves with the digest header beside
    them (no framed copy): one copy of an entry while it is in flight and in the write caches."""
    client, _ = cluster.client()
    h = await client.create_ledger(STRIPED)
    big = bytes(range(256)) * 512
    assert await h.append(big) == 0
    ensemble = h.metadata.ensembles[0][1]  # type: ignore[attr-defined]
    for address in ensemble[:2]:  # entry 0's write set
        head, kept = cluster.bookie(address)._cache[h.ledger_id].get(0)  # type: ignore[misc]
        assert kept is big
        assert head + kept == digest.frame(h.ledger_id, 0, len(big), big)
    assert [e.data for e in await h.read(0, 0)] == [big]
    await h.close()
