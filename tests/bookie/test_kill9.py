"""A bookie killed with SIGKILL mid-stream loses no acknowledged entry."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from bookie_helpers import payload, small_config

from magnetar.bookie.api import BookieFencedError
from magnetar.bookie.bookie import Bookie

HERE = Path(__file__).parent


def run_and_kill(data_dir: Path) -> tuple[dict[int, int], bool, int, str]:
    """Run the writer, SIGKILL it mid-stream; returns last acked entry per ledger, fenced, journal files
    reused, stderr."""
    # No empty entry: it would put the working directory (the repo root) on sys.path.
    paths = [str(HERE), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "kill9_writer.py"), str(data_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    acked: dict[int, int] = {1: -1, 2: -1}
    fenced = False
    reused = 0
    deadline = time.monotonic() + 30
    run_until = time.monotonic() + 1.0
    try:
        assert proc.stdout is not None
        # Let it run through many checkpoints (every 50 ms) and journal rotations.
        while (min(acked.values()) < 3000 or not fenced or time.monotonic() < run_until) and (
            time.monotonic() < deadline
        ):
            line = proc.stdout.readline()
            if not line:
                break
            kind, *rest = line.split()
            if kind == b"ACK":
                lid, eid = int(rest[0]), int(rest[1])
                assert eid == acked[lid] + 1  # acknowledged in order
                acked[lid] = eid
            elif kind == b"FENCED":
                fenced = True
            elif kind == b"REUSED":
                reused = int(rest[0])
        proc.send_signal(signal.SIGKILL)
        # Whatever the child printed before dying was acknowledged too.
        for line in proc.stdout.read().splitlines():
            kind, *rest = line.split()
            if kind == b"ACK" and len(rest) == 2:
                acked[int(rest[0])] = max(acked[int(rest[0])], int(rest[1]))
    finally:
        proc.kill()
        proc.wait(10)
    assert proc.stderr is not None
    return acked, fenced, reused, proc.stderr.read().decode(errors="replace")[-3000:]


@pytest.mark.slow
async def test_kill9_keeps_every_acknowledged_entry(tmp_path: Path) -> None:
    data_dir = tmp_path / "bookie"
    acked, fenced, reused, stderr = await asyncio.to_thread(run_and_kill, data_dir)
    assert fenced and min(acked.values()) >= 3000, stderr
    # The journal was writing into reused files (their old records still behind the new ones).
    assert reused >= 1, stderr

    bookie = Bookie(small_config(data_dir))
    await bookie.start()
    try:
        # Both recovery paths were needed: checkpointed entries and journal-only ones.
        assert bookie.storage.index.ledgers[1].lookup(0) is not None
        assert bookie._cache, "nothing was replayed from the journal"
        for lid, last in acked.items():
            got = await bookie.read_entries(lid, 0, last)
            assert len(got) == last + 1
            for eid, data in got:
                assert data == payload(lid, eid), f"entry {lid}:{eid} differs after kill -9"
        assert bookie.ledger_state(3).fenced  # type: ignore[union-attr]
        with pytest.raises(BookieFencedError):
            bookie.add_entry_nowait(3, 1, b"master-key", 0, b"late")
    finally:
        await bookie.close()
