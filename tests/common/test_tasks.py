"""TaskSet: kept tasks, failures logged once, cancel and bounded close."""

from __future__ import annotations

import asyncio
import gc
import logging
import time

import pytest

from magnetar.common.tasks import TaskSet


async def test_keeps_a_reference_until_done() -> None:
    tasks = TaskSet("owner")
    gate = asyncio.Event()

    async def work() -> int:
        await gate.wait()
        return 7

    task = tasks.spawn(work(), name="work")
    del task
    gc.collect()
    assert len(tasks) == 1
    gate.set()
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert len(tasks) == 0


async def test_result_and_exception_reach_an_awaiting_caller() -> None:
    tasks = TaskSet("owner")

    async def ok() -> int:
        return 3

    async def bad() -> None:
        raise ValueError("boom")

    assert await tasks.spawn(ok()) == 3
    with pytest.raises(ValueError, match="boom"):
        await tasks.spawn(bad())


async def test_unexpected_failure_logged_once_with_traceback(caplog: pytest.LogCaptureFixture) -> None:
    tasks = TaskSet("conn 1")

    async def bad() -> None:
        raise RuntimeError("kaput")

    with caplog.at_level(logging.WARNING):
        task = tasks.spawn(bad(), name="bad-one")
        await asyncio.wait([task])
        await asyncio.sleep(0)
    records = [r for r in caplog.records if "bad-one" in r.getMessage()]
    assert len(records) == 1
    assert records[0].levelno == logging.ERROR
    assert records[0].exc_info is not None and records[0].exc_info[0] is RuntimeError
    assert "conn 1" in records[0].getMessage()


async def test_expected_failure_logged_as_one_line(caplog: pytest.LogCaptureFixture) -> None:
    tasks = TaskSet("topic t", expected=(ConnectionError,))

    async def gone() -> None:
        raise ConnectionResetError("peer went away")

    with caplog.at_level(logging.WARNING):
        task = tasks.spawn(gone(), name="send")
        await asyncio.wait([task])
        await asyncio.sleep(0)
    records = [r for r in caplog.records if "send" in r.getMessage()]
    assert len(records) == 1
    assert records[0].levelno == logging.WARNING
    assert records[0].exc_info is None
    assert "peer went away" in records[0].getMessage()


async def test_cancelled_task_is_not_logged(caplog: pytest.LogCaptureFixture) -> None:
    tasks = TaskSet("owner")
    task = tasks.spawn(asyncio.sleep(10))
    await asyncio.sleep(0)
    with caplog.at_level(logging.DEBUG, logger="magnetar.common.tasks"):
        task.cancel()
        await asyncio.wait([task])
        await asyncio.sleep(0)
    assert not caplog.records
    assert len(tasks) == 0


async def test_close_cancels_and_awaits_everything() -> None:
    tasks = TaskSet("owner")
    cleaned: list[int] = []

    async def worker(i: int) -> None:
        try:
            await asyncio.sleep(10)
        finally:
            cleaned.append(i)

    spawned = [tasks.spawn(worker(i)) for i in range(3)]
    await asyncio.sleep(0)
    await tasks.close(grace=1)
    assert sorted(cleaned) == [0, 1, 2]
    assert all(t.cancelled() for t in spawned)
    assert len(tasks) == 0 and tasks.closed


async def test_close_is_bounded_by_timeout(caplog: pytest.LogCaptureFixture) -> None:
    tasks = TaskSet("owner")
    release = asyncio.Event()

    async def stubborn() -> None:
        while not release.is_set():
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                continue  # ignores cancellation until released

    task = tasks.spawn(stubborn(), name="stubborn")
    await asyncio.sleep(0)
    start = time.monotonic()
    with caplog.at_level(logging.WARNING):
        await tasks.close(grace=0.2)
    assert time.monotonic() - start < 2
    assert any("stubborn" in r.getMessage() for r in caplog.records)
    release.set()
    task.cancel()
    await asyncio.wait([task], timeout=2)
    assert task.done()


async def test_spawn_after_close_never_starts() -> None:
    tasks = TaskSet("owner")
    await tasks.close()
    started = []

    async def work() -> None:
        started.append(1)

    task = tasks.spawn(work())
    await asyncio.wait([task])
    assert task.cancelled() and not started and len(tasks) == 0


async def test_sync_cancel_for_synchronous_owners() -> None:
    tasks = TaskSet("owner")
    task = tasks.spawn(asyncio.sleep(10))
    await asyncio.sleep(0)
    tasks.cancel()
    await asyncio.wait([task], timeout=1)
    assert task.cancelled() and tasks.closed


async def test_a_task_may_close_its_own_set() -> None:
    tasks = TaskSet("owner")
    other = tasks.spawn(asyncio.sleep(10))

    async def closer() -> str:
        await tasks.close(grace=1)
        return "closed"

    me = tasks.spawn(closer())
    assert await asyncio.wait_for(asyncio.shield(me), 2) == "closed"
    assert other.cancelled()
