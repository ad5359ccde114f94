"""Seek by a monotone predicate over a ledger list (``managed_ledger/seek.py``, ``positions.stored_spans``):
pure functions, so the spans and the number of entries read are checked directly."""

from __future__ import annotations

from magnetar.managed_ledger.api import Entry, Position
from magnetar.managed_ledger.metadata import LedgerInfo
from magnetar.managed_ledger.positions import stored_spans
from magnetar.managed_ledger.seek import newest_matching

# Ledgers 3 (5 entries), 4 (empty), 7 (3 entries), 9 (the current one, 2 so far).
IDS = [3, 4, 7, 9]
LEDGERS = {3: LedgerInfo(3, 5), 4: LedgerInfo(4, 0), 7: LedgerInfo(7, 3), 9: LedgerInfo(9, 2)}
ALL = [Position(3, e) for e in range(5)] + [Position(7, e) for e in range(3)] + [Position(9, e) for e in range(2)]


def test_spans_skip_empty_ledgers_and_clip_to_first_and_last() -> None:
    assert stored_spans(IDS, LEDGERS, Position(3, 0), Position(9, 1)) == [(3, 0, 5), (7, 0, 3), (9, 0, 2)]
    assert stored_spans(IDS, LEDGERS, Position(3, 2), Position(7, 1)) == [(3, 2, 3), (7, 0, 2)]
    assert stored_spans(IDS, LEDGERS, Position(7, 0), Position(9, 0)) == [(7, 0, 3), (9, 0, 1)]
    assert stored_spans(IDS, LEDGERS, Position(9, 1), Position(9, 0)) == []  # last before first


async def test_newest_matching_reads_log_n_entries_across_ledgers() -> None:
    reads: list[Position] = []

    async def read(pos: Position) -> Entry:
        reads.append(pos)
        return Entry(pos, ALL.index(pos).to_bytes(1, "big"))

    spans = stored_spans(IDS, LEDGERS, Position(3, 0), Position(9, 1))
    for k, want in enumerate(ALL):
        reads.clear()
        assert await newest_matching(spans, read, lambda e, k=k: e.data[0] <= k) == want
        assert len(reads) <= 5  # 1 + ceil(log2(10))

    async def never(_e: Entry) -> bool:  # an awaitable predicate
        return False

    assert await newest_matching(spans, read, never) is None
    assert await newest_matching([], read, lambda _e: True) is None
