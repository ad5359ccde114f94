"""Managed-ledger error paths under physical faults: a stopped etcd during rollover, a bookie that
never answers, ledgers failing one after another. Every add must end (a position or an error) in
bounded time, entries are never reordered, and what was acknowledged stays readable."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from magnetar.bookie.api import BookieClient
from magnetar.bookie.bookie import Bookie
from magnetar.bookie.local import LocalBookieClient
from magnetar.ledger.client import BookieLedgerClient
from magnetar.ledger.context import LedgerClientConfig
from magnetar.ledger.registry import StaticBookieRegistry
from magnetar.managed_ledger.api import InitialPosition, ManagedLedgerError, Position
from magnetar.managed_ledger.factory import ManagedLedgerFactoryImpl
from magnetar.managed_ledger.ledger import ManagedLedgerImpl
from magnetar.metadata.embedded import EmbeddedMetadataStore
from magnetar.metadata.etcd import EtcdMetadataStore
from tests.etcd_server import EtcdServer, find_etcd_binary
from tests.managed_ledger.conftest import config
from tests.managed_ledger.ml_memory_ledger import MemoryLedgerClient

NAME = "public/default/persistent/failures"


class BlackHoleBookieClient(BookieClient):
    """FAULT-INJECTION TEST DOUBLE: forwards to a real in-process bookie, but once ``black_hole`` is
    set its adds are never answered (a partitioned bookie that keeps its connection open)."""

    def __init__(self, bookie: Bookie) -> None:
        self.inner = LocalBookieClient(bookie)
        self.address = self.inner.address
        self.black_hole = False

    async def add_entry(self, *args: Any, **kwargs: Any) -> None:
        if self.black_hole:
            await asyncio.Event().wait()
        await self.inner.add_entry(*args, **kwargs)

    async def read_entries(self, ledger_id: int, first: int, last: int) -> list[tuple[int, bytes]]:
        return await self.inner.read_entries(ledger_id, first, last)

    async def read_last_add_confirmed(self, ledger_id: int) -> tuple[int, int]:
        return await self.inner.read_last_add_confirmed(ledger_id)

    async def fence(self, ledger_id: int, master_key: bytes) -> tuple[int, int]:
        return await self.inner.fence(ledger_id, master_key)

    async def delete_ledger(self, ledger_id: int) -> None:
        await self.inner.delete_ledger(ledger_id)

    async def close(self) -> None:
        await self.inner.close()


async def outcome(aw: Any, within: float) -> Position | BaseException:
    """The position or the exception an add ends with; fails the test if it does not end in time."""
    try:
        async with asyncio.timeout(within):
            return await aw
    except TimeoutError:
        pytest.fail(f"an add did not end within {within}s")
    except BaseException as e:
        return e


# ---------------------------------------------------------------------- item 4: no reordering


async def test_after_a_permanent_failure_later_adds_fail_too(memory_client: MemoryLedgerClient, store) -> None:
    """An add that ran out of retries must take every add behind it down too: a later entry may not
    be stored while an earlier one failed (the producer would resend it after its successor)."""
    factory = ManagedLedgerFactoryImpl(store, memory_client, trim_delay_seconds=0.01)
    ml = await factory.open(NAME, config())
    memory_client.fail_appends = 3  # the next three ledgers each fail their first add
    a = asyncio.ensure_future(ml.add_entry(b"a"))
    async with asyncio.timeout(5):  # until "a" was issued on its third and last ledger
        while memory_client.fail_appends != 0:  # noqa: ASYNC110
            await asyncio.sleep(0)
    # Issued behind "a" on the same (failing) ledger, before a's failure is known: adds are issued at
    # once (no task each), so "b" must not wait for an earlier ledger's failure to be noticed first.
    b = asyncio.ensure_future(ml.add_entry(b"b"))
    ra, rb = await outcome(a, 5), await outcome(b, 5)
    assert isinstance(ra, ManagedLedgerError), ra
    assert isinstance(rb, ManagedLedgerError), f"'b' was stored at {rb} although 'a' before it failed"
    # The managed ledger carries on: a new add succeeds.
    pos = await outcome(ml.add_entry(b"c"), 5)
    assert isinstance(pos, Position)
    await factory.close()


# ---------------------------------------------------------------------- item 3: no stranded adds


@pytest.fixture
async def black_hole_stack(
    store: EmbeddedMetadataStore, bookie: Bookie
) -> AsyncIterator[tuple[ManagedLedgerFactoryImpl, BlackHoleBookieClient]]:
    bk = BlackHoleBookieClient(bookie)
    client = BookieLedgerClient(store, StaticBookieRegistry([bk]), LedgerClientConfig(add_timeout_s=60.0))
    factory = ManagedLedgerFactoryImpl(store, client, op_timeout_seconds=0.5, trim_delay_seconds=0.01)
    yield factory, bk
    bk.black_hole = False
    await factory.close()
    await client.close()


async def test_unload_with_unanswered_adds_fails_them(black_hole_stack) -> None:
    """Adds stuck on a bookie that never answers must fail when the managed ledger is closed
    (unload), not wait forever: a producer's receipts go out in order, one stuck add strands it."""
    factory, bk = black_hole_stack
    ml = await factory.open(NAME, config(max_entries_per_ledger=2))
    await ml.add_entry(b"ok")
    bk.black_hole = True
    adds = [asyncio.ensure_future(ml.add_entry(f"x{i}".encode())) for i in range(4)]  # some queued by a rollover
    await asyncio.sleep(0.1)
    await outcome(ml.close(), 10)
    for a in adds:
        r = await outcome(a, 5)
        assert isinstance(r, ManagedLedgerError), r


