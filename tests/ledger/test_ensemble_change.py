"""Ensemble changes: a failing bookie is replaced in a new fragment and writes carry on."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from ledger_helpers import Cluster

from magnetar.ledger.api import LedgerConfig, LedgerFencedError, NotEnoughBookiesError
from magnetar.ledger.handles import LedgerWriteHandle
from magnetar.ledger.metadata import LedgerMetadata, LedgerState
from magnetar.ledger.registry import StaticBookieRegistry
from magnetar.metadata.embedded import EmbeddedMetadataStore

STRIPED = LedgerConfig(ensemble_size=3, write_quorum=2, ack_quorum=2)


def data(i: int) -> bytes:
    return b"entry-%d-" % i * (1 + i % 5)


@pytest.fixture
async def big(tmp_path: Path, store: EmbeddedMetadataStore) -> AsyncIterator[Cluster]:
    c = Cluster(tmp_path, store, n=5)
    await c.start()
    yield c
    await c.close()


async def append_range(h: LedgerWriteHandle, first: int, last: int) -> list[int]:
    return list(await asyncio.wait_for(asyncio.gather(*(h.append(data(i)) for i in range(first, last + 1))), 10))


def assert_placement(cluster: Cluster, lid: int, md: LedgerMetadata, last: int) -> None:
    """Every entry is on each bookie of its fragment's write set."""
    stored = {b.address: set(b.entry_ids(lid)) for b in cluster.bookies}
    for e in range(last + 1):
        for address in md.write_set(e):
            assert e in stored[address], f"entry {e} missing on {address}"


async def read_all(cluster: Cluster, lid: int, last: int) -> None:
    reader, _ = cluster.client()
    r = await reader.open_ledger(lid)
    assert r.last_add_confirmed == last
    assert [e.data for e in await r.read(0, last)] == [data(i) for i in range(last + 1)]


async def test_bookie_failing_mid_stream_is_replaced(big: Cluster) -> None:
    client, faulty = big.client(faulty=True)
    h = await client.create_ledger(STRIPED)
    assert isinstance(h, LedgerWriteHandle)
    assert await append_range(h, 0, 29) == list(range(30))
    broken = h.metadata.ensembles[0][1][1]
    faulty[broken].fail_adds = True
    # Pipelined adds keep completing, in order, across the change.
    assert await append_range(h, 30, 99) == list(range(30, 100))
    md, _ = await client.manager.read(h.ledger_id)
    assert len(md.ensembles) == 2 and md.ensembles[1][0] == 30
    assert broken not in md.ensembles[1][1] and md.ensembles[0][1] == h.metadata.ensembles[0][1]
    assert [a for a in md.ensembles[1][1] if a not in md.ensembles[0][1]] != []
    assert md.ensembles[1][1][0] == md.ensembles[0][1][0] and md.ensembles[1][1][2] == md.ensembles[0][1][2]
    assert h.ensemble_changes == 1
    await h.close()
    md, _ = await client.manager.read(h.ledger_id)
    assert md.state is LedgerState.CLOSED and md.last_entry_id == 99 and len(md.ensembles) == 2
    assert_placement(big, h.ledger_id, md, 99)
    await read_all(big, h.ledger_id, 99)


async def test_in_flight_adds_resent_after_timeout(big: Cluster) -> None:
    client, faulty = big.client(faulty=True, add_timeout_s=0.4)
    h = await client.create_ledger(STRIPED)
    assert isinstance(h, LedgerWriteHandle)
    await append_range(h, 0, 9)
    hung = faulty[h.metadata.ensembles[0][1][2]]
    hung.add_gate = asyncio.Event()  # never opened: adds to it hang
    # Entries whose write set includes the hung bookie wait until the add timeout replaces it.
    assert await append_range(h, 10, 39) == list(range(10, 40))
    assert h.metadata.ensembles[-1][0] == 10 and hung.address not in h.metadata.ensembles[-1][1]
    await h.close()
    md, _ = await client.manager.read(h.ledger_id)
    assert_placement(big, h.ledger_id, md, 39)
    await read_all(big, h.ledger_id, 39)
    hung.add_gate.set()


async def test_replacement_fails_too_and_concurrent_failures(big: Cluster) -> None:
    client, faulty = big.client(faulty=True)
    h = await client.create_ledger(STRIPED)
    assert isinstance(h, LedgerWriteHandle)
    await append_range(h, 0, 9)
    faulty[h.metadata.ensembles[0][1][0]].fail_adds = True
    await append_range(h, 10, 19)
    replacement = h.metadata.ensembles[1][1][0]
    faulty[replacement].fail_adds = True  # the replacement dies as well
    await append_range(h, 20, 29)
    md, _ = await client.manager.read(h.ledger_id)
    assert [first for first, _ in md.ensembles] == [0, 10, 20]
    assert replacement not in md.ensembles[2][1]
    await h.close()
    md, _ = await client.manager.read(h.ledger_id)
    assert_placement(big, h.ledger_id, md, 29)
    await read_all(big, h.ledger_id, 29)
    assert h.metadata.ensembles[0][1][0] not in md.ensembles[2][1]  # failed bookies are not reused

    # Two failures at once on a fresh ledger: both spares step in.
    for f in faulty.values():
        f.fail_adds = False
    h2 = await client.create_ledger(STRIPED)
    assert isinstance(h2, LedgerWriteHandle)
    await append_range(h2, 0, 9)
    first = h2.metadata.ensembles[0][1]
    faulty[first[1]].fail_adds = faulty[first[2]].fail_adds = True
    assert await append_range(h2, 10, 39) == list(range(10, 40))
    md, _ = await client.manager.read(h2.ledger_id)
    assert md.ensembles[-1][0] == 10 and not {first[1], first[2]} & set(md.ensembles[-1][1])
    await h2.close()
    md, _ = await client.manager.read(h2.ledger_id)
    assert_placement(big, h2.ledger_id, md, 39)
    await read_all(big, h2.ledger_id, 39)


