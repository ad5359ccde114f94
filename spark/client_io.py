"""Reading ranges with the official ``pulsar-client`` Reader (runs on executors and on the driver)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from typing import Any

from magnetar.admin_client.auth import ClientSecurity
from magnetar.spark.offsets import EARLIEST, Position, after
from magnetar.spark.schemas import TopicSchema


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


def iter_range(
    client: Any,
    topic: str,
    start: Position,
    end: Position,
    poll_timeout_ms: int,
    reader_options: Mapping[str, Any] | None = None,
) -> Iterator[tuple[Any, tuple[int, int, int]]]:
    """``(message, (ledger, entry, batch))`` for messages with ``start <= position < end``, in order.

    Stops at ``end`` or when the broker has nothing more. A range that should hold messages but whose
    first message found lies beyond the entry of ``start`` in a later ledger is not necessarily lost
    (ledgers roll over), so data-loss checks are done by the caller against ledger metadata.
    This is the per-message hot path: plain tuples, and the client's own message objects (the ``pulsar``
    module wraps each message in a Python object otherwise; the accessors are the same).
    """
    if end <= start:
        return
    reader = open_reader(client, topic, start, reader_options)
    read_next = getattr(reader, "_reader", reader).read_next
    # Entries before `end`'s entry exist (ends come from lastMessageId), so while the entry read last is
    # not the end entry another message is certainly coming: ask the broker only near the end.
    certain_before = (end.ledger, end.entry - 1) if end.batch < 0 else (end.ledger, end.entry)
    first, stop = tuple(start), tuple(end)
    last = (start.ledger, start.entry)
    stalls = 0
    try:
        while True:
            if last >= certain_before and not reader.has_message_available():
                return
            try:
                msg = read_next(poll_timeout_ms)
            except Exception as exc:  # the client raises its own Timeout type
                if not _is_timeout(exc):
                    raise
                # A slow receive is not the end: stop only when the broker has nothing more (data trimmed or
                # the topic deleted under the query), and fail rather than truncate when it stays stuck.
                if not reader.has_message_available():
                    return
                stalls += 1
                if stalls * poll_timeout_ms >= STALL_LIMIT_MS:
                    raise TimeoutError(
                        f"{topic}: no message for {stalls * poll_timeout_ms} ms although the broker has more "
                        f"before {end}"
                    ) from exc
                continue
            stalls = 0
            mid = msg.message_id()
            pos = (mid.ledger_id(), mid.entry_id(), mid.batch_index())
            last = pos[:2]
            if pos >= stop:
                return
            if pos < first:
                continue  # earlier batch indexes of the start entry
            yield msg, pos
    finally:
        reader.close()


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


def to_arrow_batches(
    messages: Iterator[tuple[Any, tuple[int, int, int]]], topic: str, rows: int = ARROW_BATCH_ROWS
) -> Iterator[Any]:
    """Messages -> Arrow record batches of the raw-bytes row type.

    Per message only the client's accessors run; ids, times and null keys are built column-wise by Arrow.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    ts = pa.timestamp("us", tz="UTC")
    schema = pa.schema(
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
    string = pa.string()

    def times(ms: list[int]) -> Any:
        micros = pc.multiply(pa.array(ms, pa.int64()), 1000)
        return pc.if_else(pc.equal(micros, 0), pa.scalar(None, pa.int64()), micros).cast(ts)

    def flush(
        values: list[bytes],
        keys: list[str],
        ids: list[tuple[int, int, int]],
        published: list[int],
        events: list[int],
        props: list[dict[str, str]],
    ) -> Any:
        ledger, entry, batch = (pa.array(col, pa.int64()).cast(string) for col in zip(*ids, strict=True))
        key_array = pa.array(keys, string)
        arrays = [
            pa.array(values, pa.binary()),
            pc.if_else(pc.equal(key_array, ""), pa.scalar(None, string), key_array),
            pa.array([topic] * len(values), string),
            pc.binary_join_element_wise(ledger, entry, batch, ":"),
            times(published),
            times(events),
            pa.array(props, schema.field("__messageProperties").type),
        ]
        return pa.RecordBatch.from_arrays(arrays, schema=schema)

    cols: tuple[list[Any], ...] = ([], [], [], [], [], [])
    values, keys, ids, published, events, props = cols
    for msg, pos in messages:
        values.append(msg.data())
        keys.append(msg.partition_key())
        ids.append(pos)
        published.append(msg.publish_timestamp())
        events.append(msg.event_timestamp())
        props.append(msg.properties())
        if len(values) >= rows:
            yield flush(*cols)
            for col in cols:
                col.clear()
    if values:
        yield flush(*cols)


def _meta(msg: Any, pos: tuple[int, int, int], topic: str) -> dict[str, Any]:
    event = msg.event_timestamp()
    return {
        "__key": msg.partition_key() or None,
        "__topic": topic,
        "__messageId": ":".join(map(str, pos)),
        "__publishTime": msg.publish_timestamp() * 1000,
        "__eventTime": event * 1000 if event else None,
        "__messageProperties": list(msg.properties().items()),
    }


def to_typed_batches(
    messages: Iterator[tuple[Any, tuple[int, int, int]]],
    topic: str,
    schema: TopicSchema,
    spark_schema: Any,
    rows: int = ARROW_BATCH_ROWS,
) -> Iterator[Any]:
    """Messages of a typed topic -> Arrow record batches with the payload decoded into its columns."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    arrow_schema = to_arrow_schema(spark_schema, timezone="UTC")
    batch: list[dict[str, Any]] = []
    for msg, pos in messages:
        row = schema.decode(msg.data())
        row.update(_meta(msg, pos, topic))
        batch.append(row)
        if len(batch) >= rows:
            yield pa.RecordBatch.from_pylist(batch, schema=arrow_schema)
            batch = []
    if batch:
        yield pa.RecordBatch.from_pylist(batch, schema=arrow_schema)
