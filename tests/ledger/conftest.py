"""Fixtures of the ledger-client tests: three real bookies and the embedded metadata store."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from ledger_helpers import Cluster

from magnetar.metadata.embedded import EmbeddedMetadataStore


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[EmbeddedMetadataStore]:
    s = EmbeddedMetadataStore(str(tmp_path / "metadata.db"))
    await s.start()
    yield s
    await s.close()


@pytest.fixture
async def cluster(tmp_path: Path, store: EmbeddedMetadataStore) -> AsyncIterator[Cluster]:
    c = Cluster(tmp_path, store, n=3)
    await c.start()
    yield c
    await c.close()
