"""Bounded polling for tests: conditions that background work brings about without an event to await."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


async def eventually(condition: Callable[[], object], within: float = 5.0) -> None:
    """Wait until ``condition()`` is true; AssertionError after ``within`` seconds."""
    try:
        async with asyncio.timeout(within):
            while not condition():  # noqa: ASYNC110 (nothing to await but time)
                await asyncio.sleep(0.01)
    except TimeoutError:
        raise AssertionError(f"condition not reached within {within} s") from None
