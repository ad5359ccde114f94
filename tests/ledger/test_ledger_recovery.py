"""Recovery open: fencing the old writer, finding the true end, closing with compare-and-swap."""

from __future__ import annotations

import asyncio

import pytest
from ledger_helpers import Cluster

from magnetar.ledger.api import LedgerConfig, LedgerError, LedgerFencedError
from magnetar.ledger.errors import MetadataVersionConflictError
from magnetar.ledger.metadata import LedgerState

STRIPED = LedgerConfig(ensemble_size=3, write_quorum=2, ack_quorum=2)


def data(i: int) -> bytes:
    return b"payload-%d" % i


async def test_recovery_fences_writer_and_closes_at_last_entry(cluster: Cluster) -> None:
    writer, _ = cluster.client()
    h = await writer.create_ledger(STRIPED)
    await asyncio.gather(*(h.append(data(i)) for i in range(20)))  # bookies' LAC lags behind
    recoverer, _ = cluster.client()
    r = await recoverer.open_ledger(h.ledger_id, recovery=True)
    assert r.last_add_confirmed == 19
    assert r.length == sum(len(data(i)) for i in range(20))
    assert [e.data for e in await r.read(0, 19)] == [data(i) for i in range(20)]
    md, _ = await recoverer.manager.read(h.ledger_id)
    assert md.state is LedgerState.CLOSED and md.last_entry_id == 19 and md.length == r.length
    with pytest.raises(LedgerFencedError):
        await h.append(b"too late")
    with pytest.raises(LedgerFencedError):
        await h.append(b"still too late")
    with pytest.raises(LedgerFencedError):
        await h.close()
    # The ledger stays as recovery closed it.
    md2, _ = await recoverer.manager.read(h.ledger_id)
    assert md2 == md


async def test_recovery_rereplicates_partially_written_tail(cluster: Cluster) -> None:
    writer, faulty = cluster.client(faulty=True)
    h = await writer.create_ledger(STRIPED)
    for i in range(10):
        await h.append(data(i))
    ensemble = h.metadata.ensembles[0][1]  # type: ignore[attr-defined]
    # Entry 10 goes to bookies {1, 2}; hold bookie 2 back so only bookie 1 gets it: not acked.
    gate = faulty[ensemble[2]].add_gate = asyncio.Event()
    pending = asyncio.ensure_future(h.append(data(10)))
    await asyncio.sleep(0.1)
    assert not pending.done()
    assert 10 in cluster.bookie(ensemble[1]).entry_ids(h.ledger_id)
    assert 10 not in cluster.bookie(ensemble[2]).entry_ids(h.ledger_id)
    recoverer, _ = cluster.client()
    r = await recoverer.open_ledger(h.ledger_id)
    # The surviving copy was found and re-added to the whole write set before closing.
    assert r.last_add_confirmed == 10
    assert 10 in cluster.bookie(ensemble[2]).entry_ids(h.ledger_id)
    assert (await r.read(10, 10))[0].data == data(10)
    gate.set()  # the old writer's held-back add now hits a fenced bookie
    with pytest.raises(LedgerFencedError):
        await asyncio.wait_for(pending, 5)


async def test_recovery_drops_entry_nobody_has(cluster: Cluster) -> None:
    writer, faulty = cluster.client(faulty=True)
    h = await writer.create_ledger(STRIPED)
    for i in range(5):
        await h.append(data(i))
    for f in faulty.values():
        f.add_gate = asyncio.Event()  # entry 5 reaches no bookie
    pending = asyncio.ensure_future(h.append(data(5)))
    recoverer, _ = cluster.client()
    r = await recoverer.open_ledger(h.ledger_id)
    assert r.last_add_confirmed == 4
    for f in faulty.values():
        f.add_gate.set()  # type: ignore[union-attr]
    with pytest.raises(LedgerFencedError):
        await asyncio.wait_for(pending, 5)


async def test_recovery_tolerates_one_unreachable_bookie(cluster: Cluster) -> None:
    writer, _ = cluster.client()
    h = await writer.create_ledger(STRIPED)
    await asyncio.gather(*(h.append(data(i)) for i in range(12)))
    ensemble = h.metadata.ensembles[0][1]  # type: ignore[attr-defined]
    recoverer, rf = cluster.client(faulty=True)
    rf[ensemble[0]].fail_fence = True
    rf[ensemble[0]].fail_reads = True
    r = await recoverer.open_ledger(h.ledger_id)
    assert r.last_add_confirmed == 11
    with pytest.raises(LedgerFencedError):
        await h.append(b"x")  # every write set has a fenced member


async def test_recovery_fails_when_it_cannot_fence_enough(cluster: Cluster) -> None:
    writer, _ = cluster.client()
    h = await writer.create_ledger(STRIPED)
    await h.append(b"a")
    ensemble = h.metadata.ensembles[0][1]  # type: ignore[attr-defined]
    recoverer, rf = cluster.client(faulty=True)
    rf[ensemble[0]].fail_fence = rf[ensemble[1]].fail_fence = True
    with pytest.raises(LedgerError, match="fence"):
        await recoverer.open_ledger(h.ledger_id)
    md, _ = await recoverer.manager.read(h.ledger_id)
    assert md.state is LedgerState.IN_RECOVERY  # a later attempt can finish the job
    rf[ensemble[0]].fail_fence = rf[ensemble[1]].fail_fence = False
    r = await recoverer.open_ledger(h.ledger_id)
    assert r.last_add_confirmed == 0


