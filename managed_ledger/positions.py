"""Position arithmetic over a managed ledger's ledger list.

The list is ``ids`` (ledger ids ascending, the last one current) and ``ledgers`` (id -> info,
whose ``entries`` counts the entries written so far). Pure functions: the managed ledger passes
its list in, so cursors and readers get one definition of "next", "previous" and "between".
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Mapping, Sequence

from magnetar.managed_ledger.api import Position
from magnetar.managed_ledger.metadata import LedgerInfo


def normalize(ids: Sequence[int], ledgers: Mapping[int, LedgerInfo], pos: Position) -> Position:
    """The first stored (or next-to-be-written) position at or after ``pos``."""
    lid, eid = pos
    if eid < 0:
        eid = 0
    i = bisect_left(ids, lid)
    n = len(ids)
    while i < n:
        cid = ids[i]
        if cid != lid:
            eid = 0
        li = ledgers[cid]
        if eid < li.entries or i == n - 1:
            return Position(cid, eid)
        i += 1
    if n:  # past the current ledger: the next position to be written
        li = ledgers[ids[-1]]
        return Position(ids[-1], max(li.entries, 0))
    return Position(lid, eid)


def previous(ids: Sequence[int], ledgers: Mapping[int, LedgerInfo], position: Position) -> Position:
    """The stored position before ``position`` (``(ledger, -1)`` if there is none)."""
    lid, eid = position
    if eid > 0:
        return Position(lid, eid - 1)
    i = bisect_left(ids, lid) - 1
    while i >= 0:
        li = ledgers[ids[i]]
        if li.entries > 0:
            return Position(li.ledger_id, li.entries - 1)
        i -= 1
    return Position(lid, -1)


def count_between(ids: Sequence[int], ledgers: Mapping[int, LedgerInfo], start: Position, end: Position) -> int:
    """Entries stored from ``start`` to ``end``, both included."""
    if end < start:
        return 0
    total = 0
    i = bisect_left(ids, start.ledger_id)
    while i < len(ids) and ids[i] <= end.ledger_id:
        lid = ids[i]
        n = ledgers[lid].entries
        lo = max(start.entry_id, 0) if lid == start.ledger_id else 0
        hi = min(end.entry_id, n - 1) if lid == end.ledger_id else n - 1
        if hi >= lo:
            total += hi - lo + 1
        i += 1
    return total


def stored_spans(
    ids: Sequence[int], ledgers: Mapping[int, LedgerInfo], first: Position, last: Position
) -> list[tuple[int, int, int]]:
    """The entries stored from ``first`` to ``last`` (both included) as ``(ledger, first entry, count)``
    runs, one per non-empty ledger, in order."""
    spans: list[tuple[int, int, int]] = []
    for lid in ids:
        if lid < first.ledger_id or lid > last.ledger_id:
            continue
        n = ledgers[lid].entries
        lo = first.entry_id if lid == first.ledger_id else 0
        hi = min(n - 1, last.entry_id if lid == last.ledger_id else n - 1)
        if hi >= lo:
            spans.append((lid, lo, hi - lo + 1))
    return spans