# ---------------------------------------------------------------------- items 1 and 2: metadata store outage


@pytest.fixture
async def etcd_stack(
    tmp_path: Path, bookie: Bookie
) -> AsyncIterator[tuple[EtcdServer, EtcdMetadataStore, BookieLedgerClient]]:
    if find_etcd_binary() is None:
        pytest.skip("no etcd binary")
    server = EtcdServer(tmp_path / "etcd")
    await asyncio.to_thread(server.start)
    store = EtcdMetadataStore(server.endpoint, op_timeout_seconds=1.0)
    client = BookieLedgerClient(store, StaticBookieRegistry([LocalBookieClient(bookie)]))
    try:
        yield server, store, client
    finally:
        await client.close()
        await store.close()
        await asyncio.to_thread(server.kill)


async def _rollover_during_outage(
    server: EtcdServer, store: EtcdMetadataStore, client: BookieLedgerClient
) -> tuple[ManagedLedgerFactoryImpl, ManagedLedgerImpl, list[Position]]:
    """Write 2 entries, stop etcd, write the 3rd (it fills the ledger: rollover fails), start etcd."""
    factory = ManagedLedgerFactoryImpl(store, client, op_timeout_seconds=2.0, trim_delay_seconds=0.01)
    ml = await factory.open(NAME, config(max_entries_per_ledger=3))
    assert isinstance(ml, ManagedLedgerImpl)
    await ml.open_cursor("sub", InitialPosition.EARLIEST)
    acked = [await ml.add_entry(b"e0"), await ml.add_entry(b"e1")]
    await asyncio.to_thread(server.stop)
    third = await outcome(ml.add_entry(b"e2"), 10)  # the bookie has it; only the rollover needs etcd
    assert isinstance(third, Position), third
    acked.append(third)
    during = await outcome(ml.add_entry(b"during"), 15)  # may fail (no ledger to write to) but must end
    if isinstance(during, Position):
        acked.append(during)
    await asyncio.to_thread(server.start)
    return factory, ml, acked


async def test_rollover_failing_on_metadata_outage_recovers(etcd_stack) -> None:
    """A metadata-store outage during rollover (closing the full ledger fails) must not leave the
    managed ledger on a released write handle: once etcd is back, publishing works again."""
    server, store, client = etcd_stack
    factory, ml, _acked = await _rollover_during_outage(server, store, client)
    ok = None
    for i in range(20):  # bounded: each add ends within its timeout
        r = await outcome(ml.add_entry(f"after{i}".encode()), 10)
        if isinstance(r, Position):
            ok = r
            break
        await asyncio.sleep(0.25)
    assert ok is not None, "publishing never recovered after the metadata store came back"
    await factory.close()


async def test_ledger_closed_only_in_managed_ledger_metadata_is_recovered(etcd_stack) -> None:
    """A ledger whose BookKeeper close failed is recorded closed by the managed ledger only; a later
    reader must recover it (as Pulsar opens ledgers), or its last acknowledged entry is unreadable."""
    server, store, client = etcd_stack
    factory, ml, acked = await _rollover_during_outage(server, store, client)
    for i in range(20):
        if isinstance(await outcome(ml.add_entry(f"after{i}".encode()), 10), Position):
            break
        await asyncio.sleep(0.25)
    await factory.close()  # as a crash would, the store keeps what was written
    # A new owner (another factory: cold cache) reads everything back.
    factory2 = ManagedLedgerFactoryImpl(store, client, op_timeout_seconds=5.0, trim_delay_seconds=0.01)
    ml2 = await factory2.open(NAME, config(max_entries_per_ledger=3))
    cursor = await ml2.open_cursor("sub", InitialPosition.EARLIEST)
    got: list[Position] = []
    async with asyncio.timeout(15):
        while cursor.has_more_entries():
            got.extend(e.position for e in await cursor.read_entries(10))
    assert set(acked) <= set(got), f"acknowledged {acked}, read back {got}"
    await factory2.close()
