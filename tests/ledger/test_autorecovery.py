"""Auto-recovery: a lost bookie's entries are copied back to two replicas, once, under a lock."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from ledger_helpers import Cluster

from magnetar.bookie.local import LocalBookieClient
from magnetar.ledger.api import LedgerConfig, LedgerFencedError
from magnetar.ledger.autorecovery import AutoRecovery, AutoRecoveryConfig
from magnetar.ledger.client import BookieLedgerClient
from magnetar.ledger.handles import LedgerWriteHandle
from magnetar.ledger.metadata import LedgerMetadata, LedgerState
from magnetar.ledger.registry import StaticBookieRegistry
from magnetar.metadata.api import NOT_EXISTS
from magnetar.metadata.embedded import EmbeddedMetadataStore

STRIPED = LedgerConfig(ensemble_size=3, write_quorum=2, ack_quorum=2)


def data(lid: int, i: int) -> bytes:
    return b"ledger-%d-entry-%d" % (lid, i)


@pytest.fixture
async def big(tmp_path: Path, store: EmbeddedMetadataStore) -> AsyncIterator[Cluster]:
    c = Cluster(tmp_path, store, n=5)
    await c.start()
    yield c
    await c.close()


def worker(cluster: Cluster, lost: str | None = None, **config: float) -> AutoRecovery:
    """An auto-recovery worker with its own registry, from which ``lost`` is removed."""
    registry = StaticBookieRegistry([LocalBookieClient(b) for b in cluster.bookies])
    if lost is not None:
        registry.remove(lost)
    config.setdefault("lost_bookie_grace_s", 0)
    return AutoRecovery(cluster.store, registry, AutoRecoveryConfig(**config))  # type: ignore[arg-type]


async def write(h: LedgerWriteHandle, first: int, last: int) -> None:
    await asyncio.wait_for(asyncio.gather(*(h.append(data(h.ledger_id, i)) for i in range(first, last + 1))), 10)


async def on_bookie(client: BookieLedgerClient, bookie: str) -> LedgerWriteHandle:
    """A new ledger whose ensemble includes ``bookie``: placement is random (3 of 5 bookies), and a test
    whose ledgers all missed the lost bookie would have nothing to recover."""
    for _ in range(100):
        h = await client.create_ledger(STRIPED)
        assert isinstance(h, LedgerWriteHandle)
        if bookie in h.metadata.ensembles[0][1]:
            return h
        await h.close()
        await client.delete_ledger(h.ledger_id)
    raise AssertionError(f"no ensemble with {bookie} in 100 ledgers")


async def make_ledgers(cluster: Cluster, lost: str) -> tuple[list[int], BookieLedgerClient]:
    """Closed ledgers on the lost bookie, one of them with two fragments."""
    client, faulty = cluster.client(faulty=True)
    ids = []
    for _ in range(3):
        h = await on_bookie(client, lost)
        await write(h, 0, 29)
        ids.append(h.ledger_id)
        if len(ids) == 1:  # an ensemble change away from some bookie other than the lost one
            other = next(a for a in h.metadata.ensembles[0][1] if a != lost)
            faulty[other].fail_adds = True
            await write(h, 30, 59)
            faulty[other].fail_adds = False
            assert len(h.metadata.ensembles) == 2
        await h.close()
    return ids, client


def copies_needed(md: LedgerMetadata, lost: str) -> int:
    return sum(1 for e in range(md.last_entry_id + 1) if lost in md.write_set(e))


async def assert_fully_replicated(cluster: Cluster, lid: int, lost: str) -> None:
    """Two copies of every entry on surviving bookies, exactly where the metadata says."""
    md, _ = await cluster.store_manager.read(lid)  # type: ignore[attr-defined]
    assert lost not in md.all_bookies()
    survivors = {b.address: set(b.entry_ids(lid)) for b in cluster.bookies if b.address != lost}
    for e in range(md.last_entry_id + 1):
        holders = {a for a, ids in survivors.items() if e in ids}
        assert set(md.write_set(e)) <= holders and len(holders) >= 2, (lid, e, holders)


async def read_back(cluster: Cluster, lid: int, lost: str, n: int) -> None:
    registry = StaticBookieRegistry([LocalBookieClient(b) for b in cluster.bookies if b.address != lost])
    client = BookieLedgerClient(cluster.store, registry)
    r = await client.open_ledger(lid)
    assert [e.data for e in await r.read(0, n - 1)] == [data(lid, i) for i in range(n)]
    await client.close()


async def test_lost_bookie_is_rereplicated(big: Cluster) -> None:
    lost = big.bookies[0].address
    ids, client = await make_ledgers(big, lost)
    big.store_manager = client.manager  # type: ignore[attr-defined]
    before = {lid: (await client.manager.read(lid))[0] for lid in ids}
    affected = [lid for lid in ids if lost in before[lid].all_bookies()]
    assert affected
    await big.bookie(lost).close()  # gone for good
    ar = worker(big, lost)
    marked = await ar.audit()
    assert sorted(marked) == sorted(affected)
    assert await ar.under_replicated_ledgers() == sorted(affected)
    assert (await ar.audit()) == []  # marking is idempotent
    await ar.replicate_marked()
    assert await ar.under_replicated_ledgers() == []
    assert ar.stats.ledgers_recovered == len(affected)
    assert ar.stats.entries_copied == sum(copies_needed(before[lid], lost) for lid in affected)
    for lid in ids:
        await assert_fully_replicated(big, lid, lost)
        md, _ = await client.manager.read(lid)
        assert md.state is LedgerState.CLOSED and md.last_entry_id == before[lid].last_entry_id
        assert [f for f, _ in md.ensembles] == [f for f, _ in before[lid].ensembles]
        await read_back(big, lid, lost, md.last_entry_id + 1)
    status = await ar.status()
    assert status["underReplicatedLedgers"] == [] and status["lostBookies"] == [lost]
    assert status["entriesCopied"] == ar.stats.entries_copied and status["underReplicated"] == 0
    await ar.run_once()  # nothing left to do
    assert ar.stats.entries_copied == status["entriesCopied"]
    await ar.close()


async def test_lock_prevents_double_work(big: Cluster) -> None:
    lost = big.bookies[1].address
    ids, client = await make_ledgers(big, lost)
    big.store_manager = client.manager  # type: ignore[attr-defined]
    before = {lid: (await client.manager.read(lid))[0] for lid in ids}
    expected = sum(copies_needed(md, lost) for md in before.values())
    a, b = worker(big, lost), worker(big, lost)
    await a.audit()
    held = sorted(await a.under_replicated_ledgers())[0]
    # Another worker (its own session) holds one ledger's lock: this pass leaves it alone.
    other = await big.store.create_session(5.0)
    await big.store.put(f"/ledgers/underreplication/locks/L{held:010d}", b"other", NOT_EXISTS, session=other)
    await a.replicate_marked()
    assert await a.under_replicated_ledgers() == [held]
    assert a.stats.entries_copied == expected - copies_needed(before[held], lost)
    await other.close()  # the holder died: its ephemeral lock vanished
    # Two workers racing over what is left do it once between them.
    await asyncio.gather(a.run_once(), b.run_once())
    assert await a.under_replicated_ledgers() == []
    assert a.stats.entries_copied + b.stats.entries_copied == expected
    for lid in ids:
        await assert_fully_replicated(big, lid, lost)
    await a.close()
    await b.close()


async def test_open_ledger_waits_for_writer_then_is_recovered(big: Cluster) -> None:
    client, faulty = big.client(faulty=True)
    h = await client.create_ledger(STRIPED)
    assert isinstance(h, LedgerWriteHandle)
    await write(h, 0, 19)
    lost = h.metadata.ensembles[0][1][0]
    faulty[lost].fail_adds = faulty[lost].fail_reads = True
    big.store_manager = client.manager  # type: ignore[attr-defined]
    patient = worker(big, lost, open_ledger_grace_s=3600)
    await patient.run_once()
    # Only the writer's fragment holds the lost bookie: left to the writer, still marked.
    assert await patient.under_replicated_ledgers() == [h.ledger_id]
    assert patient.stats.entries_copied == 0
    await write(h, 20, 39)  # the writer replaces the bookie itself (new fragment at 20)
    await patient.run_once()  # now fragment 0 is not the writer's any more: copied
    assert await patient.under_replicated_ledgers() == []
    md, _ = await client.manager.read(h.ledger_id)
    assert md.state is LedgerState.OPEN and lost not in md.all_bookies()
    # A writer that never comes back: after the grace period the ledger is fenced and closed.
    h2 = await client.create_ledger(STRIPED)
    assert isinstance(h2, LedgerWriteHandle)
    await write(h2, 0, 9)
    lost2 = h2.metadata.ensembles[0][1][1]
    impatient = worker(big, lost2, open_ledger_grace_s=0)
    await impatient.run_once()
    md, _ = await client.manager.read(h2.ledger_id)
    assert md.state is LedgerState.CLOSED and md.last_entry_id == 9 and lost2 not in md.all_bookies()
    await assert_fully_replicated(big, h2.ledger_id, lost2)
    with pytest.raises(LedgerFencedError):
        await h2.append(b"too late")
    await patient.close()
    await impatient.close()


async def test_background_task_and_trigger(big: Cluster) -> None:
    lost = big.bookies[2].address
    ids, client = await make_ledgers(big, lost)
    big.store_manager = client.manager  # type: ignore[attr-defined]
    ar = worker(big, None, check_interval_s=3600)
    await ar.start()
    for _ in range(100):
        if ar.stats.passes:
            break
        await asyncio.sleep(0.02)
    assert (await ar.status())["running"] and await ar.under_replicated_ledgers() == []
    ar.registry.remove(lost)  # type: ignore[attr-defined]
    ar.trigger()
    for _ in range(200):
        if ar.stats.passes >= 2 and not await ar.under_replicated_ledgers():
            break
        await asyncio.sleep(0.02)
    assert ar.stats.ledgers_recovered >= 1
    for lid in ids:
        await assert_fully_replicated(big, lid, lost)
    await ar.close()
    assert not (await ar.status())["running"]


def test_cli_once_reports_lost_bookies(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from magnetar.cli.main import main
    from magnetar.ledger.ledger_manager import LedgerManager

    db = tmp_path / "meta.db"

    async def seed() -> None:
        store = EmbeddedMetadataStore(str(db))
        await store.start()
        md = LedgerMetadata(2, 2, 2, [(0, ["gone-1:3181", "gone-2:3181"])], state=LedgerState.CLOSED)
        await LedgerManager(store).create(7, md)
        await store.close()

    asyncio.run(seed())
    argv = ["autorecovery", "--metadata-url", f"embedded://{db}", "--once", "--lost-bookie-grace", "0"]
    assert main([*argv, "--log-level", "ERROR"]) == 0
    status = json.loads(capsys.readouterr().out)
    # No bookie is registered: both are lost, the ledger is marked, and nothing can host copies.
    assert status["lostBookies"] == ["gone-1:3181", "gone-2:3181"]
    assert status["underReplicatedLedgers"] == [7] and status["failures"] == 1
