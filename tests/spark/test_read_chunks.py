"""The executors' read loop (``client_io.iter_chunks`` / ``to_arrow_batches``) against a scripted reader: range
ends inside batches, non-batched entries, per-entry positions, column building. No Spark, no broker (the
real client and broker are in test_spark_pulsar.py)."""

from __future__ import annotations

from typing import Any

import pytest

from magnetar.broker.protocol import pulsar_api_pb2 as pb
from magnetar.spark import client_io
from magnetar.spark.offsets import EARLIEST, Position


class _Id:
    def __init__(self, ledger: int, entry: int, batch: int, size: int) -> None:
        self.pos = (ledger, entry, batch, size)

    def serialize(self) -> bytes:
        ledger, entry, batch, size = self.pos
        mid = pb.MessageIdData(ledgerId=ledger, entryId=entry)
        if batch >= 0:
            mid.batch_index, mid.batch_size = batch, size
        return mid.SerializeToString()


class _Msg:
    def __init__(self, ledger: int, entry: int, batch: int, size: int, props: dict[str, str] | None = None) -> None:
        self.id = _Id(ledger, entry, batch, size)
        self.props = props or {}

    def message_id(self) -> _Id:
        return self.id

    def data(self) -> bytes:
        return ":".join(map(str, self.id.pos[:3])).encode()

    def partition_key(self) -> str:
        return "k" if self.id.pos[2] == 1 else ""

    def publish_timestamp(self) -> int:
        return 1000 + self.id.pos[1]

    def event_timestamp(self) -> int:
        return 7 if self.id.pos[2] == 0 else 0

    def properties(self) -> dict[str, str]:
        return self.props


class _Reader:
    def __init__(self, messages: list[_Msg]) -> None:
        self.messages = list(messages)

    def read_next(self, timeout_millis: int) -> _Msg:
        if not self.messages:
            raise TimeoutError("Pulsar error: TimeOut")
        return self.messages.pop(0)

    def has_message_available(self) -> bool:
        return bool(self.messages)

    def close(self) -> None:
        pass


class _Client:
    def __init__(self, messages: list[_Msg]) -> None:
        self.messages = messages

    def create_reader(self, topic: str, start: Any, **kwargs: Any) -> _Reader:
        # The reader starts at the start entry's first message, as the client does for (ledger, entry, -1).
        return _Reader(self.messages)


def _topic() -> list[_Msg]:
    """Ledger 3: entry 0 a batch of 3, entry 1 not batched, entry 2 a batch of 2 (one with properties)."""
    return [
        _Msg(3, 0, 0, 3), _Msg(3, 0, 1, 3), _Msg(3, 0, 2, 3),
        _Msg(3, 1, -1, 0),
        _Msg(3, 2, 0, 2, {"p": "v"}), _Msg(3, 2, 1, 2),
    ]  # fmt: skip


def _positions(start: Position, end: Position, messages: list[_Msg] | None = None) -> list[tuple[int, int, int]]:
    client = _Client(messages if messages is not None else _topic())
    return [pos for _msg, pos in client_io.iter_range(client, "t", start, end, 10)]


ALL = [(3, 0, 0), (3, 0, 1), (3, 0, 2), (3, 1, -1), (3, 2, 0), (3, 2, 1)]


@pytest.mark.parametrize(
    ("start", "end", "expected"),
    [
        (EARLIEST, Position(3, 3), ALL),
        (Position(3, 0, 1), Position(3, 2, 1), ALL[1:5]),  # both ends inside batches
        (Position(3, 0, 3), Position(3, 3), ALL[3:]),  # after the last message of a batch
        (Position(3, 1, 0), Position(3, 3), ALL[4:]),  # a non-batched message is before index 0 of its entry
        (Position(3, 0), Position(3, 1, 0), ALL[:4]),  # ... and before an end at index 0 of its entry
        (Position(3, 0), Position(3, 1), ALL[:3]),
        (Position(3, 0, 2), Position(3, 0, 2), []),
        (EARLIEST, Position(3, 2, 0), ALL[:4]),
    ],
)
def test_ranges_cut_inside_entries(start: Position, end: Position, expected: list[tuple[int, int, int]]) -> None:
    assert _positions(start, end) == expected


def test_batch_positions_are_checked() -> None:
    # A batch whose messages do not arrive consecutively (one missing) fails instead of mislabelling rows.
    broken = [_Msg(3, 0, 0, 3), _Msg(3, 0, 1, 3), _Msg(3, 1, -1, 0), _Msg(3, 2, 0, 2), _Msg(3, 2, 1, 2)]
    with pytest.raises(client_io.MessageOrderError, match="3:0 was not delivered in order"):
        _positions(EARLIEST, Position(3, 3), broken)


