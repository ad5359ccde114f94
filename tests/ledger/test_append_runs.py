"""Runs of appends (``WriteHandle.append_many``): one bookie call per run where the write set allows it,
completions told per run, and the per-entry rules (order, ensemble changes, failures) kept."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from ledger_helpers import Cluster

from magnetar.bookie.bookie import Bookie
from magnetar.bookie.journal import Journal
from magnetar.ledger.api import LedgerConfig, LedgerError
from magnetar.ledger.handles import LedgerWriteHandle
from magnetar.metadata.embedded import EmbeddedMetadataStore

MIRRORED = LedgerConfig(ensemble_size=3, write_quorum=3, ack_quorum=2)
STRIPED = LedgerConfig(ensemble_size=3, write_quorum=2, ack_quorum=2)


def data(i: int) -> bytes:
    return b"run-entry-%d-" % i * (1 + i % 4)


class Runs:
    """Collects a run callback's reports and resolves once ``expected`` appends were told."""

    def __init__(self, expected: int) -> None:
        self.reports: list[tuple[int, int | None, int, BaseException | None]] = []
        self.told = 0
        self.expected = expected
        self.done = asyncio.get_running_loop().create_future()

    def __call__(self, index: int, entry_id: int | None, count: int, exc: BaseException | None) -> None:
        self.reports.append((index, entry_id, count, exc))
        self.told += count
        if self.told >= self.expected and not self.done.done():
            self.done.set_result(None)

    def told_indexes(self) -> list[int]:
        return [i for index, _, count, _ in self.reports for i in range(index, index + count)]


@pytest.fixture
async def cluster(tmp_path: Path, store: EmbeddedMetadataStore) -> AsyncIterator[Cluster]:
    c = Cluster(tmp_path, store, n=4)
    await c.start()
    yield c
    await c.close()


def count_journal_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Records the number of entries of every ``Journal.append_many`` call (the real method still runs)."""
    sizes: list[int] = []
    real = Journal.append_many

    def spy(self: Journal, rtype: int, ledger_id: int, entry_ids, *args, **kwargs):  # type: ignore[no-untyped-def]
        sizes.append(len(entry_ids))
        return real(self, rtype, ledger_id, entry_ids, *args, **kwargs)

    monkeypatch.setattr(Journal, "append_many", spy)
    return sizes


async def read_back(cluster: Cluster, lid: int, last: int) -> list[bytes]:
    reader, _ = cluster.client()
    r = await reader.open_ledger(lid)
    assert r.last_add_confirmed == last
    return [e.data for e in await r.read(0, last)]


async def test_a_run_reaches_each_bookie_in_one_call_and_is_told_once(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = count_journal_calls(monkeypatch)
    client, _ = cluster.client()
    h = await client.create_ledger(MIRRORED)
    assert isinstance(h, LedgerWriteHandle)
    await h.append(data(0))
    calls.clear()
    runs = Runs(50)
    h.append_many([data(i) for i in range(1, 51)], runs)
    await asyncio.wait_for(runs.done, 10)
    # One journal call per bookie of the write set, not one per entry; one report for the whole run.
    assert calls == [50, 50, 50]
    assert runs.reports == [(0, 1, 50, None)]
    assert h.last_add_confirmed == 50
    await h.close()
    assert await read_back(cluster, h.ledger_id, 50) == [data(i) for i in range(51)]


async def test_runs_and_single_appends_keep_call_order(cluster: Cluster) -> None:
    client, _ = cluster.client()
    h = await client.create_ledger(STRIPED)  # striped: each entry of a run goes out on its own
    assert isinstance(h, LedgerWriteHandle)
    first = h.append_nowait(data(0))
    runs = Runs(20)
    h.append_many([data(i) for i in range(1, 21)], runs)
    last = h.append_nowait(data(21))
    assert await asyncio.wait_for(first, 10) == 0
    assert await asyncio.wait_for(last, 10) == 21
    await asyncio.wait_for(runs.done, 10)
    assert runs.told_indexes() == list(range(20))
    assert all(exc is None and entry_id == index + 1 for index, entry_id, _, exc in runs.reports)
    await h.close()
    assert await read_back(cluster, h.ledger_id, 21) == [data(i) for i in range(22)]


async def test_a_bookie_refusing_a_run_is_replaced_and_the_run_completes(cluster: Cluster) -> None:
    client, _ = cluster.client()
    h = await client.create_ledger(MIRRORED)
    assert isinstance(h, LedgerWriteHandle)
    await h.append(data(0))
    broken = h.metadata.ensembles[0][1][1]
    cluster.bookie(broken).set_read_only(True)
    runs = Runs(30)
    h.append_many([data(i) for i in range(1, 31)], runs)
    await asyncio.wait_for(runs.done, 10)
    assert runs.told_indexes() == list(range(30)) and all(exc is None for *_, exc in runs.reports)
    assert h.ensemble_changes == 1 and broken not in h.metadata.ensembles[-1][1]
    await h.close()
    assert await read_back(cluster, h.ledger_id, 30) == [data(i) for i in range(31)]
    spare: Bookie = cluster.bookie(next(a for a in h.metadata.ensembles[-1][1] if a not in h.metadata.ensembles[0][1]))
    assert set(range(1, 31)) <= set(spare.entry_ids(h.ledger_id))


async def test_a_failed_ledger_fails_each_append_of_the_run(cluster: Cluster) -> None:
    client, _ = cluster.client()
    h = await client.create_ledger(MIRRORED)
    assert isinstance(h, LedgerWriteHandle)
    await h.append(data(0))
    for b in cluster.bookies:  # no replacement and no ack quorum: the handle fails
        b.set_read_only(True)
    runs = Runs(10)
    h.append_many([data(i) for i in range(1, 11)], runs)
    await asyncio.wait_for(runs.done, 10)
    assert runs.told_indexes() == list(range(10))
    for _, entry_id, count, exc in runs.reports:
        assert entry_id is None and count == 1 and isinstance(exc, LedgerError)
    with pytest.raises(LedgerError):
        h.append_many([data(99)], runs)
