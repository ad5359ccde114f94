"""TEST DOUBLE: an in-memory LedgerClient for managed-ledger unit tests.

Not durable and not replicated; it models only what the managed ledger relies on: ids ascending,
appends pipelined and completed in order, fencing by a recovery open, closed ledgers immutable,
deletes. ``fail_appends`` injects write failures.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from magnetar.ledger.api import (
    LedgerClient,
    LedgerClosedError,
    LedgerConfig,
    LedgerEntry,
    LedgerError,
    LedgerFencedError,
    NoSuchEntryError,
    NoSuchLedgerError,
    ReadHandle,
    WriteHandle,
)


@dataclass
class _Ledger:
    ledger_id: int
    entries: list[bytes] = field(default_factory=list)
    lac: int = -1
    closed: bool = False
    fenced: bool = False


class _ReadHandle(ReadHandle):
    def __init__(self, client: MemoryLedgerClient, ledger: _Ledger) -> None:
        self._client = client
        self._ledger = ledger
        self.ledger_id = ledger.ledger_id

    @property
    def last_add_confirmed(self) -> int:
        return self._ledger.lac

    @property
    def length(self) -> int:
        return sum(len(d) for d in self._ledger.entries[: self._ledger.lac + 1])

    async def read(self, first: int, last: int) -> list[LedgerEntry]:
        await asyncio.sleep(0)
        if self._client._ledgers.get(self.ledger_id) is not self._ledger:
            raise NoSuchLedgerError(str(self.ledger_id))
        if first < 0 or last > self._ledger.lac or first > last:
            raise NoSuchEntryError(f"{self.ledger_id}:{first}..{last} (lac {self._ledger.lac})")
        self._client.reads += 1
        return [LedgerEntry(self.ledger_id, e, self._ledger.entries[e]) for e in range(first, last + 1)]

    async def close(self) -> None:
        return None


class _WriteHandle(_ReadHandle, WriteHandle):
    async def append(self, data: bytes) -> int:
        led = self._ledger
        if led.fenced:
            raise LedgerFencedError(str(self.ledger_id))
        if led.closed:
            raise LedgerClosedError(str(self.ledger_id))
        entry_id = len(led.entries)  # assigned at issue: concurrent appends keep call order
        led.entries.append(data)
        fail = self._client.fail_appends > 0
        if fail:
            self._client.fail_appends -= 1
        await asyncio.sleep(0)  # "network": later appends are issued before this one completes
        if led.fenced:
            raise LedgerFencedError(str(self.ledger_id))
        if fail or self._client._broken.get(self.ledger_id):
            self._client._broken[self.ledger_id] = True  # like a broken ensemble: later adds fail too
            raise LedgerError(f"injected failure at {self.ledger_id}:{entry_id}")
        led.lac = max(led.lac, entry_id)
        return entry_id

    async def close(self) -> None:
        led = self._ledger
        if led.fenced:
            raise LedgerFencedError(str(self.ledger_id))
        led.closed = True
        del led.entries[led.lac + 1 :]


class MemoryLedgerClient(LedgerClient):
    """TEST DOUBLE for :class:`~magnetar.ledger.api.LedgerClient` (memory only)."""

    def __init__(self) -> None:
        self._ledgers: dict[int, _Ledger] = {}
        self._broken: dict[int, bool] = {}
        self._next_id = 1
        self.fail_appends = 0
        self.reads = 0

    @property
    def ledger_ids(self) -> list[int]:
        return sorted(self._ledgers)

    async def create_ledger(self, config: LedgerConfig) -> WriteHandle:
        await asyncio.sleep(0)
        led = _Ledger(self._next_id)
        self._next_id += 1
        self._ledgers[led.ledger_id] = led
        return _WriteHandle(self, led)

    async def open_ledger(self, ledger_id: int, *, recovery: bool = True, password: bytes = b"") -> ReadHandle:
        await asyncio.sleep(0)
        led = self._ledgers.get(ledger_id)
        if led is None:
            raise NoSuchLedgerError(str(ledger_id))
        if recovery and not led.closed:
            led.fenced = True
            led.lac = len(led.entries) - 1  # recovery finds what the writer issued
            led.closed = True
        return _ReadHandle(self, led)

    async def delete_ledger(self, ledger_id: int) -> None:
        await asyncio.sleep(0)
        self._ledgers.pop(ledger_id, None)

    async def close(self) -> None:
        return None
