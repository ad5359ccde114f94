"""Fixtures: the real storage stack (embedded metadata store + ledger client + in-process bookie)
and a managed-ledger factory over it; the in-memory ledger test double for fault injection."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from magnetar.bookie.bookie import Bookie
from magnetar.bookie.config import BookieConfig
from magnetar.bookie.local import LocalBookieClient
from magnetar.ledger.api import LedgerClient
from magnetar.ledger.client import BookieLedgerClient
from magnetar.ledger.registry import StaticBookieRegistry
from magnetar.managed_ledger.api import ManagedLedgerConfig
from magnetar.managed_ledger.factory import ManagedLedgerFactoryImpl
from magnetar.metadata.embedded import EmbeddedMetadataStore
from tests.managed_ledger.ml_memory_ledger import MemoryLedgerClient


def config(**overrides: object) -> ManagedLedgerConfig:
    """A config that rolls over as soon as a limit is hit (tests use tiny limits)."""
    values: dict[str, object] = {"min_ledger_rollover_seconds": 0.0, "cursor_flush_interval_seconds": 0.01}
    values.update(overrides)
    return ManagedLedgerConfig(**values)  # type: ignore[arg-type]


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[EmbeddedMetadataStore]:
    s = EmbeddedMetadataStore(str(tmp_path / "metadata.db"))
    await s.start()
    yield s
    await s.close()


@pytest.fixture
async def bookie(tmp_path: Path) -> AsyncIterator[Bookie]:
    b = Bookie(
        BookieConfig(
            data_dir=tmp_path / "bookie",
            journal_file_size=1024 * 1024,
            entry_log_size=4 * 1024 * 1024,
            min_free_bytes=0,
        )
    )
    await b.start()
    yield b
    await b.close()


@pytest.fixture
async def client(store: EmbeddedMetadataStore, bookie: Bookie) -> AsyncIterator[LedgerClient]:
    """The real ledger client over one in-process bookie."""
    c = BookieLedgerClient(store, StaticBookieRegistry([LocalBookieClient(bookie)]))
    yield c
    await c.close()


@pytest.fixture
async def memory_client() -> AsyncIterator[MemoryLedgerClient]:
    """TEST DOUBLE ledger client (memory only) for fault injection and counting reads."""
    c = MemoryLedgerClient()
    yield c
    await c.close()


@pytest.fixture
def make_factory(
    store: EmbeddedMetadataStore, client: LedgerClient
) -> Iterator[Callable[..., ManagedLedgerFactoryImpl]]:
    """Build factories on the shared store and client (a second one models another broker)."""

    def make(ledger_client: LedgerClient | None = None, **kwargs: object) -> ManagedLedgerFactoryImpl:
        kwargs.setdefault("trim_delay_seconds", 0.01)
        return ManagedLedgerFactoryImpl(store, ledger_client or client, **kwargs)  # type: ignore[arg-type]

    yield make


@pytest.fixture
async def factory(make_factory: Callable[..., ManagedLedgerFactoryImpl]) -> AsyncIterator[ManagedLedgerFactoryImpl]:
    f = make_factory()
    yield f
    await f.close()


@pytest.fixture
async def memory_factory(
    make_factory: Callable[..., ManagedLedgerFactoryImpl], memory_client: MemoryLedgerClient
) -> AsyncIterator[ManagedLedgerFactoryImpl]:
    """A factory over the in-memory TEST DOUBLE ledger client."""
    f = make_factory(memory_client)
    yield f
    await f.close()