async def test_not_enough_bookies_then_writable_again(cluster: Cluster) -> None:
    client, faulty = cluster.client(faulty=True, add_timeout_s=0.4)
    registry = client.ctx.registry
    assert isinstance(registry, StaticBookieRegistry)
    h = await client.create_ledger(STRIPED)
    await append_range(h, 0, 9)
    faulty[h.metadata.ensembles[0][1][1]].fail_adds = True  # type: ignore[attr-defined]
    # Three bookies, all in the ensemble: nobody can take over and Qa=2 is out of reach.
    with pytest.raises(NotEnoughBookiesError, match="no writable bookie"):
        await append_range(h, 10, 19)
    with pytest.raises(NotEnoughBookiesError):
        await h.append(b"later")
    await h.close()  # sealed at the last confirmed entry
    md, _ = await client.manager.read(h.ledger_id)
    assert md.state is LedgerState.CLOSED and md.last_entry_id == 9
    await read_all(cluster, h.ledger_id, 9)

    # Degraded but tolerable (Qw=2, Qa=1): writes go on, and once a bookie is writable again
    # the handle replaces the failed slot by itself.
    for f in faulty.values():
        f.fail_adds = False
    big = await client.create_ledger(LedgerConfig(ensemble_size=2, write_quorum=2, ack_quorum=1))
    assert isinstance(big, LedgerWriteHandle)
    spare = next(a for a in faulty if a not in big.metadata.ensembles[0][1])
    registry.set_writable(spare, False)
    broken = big.metadata.ensembles[0][1][0]
    faulty[broken].fail_adds = True
    assert await append_range(big, 0, 9) == list(range(10))  # Qa=1 still reachable
    assert len(big.metadata.ensembles) == 1
    registry.set_writable(spare, True)
    for _ in range(100):
        if len(big.metadata.ensembles) == 2:
            break
        await asyncio.sleep(0.05)
    assert big.metadata.ensembles[-1][1] == [spare, big.metadata.ensembles[0][1][1]]
    await append_range(big, 10, 19)
    await big.close()
    md, _ = await client.manager.read(big.ledger_id)
    for e in range(10, 20):
        assert all(e in cluster.bookie(a).entry_ids(big.ledger_id) for a in md.write_set(e))


async def test_recovery_open_of_ledger_with_several_fragments(big: Cluster) -> None:
    writer, faulty = big.client(faulty=True)
    h = await writer.create_ledger(STRIPED)
    assert isinstance(h, LedgerWriteHandle)
    await append_range(h, 0, 14)
    faulty[h.metadata.ensembles[0][1][0]].fail_adds = True
    await append_range(h, 15, 29)
    faulty[h.metadata.ensembles[1][1][2]].fail_adds = True
    await append_range(h, 30, 44)
    assert len(h.metadata.ensembles) == 3
    # A stale reader (opened before the changes) still finds every entry.
    recoverer, _ = big.client()
    r = await recoverer.open_ledger(h.ledger_id)
    assert r.last_add_confirmed == 44
    assert [e.data for e in await r.read(0, 44)] == [data(i) for i in range(45)]
    md, _ = await recoverer.manager.read(h.ledger_id)
    assert md.state is LedgerState.CLOSED and len(md.ensembles) == 3
    with pytest.raises(LedgerFencedError):
        await h.append(b"too late")


async def test_stale_read_handle_reloads_metadata(big: Cluster) -> None:
    writer, faulty = big.client(faulty=True)
    h = await writer.create_ledger(STRIPED)
    assert isinstance(h, LedgerWriteHandle)
    for i in range(10):
        await h.append(data(i))
    reader, rf = big.client(faulty=True)
    r = await reader.open_ledger(h.ledger_id, recovery=False)
    old = h.metadata.ensembles[0][1]
    faulty[old[0]].fail_adds = True
    for i in range(10, 20):
        await h.append(data(i))
    assert len(h.metadata.ensembles) == 2
    # The reader's metadata says entry 12 is on old[0] and old[1]; neither can serve it now.
    rf[old[0]].fail_reads = rf[old[1]].fail_reads = True
    assert (await r.read(12, 12))[0].data == data(12)
    assert len(r.metadata.ensembles) == 2  # type: ignore[attr-defined]
    await h.close()
