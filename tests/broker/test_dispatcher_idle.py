"""An idle dispatcher holds no task: its read loop ends after IDLE_EXIT_DELAY and a wakeup restarts it."""

from __future__ import annotations

import asyncio
import gc
from types import SimpleNamespace

import pytest

from magnetar.broker import dispatcher as dispatcher_module
from magnetar.broker.config import BrokerConfig
from magnetar.broker.dispatcher import Dispatcher
from magnetar.managed_ledger.api import Entry, Position


class _Cursor:
    """Entries appended by the test, read in order."""

    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self.read = 0

    def has_more_entries(self) -> bool:
        return self.read < len(self.entries)

    async def read_entries(self, n: int) -> list[Entry]:
        got = self.entries[self.read : self.read + n]
        self.read += len(got)
        return got

    async def replay_entries(self, positions: list[Position]) -> list[Entry]:
        raise AssertionError("no redelivery here")


class _Collecting(Dispatcher):
    def __init__(self, cursor: _Cursor) -> None:
        topic = SimpleNamespace(service=SimpleNamespace(config=BrokerConfig()), terminated=False)
        super().__init__(SimpleNamespace(name="sub", cursor=cursor, topic=topic), 10)  # type: ignore[arg-type]
        self.got: list[Entry] = []

    def _budget(self) -> int:
        return 10

    def _dispatch(self, entries: list[Entry], replay: bool) -> None:
        self.got.extend(entries)


def _loops() -> list[asyncio.Task[object]]:
    return [t for t in asyncio.all_tasks() if t.get_name().startswith("dispatch sub")]


async def _until(cond: object, seconds: float = 2.0) -> None:
    for _ in range(int(seconds / 0.01)):
        if cond():  # type: ignore[operator]
            return
        await asyncio.sleep(0.01)


@pytest.fixture
def short_idle(monkeypatch: pytest.MonkeyPatch) -> float:
    monkeypatch.setattr(dispatcher_module, "IDLE_EXIT_DELAY", 0.1)
    return 0.1


async def test_idle_loop_ends_and_a_wakeup_starts_exactly_one_again(short_idle: float) -> None:
    cursor = _Cursor()
    d = _Collecting(cursor)
    d.start()
    try:
        assert not d.running  # nothing to read: no loop at all
        cursor.entries.append(Entry(Position(0, 0), b"x"))
        d.wakeup()
        await asyncio.sleep(0)
        assert d.running and len(_loops()) == 1
        await _until(lambda: len(d.got) == 1)
        d.got.clear()
        await _until(lambda: not d.running)
        assert not d.running and _loops() == []  # idle: no suspended task left
        await asyncio.sleep(0)  # the TaskSet drops it in its done callback
        assert len(d.tasks) == 0
        for i in range(3):  # several wakeups in a row: still one loop
            cursor.entries.append(Entry(Position(1, i), b"x"))
            d.wakeup()
        assert d.running and len(_loops()) == 1
        await _until(lambda: len(d.got) == 3)
        assert [e.position.entry_id for e in d.got] == [0, 1, 2]
        await _until(lambda: not d.running)
        assert _loops() == []
    finally:
        await d.close()


async def test_busy_loop_is_kept_while_wakeups_come_within_the_delay(short_idle: float) -> None:
    cursor = _Cursor()
    d = _Collecting(cursor)
    cursor.entries.append(Entry(Position(0, 0), b"x"))
    d.start()
    try:
        await asyncio.sleep(0)
        first = _loops()
        assert len(first) == 1
        for i in range(5):  # wakeups faster than the idle delay
            cursor.entries.append(Entry(Position(1, i), b"x"))
            d.wakeup()
            await asyncio.sleep(short_idle / 5)
        assert len(d.got) == 6
        assert _loops() == first  # the same task did all of it
    finally:
        await d.close()


async def test_stopped_or_closed_dispatcher_is_not_restarted_by_wakeups(short_idle: float) -> None:
    cursor = _Cursor()
    d = _Collecting(cursor)
    cursor.entries.append(Entry(Position(1, 0), b"x"))
    d.start()
    await asyncio.sleep(0)
    await d.stop()
    cursor.entries.append(Entry(Position(1, 1), b"x"))
    d.wakeup()
    assert not d.running
    d.start()
    await _until(lambda: len(d.got) == 2)
    assert [e.position.entry_id for e in d.got] == [0, 1]
    await d.close()
    d.wakeup()
    d.start()
    assert not d.running and _loops() == []
    gc.collect()


async def test_read_state_shows_a_read_in_flight_then_a_wait_for_entries(short_idle: float) -> None:
    """What internal stats report as ``pendingReadOps`` / ``waitingReadOp``: a read in flight, then a
    loop asleep with permits to spare (waiting for entries); neither once the loop ended idle."""
    cursor = _Cursor()
    gate = asyncio.Event()
    read = cursor.read_entries

    async def slow_read(n: int) -> list[Entry]:
        await gate.wait()
        return await read(n)

    cursor.read_entries = slow_read  # type: ignore[method-assign]
    d = _Collecting(cursor)
    cursor.entries.append(Entry(Position(1, 0), b"x"))
    d.start()
    try:
        await asyncio.sleep(0.01)
        assert d.reading and not d.waiting_for_entries
        gate.set()
        await _until(lambda: d.waiting_for_entries)
        assert not d.reading and d.waiting_for_entries and len(d.got) == 1
        await _until(lambda: not d.running)
        assert not d.reading and not d.waiting_for_entries
    finally:
        await d.close()
