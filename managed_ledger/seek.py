"""Seek by a monotone predicate: the newest entry for which it holds (Pulsar's ``findNewestMatching``,
behind a seek or a cursor reset by publish time).

The predicate must hold for a prefix of the entries and not after it (publish times only grow); the search
reads O(log n) entries, not n.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from magnetar.managed_ledger.api import Entry, Position

Predicate = Callable[[Entry], bool | Awaitable[bool]]


def _nth(spans: Sequence[tuple[int, int, int]], k: int) -> Position:
    for lid, lo, count in spans:
        if k < count:
            return Position(lid, lo + k)
        k -= count
    raise IndexError(k)


async def newest_matching(
    spans: Sequence[tuple[int, int, int]], read: Callable[[Position], Awaitable[Entry]], predicate: Predicate
) -> Position | None:
    """The last position of ``spans`` (``(ledger, first entry, count)`` runs, see
    :func:`~magnetar.managed_ledger.positions.stored_spans`) whose entry ``predicate`` accepts, or None when
    it accepts not even the first. ``read`` fetches one entry."""
    total = sum(count for _lid, _lo, count in spans)
    if total == 0:
        return None

    async def matches(k: int) -> bool:
        res = predicate(await read(_nth(spans, k)))
        if not isinstance(res, bool):
            res = await res
        return bool(res)

    if not await matches(0):
        return None
    lo, hi = 0, total - 1  # invariant: lo matches
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if await matches(mid):
            lo = mid
        else:
            hi = mid - 1
    return _nth(spans, lo)
