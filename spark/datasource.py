"""The ``pulsar`` data source for PySpark 4.x (``pyspark.sql.datasource``): batch/streaming read and write.

Planning (topic resolution, offsets, admission control) runs on the driver with the admin API and a
driver-side client; ``read``/``write`` run on executors in other processes, on pickled copies of the
reader/writer, so clients are created lazily there and never pickled.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)

try:  # admission control and availableNow for Python sources arrived in Spark 4.2
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxBytes,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )

    HAS_ADMISSION_CONTROL = True
except ImportError:  # Spark 4.0/4.1: latestOffset() takes no arguments; read everything available
    HAS_ADMISSION_CONTROL = False

    class ReadLimit:  # type: ignore[no-redef]
        """Stand-in so the reader also loads on Spark 4.0/4.1 (limits are not applied there)."""

    class ReadAllAvailable(ReadLimit):  # type: ignore[no-redef]
        pass

    @dataclass
    class ReadMaxRows(ReadLimit):  # type: ignore[no-redef]
        max_rows: int

    @dataclass
    class ReadMaxBytes(ReadLimit):  # type: ignore[no-redef]
        max_bytes: int

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        pass


from pyspark.sql.types import MapType, StringType, StructField, StructType, TimestampType

from magnetar.admin_client.errors import AdminConnectionError, AdminError
from magnetar.broker.topic_name import TopicName
from magnetar.spark import client_io
from magnetar.spark.admin import Admin
from magnetar.spark.offsets import (
    EARLIEST,
    Offset,
    Position,
    after,
    clamp,
    data_lost,
    entries_between,
    fair_shares,
    load_offset,
    split_range,
    to_json_dict,
)
from magnetar.spark.options import (
    EARLIEST as EARLIEST_WORD,
)
from magnetar.spark.options import (
    LATEST,
    SinkOptions,
    SourceOptions,
    default_admin_url,
    producer_name,
    route,
    sequence_id,
)
from magnetar.spark.schemas import RAW, TopicSchema

log = logging.getLogger(__name__)

#: Seconds between checks for a topic that does not exist yet (``waitingForNonExistedTopic``).
WAIT_POLL_S = 1.0

#: Seconds a running stream keeps its topics' partitions (pattern matches, partition counts) between
#: ``latestOffset`` calls before looking them up again: Spark calls it every 10 ms while a query is idle
#: (``spark.sql.streaming.pollingDelay``), and a lookup per call was a third of the source's polling cost.
TOPIC_REFRESH_S = 1.0

#: Seconds a micro-batch held back by ``minRecordsPerTrigger`` waits before the source looks the topics' ends up
#: again (``latestOffset`` sleeps that long): Spark asks every 10 ms with its default trigger, each call costs its
#: JVM a round trip into the planner process, and each lookup an admin call per partition.
HOLD_POLL_S = 0.1

#: Columns of every row besides the payload's (built without a JVM: planning runs in a Python worker).
META_FIELDS = [
    StructField("__key", StringType()),
    StructField("__topic", StringType()),
    StructField("__messageId", StringType()),
    StructField("__publishTime", TimestampType()),
    StructField("__eventTime", TimestampType()),
    StructField("__messageProperties", MapType(StringType(), StringType())),
]


class TopicRange(InputPartition):
    """One Spark partition: ``[start, end)`` of one topic partition (positions as ``L:E:B`` text), and
    ``(ledger, entries)`` of its ledgers when planned (the read notices entries trimmed under it)."""

    def __init__(self, topic: str, start: str, end: str, ledgers: tuple[tuple[int, int], ...] = ()) -> None:
        super().__init__((topic, start, end))
        self.topic, self.start, self.end, self.ledgers = topic, start, end, ledgers


class PulsarDataSource(DataSource):
    """``spark.read.format("pulsar")`` / ``readStream`` / ``write`` / ``writeStream``."""

    @classmethod
    def name(cls) -> str:
        return "pulsar"

    def schema(self) -> StructType:
        """Meta columns plus the topics' schema: record fields as columns, or a (typed) ``value``."""
        return row_schema(topic_schema(SourceOptions.parse(self.options, streaming=None)))

    def reader(self, schema: StructType) -> DataSourceReader:
        opts = SourceOptions.parse(self.options, streaming=False)
        return PulsarBatchReader(opts, topic_schema(opts))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        opts = SourceOptions.parse(self.options, streaming=True)
        return PulsarStreamReader(opts, topic_schema(opts))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return PulsarBatchWriter(_checked_sink(SinkOptions.parse(self.options)))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return PulsarStreamWriter(_checked_sink(SinkOptions.parse(self.options)))


