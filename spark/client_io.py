"""Reading ranges with the official ``pulsar-client`` Reader (runs on executors and on the driver)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

from magnetar.admin_client.auth import ClientSecurity
from magnetar.spark.offsets import EARLIEST, Position, after
from magnetar.spark.schemas import TopicSchema

log = logging.getLogger(__name__)


class DataLossError(RuntimeError):
    """Messages of a requested range are gone (retention/TTL trimmed them under the query)."""


def make_client(service_url: str, client_options: Mapping[str, Any], security: ClientSecurity | None = None) -> Any:
    """A ``pulsar.Client`` with the user's pass-through options, credentials and TLS trust (made where used:
    the client's Authentication object cannot be pickled to executors)."""
    import pulsar

    opts = {"operation_timeout_seconds": 30, "logger": pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)}
    opts.update(client_options)
    if security is not None:
        opts.update(security.pulsar_client_kwargs())
    return pulsar.Client(service_url, **opts)


def message_position(msg: Any) -> Position:
    mid = msg.message_id()
    return Position(mid.ledger_id(), mid.entry_id(), mid.batch_index())


def _start_id(partition_index: int, pos: Position) -> Any:
    import pulsar

    if pos.is_earliest:
        return pulsar.MessageId.earliest
    # The entry's first message: batch-index filtering happens here, by position (the reader's own
    # batch-index handling differs between client versions).
    return pulsar.MessageId(partition_index, pos.ledger, pos.entry, -1)


def partition_index(topic: str) -> int:
    _head, sep, tail = topic.rpartition("-partition-")
    return int(tail) if sep and tail.isdigit() else -1


def open_reader(client: Any, topic: str, start: Position, options: Mapping[str, Any] | None = None) -> Any:
    """A non-durable reader at ``start``; ``options`` are the user's ``pulsar.reader.*`` arguments."""
    kwargs: dict[str, Any] = {"reader_name": f"spark-{uuid.uuid4().hex[:12]}", "receiver_queue_size": 2000}
    kwargs.update(options or {})
    return client.create_reader(
        topic, _start_id(partition_index(topic), start), start_message_id_inclusive=True, **kwargs
    )


#: How long a range read waits for messages the broker says exist before failing the task (Spark retries it).
STALL_LIMIT_MS = 120_000


def _is_timeout(exc: BaseException) -> bool:
    return "Timeout" in type(exc).__name__ or "timeout" in str(exc).lower()


class Chunk(NamedTuple):
    """Consecutive messages of one entry: ``messages[i]`` is at ``(ledger, entry, first_batch + i)``
    (``first_batch`` -1 for a message that is not in a batch). ``publish_time`` (ms) is the entry's."""

    ledger: int
    entry: int
    first_batch: int
    messages: list[Any]
    publish_time: int

    def positions(self) -> Iterator[tuple[int, int, int]]:
        if self.first_batch < 0:
            return iter([(self.ledger, self.entry, -1)] * len(self.messages))
        return ((self.ledger, self.entry, b) for b in range(self.first_batch, self.first_batch + len(self.messages)))


class MessageOrderError(RuntimeError):
    """The client delivered a batch's messages other than consecutively (positions would be wrong)."""


def _id_of(msg: Any) -> tuple[int, int, int, int]:
    """``(ledger, entry, batch_index, batch_size)`` of a message (-1, 0 when not batched): one call into the
    client (the serialized ``MessageIdData`` carries the batch size, which the accessors do not expose)."""
    from magnetar.broker.protocol import pulsar_api_pb2 as pb

    data = pb.MessageIdData()
    data.ParseFromString(msg.message_id().serialize())
    if data.HasField("batch_index") and data.batch_index >= 0:
        return data.ledgerId, data.entryId, data.batch_index, data.batch_size
    return data.ledgerId, data.entryId, -1, 0


