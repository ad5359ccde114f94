"""Runs of adds (``Bookie.add_parts_many`` / ``Journal.append_many``): one call and one waiter for many entries,
stored and replayed exactly as the same adds made one by one."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from bookie_helpers import KEY, payload
from test_journal import replayed, start_journal

from magnetar.bookie import entry_log
from magnetar.bookie.api import BookieFencedError, BookieTooManyRequestsError
from magnetar.bookie.bookie import Bookie
from magnetar.bookie.journal_format import REC_ADD


class Heard:
    """A waiter recording what it is told (and where: it must be the event loop's thread)."""

    def __init__(self) -> None:
        self.told: list[BaseException | None] = []
        self.done = asyncio.get_running_loop().create_future()

    def __call__(self, exc: BaseException | None) -> None:
        self.told.append(exc)
        if not self.done.done():
            self.done.set_result(None)


async def test_a_run_of_records_replays_as_records_appended_one_by_one(tmp_path: Path) -> None:
    ones, run = tmp_path / "ones", tmp_path / "run"
    datas = [payload(1, e) for e in range(40)] + [b"B" * 9000]  # the last one bigger than _INLINE_MAX
    heads = [b"h%03d" % e for e in range(len(datas))]
    j = await start_journal(ones)
    for e, (head, data) in enumerate(zip(heads, datas, strict=True)):
        j.append_cb(REC_ADD, 7, e, e - 1, data, lambda exc: None, head)
    await j.close()
    j = await start_journal(run)
    heard = Heard()
    j.append_many(REC_ADD, 7, range(len(datas)), -1, heads, datas, heard)
    assert heard.told == []  # never from inside the call
    await asyncio.wait_for(heard.done, 10)
    await asyncio.sleep(0.05)
    assert heard.told == [None]  # one waiter, told once
    await j.close()
    got = replayed(run)
    assert [(r[0], r[1], r[2], r[4]) for r in got] == [(REC_ADD, 7, e, heads[e] + datas[e]) for e in range(len(datas))]
    assert [(r[0], r[1], r[2], r[4]) for r in replayed(ones)] == [(r[0], r[1], r[2], r[4]) for r in got]


async def test_a_run_spanning_groups_is_told_after_its_last_group(tmp_path: Path) -> None:
    j = await start_journal(tmp_path, group_max_bytes=4096)
    heard = Heard()
    datas = [b"g" * 500 for _ in range(40)]  # ~20 KiB: several groups
    j.append_many(REC_ADD, 1, range(40), -1, [b""] * 40, datas, heard)
    await asyncio.wait_for(heard.done, 10)
    assert heard.told == [None]
    assert j.groups_written >= 1 and j.synced_position.offset >= 40 * 500
    await j.close()
    assert [r[2] for r in replayed(tmp_path)] == list(range(40))


async def test_add_parts_many_stores_and_answers_once(make_bookie) -> None:  # type: ignore[no-untyped-def]
    b: Bookie = await make_bookie()
    heard = Heard()
    datas = [payload(3, e) for e in range(100)]
    b.add_parts_many(3, range(100), KEY, -1, [b""] * 100, datas, False, heard)
    await asyncio.wait_for(heard.done, 10)
    assert heard.told == [None]
    assert [d for _, d in await b.read_entries(3, 0, 99)] == datas
    await b.checkpoint()
    assert [d for _, d in await b.read_entries(3, 0, 99)] == datas


async def test_add_parts_many_on_a_fenced_ledger_raises_and_adds_nothing(make_bookie) -> None:  # type: ignore[no-untyped-def]
    b: Bookie = await make_bookie()
    await b.add_entry_nowait(4, 0, KEY, -1, b"first")
    await b.fence(4, KEY)
    heard = Heard()
    with pytest.raises(BookieFencedError):
        b.add_parts_many(4, range(1, 6), KEY, 0, [b""] * 5, [b"x"] * 5, False, heard)
    assert b.entry_ids(4) == [0] and heard.told == []


async def test_held_back_run_answers_once_with_the_first_error(make_bookie, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """A full write cache holds a run back entry by entry; the run's waiter hears once, after all of them."""
    cache_max = 32 * 1024
    b: Bookie = await make_bookie(write_cache_max_bytes=cache_max, max_throttle_time_s=0.3, entry_log_size=8 << 20)
    real = entry_log._writev

    def slow_writev(fd: int, parts: list[bytes]) -> int:
        time.sleep(1.0)  # the checkpoint thread: the event loop keeps running
        return real(fd, parts)

    monkeypatch.setattr(entry_log, "_writev", slow_writev)
    entry = b"r" * 1024
    first = Heard()
    b.add_parts_many(1, range(40), KEY, -1, [b""] * 40, [entry] * 40, False, first)  # fills the cache
    held = Heard()
    b.add_parts_many(1, range(40, 80), KEY, -1, [b""] * 40, [entry] * 40, False, held)
    await asyncio.wait_for(asyncio.gather(first.done, held.done), 20)
    await asyncio.sleep(0.05)
    assert first.told == [None]
    assert len(held.told) == 1 and isinstance(held.told[0], BookieTooManyRequestsError)
    assert b.throttled_adds == 40
    monkeypatch.setattr(entry_log, "_writev", real)
    await b.checkpoint()