def _checked_sink(opts: SinkOptions) -> SinkOptions:
    """A sink with a fixed topic and credentials gets them checked before any task runs."""
    if opts.topic and opts.client_security.credentials is not None:
        admin_url = opts.admin_url or default_admin_url(opts.service_url)
        try:
            Admin(admin_url, opts.client_security).check_credentials(opts.topic)
        except AdminConnectionError:
            # Without admin.url a raw-bytes sink needs no admin API: none answering is not an error here.
            if opts.admin_url:
                raise
    return opts


def topic_schema(opts: SourceOptions) -> TopicSchema:
    """The one schema of the topics read (raw bytes with ``allowDifferentTopicSchemas``); differing ones fail."""
    if opts.allow_different_schemas:
        return TopicSchema()
    admin = Admin(opts.admin_url, opts.admin_security)
    bases = sorted({str(TopicName.parse(t).partitioned_base) for t in _Planner(opts).topic_partitions()})
    found = {t: TopicSchema.from_info(admin.schema(t)) for t in bases or opts.topics}
    kinds: list[TopicSchema] = []
    for schema in found.values():
        if schema not in kinds:
            kinds.append(schema)
    if len(kinds) > 1:
        listed = ", ".join(f"{t}: {s.kind}" for t, s in found.items())
        raise ValueError(
            f"the topics have different schemas ({listed}); read them separately, or set "
            "allowDifferentTopicSchemas=true to read every topic's payload as raw value bytes"
        )
    return kinds[0] if kinds else TopicSchema()


def row_schema(schema: TopicSchema) -> StructType:
    """The source's row type for a topic schema: value column(s) first, then the meta columns."""
    return StructType([*schema.value_fields(), *META_FIELDS])