class RangeCheck:
    """What a range read needs to notice messages trimmed away under it (retention, no subscription).

    ``ledgers`` are ``(ledger, entries)`` of the range's ledgers when it was planned, so the entry after
    each one is known (also across ledgers); ``gone(position)`` asks the broker whether an entry is no longer
    stored. Readers do not hold data back (as in Pulsar), so the broker moves a reader past trimmed ledgers:
    it delivers a later entry (a gap), or nothing while ``lastMessageId`` still names the trimmed entries
    (``has_message_available()`` stays true and every receive times out). ``fail``: raise
    :class:`DataLossError` then (``failOnDataLoss``), else log it and go on with what is left.
    """

    def __init__(self, ledgers: Sequence[tuple[int, int]], gone: Callable[[Position], bool], fail: bool) -> None:
        self.gone = gone
        self.fail = fail
        self._entries = dict(ledgers)
        filled = [lid for lid, n in ledgers if n > 0]
        # Per ledger, the entry after its last one: the next non-empty ledger's first.
        self._after_last = {lid: next(((f, 0) for f in filled if f > lid), (lid, n)) for lid, n in ledgers}

    def first(self, start: Position) -> tuple[int, int] | None:
        """The first entry of a range starting at ``start`` (after a ledger's last entry: the next ledger's
        first); None when the layout has none."""
        if start.ledger in self._entries:
            return self.successor(start.ledger, start.entry - 1)
        # "earliest", or a start whose ledger was gone at planning already (read and committed by the
        # query's subscription, or failOnDataLoss=false): the first planned entry after it.
        return next(((lid, 0) for lid, n in self._entries.items() if n > 0 and lid > start.ledger), None)

    def successor(self, ledger: int, entry: int) -> tuple[int, int]:
        """The entry after ``ledger:entry`` in the planned layout (per entry: a dict look-up)."""
        n = self._entries.get(ledger)
        if n is None or entry + 1 < n:
            return ledger, entry + 1
        return self._after_last[ledger]

    def lost(self, topic: str, missing: tuple[int, int], found: str) -> None:
        """Report entries from ``missing`` on as trimmed away (raise, or log when not failing on loss)."""
        what = f"{topic}: messages from {missing[0]}:{missing[1]} are no longer available (retention/TTL; {found})"
        if self.fail:
            raise DataLossError(f"{what}; set failOnDataLoss=false to continue with the messages left")
        log.warning("%s: skipped", what)


def iter_chunks(
    client: Any,
    topic: str,
    start: Position,
    end: Position,
    poll_timeout_ms: int,
    reader_options: Mapping[str, Any] | None = None,
    check: RangeCheck | None = None,
) -> Iterator[Chunk]:
    """The messages with ``start <= position < end``, in order, an entry (batch) at a time.

    The executors' hot path: the client's accessors run once per *entry* for the position and publish time
    (a batch's messages arrive consecutively, so the i-th after the first is at batch index first + i; the
    last one's id is checked). Stops at ``end`` or when the broker has nothing more. With ``check``, entries
    of the range trimmed away while it is read are noticed (see :class:`RangeCheck`); without it a read
    cannot tell a trimmed ledger from a rollover.
    """
    if end <= start:
        return
    reader = open_reader(client, topic, start, reader_options)
    read_next = getattr(reader, "_reader", reader).read_next
    # Entries before `end`'s entry exist (ends come from lastMessageId), so while the entry read last is
    # not the end entry another message is certainly coming: ask the broker only near the end.
    certain_before = (end.ledger, end.entry - 1) if end.batch < 0 else (end.ledger, end.entry)
    first_entry, stop_entry = (start.ledger, start.entry), (end.ledger, end.entry)
    last = first_entry
    stalls = 0
    # The entry the next head message must be at (None: no planned layout to tell).
    expected = None if check is None else check.first(start)
    done: tuple[int, int, int] | None = None  # the last message given out

    def in_range(entry: tuple[int, int]) -> bool:
        return entry < stop_entry or (entry == stop_entry and end.batch >= 0)

    def next_message(must_exist: bool) -> Any:
        """The next message; None when the broker has no more (and ``must_exist`` is false)."""
        nonlocal stalls
        while True:
            try:
                msg = read_next(poll_timeout_ms)
            except Exception as exc:  # the client raises its own Timeout type
                if not _is_timeout(exc):
                    raise
                # A slow receive is not the end: stop only when the broker has nothing more (the topic
                # deleted under the query), and fail rather than truncate when it stays stuck.
                if not must_exist and not reader.has_message_available():
                    return None
                if (
                    not must_exist
                    and check is not None
                    and expected is not None
                    and in_range(expected)
                    and check.gone(Position(*expected, -1))
                ):  # trimmed: it will never come, whatever has_message_available() says
                    check.lost(topic, expected, "the broker has nothing left to deliver")
                    return None
                stalls += 1
                if stalls * poll_timeout_ms >= STALL_LIMIT_MS:
                    raise TimeoutError(
                        f"{topic}: no message for {stalls * poll_timeout_ms} ms although the broker has more "
                        f"before {end} (last entry read {last[0]}:{last[1]}, "
                        + ("inside its batch)" if must_exist else "has_message_available() true)")
                    ) from exc
                continue
            stalls = 0
            return msg

    try:
        while True:
            if expected is not None and not in_range(expected):
                return  # the planned layout says the range is complete: no need to ask the broker
            if last >= certain_before and not reader.has_message_available():
                return
            head = next_message(must_exist=False)
            if head is None:
                return
            ledger, entry, batch, size = _id_of(head)
            here = last = (ledger, entry)
            again = done is not None and here <= done[:2]  # given out already (see below)
            if check is not None and not again:
                if expected is not None and here > expected and in_range(expected):
                    check.lost(topic, expected, f"the next message found is at {ledger}:{entry}")
                expected = check.successor(ledger, entry)
            if here > stop_entry or (here == stop_entry and batch >= end.batch):
                return  # (a message not in a batch, index -1, is before any end inside its entry)
            messages = [head]
            if batch >= 0:
                for _ in range(size - 1 - batch):  # the rest of the batch is in the client's queue already
                    messages.append(next_message(must_exist=True))
                if len(messages) > 1 and _id_of(messages[-1])[:3] != (ledger, entry, size - 1):
                    raise MessageOrderError(f"{topic}: batch {ledger}:{entry} was not delivered in order")
            # Trim to [start, end): only the start and the end entry can be cut.
            lo, hi = 0, len(messages)
            if here < first_entry:
                continue
            if here == first_entry and start.batch > batch:
                lo = start.batch - batch if batch >= 0 else 1
            if here == stop_entry and batch >= 0:
                hi = min(hi, end.batch - batch)
            if again and done is not None:
                # After a reconnection (the topic reloaded) the client's reader resubscribes at the last
                # message it delivered, inclusively: that one (or its whole entry) arrives a second time.
                if here < done[:2] or batch < 0:
                    continue
                lo = max(lo, done[2] - batch + 1)
            if lo < hi:
                yield Chunk(ledger, entry, batch + lo if batch >= 0 else -1, messages[lo:hi], head.publish_timestamp())
                done = (ledger, entry, batch + hi - 1 if batch >= 0 else -1)
    finally:
        reader.close()


