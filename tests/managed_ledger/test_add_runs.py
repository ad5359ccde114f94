"""Runs of adds (``ManagedLedger.add_entries_async``): one call down to the ledger while the current ledger takes
them, the per-entry path across rollovers and failures; every add answered once, in order."""

from __future__ import annotations

import asyncio

import pytest

from magnetar.ledger.handles import LedgerWriteHandle
from magnetar.managed_ledger.api import InitialPosition, Position
from magnetar.managed_ledger.factory import ManagedLedgerFactoryImpl
from tests.managed_ledger.ml_memory_ledger import MemoryLedgerClient
from tests.managed_ledger.test_managed_ledger import open_ml


class Told:
    """An add-run callback: every report, and the position (or error) of each index."""

    def __init__(self, expected: int) -> None:
        self.reports: list[tuple[int, Position | None, int, BaseException | None]] = []
        self.outcome: dict[int, Position | BaseException] = {}
        self.expected = expected
        self.done = asyncio.get_running_loop().create_future()

    def __call__(self, index: int, position: Position | None, count: int, exc: BaseException | None) -> None:
        self.reports.append((index, position, count, exc))
        for k in range(count):
            assert index + k not in self.outcome, f"add {index + k} answered twice"
            if exc is not None:
                self.outcome[index + k] = exc
            else:
                assert position is not None
                self.outcome[index + k] = Position(position.ledger_id, position.entry_id + k)
        if len(self.outcome) >= self.expected and not self.done.done():
            self.done.set_result(None)

    def positions(self) -> list[Position]:
        return [self.outcome[i] for i in range(self.expected)]  # type: ignore[misc]


def datas(n: int, prefix: str = "r") -> list[bytes]:
    return [f"{prefix}{i}".encode() for i in range(n)]


async def test_a_run_goes_down_in_one_append_and_is_told_once(
    factory: ManagedLedgerFactoryImpl, monkeypatch: pytest.MonkeyPatch
) -> None:
    ml = await open_ml(factory)
    cursor = await ml.open_cursor("sub", InitialPosition.EARLIEST)
    await ml.add_entry(b"first")
    calls: list[int] = []
    real = LedgerWriteHandle.append_many

    def spy(self: LedgerWriteHandle, items, callback):  # type: ignore[no-untyped-def]
        calls.append(len(items))
        return real(self, items, callback)

    monkeypatch.setattr(LedgerWriteHandle, "append_many", spy)
    told = Told(100)
    ml.add_entries_async(datas(100), told)
    await asyncio.wait_for(told.done, 10)
    assert calls == [100]
    (ledger,) = ml.ledger_ids
    assert told.reports == [(0, Position(ledger, 1), 100, None)]
    assert ml.last_confirmed_entry == Position(ledger, 100) and ml.number_of_entries == 101
    entries = await cursor.read_entries(1000)
    assert [e.data for e in entries] == [b"first", *datas(100)]
    assert [e.position for e in entries[1:]] == told.positions()


async def test_a_run_crossing_rollovers_keeps_order(factory: ManagedLedgerFactoryImpl) -> None:
    ml = await open_ml(factory, max_entries_per_ledger=7)
    cursor = await ml.open_cursor("sub", InitialPosition.EARLIEST)
    told = Told(30)
    ml.add_entries_async(datas(30), told)
    single = asyncio.ensure_future(ml.add_entry(b"after"))  # a later add never overtakes the run
    await asyncio.wait_for(told.done, 10)
    last = await asyncio.wait_for(single, 10)
    positions = told.positions()
    assert positions == sorted(positions) and len(set(positions)) == 30 and last > positions[-1]
    assert len({p.ledger_id for p in positions}) >= 4
    assert all(exc is None for *_, exc in told.reports)
    entries = await cursor.read_entries(1000)
    assert [e.data for e in entries] == [*datas(30), b"after"]


async def test_runs_interleaved_with_single_adds_keep_call_order(factory: ManagedLedgerFactoryImpl) -> None:
    ml = await open_ml(factory)
    cursor = await ml.open_cursor("sub", InitialPosition.EARLIEST)
    runs = [Told(10) for _ in range(5)]
    singles = [Told(1) for _ in range(5)]
    for k, told in enumerate(runs):
        ml.add_entries_async(datas(10, f"run{k}-"), told)
        ml.add_entry_async(f"single{k}".encode(), lambda pos, exc, t=singles[k]: t(0, pos, 1, exc))
    await asyncio.wait_for(asyncio.gather(*(t.done for t in runs + singles)), 10)
    expected = [d for k in range(5) for d in (*datas(10, f"run{k}-"), f"single{k}".encode())]
    assert [e.data for e in await cursor.read_entries(1000)] == expected


async def test_a_failed_append_in_a_run_is_retried_on_a_new_ledger(
    memory_factory: ManagedLedgerFactoryImpl, memory_client: MemoryLedgerClient
) -> None:
    """The test double's handle has no run support: the writer's run goes through its per-entry default, and
    the injected failure takes the per-entry retry path (a new ledger) with every add answered once."""
    ml = await open_ml(memory_factory)
    cursor = await ml.open_cursor("sub", InitialPosition.EARLIEST)
    await ml.add_entry(b"m0")
    first_ledger = ml.ledger_ids[-1]
    memory_client.fail_appends = 1
    told = Told(8)
    ml.add_entries_async(datas(8), told)
    await asyncio.wait_for(told.done, 10)
    positions = told.positions()
    assert positions == sorted(positions) and all(p.ledger_id > first_ledger for p in positions)
    assert [e.data for e in await cursor.read_entries(100)] == [b"m0", *datas(8)]
