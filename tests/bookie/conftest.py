"""Fixtures for bookie tests: real bookies on real files under tmp_path, with tiny file sizes."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from bookie_helpers import small_config

from magnetar.bookie.bookie import Bookie


@pytest.fixture
async def make_bookie(tmp_path: Path) -> AsyncIterator[Callable[..., object]]:
    """``await make_bookie(dir=None, **config)`` starts a bookie; all are closed at the end."""
    started: list[Bookie] = []

    async def make(data_dir: Path | None = None, **overrides: object) -> Bookie:
        bookie = Bookie(small_config(data_dir or tmp_path / "bookie", **overrides))
        await bookie.start()
        started.append(bookie)
        return bookie

    yield make  # type: ignore[misc]
    for b in started:
        await b.close()
