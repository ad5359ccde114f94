"""Networked bookies end to end: real etcd, real ``magnetar bookie`` processes on loopback.

Covers a ledger client writing E=3/Qw=2/Qa=2 through :class:`MetadataBookieRegistry`, the
registration's lease after ``kill -9``, restart with data and re-registration, cookie checks
refusing wiped or swapped disks, and the read-only threshold moving the registration.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import time
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from magnetar.bookie.api import BookieNoSuchEntryError, BookieReadOnlyError
from magnetar.bookie.cookie import COOKIE_FILE
from magnetar.bookie.registration import readonly_path, writable_path
from magnetar.cli.bookie import EXIT_COOKIE_MISMATCH
from magnetar.ledger.api import LedgerConfig, LedgerError
from magnetar.ledger.client import BookieLedgerClient
from magnetar.ledger.etcd_registry import MetadataBookieRegistry
from magnetar.metadata import open_metadata_store
from magnetar.metadata.api import MetadataStore
from tests.bookie_network.conftest import BookieProcess

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def store(metadata_url: str) -> AsyncIterator[MetadataStore]:
    s = open_metadata_store(metadata_url)
    await s.start()  # type: ignore[attr-defined]
    yield s
    await s.close()


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.read()


async def _start(bookies: list[BookieProcess], *new: BookieProcess) -> None:
    bookies.extend(new)
    await asyncio.gather(*(asyncio.to_thread(b.start) for b in new))


async def _eventually(check: Callable[[], Awaitable[bool]], within_s: float = 10.0) -> None:
    for _ in range(int(within_s / 0.05)):
        if await check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{check.__name__} not true within {within_s}s")


async def test_ledger_over_three_bookie_processes(
    tmp_path: Path, metadata_url: str, store: MetadataStore, bookies: list[BookieProcess]
) -> None:
    procs = [BookieProcess(tmp_path / f"b{i}", metadata_url) for i in range(3)]
    await _start(bookies, *procs)
    registry = MetadataBookieRegistry(store)
    client = BookieLedgerClient(store, registry)
    try:
        assert await registry.writable_bookies() == sorted(b.address for b in procs)
        cfg = LedgerConfig(ensemble_size=3, write_quorum=2, ack_quorum=2, password=b"pw")
        w = await client.create_ledger(cfg)
        payloads = [b"entry-%d-" % i * (1 + i % 50) for i in range(300)]
        ids = await asyncio.wait_for(asyncio.gather(*(w.append_nowait(d) for d in payloads)), 20)
        assert ids == list(range(300))
        await w.close()
        r = await client.open_ledger(w.ledger_id, password=b"pw")
        assert r.last_add_confirmed == 299
        got = await r.read(0, 299)
        assert [e.data for e in got] == payloads
        # Each entry lives on exactly Qw=2 of the 3 bookies.
        counts = []
        for b in procs:
            rc = registry.client(b.address)
            have = []
            for e in range(300):
                try:
                    await rc.read_entries(w.ledger_id, e, e)
                    have.append(e)
                except Exception:
                    pass
            counts.append(len(have))
        assert sum(counts) == 600 and all(c == 200 for c in counts)
        # Recovery over the network: a second client opens a ledger whose writer is still alive,
        # fences it on the bookies and reads everything acknowledged; the old writer is fenced out.
        w2 = await client.create_ledger(cfg)
        for i in range(20):
            await w2.append(b"open-%d" % i)
        reader_registry = MetadataBookieRegistry(store)
        reader = BookieLedgerClient(store, reader_registry)
        try:
            r2 = await reader.open_ledger(w2.ledger_id, password=b"pw")
            assert [e.data for e in await r2.read(0, r2.last_add_confirmed)] == [b"open-%d" % i for i in range(20)]
        finally:
            await reader.close()
        with pytest.raises(LedgerError):
            await asyncio.wait_for(w2.append(b"too late"), 10)
        # Deleting a ledger deletes it on its bookies.
        await client.delete_ledger(w.ledger_id)
        with pytest.raises(BookieNoSuchEntryError):
            await registry.client(procs[0].address).read_last_add_confirmed(w.ledger_id)
        metrics = await asyncio.to_thread(_get, f"{procs[0].http_url}/metrics")
        added = re.search(rb'^bookie_add_entry_total\{bookie="%s"\} (\d+)$' % procs[0].address.encode(), metrics, re.M)
        assert added is not None and int(added.group(1)) >= 200
    finally:
        await client.close()


async def test_kill9_drops_registration_and_restart_keeps_data(
    tmp_path: Path, metadata_url: str, store: MetadataStore, bookies: list[BookieProcess]
) -> None:
    b = BookieProcess(tmp_path / "b", metadata_url)
    await _start(bookies, b)
    registry = MetadataBookieRegistry(store, refresh_interval_s=60)
    try:
        assert await registry.writable_bookies() == [b.address]
        rc = registry.client(b.address)
        await asyncio.gather(*(rc.add_entry(5, e, b"k", e - 1, b"data%d" % e) for e in range(50)))
        b.kill()  # kill -9: no revoke, the lease (TTL 2 s) has to run out
        t0 = time.monotonic()

        async def gone() -> bool:
            return await registry.writable_bookies() == []

        await _eventually(gone, 10)
        assert time.monotonic() - t0 < 8
        assert await store.get(writable_path(b.address)) is None
        with pytest.raises(Exception):  # noqa: B017 - any BookieError: it is down
            await rc.read_last_add_confirmed(5)

        await asyncio.to_thread(b.start)

        async def back() -> bool:
            return await registry.writable_bookies() == [b.address]

        await _eventually(back, 10)
        got = await rc.read_entries(5, 0, 100)
        assert got == [(e, b"data%d" % e) for e in range(50)]
        assert await rc.read_last_add_confirmed(5) == (48, 49)
        # SIGTERM: clean exit, registration removed at once (lease revoked).
        assert await asyncio.to_thread(b.stop) == 0
        assert await store.get(writable_path(b.address)) is None
    finally:
        await registry.close()


async def test_cookie_refuses_wiped_and_swapped_disks(
    tmp_path: Path, metadata_url: str, store: MetadataStore, bookies: list[BookieProcess]
) -> None:
    b1 = BookieProcess(tmp_path / "b1", metadata_url)
    b2 = BookieProcess(tmp_path / "b2", metadata_url)
    await _start(bookies, b1, b2)
    await asyncio.gather(asyncio.to_thread(b1.stop), asyncio.to_thread(b2.stop))

    def refused(b: BookieProcess) -> str:
        proc = b.spawn()
        assert proc.wait(20) == EXIT_COOKIE_MISMATCH, b.log()
        return b.log()

    # Swapped journal disks: b1 starts on b2's journal.
    j1, j2 = tmp_path / "b1" / "journal", tmp_path / "b2" / "journal"
    tmp = tmp_path / "swap"
    j1.rename(tmp)
    j2.rename(j1)
    tmp.rename(j2)
    assert "swapped disks" in await asyncio.to_thread(refused, b1)
    j1.rename(tmp)
    j2.rename(j1)
    tmp.rename(j2)
    # Wiped ledger disk: the cookie is gone with the data.
    shutil.rmtree(tmp_path / "b2" / "ledgers")
    assert "wiped" in await asyncio.to_thread(refused, b2)
    # Restored b1 still starts: the check passes when all copies agree.
    await asyncio.to_thread(b1.start)
    assert (tmp_path / "b1" / "ledgers" / COOKIE_FILE).exists()
    assert await store.get(writable_path(b1.address)) is not None
    assert await store.get(writable_path(b2.address)) is None


async def test_read_only_moves_registration(
    tmp_path: Path, metadata_url: str, store: MetadataStore, bookies: list[BookieProcess]
) -> None:
    full = BookieProcess(
        tmp_path / "full", metadata_url, extra_args=["--min-free-bytes", str(1 << 60), "--disk-check-interval", "0.2"]
    )
    ok = BookieProcess(tmp_path / "ok", metadata_url, extra_args=["--min-free-bytes", "0"])
    await _start(bookies, full, ok)
    registry = MetadataBookieRegistry(store)
    try:

        async def full_is_read_only() -> bool:
            return (
                await registry.writable_bookies() == [ok.address]
                and await registry.readonly_bookies() == [full.address]
                and await store.get(writable_path(full.address)) is None
            )

        await _eventually(full_is_read_only, 10)
        assert await registry.available_bookies() == sorted([ok.address, full.address])
        with pytest.raises(BookieReadOnlyError):
            await registry.client(full.address).add_entry(1, 0, b"k", -1, b"x")
        # An operator's switch (BookKeeper's REST call) moves it too, and back.
        await asyncio.to_thread(ok.http_json, "/api/v1/bookie/state/readonly", "PUT", {"readOnly": True})

        async def ok_read_only() -> bool:
            return await store.get(readonly_path(ok.address)) is not None and await registry.writable_bookies() == []

        await _eventually(ok_read_only, 10)
        await asyncio.to_thread(ok.http_json, "/api/v1/bookie/state/readonly", "PUT", {"readOnly": False})

        async def ok_writable() -> bool:
            return await registry.writable_bookies() == [ok.address] and await registry.readonly_bookies() == [
                full.address
            ]

        await _eventually(ok_writable, 10)
        ready = await asyncio.to_thread(full.http_json, "/ready")
        assert ready == {"ready": True, "readOnly": True}
    finally:
        await registry.close()


async def test_ledger_deleted_while_bookie_down_is_collected_on_etcd(
    tmp_path: Path, metadata_url: str, store: MetadataStore, bookies: list[BookieProcess]
) -> None:
    """Bookie-side GC against etcd: a ledger deleted while one of its bookies was stopped is
    reclaimed by that bookie's metadata scan once it is back; a live ledger is kept."""
    procs = [BookieProcess(tmp_path / f"b{i}", metadata_url, extra_args=["--gc-wait-time", "0.5"]) for i in range(2)]
    await _start(bookies, *procs)
    registry = MetadataBookieRegistry(store)
    client = BookieLedgerClient(store, registry)
    try:
        cfg = LedgerConfig(ensemble_size=2, write_quorum=2, ack_quorum=2, password=b"pw")
        doomed, kept = await client.create_ledger(cfg), await client.create_ledger(cfg)
        for w in (doomed, kept):
            await asyncio.wait_for(asyncio.gather(*(w.append_nowait(b"x" * 100) for _ in range(50))), 20)
            await w.close()
        await asyncio.to_thread(procs[1].stop)
        await client.delete_ledger(doomed.ledger_id)  # b1 is down: only b0 hears of it
        await asyncio.to_thread(procs[1].start)
        rc = registry.client(procs[1].address)

        async def collected() -> bool:
            try:
                await rc.read_last_add_confirmed(doomed.ledger_id)
            except BookieNoSuchEntryError:
                return True
            except Exception:  # reconnecting after the restart
                return False
            return False

        await _eventually(collected, 20)
        assert (await rc.read_last_add_confirmed(kept.ledger_id))[1] == 49  # still there

        async def counted() -> bool:
            # The ledger is forgotten at once, counted once its delete record is durable: a read can come between.
            metrics = await asyncio.to_thread(_get, f"{procs[1].http_url}/metrics")
            return re.search(rb"^bookie_gc_ledgers_total\{[^}]*\} 1$", metrics, re.M) is not None

        await _eventually(counted, 10)
    finally:
        await client.close()
