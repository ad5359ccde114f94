"""Keeping the operator's load on the broker bounded at scale: a limiter for reconciliations (start-up with
thousands of resources must not stampede the admin API) and a short-lived cache of namespaces' topic
lists (drift checks of N topics in a namespace read the list once, not N times)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager


class ReconcileLimiter:
    """At most ``concurrency`` reconciliations at once, started at most ``rate`` per second (0 = no limit)."""

    def __init__(self, concurrency: int, rate: float) -> None:
        self._slots = asyncio.Semaphore(concurrency) if concurrency > 0 else None
        self._interval = 1.0 / rate if rate > 0 else 0.0
        self._next = 0.0
        self._pace = asyncio.Lock()

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        if self._slots is None:
            await self._paced()
            yield
            return
        async with self._slots:
            await self._paced()
            yield

    async def _paced(self) -> None:
        if not self._interval:
            return
        async with self._pace:
            now = time.monotonic()
            wait = self._next - now
            if wait > 0:
                await asyncio.sleep(wait)
            self._next = max(now, self._next) + self._interval


class TopicLists:
    """Topic names per (admin URL, namespace, persistent), reused for ``ttl`` seconds; concurrent readers of
    one namespace share a single list call. A missing namespace raises the list call's error (404)."""

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self._entries: dict[tuple[str, str, bool], tuple[float, set[str]]] = {}
        self._locks: dict[tuple[str, str, bool], asyncio.Lock] = {}

    async def names(
        self, key: tuple[str, str, bool], fetch: Callable[[], Awaitable[list[str]]], fresh: bool = False
    ) -> set[str]:
        """The cached list, or a new one when older than ``ttl`` (or ``fresh``: before acting on it)."""
        async with self._locks.setdefault(key, asyncio.Lock()):
            hit = self._entries.get(key)
            if hit is not None and not fresh and time.monotonic() - hit[0] < self.ttl:
                return hit[1]
            names = set(await fetch())
            if self.ttl > 0:
                self._entries[key] = (time.monotonic(), names)
            return names

    def forget(self, key: tuple[str, str, bool]) -> None:
        self._entries.pop(key, None)

    def added(self, key: tuple[str, str, bool], topic: str) -> None:
        hit = self._entries.get(key)
        if hit is not None:
            hit[1].add(topic)

    def removed(self, key: tuple[str, str, bool], topic: str) -> None:
        hit = self._entries.get(key)
        if hit is not None:
            hit[1].discard(topic)
