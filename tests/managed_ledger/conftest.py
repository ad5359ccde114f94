"""Fixtures: a metadata store, a ledger client and a managed-ledger factory over them."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest
from magnetar.ledger.api import LedgerClient
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
async def store() -> AsyncIterator[EmbeddedMetadataStore]:
    s = EmbeddedMetadataStore(":memory:")
    await s.start()
    yield s
    await s.close()


@pytest.fixture
async def client() -> AsyncIterator[LedgerClient]:
    c = MemoryLedgerClient()
    yield c
    await c.close()


@pytest.fixture
def make_factory(store: EmbeddedMetadataStore, client: LedgerClient) -> Callable[..., ManagedLedgerFactoryImpl]:
    """Build factories on the shared store and client (a second one models another broker)."""
    made: list[ManagedLedgerFactoryImpl] = []

    def make(**kwargs: object) -> ManagedLedgerFactoryImpl:
        kwargs.setdefault("trim_delay_seconds", 0.01)
        f = ManagedLedgerFactoryImpl(store, client, **kwargs)  # type: ignore[arg-type]
        made.append(f)
        return f

    yield make  # type: ignore[misc]


@pytest.fixture
async def factory(make_factory: Callable[..., ManagedLedgerFactoryImpl]) -> AsyncIterator[ManagedLedgerFactoryImpl]:
    f = make_factory()
    yield f
    await f.close()