# ----------------------------------------------------------------------------------------------- reading
class _Planner:
    """Driver-side planning shared by the batch and the stream reader; holds a lazily made client."""

    def __init__(self, opts: SourceOptions, schema: TopicSchema | None = None) -> None:
        self.opts = opts
        self.schema = schema or TopicSchema()
        self.admin = Admin(opts.admin_url, opts.admin_security)
        self._client: Any = None

    def __getstate__(self) -> dict[str, Any]:
        # Executors get a pickled copy: never ship a client (it holds threads and sockets).
        state = dict(self.__dict__)
        state["_client"] = None
        return state

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = client_io.make_client(
                self.opts.service_url, self.opts.client_options, self.opts.client_security
            )
        return self._client

    def close(self) -> None:
        self.admin.close()
        if self._client is not None:
            self._client.close()
            self._client = None

    def check_client_credentials(self, topics: Sequence[str]) -> None:
        """When the client's credentials differ from the admin calls' (which planning has just used), check them
        with one HTTP lookup, so refused ones fail the query at once with the broker's reason rather than as a
        time-out in every task (see ``Admin.check_credentials``)."""
        client = self.opts.client_security
        if client.credentials is None or client == self.opts.admin_security or not topics:
            return
        Admin(self.opts.admin_url, client).check_credentials(topics[0])

    def topic_partitions(self) -> list[str]:
        """Concrete topics to read now (patterns and partition counts re-resolved on every call)."""
        if self.opts.topics_pattern:
            return self.admin.matching(self.opts.topics_pattern)
        if self.opts.wait_for_topics:
            for topic in self.opts.topics:
                self._wait_for(topic)
        out: list[str] = []
        for topic in self.opts.topics:
            out.extend(self.admin.expand(topic))
        return out

    def _wait_for(self, topic: str) -> None:
        """``waitingForNonExistedTopic``: block until the topic exists (the job was started before its producer)."""
        waited = 0.0
        while not self.admin.exists(topic):
            if waited % 30 == 0:
                log.info("waiting for topic %s to be created (waitingForNonExistedTopic=true)", topic)
            time.sleep(WAIT_POLL_S)
            waited += WAIT_POLL_S

    def ends(self, partitions: Sequence[str]) -> Offset:
        return {p: self.admin.end_position(p) for p in partitions}

    def _resolve(self, spec: Any, time_ms: int | None, partitions: Sequence[str], ends: Offset, default: str) -> Offset:
        out: Offset = {}
        for p in partitions:
            if time_ms is not None:
                out[p] = client_io.position_at_time(self.client, p, time_ms, ends[p], self.opts.poll_timeout_ms)
                continue
            value: Any = spec
            if isinstance(spec, dict):
                base = p.rsplit("-partition-", 1)[0]
                value = spec.get(p, spec.get(base, default))
            if value == EARLIEST_WORD:
                out[p] = EARLIEST
            elif value == LATEST:
                out[p] = ends[p]
            else:
                out[p] = value
        return out

    def starts(self, partitions: Sequence[str], ends: Offset) -> Offset:
        return self._resolve(self.opts.starting, self.opts.starting_time, partitions, ends, EARLIEST_WORD)

    def batch_ends(self, partitions: Sequence[str], ends: Offset) -> Offset:
        resolved = self._resolve(self.opts.ending, self.opts.ending_time, partitions, ends, LATEST)
        return {p: min(resolved[p], ends[p]) for p in partitions}

    def check_loss(self, topic: str, start: Position, stats: dict[str, Any]) -> None:
        """Fail (``failOnDataLoss``) when ``start`` lies in a ledger trimmed away; ``stats`` is the topic's
        ``internalStats``."""
        if not self.opts.fail_on_data_loss or start.is_earliest:
            return
        ledgers = Admin.ledgers_of(stats)
        if data_lost(start, ledgers[0][0] if ledgers else None, self._committed(stats)):
            raise client_io.DataLossError(
                f"{topic}: messages from {start} are no longer available (retention/TTL); "
                "set failOnDataLoss=false to continue from the earliest available message"
            )

    def _committed(self, stats: dict[str, Any]) -> Position | None:
        sub = self.opts.commit_subscription
        if not sub:
            return None
        cursor = stats.get("cursors", {}).get(sub)
        if not cursor:
            return None
        return after(Position.parse(cursor["markDeletePosition"]))

    def plan(self, starts: Offset, ends: Offset) -> list[TopicRange]:
        ranges: list[TopicRange] = []
        for topic in sorted(ends):
            start, end = starts.get(topic, EARLIEST), ends[topic]
            if end <= start:
                continue
            stats = self.admin.internal_stats(topic)  # one call: ledgers for the split and the loss check
            ledgers = Admin.ledgers_of(stats)
            self.check_loss(topic, start, stats)
            for s, e in split_range(start, end, ledgers, self.opts.max_entries_per_partition):
                layout = tuple((lid, n) for lid, n in ledgers if s.ledger <= lid <= e.ledger)
                ranges.append(TopicRange(topic, str(s), str(e), layout))
        return ranges

    def gone(self, topic: str, position: Position) -> bool:
        """Whether the entry at ``position`` is no longer stored (trimmed, or the topic deleted)."""
        try:
            stats = self.admin.internal_stats(topic)
        except AdminError as exc:
            if exc.status == 404:
                return True
            raise
        return not any(lid == position.ledger and 0 <= position.entry < n for lid, n in Admin.ledgers_of(stats))

    def read(self, part: TopicRange) -> Iterator[Any]:
        start, end = Position.parse(part.start), Position.parse(part.end)
        check = client_io.RangeCheck(part.ledgers, partial(self.gone, part.topic), self.opts.fail_on_data_loss)
        chunks = client_io.iter_chunks(
            self.client, part.topic, start, end, self.opts.poll_timeout_ms, self.opts.reader_options, check
        )
        if self.schema.kind == RAW:
            yield from client_io.to_arrow_batches(chunks, part.topic)
        else:
            yield from client_io.to_typed_batches(chunks, part.topic, self.schema, row_schema(self.schema))