def iter_range(
    client: Any,
    topic: str,
    start: Position,
    end: Position,
    poll_timeout_ms: int,
    reader_options: Mapping[str, Any] | None = None,
) -> Iterator[tuple[Any, tuple[int, int, int]]]:
    """``(message, (ledger, entry, batch))`` for messages with ``start <= position < end``, in order."""
    for chunk in iter_chunks(client, topic, start, end, poll_timeout_ms, reader_options):
        yield from zip(chunk.messages, chunk.positions(), strict=True)


def scan_limit(
    client: Any,
    topic: str,
    start: Position,
    end: Position,
    max_rows: int | None,
    max_bytes: int | None,
    poll_timeout_ms: int,
) -> tuple[Position, int, int]:
    """Where a read from ``start`` must stop to stay within the limits: ``(end', rows, bytes)``.

    At least one message is admitted when ``max_bytes`` alone would admit none, so a large message
    cannot stall the query (as Spark's Kafka source does with ``maxBytesPerTrigger``).
    """
    rows = size = 0
    stop = start
    for msg, pos in iter_range(client, topic, start, end, poll_timeout_ms):
        n = len(msg.data())
        if max_rows is not None and rows + 1 > max_rows:
            break
        if max_bytes is not None and size + n > max_bytes and rows > 0:
            break
        rows += 1
        size += n
        stop = after(Position(*pos))
        if max_bytes is not None and size >= max_bytes:
            break
    return (stop if rows else start), rows, size


def position_at_time(client: Any, topic: str, timestamp_ms: int, end: Position, poll_timeout_ms: int) -> Position:
    """Position of the first message published at or after ``timestamp_ms`` (``end`` when there is none).

    The broker seeks by publish time (to an entry); messages before the time are skipped client-side.
    """
    if end == EARLIEST:
        return EARLIEST
    import pulsar

    reader = client.create_reader(
        topic, pulsar.MessageId.earliest, reader_name=f"spark-{uuid.uuid4().hex[:12]}", start_message_id_inclusive=True
    )
    try:
        reader.seek(timestamp_ms)
        waited = 0
        while reader.has_message_available():
            try:
                msg = reader.read_next(timeout_millis=poll_timeout_ms)
            except Exception as exc:
                waited += poll_timeout_ms
                if not _is_timeout(exc) or waited >= STALL_LIMIT_MS:
                    raise
                continue  # slow, not finished: the broker says more is there
            pos = message_position(msg)
            if pos >= end:
                break
            if msg.publish_timestamp() >= timestamp_ms:
                return pos
    finally:
        reader.close()
    return end


ARROW_BATCH_ROWS = 4096


def _arrow_schema() -> Any:
    import pyarrow as pa

    ts = pa.timestamp("us", tz="UTC")
    return pa.schema(
        [
            ("value", pa.binary()),
            ("__key", pa.string()),
            ("__topic", pa.string()),
            ("__messageId", pa.string()),
            ("__publishTime", ts),
            ("__eventTime", ts),
            ("__messageProperties", pa.map_(pa.string(), pa.string())),
        ]
    )


