"""Helpers of the ledger-client tests: a few real bookies, a real metadata store, and a
fault-injection wrapper around bookie clients."""

from __future__ import annotations

import asyncio
from pathlib import Path

from magnetar.bookie.api import BookieClient, BookieUnavailableError
from magnetar.bookie.bookie import Bookie
from magnetar.bookie.config import BookieConfig
from magnetar.bookie.local import LocalBookieClient
from magnetar.ledger.client import BookieLedgerClient
from magnetar.ledger.context import LedgerClientConfig
from magnetar.ledger.registry import StaticBookieRegistry
from magnetar.metadata.api import MetadataStore


class FaultyBookieClient(BookieClient):
    """FAULT-INJECTION TEST DOUBLE (not a mock of behaviour): forwards every call to a real
    :class:`LocalBookieClient`, but can be told to fail adds or reads, or to hold adds back.

    It has no ``add_entry_nowait``, so handles using it exercise the generic coroutine path.
    """

    def __init__(self, inner: BookieClient) -> None:
        self.inner = inner
        self.address = inner.address
        self.fail_adds = False
        self.fail_reads = False
        self.fail_fence = False
        #: When set to an Event, adds wait for it before reaching the bookie.
        self.add_gate: asyncio.Event | None = None
        #: A partitioned bookie whose connection stays open: reads, LAC reads and fences never answer.
        self.black_hole = False
        self.reads = 0

    async def _maybe_hang(self) -> None:
        if self.black_hole:
            await asyncio.Event().wait()

    def _fail(self, what: str) -> None:
        raise BookieUnavailableError(f"injected failure: {what} on {self.address}")

    async def add_entry(self, ledger_id, entry_id, master_key, last_add_confirmed, data, *, recovery=False):  # type: ignore[no-untyped-def]
        if self.fail_adds:
            self._fail("add")
        if self.add_gate is not None:
            await asyncio.wait_for(self.add_gate.wait(), 30)
        await self.inner.add_entry(ledger_id, entry_id, master_key, last_add_confirmed, data, recovery=recovery)

    async def read_entries(self, ledger_id: int, first: int, last: int) -> list[tuple[int, bytes]]:
        if self.fail_reads:
            self._fail("read")
        await self._maybe_hang()
        self.reads += 1
        return await self.inner.read_entries(ledger_id, first, last)

    async def read_last_add_confirmed(self, ledger_id: int) -> tuple[int, int]:
        if self.fail_reads:
            self._fail("read_lac")
        await self._maybe_hang()
        return await self.inner.read_last_add_confirmed(ledger_id)

    async def fence(self, ledger_id: int, master_key: bytes) -> tuple[int, int]:
        if self.fail_fence:
            self._fail("fence")
        await self._maybe_hang()
        return await self.inner.fence(ledger_id, master_key)

    async def delete_ledger(self, ledger_id: int) -> None:
        await self.inner.delete_ledger(ledger_id)

    async def close(self) -> None:
        await self.inner.close()


class Cluster:
    """``n`` bookies under ``root`` sharing one metadata store."""

    def __init__(self, root: Path, store: MetadataStore, n: int = 3) -> None:
        self.root = root
        self.store = store
        self.n = n
        self.bookies: list[Bookie] = []
        self.clients: list[BookieLedgerClient] = []

    def config(self, i: int) -> BookieConfig:
        return BookieConfig(
            data_dir=self.root / f"bookie-{i}",
            address=f"bookie-{i}:3181",
            journal_file_size=256 * 1024,
            entry_log_size=256 * 1024,
            checkpoint_interval_s=3600.0,
            min_free_bytes=0,
        )

    async def start(self) -> None:
        for i in range(self.n):
            b = Bookie(self.config(i))
            await b.start()
            self.bookies.append(b)

    async def restart_bookies(self) -> None:
        for b in self.bookies:
            await b.close()
        self.bookies = []
        await self.start()

    def bookie(self, address: str) -> Bookie:
        return next(b for b in self.bookies if b.address == address)

    def client(
        self, *, faulty: bool = False, **config: object
    ) -> tuple[BookieLedgerClient, dict[str, FaultyBookieClient]]:
        """A new ledger client; with ``faulty`` its bookie clients are fault-injection wrappers."""
        locals_ = [LocalBookieClient(b) for b in self.bookies]
        wrappers = {c.address: FaultyBookieClient(c) for c in locals_} if faulty else {}
        registry = StaticBookieRegistry(list(wrappers.values()) if faulty else locals_)
        client = BookieLedgerClient(self.store, registry, LedgerClientConfig(**config))  # type: ignore[arg-type]
        self.clients.append(client)
        return client, wrappers

    async def close(self) -> None:
        for c in self.clients:
            await c.close()
        for b in self.bookies:
            await b.close()
