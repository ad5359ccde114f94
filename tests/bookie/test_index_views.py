"""The index as seen by concurrent readers: a rebase or an overwrite is never half visible."""

from __future__ import annotations

import sys
import threading
import time
from array import array

from magnetar.bookie.index import Block, LedgerLocations


def _block(first: int, count: int, tag: int) -> Block:
    ids = range(first, first + count)
    return Block(
        1,
        first,
        array("q", [(tag << 32) + e for e in ids]),
        array("I", [e + tag for e in ids]),
        array("I", [e * 3 + tag for e in ids]),
    )


def test_rebase_and_overwrite_are_atomic_for_readers() -> None:
    """Readers on another thread look up an indexed entry while the checkpoint thread re-bases and
    overwrites: every lookup sees one whole version (location, length and crc agree), never None.
    Thread switches are forced every microsecond so a half-done update would be seen."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    current: list[LedgerLocations] = []
    stop = threading.Event()
    bad: list[object] = []
    lookups = 0

    def reader() -> None:
        nonlocal lookups
        deadline = time.monotonic() + 20
        while not stop.is_set() and time.monotonic() < deadline:
            locs = current[-1] if current else None
            if locs is None:
                continue
            got = locs.lookup(5000)
            lookups += 1
            if got is None:
                bad.append(None)
                continue
            log_id, off, length, crc = got
            tag = log_id
            if off != 5000 or length != 5000 + tag or crc != 15000 + tag:
                bad.append(got)

    t = threading.Thread(target=reader)
    t.start()
    try:
        loop_deadline = time.monotonic() + 4
        for i in range(3000):
            if time.monotonic() > loop_deadline:
                break
            locs = LedgerLocations()
            locs.merge(_block(4000, 2000, 1))
            current.append(locs)
            locs.merge(_block(4000 - 1000 - i, 1000, 2))  # entries below the base: re-base
            locs.merge(_block(4500, 1000, 3 + i % 5))  # overwrite entries that are already known
            if bad:
                break
    finally:
        stop.set()
        t.join(30)
        sys.setswitchinterval(old)
    assert lookups > 0
    assert not bad, f"{len(bad)} inconsistent lookups, e.g. {bad[:3]}"