async def test_concurrent_recoveries_agree(cluster: Cluster) -> None:
    writer, _ = cluster.client()
    h = await writer.create_ledger(STRIPED)
    await asyncio.gather(*(h.append(data(i)) for i in range(30)))
    c1, _ = cluster.client()
    c2, _ = cluster.client()
    r1, r2 = await asyncio.gather(c1.open_ledger(h.ledger_id), c2.open_ledger(h.ledger_id))
    assert r1.last_add_confirmed == r2.last_add_confirmed == 29
    assert r1.length == r2.length
    md, _ = await c1.manager.read(h.ledger_id)
    assert md.state is LedgerState.CLOSED and md.last_entry_id == 29


async def test_recovery_of_empty_ledger_and_of_closed_ledger(cluster: Cluster) -> None:
    writer, _ = cluster.client()
    h = await writer.create_ledger(STRIPED)
    recoverer, _ = cluster.client()
    r = await recoverer.open_ledger(h.ledger_id)
    assert (r.last_add_confirmed, r.length) == (-1, 0)
    with pytest.raises(LedgerFencedError):
        await h.append(b"x")
    _, version = await recoverer.manager.read(h.ledger_id)
    await recoverer.open_ledger(h.ledger_id)  # CLOSED: only reads the metadata
    assert (await recoverer.manager.read(h.ledger_id))[1] == version


async def test_metadata_cas_conflicts(cluster: Cluster) -> None:
    client, _ = cluster.client()
    h = await client.create_ledger(STRIPED)
    await h.append(b"a")
    md, version = await client.manager.read(h.ledger_id)
    await client.manager.write(h.ledger_id, md.evolve(custom_metadata={"k": b"v"}), version)
    with pytest.raises(MetadataVersionConflictError):
        await client.manager.write(h.ledger_id, md, version)  # stale version
    # The writer holds the old version: its close notices, re-reads, and still seals (the
    # ledger is OPEN and nobody else closed it) ... unless a recovery started meanwhile.
    md, version = await client.manager.read(h.ledger_id)
    await client.manager.write(h.ledger_id, md.evolve(state=LedgerState.IN_RECOVERY), version)
    with pytest.raises(LedgerFencedError):
        await h.close()


async def test_close_retries_after_benign_metadata_change(cluster: Cluster) -> None:
    client, _ = cluster.client()
    h = await client.create_ledger(STRIPED)
    await h.append(b"a")
    md, version = await client.manager.read(h.ledger_id)
    await client.manager.write(h.ledger_id, md.evolve(custom_metadata={"k": b"v"}), version)
    await h.close()
    md, _ = await client.manager.read(h.ledger_id)
    assert md.state is LedgerState.CLOSED and md.last_entry_id == 0


async def test_recovery_under_a_black_holed_bookie_is_fast(cluster: Cluster) -> None:
    """A bookie that keeps its connection but never answers (partitioned) must not make recovery
    wait for it: fencing stops once enough bookies are fenced, each entry's read stops at the first
    copy found (or once Qw-Qa+1 replicas miss it), and entries are read in parallel, not one per
    round trip. Otherwise a topic with a partitioned bookie cannot be loaded."""
    writer, _ = cluster.client()
    h = await writer.create_ledger(STRIPED)
    await asyncio.gather(*(h.append(data(i)) for i in range(200)))  # bookies' LAC lags far behind
    ensemble = h.metadata.ensembles[0][1]  # type: ignore[attr-defined]
    recoverer, rf = cluster.client(faulty=True, read_timeout_s=3.0, bookie_op_timeout_s=3.0)
    rf[ensemble[0]].black_hole = True
    loop = asyncio.get_running_loop()
    started = loop.time()
    r = await asyncio.wait_for(recoverer.open_ledger(h.ledger_id, recovery=True), 60)
    took = loop.time() - started
    assert r.last_add_confirmed == 199
    assert took < 2.0, f"recovery took {took:.1f}s: it waited for the black-holed bookie"


async def test_answers_after_the_deciding_one_are_retrieved() -> None:
    """Recovery reads every replica at once and stops at the first decisive answer; answers that completed
    in the same loop iteration must not be logged as "Task exception was never retrieved" (one traceback
    per replica and entry filled a broker's log at every hand-over)."""
    import gc

    from magnetar.bookie.api import BookieNoSuchEntryError
    from magnetar.ledger.recovery import _first_decided

    unretrieved: list[dict[str, object]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _loop, context: unretrieved.append(context))

    async def absent(i: int) -> None:
        raise BookieNoSuchEntryError(f"no entry 1:{i}")

    async def absent_later(answer: asyncio.Future[None]) -> None:
        # As a replica read waits (wait_for): 3.11's wait_for turns the cancellation of an answered read into
        # that answer, so a cancelled read can still end with an exception.
        await asyncio.wait_for(answer, 10)

    loop = asyncio.get_running_loop()
    for _ in range(5):
        decided, _, _ = await _first_decided([absent(i) for i in range(3)], lambda _i, _r: (True, None))
        assert decided
        answers: list[asyncio.Future[None]] = [loop.create_future() for _ in range(3)]

        def decide(_i: int, _r: object, answers: list[asyncio.Future[None]] = answers) -> tuple[bool, None]:
            for i, a in enumerate(answers[1:], 1):  # the other replicas answer just as the first decides
                a.set_exception(BookieNoSuchEntryError(f"no entry 1:{i}"))
            return True, None

        deciding = asyncio.ensure_future(_first_decided([absent_later(a) for a in answers], decide))
        await asyncio.sleep(0)
        answers[0].set_exception(BookieNoSuchEntryError("no entry 1:0"))
        assert (await deciding)[0]
        await asyncio.sleep(0.01)
    gc.collect()
    await asyncio.sleep(0)
    assert unretrieved == []