class PulsarBatchReader(DataSourceReader):
    """Batch read of ``[startingOffsets|startingTime, endingOffsets|endingTime)``."""

    def __init__(self, opts: SourceOptions, schema: TopicSchema | None = None) -> None:
        self.planner = _Planner(opts, schema)

    def partitions(self) -> Sequence[InputPartition]:
        try:
            parts = self.planner.topic_partitions()
            ends = self.planner.ends(parts)
            self.planner.check_client_credentials(parts)
            return self.planner.plan(self.planner.starts(parts, ends), self.planner.batch_ends(parts, ends))
        finally:
            self.planner.close()

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, TopicRange):
            return  # PySpark's placeholder partition when there is nothing to read
        try:
            yield from self.planner.read(partition)
        finally:
            self.planner.close()


class PulsarStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch source: offsets from the broker, read limits, availableNow, optional commit subscription."""

    def __init__(self, opts: SourceOptions, schema: TopicSchema | None = None) -> None:
        self.planner = _Planner(opts, schema)
        self.ceiling: dict[str, str] | None = None
        self._initial: dict[str, str] | None = None
        self._resolved: tuple[float, list[str]] | None = None  # (when, topic partitions) for latestOffset
        # minRecordsPerTrigger: when the last micro-batch was admitted (as Kafka's source: the query's first call
        # admits, and starts the clock), and per partition (when looked up, ledger layout, messages per entry).
        self._last_trigger = float("-inf")
        self._held_until = float("-inf")  # no broker lookups before this while a micro-batch is held back
        self._layouts: dict[str, tuple[float, list[tuple[int, int]], float]] = {}

    def initialOffset(self) -> dict[str, str]:
        # Spark asks twice when a query starts (its source and its offset log); the second answer must be
        # the first one anyway (a position resolved later could differ), and costs no broker calls.
        if self._initial is None:
            self._initial = self._initial_offset()
        return self._initial

    def _initial_offset(self) -> dict[str, str]:
        parts = self.planner.topic_partitions()
        self.planner.check_client_credentials(parts)
        starts = self.planner.starts(parts, self.planner.ends(parts))
        sub = self.planner.opts.commit_subscription
        if sub:
            # From the first moment on, the subscription keeps the topics from being deleted as inactive and
            # their unread messages from being trimmed (Spark calls this once per query, not on restarts).
            for p, pos in starts.items():
                if self.planner.admin.last_position(p) is not None:
                    self.planner.admin.create_subscription(p, sub, pos)
        return to_json_dict(starts)

    def getDefaultReadLimit(self) -> ReadLimit:
        opts = self.planner.opts
        if opts.max_records_per_trigger:
            return ReadMaxRows(opts.max_records_per_trigger)
        if opts.max_bytes_per_trigger:
            return ReadMaxBytes(opts.max_bytes_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        # Everything available now, and nothing published or created afterwards, so the run ends.
        self.ceiling = to_json_dict(self.planner.ends(self.planner.topic_partitions()))

    def latestOffset(self, start: dict[str, str] | None = None, limit: ReadLimit | None = None) -> dict[str, str]:
        if start is None:  # Spark 4.0/4.1 API: no start, no limit -> everything available now
            limit = ReadAllAvailable()
        elif (wait := self._held_until - time.monotonic()) > 0:
            # Held back by minRecordsPerTrigger a moment ago: pace Spark's polling (every 10 ms with the default
            # trigger; each poll costs the JVM a call into this process and the broker an admin call per
            # partition) to one lookup per HOLD_POLL_S. No micro-batch could run meanwhile anyway.
            time.sleep(wait)
        begin = load_offset(start or {})
        parts = self._topic_partitions()
        ends = self.planner.ends(parts)
        # New partitions/topics (growing partition count, pattern matches) start at their beginning.
        target: Offset = {p: max(ends[p], begin.get(p, EARLIEST)) for p in parts}
        for p, pos in begin.items():
            target.setdefault(p, pos)  # a vanished topic keeps its offset
        if self.ceiling is not None:
            capped = clamp(target, load_offset(self.ceiling))
            target = {p: capped.get(p, begin.get(p, EARLIEST)) for p in target}
            target = {p: max(pos, begin.get(p, EARLIEST)) for p, pos in target.items()}
        if start is not None and not self._admit(begin, target):
            return start  # fewer than minRecordsPerTrigger new rows and maxTriggerDelay not over: no micro-batch
        if limit is None:
            limit = self.getDefaultReadLimit()
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        max_bytes = limit.max_bytes if isinstance(limit, ReadMaxBytes) else None
        if max_rows is None and max_bytes is None:
            return to_json_dict(target)
        pending = [p for p in sorted(target) if target[p] > begin.get(p, EARLIEST)]
        shares = fair_shares(max_rows, pending) if max_rows else {}
        per_bytes = max(1, max_bytes // max(1, len(pending))) if max_bytes else None
        result = dict(target)
        for p in pending:
            rows_allowed = shares.get(p) if max_rows else None
            if max_rows and not rows_allowed:
                result[p] = begin.get(p, EARLIEST)
                continue
            stop, _, _ = client_io.scan_limit(
                self.planner.client,
                p,
                begin.get(p, EARLIEST),
                target[p],
                rows_allowed,
                per_bytes,
                self.planner.opts.poll_timeout_ms,
            )
            result[p] = stop
        return to_json_dict(result)

    def _admit(self, begin: Offset, target: Offset) -> bool:
        """``minRecordsPerTrigger``/``maxTriggerDelay`` (Kafka's ``minOffsetsPerTrigger`` semantics): whether a
        micro-batch runs now, i.e. at least the minimum of new rows is available, or the delay has passed since
        the last micro-batch was admitted. Not applied under availableNow (it must reach its end)."""
        opts = self.planner.opts
        if not opts.min_records_per_trigger or self.ceiling is not None:
            return True
        now = time.monotonic()
        if (now - self._last_trigger) * 1000 < opts.max_trigger_delay_ms:
            pending = [p for p in sorted(target) if target[p] > begin.get(p, EARLIEST)]
            rows = sum(self._rows_between(p, begin.get(p, EARLIEST), target[p]) for p in pending)
            if rows < opts.min_records_per_trigger:
                self._held_until = time.monotonic() + HOLD_POLL_S  # after this call's lookups
                return False
        self._last_trigger = now  # the clock starts at the query's first call, and again at every admission
        return True

    def _rows_between(self, topic: str, start: Position, end: Position) -> float:
        """Messages in ``[start, end)`` of a partition, estimated without reading them: its entries (from the
        ledger layout) times its messages per entry (``msgInCounter`` over ``entriesAddedCounter``, exact
        without batching). Both looked up at most once per ``TOPIC_REFRESH_S`` while a micro-batch waits."""
        now = time.monotonic()
        cached = self._layouts.get(topic)
        if cached is None or now - cached[0] >= TOPIC_REFRESH_S:
            internal = self.planner.admin.internal_stats(topic)
            entries = int(internal.get("entriesAddedCounter") or 0)
            messages = int(self.planner.admin.stats(topic).get("msgInCounter") or 0)
            per_entry = max(1.0, messages / entries) if entries else 1.0
            cached = self._layouts[topic] = (now, Admin.ledgers_of(internal), per_entry)
        return entries_between(start, end, cached[1]) * cached[2]

    def _topic_partitions(self) -> list[str]:
        """The topics' partitions, looked up again once ``TOPIC_REFRESH_S`` has passed (new partitions and
        pattern matches are read from then on, from their beginning)."""
        now = time.monotonic()
        if self._resolved is None or now - self._resolved[0] >= TOPIC_REFRESH_S:
            self._resolved = (now, self.planner.topic_partitions())
        return self._resolved[1]

    def partitions(self, start: dict[str, str], end: dict[str, str]) -> Sequence[InputPartition]:
        return self.planner.plan(load_offset(start), load_offset(end))

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, TopicRange):
            return  # PySpark's placeholder partition when there is nothing to read
        try:
            yield from self.planner.read(partition)
        finally:
            self.planner.close()

    def commit(self, end: dict[str, str]) -> None:
        # Spark calls this after the micro-batch is in the commit log: moving the subscription earlier
        # could let retention drop data a restarted query must re-read.
        sub = self.planner.opts.commit_subscription
        if not sub:
            return
        for topic, pos in load_offset(end).items():
            if not pos.is_earliest:
                try:
                    self.planner.admin.reset_subscription(topic, sub, pos)
                except Exception:  # progress tracking is advisory: never fail the query for it
                    log.warning("could not advance subscription %s on %s", sub, topic, exc_info=True)

    def stop(self) -> None:
        self.planner.close()


# ----------------------------------------------------------------------------------------------- writing
@dataclass
class SentCount(WriterCommitMessage):
    """Rows a task handed to the broker (duplicates dropped by deduplication are counted too)."""

    rows: int


def _field(row: Mapping[str, Any], *names: str) -> Any:
    for n in names:
        if n in row and row[n] is not None:
            return row[n]
    return None


class _Sender:
    """Executor-side producer set; exactly-once when given a producer name base and a batch id."""

    def __init__(self, opts: SinkOptions) -> None:
        self.opts = opts

    def producer_options(self) -> dict[str, Any]:
        """``pulsar.producer.<arg>`` options as ``create_producer`` keyword arguments."""
        import pulsar

        out = dict(self.opts.producer_options)
        if isinstance(out.get("compression_type"), str):
            out["compression_type"] = getattr(pulsar.CompressionType, out["compression_type"])
        return out

    def topic_schema(self, admin: Admin, topic: str) -> TopicSchema:
        """The target's schema; raw bytes when ``admin.url`` was not given and the default one does not answer."""
        try:
            return TopicSchema.from_info(admin.schema(topic))
        except AdminConnectionError:
            if self.opts.admin_url:
                raise
            log.warning("no admin.url and none at %s: writing %s without its schema", admin.client.base_url, topic)
            return TopicSchema()

    def send_all(self, rows: Iterator[Any], name_base: str | None, batch_id: int | None) -> int:
        import datetime as dt

        client = client_io.make_client(self.opts.service_url, self.opts.client_options, self.opts.client_security)
        producers: dict[str, Any] = {}
        partitions: dict[str, list[str]] = {}
        schemas: dict[str, TopicSchema] = {}
        admin = Admin(self.opts.admin_url or default_admin_url(self.opts.service_url), self.opts.admin_security)
        errors: list[str] = []

        import pulsar

        def done(result: Any, _msg_id: Any) -> None:
            if result != pulsar.Result.Ok:
                errors.append(str(result))

        count = 0
        try:
            for index, row in enumerate(rows):
                data = row.asDict() if hasattr(row, "asDict") else dict(row)
                topic = self.opts.topic or _field(data, "__topic", "topic")
                if not topic:
                    raise ValueError("no topic: set option topic or provide a __topic column")
                key = _field(data, "__key", "key")
                if name_base is not None:
                    # Exactly-once: write to the partitions ourselves, routed deterministically.
                    names = partitions.get(topic)
                    if names is None:
                        names = partitions[topic] = list(client.get_topic_partitions(topic))
                    topic = names[route(None if key is None else str(key), index, len(names))]
                value = _field(data, "value")
                schema = schemas.get(topic)
                if schema is None and not isinstance(value, bytes | bytearray):
                    # Typed columns or a typed value: the topic's schema says how to encode them. Raw bytes
                    # rows never need it (nor the admin API).
                    schema = schemas[topic] = self.topic_schema(admin, topic)
                producer = producers.get(topic)
                if producer is None:
                    kwargs: dict[str, Any] = {"block_if_queue_full": True, "send_timeout_millis": 0}
                    if schema is not None and schema.is_record:
                        kwargs["schema"] = schema.pulsar_schema()
                    kwargs.update(self.producer_options())
                    if name_base is not None:
                        # Broker deduplication works per producer name and on whole entries: one message
                        # per entry keeps "sequence id not above the last persisted one" exact.
                        kwargs.update(producer_name=name_base, batching_enabled=False)
                    producer = producers[topic] = client.create_producer(topic, **kwargs)
                if schema is not None and schema.kind != RAW and not isinstance(value, bytes | bytearray):
                    value = schema.encode(data)  # typed columns (or a typed value) in the topic's schema
                elif isinstance(value, str):
                    value = value.encode()
                kwargs = {}
                if key is not None:
                    kwargs["partition_key"] = str(key)
                props = _field(data, "__messageProperties", "properties")
                if props:
                    kwargs["properties"] = {str(k): str(v) for k, v in props.items()}
                event = _field(data, "__eventTime", "eventTime")
                if isinstance(event, dt.datetime):
                    if event.tzinfo is None:
                        event = event.astimezone()  # Spark hands naive local-time datetimes
                    kwargs["event_timestamp"] = int(event.timestamp() * 1000)
                if batch_id is not None and name_base is not None:
                    kwargs["sequence_id"] = sequence_id(batch_id, index)
                producer.send_async(value if value is not None else b"", done, **kwargs)
                count += 1
            for producer in producers.values():
                producer.flush()
        finally:
            for producer in producers.values():
                try:
                    producer.close()
                except Exception:
                    log.debug("producer close failed", exc_info=True)
            client.close()
        if errors:
            raise RuntimeError(f"{len(errors)} sends failed, e.g. {errors[0]}")
        return count


class PulsarBatchWriter(DataSourceWriter):
    """Batch write: at-least-once (a retried task resends its rows)."""

    def __init__(self, opts: SinkOptions) -> None:
        self.sender = _Sender(opts)

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        return SentCount(self.sender.send_all(iterator, None, None))


class PulsarStreamWriter(DataSourceStreamWriter):
    """Streaming write, exactly-once through broker deduplication (namespace policy must be on)."""

    def __init__(self, opts: SinkOptions) -> None:
        self.sender = _Sender(opts)

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        name_base = batch_id = None
        if ctx is not None and self.sender.opts.exactly_once:
            batch = ctx.getLocalProperty("streaming.sql.batchId")
            query = ctx.getLocalProperty("sql.streaming.queryId")
            if batch is not None and query is not None:
                batch_id = int(batch)
                name_base = producer_name(self.sender.opts.producer_prefix, query, ctx.partitionId())
        return SentCount(self.sender.send_all(iterator, name_base, batch_id))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass  # the broker already has the messages; nothing to publish atomically

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass  # a replay of the batch is deduplicated by the broker