def test_arrow_columns_per_entry() -> None:
    client = _Client(_topic())
    chunks = client_io.iter_chunks(client, "persistent://t/ns/x", Position(3, 0, 1), Position(3, 3), 10)
    batches = list(client_io.to_arrow_batches(chunks, "persistent://t/ns/x", rows=3))
    assert [b.num_rows for b in batches] == [3, 2]  # whole entries per Arrow batch
    rows = [r for b in batches for r in b.to_pylist()]
    assert [r["__messageId"] for r in rows] == ["3:0:1", "3:0:2", "3:1:-1", "3:2:0", "3:2:1"]
    assert [r["value"] for r in rows] == [b"3:0:1", b"3:0:2", b"3:1:-1", b"3:2:0", b"3:2:1"]
    assert [r["__key"] for r in rows] == ["k", None, None, None, "k"]
    assert [r["__publishTime"].timestamp() for r in rows] == [1.0, 1.0, 1.001, 1.002, 1.002]
    assert [r["__eventTime"] is None for r in rows] == [True, True, True, False, True]
    assert [r["__messageProperties"] for r in rows] == [[], [], [], [("p", "v")], []]
    assert {r["__topic"] for r in rows} == {"persistent://t/ns/x"}


def _checked(start: Position, end: Position, messages: list[_Msg], layout: list[tuple[int, int]]) -> list[Any]:
    check = client_io.RangeCheck(layout, lambda _pos: False, fail=True)
    chunks = client_io.iter_chunks(_Client(messages), "t", start, end, 10, None, check)
    return [(c.ledger, c.entry) for c in chunks]


def test_rollovers_are_not_gaps() -> None:
    """Ledger 3 has 2 entries, ledger 4 none (rolled over idle), ledger 5 one: reading across them, or from
    the position after ledger 3's last entry, is complete."""
    topic = [_Msg(3, 0, -1, 0), _Msg(3, 1, -1, 0), _Msg(5, 0, -1, 0)]
    layout = [(3, 2), (4, 0), (5, 1)]
    assert _checked(EARLIEST, Position(5, 1), topic, layout) == [(3, 0), (3, 1), (5, 0)]
    assert _checked(Position(3, 2), Position(5, 1), topic[2:], layout) == [(5, 0)]
    # A start in a ledger gone at planning (fully read and committed, then trimmed): not a gap either.
    assert _checked(Position(2, 7), Position(5, 1), topic[2:], [(5, 1)]) == [(5, 0)]


def test_a_gap_inside_the_range_is_data_loss() -> None:
    """The broker moved the reader past a trimmed ledger: the next entry found is not the planned next one."""
    layout = [(3, 2), (5, 1)]
    with pytest.raises(client_io.DataLossError, match="messages from 3:0 are no longer available"):
        _checked(EARLIEST, Position(5, 1), [_Msg(5, 0, -1, 0)], layout)
    with pytest.raises(client_io.DataLossError, match="messages from 3:1 are no longer available"):
        _checked(Position(3, 0), Position(3, 2), [_Msg(3, 0, -1, 0), _Msg(5, 0, -1, 0)], layout)


def test_a_planned_range_ends_without_asking_the_broker(monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader that keeps saying it has more (as one does after a reconnection to a reloaded topic) cannot
    stall a range whose planned layout says it is complete."""
    monkeypatch.setattr(_Reader, "has_message_available", lambda self: True)
    monkeypatch.setattr(client_io, "STALL_LIMIT_MS", 50)
    topic = [_Msg(3, 0, -1, 0), _Msg(3, 1, 0, 2), _Msg(3, 1, 1, 2)]
    assert _checked(EARLIEST, Position(3, 2), topic, [(3, 2)]) == [(3, 0), (3, 1)]
    assert _checked(Position(3, 0), Position(3, 1, 1), topic, [(3, 2)]) == [(3, 0), (3, 1)]
    with pytest.raises(TimeoutError):  # without the layout it can only wait, then fail
        list(client_io.iter_chunks(_Client(topic), "t", EARLIEST, Position(3, 2), 10))


def test_messages_delivered_again_after_a_reconnection_are_dropped() -> None:
    """The client's reader resubscribes at its last delivered message, inclusively: a batch's last message
    (or a whole entry) can arrive twice."""
    topic = _topic()
    again = [*topic[:3], topic[2], topic[3], topic[3], *topic[4:]]
    assert _positions(EARLIEST, Position(3, 3), again) == ALL
    chunks = client_io.iter_chunks(_Client(again), "t", EARLIEST, Position(3, 3), 10)
    assert [len(c.messages) for c in chunks] == [3, 1, 2]