class _Columns:
    """Meta columns of the rows of a run of chunks, gathered with list operations (no per-row Python code
    besides one client accessor call per message and column) and turned into Arrow arrays column-wise."""

    def __init__(self) -> None:
        self.rows = 0
        self.ledgers: list[int] = []
        self.entries: list[int] = []
        self.batches: list[int] = []
        self.published: list[int] = []
        self.keys: list[str] = []
        self.events: list[int] = []
        self.props: list[dict[str, str]] = []

    def add(self, chunk: Chunk) -> None:
        msgs = chunk.messages
        n = len(msgs)
        cls = type(msgs[0])  # unbound accessors: no bound-method object per call
        self.rows += n
        self.ledgers += [chunk.ledger] * n
        self.entries += [chunk.entry] * n
        self.batches += range(chunk.first_batch, chunk.first_batch + n) if chunk.first_batch >= 0 else [-1] * n
        self.published += [chunk.publish_time] * n
        self.keys += map(cls.partition_key, msgs)
        self.events += map(cls.event_timestamp, msgs)
        self.props += map(cls.properties, msgs)

    def arrays(self, topic: str, map_type: Any) -> list[Any]:
        """``__key`` .. ``__messageProperties`` arrays."""
        import pyarrow as pa
        import pyarrow.compute as pc

        string, ts = pa.string(), pa.timestamp("us", tz="UTC")

        def times(ms: list[int]) -> Any:
            micros = pc.multiply(pa.array(ms, pa.int64()), 1000)
            return pc.if_else(pc.equal(micros, 0), pa.scalar(None, pa.int64()), micros).cast(ts)

        ids = (pa.array(col, pa.int64()).cast(string) for col in (self.ledgers, self.entries, self.batches))
        keys = pa.array(self.keys, string)
        if any(self.props):
            props = pa.array(self.props, map_type)
        else:  # the common case: no properties at all, one offsets buffer of zeros
            empty = pa.array([], string)
            props = pa.MapArray.from_arrays(pa.array([0] * (self.rows + 1), pa.int32()), empty, empty, type=map_type)
        return [
            pc.if_else(pc.equal(keys, ""), pa.scalar(None, string), keys),
            pa.array([topic] * self.rows, string) if self.rows else pa.array([], string),
            pc.binary_join_element_wise(*ids, ":"),
            times(self.published),
            times(self.events),
            props,
        ]


def to_arrow_batches(chunks: Iterator[Chunk], topic: str, rows: int = ARROW_BATCH_ROWS) -> Iterator[Any]:
    """Chunks -> Arrow record batches (about ``rows`` rows, whole entries) of the raw-bytes row type."""
    import pyarrow as pa

    schema = _arrow_schema()
    map_type = schema.field("__messageProperties").type
    values: list[bytes] = []
    cols = _Columns()
    for chunk in chunks:
        values += map(type(chunk.messages[0]).data, chunk.messages)
        cols.add(chunk)
        if cols.rows >= rows:
            yield pa.RecordBatch.from_arrays(
                [pa.array(values, pa.binary()), *cols.arrays(topic, map_type)], schema=schema
            )
            values, cols = [], _Columns()
    if cols.rows:
        yield pa.RecordBatch.from_arrays([pa.array(values, pa.binary()), *cols.arrays(topic, map_type)], schema=schema)


def _meta(msg: Any, pos: tuple[int, int, int], topic: str, published: int) -> dict[str, Any]:
    event = msg.event_timestamp()
    return {
        "__key": msg.partition_key() or None,
        "__topic": topic,
        "__messageId": ":".join(map(str, pos)),
        "__publishTime": published * 1000,
        "__eventTime": event * 1000 if event else None,
        "__messageProperties": list(msg.properties().items()),
    }


def to_typed_batches(
    chunks: Iterator[Chunk],
    topic: str,
    schema: TopicSchema,
    spark_schema: Any,
    rows: int = ARROW_BATCH_ROWS,
) -> Iterator[Any]:
    """Chunks of a typed topic -> Arrow record batches with the payload decoded into its columns."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    arrow_schema = to_arrow_schema(spark_schema, timezone="UTC")
    batch: list[dict[str, Any]] = []
    for chunk in chunks:
        for msg, pos in zip(chunk.messages, chunk.positions(), strict=True):
            row = schema.decode(msg.data())
            row.update(_meta(msg, pos, topic, chunk.publish_time))
            batch.append(row)
        if len(batch) >= rows:
            yield pa.RecordBatch.from_pylist(batch, schema=arrow_schema)
            batch = []
    if batch:
        yield pa.RecordBatch.from_pylist(batch, schema=arrow_schema)
