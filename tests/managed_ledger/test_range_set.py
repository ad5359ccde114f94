"""RangeSet: sorted disjoint ranges of individually acked positions."""

from __future__ import annotations

import random

from magnetar.managed_ledger.api import Position as P
from magnetar.managed_ledger.range_set import RangeSet


def test_add_merge_contains() -> None:
    rs = RangeSet()
    assert rs.add(P(1, 5)) and not rs.add(P(1, 5))
    rs.add(P(1, 7))
    assert len(rs) == 2 and rs.count == 2
    rs.add(P(1, 6))  # bridges two ranges
    assert list(rs) == [(P(1, 5), P(1, 7))] and rs.count == 3
    rs.add(P(2, 0))  # next ledger: never merged across ledgers
    assert len(rs) == 2
    assert P(1, 6) in rs and P(1, 8) not in rs and P(0, 6) not in rs
    assert rs.range_containing(P(1, 7)) == (P(1, 5), P(1, 7))
    assert rs.first_at_or_after(P(1, 8)) == (P(2, 0), P(2, 0))
    assert rs.count_in(P(1, 6), P(3, 0)) == 3
    assert rs.add_range(P(1, 0), P(1, 9)) == 7 and rs.count == 11


def test_remove_up_to_and_serialisation() -> None:
    rs = RangeSet.from_list([[1, 2, 4], [1, 8, 9], [3, 0, 5]])
    assert rs.count == 11
    rs.remove_up_to(P(1, 3))
    assert next(iter(rs)) == (P(1, 4), P(1, 4)) and rs.count == 9
    rs.remove_ledgers_before(3)
    assert rs.to_list() == [[3, 0, 5]] and rs.count == 6
    rs.clear()
    assert not rs and rs.count == 0


def test_matches_a_plain_set() -> None:
    rnd = random.Random(7)
    rs, ref = RangeSet(), set()
    for _ in range(3000):
        p = P(rnd.randint(1, 3), rnd.randint(0, 60))
        if rnd.random() < 0.9:
            rs.add(p)
            ref.add(p)
        else:
            rs.remove_up_to(p)
            ref = {q for q in ref if q > p}
        assert rs.count == len(ref)
    assert all((P(lid, e) in rs) == (P(lid, e) in ref) for lid in range(4) for e in range(-1, 62))
    starts = [s for s, _ in rs]
    assert starts == sorted(starts)
