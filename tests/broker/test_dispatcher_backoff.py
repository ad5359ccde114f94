"""Dispatcher read failures: retried after a growing back-off (Pulsar's dispatcherReadFailureBackoff*)."""

from __future__ import annotations

import asyncio
import logging
import time
from types import SimpleNamespace

import pytest

from magnetar.broker.config import BrokerConfig
from magnetar.broker.dispatcher import Dispatcher
from magnetar.managed_ledger.api import Entry, ManagedLedgerError, Position


class _FlakyCursor:
    """Fails the reads listed in ``failures`` (by attempt number), answers one entry otherwise."""

    def __init__(self, failures: dict[int, Exception]) -> None:
        self.failures = failures
        self.attempts: list[float] = []

    def has_more_entries(self) -> bool:
        return True

    async def read_entries(self, n: int) -> list[Entry]:
        self.attempts.append(time.monotonic())
        exc = self.failures.get(len(self.attempts))
        if exc is not None:
            raise exc
        return [Entry(Position(1, len(self.attempts)), b"")]

    async def replay_entries(self, positions: list[Position]) -> list[Entry]:
        raise AssertionError("no redelivery here")


class _OneAtATime(Dispatcher):
    """Reads one entry per round while entries are wanted."""

    def __init__(self, subscription: SimpleNamespace, wanted: int) -> None:
        super().__init__(subscription, 1)  # type: ignore[arg-type]
        self.wanted = wanted
        self.got: list[Entry] = []

    def _budget(self) -> int:
        return 1 if len(self.got) < self.wanted else 0

    def _dispatch(self, entries: list[Entry], replay: bool) -> None:
        self.got.extend(entries)


def _subscription(cursor: _FlakyCursor, initial_ms: int, max_ms: int) -> SimpleNamespace:
    config = BrokerConfig()
    config.apply(
        {
            "dispatcherReadFailureBackoffInitialTimeInMs": initial_ms,
            "dispatcherReadFailureBackoffMaxTimeInMs": max_ms,
        }
    )
    topic = SimpleNamespace(service=SimpleNamespace(config=config), terminated=False)
    return SimpleNamespace(name="sub", cursor=cursor, topic=topic)


def test_settings_have_pulsars_names_and_defaults() -> None:
    d = BrokerConfig().to_pulsar_dict()
    assert d["dispatcherReadFailureBackoffInitialTimeInMs"] == 15000
    assert d["dispatcherReadFailureBackoffMaxTimeInMs"] == 60000
    assert d["dispatcherReadFailureBackoffMandatoryStopTimeInMs"] == 0


async def test_read_failures_back_off_exponentially_and_reset_after_a_success(
    caplog: pytest.LogCaptureFixture,
) -> None:
    err = ManagedLedgerError("bookies unavailable")
    # attempts 1-4 fail, 5 succeeds, 6 fails again, 7 succeeds
    cursor = _FlakyCursor({1: err, 2: err, 3: err, 4: RuntimeError("a bug"), 6: err})
    dispatcher = _OneAtATime(_subscription(cursor, initial_ms=50, max_ms=200), wanted=2)
    with caplog.at_level(logging.WARNING, logger="magnetar.broker.dispatcher"):
        dispatcher.start()
        try:
            for _ in range(300):
                if len(dispatcher.got) >= 2:
                    break
                await asyncio.sleep(0.01)
        finally:
            await dispatcher.close()
    assert len(dispatcher.got) == 2
    gaps = [b - a for a, b in zip(cursor.attempts, cursor.attempts[1:], strict=False)]
    nominal = [0.05, 0.1, 0.2, 0.2, 0.0, 0.05]  # doubling, capped at max; no wait after a success; reset
    for gap, want in zip(gaps, nominal, strict=True):
        assert gap >= want * 0.9 - 0.005, (gaps, nominal)
        assert gap <= want + 0.15, (gaps, nominal)
    storage = [r for r in caplog.records if "bookies unavailable" in r.getMessage()]
    assert len(storage) == 4 and all(r.exc_info is None for r in storage)  # expected: one line each
    bugs = [r for r in caplog.records if r.exc_info is not None]
    assert len(bugs) == 1 and bugs[0].exc_info[0] is RuntimeError  # type: ignore[index]


async def test_close_interrupts_a_back_off_wait() -> None:
    cursor = _FlakyCursor({1: ManagedLedgerError("down")})
    dispatcher = _OneAtATime(_subscription(cursor, initial_ms=60_000, max_ms=60_000), wanted=1)
    dispatcher.start()
    for _ in range(100):
        if cursor.attempts:
            break
        await asyncio.sleep(0.01)
    start = time.monotonic()
    await dispatcher.close()
    assert time.monotonic() - start < 1
    assert dispatcher.got == []
