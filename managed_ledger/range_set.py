"""Individually acknowledged positions as sorted, disjoint, closed ranges.

A range never spans two ledgers: whether ``(L1, last)`` and ``(L2, 0)`` are adjacent depends on
the ledger list, which only the cursor knows, so cross-ledger contiguity is the cursor's job.
Lookups are ``bisect`` over a list of range starts (O(log n)); inserting a new range shifts the
lists (a memmove), which is cheap for the range counts subscriptions produce.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterator

from magnetar.managed_ledger.api import Position


class RangeSet:
    """Sorted disjoint closed ranges ``[first, last]`` of positions within one ledger each."""

    __slots__ = ("_count", "_ends", "_starts")

    def __init__(self) -> None:
        self._starts: list[Position] = []
        self._ends: list[Position] = []
        self._count = 0  # positions covered, kept incrementally for O(1) backlog arithmetic

    def __len__(self) -> int:
        """Number of ranges."""
        return len(self._starts)

    def __bool__(self) -> bool:
        return bool(self._starts)

    @property
    def count(self) -> int:
        """Number of positions covered."""
        return self._count

    def __iter__(self) -> Iterator[tuple[Position, Position]]:
        return zip(self._starts, self._ends, strict=True)

    def __contains__(self, pos: Position) -> bool:
        i = bisect_right(self._starts, pos) - 1
        return i >= 0 and self._ends[i] >= pos

    def range_containing(self, pos: Position) -> tuple[Position, Position] | None:
        """The range holding ``pos``, if any."""
        i = bisect_right(self._starts, pos) - 1
        if i >= 0 and self._ends[i] >= pos:
            return self._starts[i], self._ends[i]
        return None

    def first_at_or_after(self, pos: Position) -> tuple[Position, Position] | None:
        """The first range ending at or after ``pos`` (it may contain ``pos``)."""
        i = bisect_right(self._starts, pos) - 1
        if i < 0 or self._ends[i] < pos:
            i += 1
        if i < len(self._starts):
            return self._starts[i], self._ends[i]
        return None

    def add(self, pos: Position) -> bool:
        """Add one position; returns whether it was new."""
        return self.add_range(pos, pos) > 0

    def add_range(self, first: Position, last: Position) -> int:
        """Add ``[first, last]`` (same ledger); returns how many positions were new."""
        if first.ledger_id != last.ledger_id:
            raise ValueError("a range must stay within one ledger")
        if last < first:
            return 0
        lid = first.ledger_id
        starts, ends = self._starts, self._ends
        # Ranges that overlap or touch [first, last] inside this ledger are merged into one.
        lo = bisect_left(ends, Position(lid, first.entry_id - 1))
        hi = bisect_right(starts, Position(lid, last.entry_id + 1))
        if lo == hi:
            starts.insert(lo, first)
            ends.insert(lo, last)
            n = last.entry_id - first.entry_id + 1
            self._count += n
            return n
        new_first = min(first, starts[lo])
        new_last = max(last, ends[hi - 1])
        covered = sum(ends[i].entry_id - starts[i].entry_id + 1 for i in range(lo, hi))
        starts[lo:hi] = [new_first]
        ends[lo:hi] = [new_last]
        n = (new_last.entry_id - new_first.entry_id + 1) - covered
        self._count += n
        return n

    def remove_up_to(self, pos: Position) -> None:
        """Drop every position ``<= pos`` (the mark-delete position moved there)."""
        starts, ends = self._starts, self._ends
        i = bisect_right(ends, pos)
        removed = sum(ends[k].entry_id - starts[k].entry_id + 1 for k in range(i))
        del starts[:i]
        del ends[:i]
        if starts and starts[0] <= pos:  # a range straddles pos: cut its head off
            head = starts[0]
            cut = Position(pos.ledger_id, pos.entry_id + 1)
            removed += cut.entry_id - head.entry_id
            starts[0] = cut
        self._count -= removed

    def remove_ledgers_before(self, ledger_id: int) -> None:
        """Drop every position in ledgers with a smaller id (they were trimmed)."""
        self.remove_up_to(Position(ledger_id, -1))

    def clear(self) -> None:
        """Remove everything."""
        self._starts.clear()
        self._ends.clear()
        self._count = 0

    def count_in(self, first: Position, last: Position) -> int:
        """How many covered positions lie in ``[first, last]``."""
        if last < first or not self._starts:
            return 0
        i = bisect_right(self._starts, first) - 1
        if i < 0 or self._ends[i] < first:
            i += 1
        n = 0
        while i < len(self._starts) and self._starts[i] <= last:
            # Both clipped ends stay in the range's own ledger (tuple order), so ids subtract.
            s, e = max(self._starts[i], first), min(self._ends[i], last)
            n += e.entry_id - s.entry_id + 1
            i += 1
        return n

    def to_list(self) -> list[list[int]]:
        """``[[ledger, first_entry, last_entry], ...]`` for persistence."""
        return [[s.ledger_id, s.entry_id, e.entry_id] for s, e in zip(self._starts, self._ends, strict=True)]

    @classmethod
    def from_list(cls, items: list[list[int]]) -> RangeSet:
        """Inverse of :meth:`to_list`."""
        rs = cls()
        for lid, first, last in items:
            rs.add_range(Position(lid, first), Position(lid, last))
        return rs

    def __repr__(self) -> str:
        inner = ", ".join(f"[{s}..{e}]" for s, e in self)
        return f"RangeSet({inner})"
