"""Entry-log compaction: a long-lived ledger must not pin every entry log it touched."""

from __future__ import annotations

import asyncio
from pathlib import Path

from bookie_helpers import KEY, payload

from magnetar.bookie.bookie import Bookie


async def add_many(bookie: Bookie, ledger_id: int, count: int, start: int = 0, size: int = 200) -> None:
    futs = [
        bookie.add_entry_nowait(ledger_id, e, KEY, e - 1, payload(ledger_id, e, size))
        for e in range(start, start + count)
    ]
    await asyncio.wait_for(asyncio.gather(*futs), 10)


async def assert_ledger(bookie: Bookie, ledger_id: int, count: int, size: int = 200) -> None:
    got = await bookie.read_entries(ledger_id, 0, count - 1)
    assert [e for e, _ in got] == list(range(count))
    assert all(data == payload(ledger_id, e, size) for e, data in got)


def log_bytes(ledger_dir: Path) -> int:
    return sum(p.stat().st_size for p in ledger_dir.glob("*.log"))


async def test_compaction_reclaims_logs_pinned_by_a_long_lived_ledger(make_bookie) -> None:  # type: ignore[no-untyped-def]
    b = await make_bookie()
    ledger_dir = b.config.ledger_dir
    # Each round: a few entries of long-lived ledger 1 next to a big short-lived ledger.
    for r in range(6):
        await add_many(b, 1, 5, start=r * 5)
        await add_many(b, 100 + r, 150)  # ~30 KiB: about one 32 KiB entry log each
        await b.checkpoint()
    for r in range(6):
        await b.delete_ledger(100 + r)
    await b.checkpoint()
    pinned = set(b.storage.index.ledger_logs[1])
    assert len(pinned) >= 4  # GC alone cannot free these: ledger 1 lives in each of them
    before = log_bytes(ledger_dir)
    removed = await b.compact(major=False)  # live ratio ~3% < minorCompactionThreshold 0.2
    assert set(removed) >= pinned - {b.storage.writer.log_id}
    after = log_bytes(ledger_dir)
    assert after < before / 3, f"{before} -> {after} bytes of entry logs"
    await assert_ledger(b, 1, 30)
    await add_many(b, 1, 5, start=30)
    await b.close()
    b2 = await make_bookie()
    await assert_ledger(b2, 1, 35)
    assert not set(removed) & {int(p.stem, 16) for p in ledger_dir.glob("*.log")}


async def test_compaction_leaves_mostly_live_logs_alone(make_bookie) -> None:  # type: ignore[no-untyped-def]
    b = await make_bookie()
    await add_many(b, 1, 300)
    await add_many(b, 2, 30)
    await b.checkpoint()
    await b.delete_ledger(2)
    await b.checkpoint()
    logs = {p.name for p in b.config.ledger_dir.glob("*.log")}
    assert await b.compact(major=True) == []  # live ratio ~90% > majorCompactionThreshold 0.8
    assert {p.name for p in b.config.ledger_dir.glob("*.log")} == logs
    await assert_ledger(b, 1, 300)


async def test_reads_during_compaction_never_miss_an_entry(make_bookie) -> None:  # type: ignore[no-untyped-def]
    b = await make_bookie()
    for r in range(4):
        await add_many(b, 1, 20, start=r * 20)
        await add_many(b, 100 + r, 150)
        await b.checkpoint()
    for r in range(4):
        await b.delete_ledger(100 + r)
    await b.checkpoint()
    stop = False

    async def reader() -> int:
        n = 0
        while not stop and n < 10_000:
            got = await b.read_entries(1, 0, 79)
            assert len(got) == 80
            n += 1
        return n

    task = asyncio.create_task(reader())
    await asyncio.sleep(0)
    assert await b.compact(major=True)
    stop = True
    assert await asyncio.wait_for(task, 30) >= 1


async def test_compaction_runs_on_its_interval(make_bookie) -> None:  # type: ignore[no-untyped-def]
    b = await make_bookie(minor_compaction_interval_s=0.2, major_compaction_interval_s=3600.0)
    for r in range(3):
        await add_many(b, 1, 5, start=r * 5)
        await add_many(b, 100 + r, 150)
        await b.checkpoint()
    for r in range(3):
        await b.delete_ledger(100 + r)
    await b.checkpoint()
    pinned = set(b.storage.index.ledger_logs[1]) - {b.storage.writer.log_id}
    assert pinned
    for _ in range(60):
        present = {int(p.stem, 16) for p in b.config.ledger_dir.glob("*.log")}
        if not pinned & present:
            break
        await asyncio.sleep(0.1)
    assert not pinned & present
    await assert_ledger(b, 1, 15)
