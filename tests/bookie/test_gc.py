"""Bookie-side garbage collection against the metadata store (embedded store, real bookie files).

The networked bookie runs the same collector against etcd (``cli/bookie.py``); the scan only
uses the :class:`MetadataStore` interface, which both stores implement.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from bookie_helpers import KEY, payload

from magnetar.bookie.api import BookieNoSuchEntryError
from magnetar.bookie.bookie import Bookie
from magnetar.bookie.gc import LedgerGarbageCollector
from magnetar.ledger.ledger_manager import LedgerManager
from magnetar.ledger.metadata import LedgerMetadata
from magnetar.metadata.embedded import EmbeddedMetadataStore


async def add_many(bookie: Bookie, ledger_id: int, count: int) -> None:
    futs = [bookie.add_entry_nowait(ledger_id, e, KEY, e - 1, payload(ledger_id, e, 200)) for e in range(count)]
    await asyncio.wait_for(asyncio.gather(*futs), 10)


def _md() -> LedgerMetadata:
    return LedgerMetadata(ensemble_size=1, write_quorum=1, ack_quorum=1, ensembles=[(0, ["127.0.0.1:3181"])])


@pytest.fixture
async def store(tmp_path: Path):  # type: ignore[no-untyped-def]
    s = EmbeddedMetadataStore(str(tmp_path / "metadata.db"))
    await s.start()
    yield s
    await s.close()


async def test_ledger_deleted_while_bookie_was_down_is_reclaimed(make_bookie, store, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    manager = LedgerManager(store, "/ledgers")
    for lid in (1, 2):
        await manager.create(lid, _md())
    b = await make_bookie()
    await add_many(b, 1, 200)
    await add_many(b, 2, 400)  # ~90 KiB: entry logs of their own
    await b.checkpoint()
    await b.close()
    # The client deletes ledger 2 while this bookie is down: only the metadata goes.
    _, version = await manager.read(2)
    await manager.delete(2, version)
    b = await make_bookie()
    assert b.ledger_ids() == [1, 2]
    logs_before = {p.name for p in b.config.ledger_dir.glob("*.log")}
    gc = LedgerGarbageCollector(b, store)
    assert await gc.collect_once() == [2]
    assert b.ledger_ids() == [1]
    with pytest.raises(BookieNoSuchEntryError):
        await b.read_entries(2, 0, 0)
    await b.checkpoint()  # space comes back with the checkpoint's entry-log GC
    assert len({p.name for p in b.config.ledger_dir.glob("*.log")}) < len(logs_before)
    assert len(await b.read_entries(1, 0, 199)) == 200
    assert await gc.collect_once() == []


async def test_gc_never_deletes_a_ledger_newer_than_its_snapshot(make_bookie, store) -> None:  # type: ignore[no-untyped-def]
    """A ledger whose first entry arrives while the metadata is being listed (its metadata too new
    for the listing) is not collected; nor is one the listing missed but a direct read finds."""
    manager = LedgerManager(store, "/ledgers")
    await manager.create(1, _md())
    b = await make_bookie()
    await add_many(b, 1, 10)
    await add_many(b, 7, 10)  # on the bookie, and (below) in metadata, but missed by the listing

    real_children = store.get_children

    async def racing_get_children(path: str) -> list[str]:
        names = await real_children(path)
        # Meanwhile a client creates ledger 5 and writes to this bookie.
        await manager.create(5, _md())
        await add_many(b, 5, 10)
        await manager.create(7, _md())
        return names

    store.get_children = racing_get_children  # type: ignore[method-assign]
    try:
        gc = LedgerGarbageCollector(b, store)
        assert await gc.collect_once() == []
    finally:
        store.get_children = real_children  # type: ignore[method-assign]
    assert b.ledger_ids() == [1, 5, 7]


async def test_gc_deletes_nothing_without_a_ledgers_root(make_bookie, store) -> None:  # type: ignore[no-untyped-def]
    b = await make_bookie()
    await add_many(b, 1, 10)
    gc = LedgerGarbageCollector(b, store, root="/elsewhere")
    assert await gc.collect_once() == []
    assert b.ledger_ids() == [1]


async def test_gc_task_runs_periodically_and_stops_on_close(make_bookie, store) -> None:  # type: ignore[no-untyped-def]
    manager = LedgerManager(store, "/ledgers")
    await manager.create(1, _md())
    b = await make_bookie(gc_wait_time_s=0.05)
    await add_many(b, 1, 10)
    await add_many(b, 3, 10)  # no metadata at all
    gc = LedgerGarbageCollector(b, store)
    gc.start()
    for _ in range(100):
        if gc.ledgers_collected:
            break
        await asyncio.sleep(0.05)
    await gc.close()
    assert b.ledger_ids() == [1] and gc.runs >= 1


async def test_gc_close_meeting_the_end_of_a_pass_stops_the_loop(make_bookie, store) -> None:  # type: ignore[no-untyped-def]
    """close() cancels the loop right as a pass completes: the moment Python 3.11's wait_for loses a
    cancellation (the loop then slept on and close() waited out its 5 s grace)."""
    manager = LedgerManager(store, "/ledgers")
    await manager.create(1, _md())
    b = await make_bookie(gc_wait_time_s=0.01)
    await add_many(b, 1, 10)
    gc = LedgerGarbageCollector(b, store)
    closing: list[asyncio.Task[None]] = []
    real_children = store.get_children

    async def closing_get_children(path: str) -> list[str]:
        names = await real_children(path)  # the pass's last wait: ledger 1 is both here and listed
        if not closing:
            closing.append(asyncio.create_task(gc.close()))
        return names

    store.get_children = closing_get_children  # type: ignore[method-assign]
    try:
        gc.start()
        for _ in range(200):
            if closing:
                break
            await asyncio.sleep(0.01)
        assert closing, "no GC pass listed the ledgers"
        t0 = asyncio.get_running_loop().time()
        await asyncio.wait_for(closing[0], 30)
        assert asyncio.get_running_loop().time() - t0 < 2.0
    finally:
        store.get_children = real_children  # type: ignore[method-assign]
