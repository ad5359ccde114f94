"""Positions and offsets of the ``pulsar`` Spark source: pure arithmetic, no Spark, no broker.

A *position* is ``(ledger, entry, batch)``: the message id without the partition. Non-batched messages have
``batch == -1``; a batched entry's messages have batch indexes ``0..n-1``. Positions order lexicographically,
so ``(L, E, -1)`` is "the start of entry E" (before its batch index 0) and ``EARLIEST`` precedes every message.

An *offset* is ``{topic-partition: "ledger:entry:batch"}`` where each value is the position of the *next*
message to read (inclusive start, exclusive end). It depends only on positions, never on time or on the
state of a client, so a restarted query resumes exactly where its checkpoint says.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import NamedTuple


class Position(NamedTuple):
    """A message position inside one topic partition."""

    ledger: int
    entry: int
    batch: int = -1

    def __str__(self) -> str:
        return f"{self.ledger}:{self.entry}:{self.batch}"

    @classmethod
    def parse(cls, text: str) -> Position:
        """``"L:E"`` or ``"L:E:B"`` -> Position; raises ValueError on anything else."""
        parts = str(text).strip().split(":")
        if len(parts) not in (2, 3):
            raise ValueError(f"not a position (ledger:entry[:batch]): {text!r}")
        nums = [int(p) for p in parts]
        return cls(nums[0], nums[1], nums[2] if len(nums) == 3 else -1)

    @property
    def is_earliest(self) -> bool:
        return self.ledger < 0


EARLIEST = Position(-1, -1, -1)


def after(message: Position) -> Position:
    """The position just after a message: the next batch index, or the start of the next entry."""
    if message.batch >= 0:
        return Position(message.ledger, message.entry, message.batch + 1)
    return Position(message.ledger, message.entry + 1, -1)


def after_last(last_ledger: int, last_entry: int) -> Position:
    """End (exclusive) of a partition whose last entry is ``last_ledger:last_entry`` (the whole entry, batch or not).

    ``lastMessageId`` of an empty topic has a negative ledger or entry: the end is then ``EARLIEST``.
    """
    if last_ledger < 0 or last_entry < 0:
        return EARLIEST
    return Position(last_ledger, last_entry + 1, -1)


Offset = dict[str, Position]


def dump_offset(offset: Mapping[str, Position]) -> str:
    """Compact, key-sorted JSON so equal offsets have equal text."""
    return json.dumps({k: str(v) for k, v in sorted(offset.items())}, separators=(",", ":"))


def to_json_dict(offset: Mapping[str, Position]) -> dict[str, str]:
    """Offset as the plain dict PySpark serializes (string keys and values)."""
    return {k: str(v) for k, v in sorted(offset.items())}


def load_offset(data: str | Mapping[str, object]) -> Offset:
    """Inverse of :func:`dump_offset` / :func:`to_json_dict`."""
    raw = json.loads(data) if isinstance(data, str) else data
    if not isinstance(raw, Mapping):
        raise ValueError(f"offset must be a JSON object: {data!r}")
    return {str(k): Position.parse(str(v)) for k, v in raw.items()}


def is_empty_range(start: Position, end: Position) -> bool:
    return end <= start


def split_range(
    start: Position,
    end: Position,
    ledgers: Iterable[tuple[int, int]],
    max_entries: int,
) -> list[tuple[Position, Position]]:
    """Split ``[start, end)`` into ranges of at most ``max_entries`` entries, cut at entry starts.

    ``ledgers`` are ``(ledger_id, entries)`` of the partition's ledgers in order (the managed ledger's list);
    the ranges cover ``[start, end)`` exactly, with no gaps, so reading each range and concatenating gives
    the same messages as reading the whole. Without ledger information the range is returned whole.
    """
    if is_empty_range(start, end):
        return []
    if max_entries <= 0:
        return [(start, end)]
    cuts: list[Position] = []
    count = 0
    for ledger_id, entries in ledgers:
        first = 0
        if start.ledger > ledger_id:
            continue
        if start.ledger == ledger_id:
            # The entry of `start` itself is only partly ours when start is mid-batch; cut after it.
            first = start.entry + (1 if start.batch >= 0 else 0)
        for entry in range(first, entries):
            pos = Position(ledger_id, entry, -1)
            if pos >= end:
                break
            if pos > start and count >= max_entries:
                cuts.append(pos)
                count = 0
            count += 1
        else:
            continue
        break
    bounds = [start, *cuts, end]
    return [(bounds[i], bounds[i + 1]) for i in range(len(bounds) - 1)]


def entries_between(start: Position, end: Position, ledgers: Iterable[tuple[int, int]]) -> int:
    """Entries from ``start``'s entry (counted whole when ``start`` is mid-batch) up to ``end`` (exclusive).

    ``ledgers`` are ``(ledger_id, entries)`` in order (``internalStats``); ledgers newer than those listed count
    up to ``end``'s entry, so a layout looked up a while ago still counts the current ledger's new entries.
    """
    if end <= start:
        return 0
    if start.ledger == end.ledger:
        return max(0, end.entry - start.entry)
    count = 0
    for ledger_id, entries in ledgers:
        if ledger_id < start.ledger or ledger_id >= end.ledger:
            continue
        count += entries - (max(start.entry, 0) if ledger_id == start.ledger else 0)
    return count + max(end.entry, 0)


def fair_shares(budget: int, names: list[str]) -> dict[str, int]:
    """Split a row budget across partitions: equal shares, the remainder to the first ones; sums to ``budget``."""
    if not names or budget <= 0:
        return {n: 0 for n in names}
    base, extra = divmod(budget, len(names))
    return {n: base + (1 if i < extra else 0) for i, n in enumerate(names)}


def clamp(offset: Mapping[str, Position], ceiling: Mapping[str, Position]) -> Offset:
    """Per partition, the lower of two offsets; partitions missing from ``ceiling`` are left out.

    Used by ``Trigger.AvailableNow``: partitions that appeared after the query started wait for the next run.
    """
    return {k: min(v, ceiling[k]) for k, v in offset.items() if k in ceiling}


def data_lost(start: Position, first_ledger: int | None, committed_next: Position | None = None) -> bool:
    """Whether messages at ``start`` were trimmed away (retention/TTL) before being read.

    Trimming removes whole ledgers from the front, so ``start`` is gone when its ledger precedes the
    first surviving ledger. Exception: the query's own commit subscription had already passed ``start``
    (``committed_next >= start``), i.e. the trimmed ledger was fully read and committed by this query.
    A ledger fully read without a commit subscription and trimmed afterwards is reported as lost too
    (the broker keeps no record of its length): use ``commitSubscription`` or retention to avoid that.
    """
    if start.is_earliest or first_ledger is None:
        return False
    if committed_next is not None and committed_next >= start:
        return False
    return start.ledger < first_ledger
