"""An idle bookie does not poll: its checkpoint loop sleeps until a job is due and its journal writer until an
add arrives (a broker's idle CPU, and the fixed cost in a lightly loaded benchmark row, come from polling)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from bookie_helpers import KEY, small_config

from magnetar.bookie.bookie import Bookie


def _voluntary_switches(native_id: int) -> int:
    """How often the thread blocked (each wake-up from a wait is one voluntary context switch)."""
    for line in Path(f"/proc/self/task/{native_id}/status").read_text().splitlines():
        if line.startswith("voluntary_ctxt_switches:"):
            return int(line.split()[1])
    raise AssertionError("no voluntary_ctxt_switches in /proc status")


async def _add(b: Bookie, entry_id: int, data: bytes) -> None:
    await asyncio.wait_for(b.add_entry_nowait(1, entry_id, KEY, entry_id - 1, data), 10)


async def test_idle_checkpoint_loop_sleeps_until_a_job_is_due(make_bookie) -> None:  # type: ignore[no-untyped-def]
    b: Bookie = await make_bookie(minor_compaction_interval_s=3600.0, major_compaction_interval_s=3600.0)
    await asyncio.sleep(0.1)  # the first round (free-space check at start) is done
    before = b.checkpoint_loop_rounds
    await asyncio.sleep(1.5)
    # A polling loop (the old 0.25 s tick) would have run 6 rounds here; nothing is due for an hour.
    assert b.checkpoint_loop_rounds - before == 0


async def test_checkpoint_loop_still_runs_due_checkpoints(make_bookie) -> None:  # type: ignore[no-untyped-def]
    b: Bookie = await make_bookie(checkpoint_interval_s=0.3)
    await asyncio.sleep(0.1)
    before = b.checkpoint_loop_rounds
    await _add(b, 0, b"x" * 100)
    await asyncio.sleep(1.0)
    assert b.cache_bytes == 0  # the periodic checkpoint flushed the entry without being asked
    assert 1 in b.storage.index.ledgers
    # About one round per interval (plus the wake-ups at each flush's end), not one per polling tick.
    assert 2 <= b.checkpoint_loop_rounds - before <= 8


async def test_idle_journal_writer_does_not_wake(make_bookie) -> None:  # type: ignore[no-untyped-def]
    b: Bookie = await make_bookie()
    await _add(b, 0, b"x" * 100)  # the writer has run and gone idle
    (writer,) = [t for t in threading.enumerate() if t.name == "journal-writer"]
    assert writer.native_id is not None
    await asyncio.sleep(0.1)
    before = _voluntary_switches(writer.native_id)
    await asyncio.sleep(1.5)
    assert _voluntary_switches(writer.native_id) - before == 0  # a 0.5 s poll would show 3
    await _add(b, 1, b"y" * 100)  # and an add still wakes it
    assert await b.read_entries(1, 1, 1) == [(1, b"y" * 100)]


async def test_close_cancels_the_checkpoint_loop_whatever_it_waits_on(tmp_path: Path) -> None:
    """The loop's jobs wait with asyncio.timeout: Python 3.11's wait_for loses a cancellation that arrives as
    its inner future completes, and the loop then slept on while close() waited out its 5 s grace period.
    A checkpoint right before close() (its flush's end wakes the loop) hit that in a few percent of closes."""
    for i in range(30):
        b = Bookie(small_config(tmp_path / f"b{i}", minor_compaction_interval_s=0.0))
        await b.start()
        await _add(b, 0, b"x" * 100)
        await b.checkpoint()
        await asyncio.sleep(0)
        t0 = asyncio.get_running_loop().time()
        await asyncio.wait_for(b.close(), 30)
        assert asyncio.get_running_loop().time() - t0 < 2.0, f"close {i} waited for the checkpoint loop"
