"""The ``pulsar`` data source in real PySpark (``local[2]``) against a real standalone broker.

All tests share one Spark session (``spark`` fixture) and the session broker; the kill -9 test runs its
driver as a subprocess of its own.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import StandaloneProcess
from tests.spark.conftest import spark_env, spark_unavailable

pytestmark = pytest.mark.skipif(spark_unavailable() is not None, reason=str(spark_unavailable()))

REPO = Path(__file__).resolve().parents[2]


def _admin(broker: StandaloneProcess, method: str, path: str, body: Any = None) -> None:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"{broker.http_url}/admin/v2/{path}", data=data, method=method)
    req.add_header("Content-Type", "application/json")
    urllib.request.urlopen(req, timeout=10).close()


def _produce(client: Any, topic: str, values: list[str], batching: bool = False, **kw: Any) -> None:
    producer = client.create_producer(topic, batching_enabled=batching, batching_max_publish_delay_ms=5)
    for v in values:
        producer.send_async(v.encode(), None, **kw)
    producer.flush()
    producer.close()


def _opts(broker: StandaloneProcess, **extra: str) -> dict[str, str]:
    return {"service.url": broker.service_url, "admin.url": broker.http_url, **extra}


def test_batch_read_offsets_and_times(spark: Any, standalone: StandaloneProcess, client: Any, topic_name: str) -> None:
    _produce(client, topic_name, [f"a{i}" for i in range(10)], partition_key="k", properties={"p": "1"})
    time.sleep(0.05)  # publish times have millisecond resolution: keep `middle` strictly between
    middle = int(time.time() * 1000)
    time.sleep(0.05)
    _produce(client, topic_name, [f"b{i}" for i in range(10)], batching=True)  # batch indexes in positions
    df = spark.read.format("pulsar").options(**_opts(standalone, topic=topic_name)).load()
    rows = df.collect()
    assert [r.value.decode() for r in rows] == [f"a{i}" for i in range(10)] + [f"b{i}" for i in range(10)]
    first = rows[0]
    assert first["__key"] == "k" and first["__messageProperties"] == {"p": "1"} and first["__topic"] == topic_name
    assert first["__publishTime"] is not None

    ids = [r["__messageId"] for r in rows]
    # [start, end) with JSON offsets, start and end inside a batch (message ids are positions).
    start, end = ids[3], ids[15]
    part = spark.read.format("pulsar").options(
        **_opts(
            standalone,
            topic=topic_name,
            startingOffsets=json.dumps({topic_name: start}),
            endingOffsets=json.dumps({topic_name: end}),
        )
    )
    assert [r.value.decode() for r in part.load().collect()] == [r.value.decode() for r in rows[3:15]]

    by_time = spark.read.format("pulsar").options(**_opts(standalone, topic=topic_name, startingTime=str(middle)))
    assert [r.value.decode() for r in by_time.load().collect()] == [f"b{i}" for i in range(10)]
    until = spark.read.format("pulsar").options(**_opts(standalone, topic=topic_name, endingTime=str(middle)))
    assert until.load().count() == 10

    # Large ranges are split into several Spark partitions, and still read exactly once.
    split = spark.read.format("pulsar").options(**_opts(standalone, topic=topic_name, maxEntriesPerPartition="3"))
    loaded = split.load()
    assert loaded.rdd.getNumPartitions() >= 4
    assert sorted(r.value.decode() for r in loaded.collect()) == sorted(r.value.decode() for r in rows)


def test_partitioned_topic_and_pattern(
    spark: Any, standalone: StandaloneProcess, client: Any, topic_name: str, tmp_path: Path
) -> None:
    base = topic_name.split("/")[-1]
    _admin(standalone, "PUT", f"persistent/public/default/{base}-p/partitions", 3)
    _produce(client, f"{topic_name}-p", [f"p{i}" for i in range(30)])
    df = spark.read.format("pulsar").options(**_opts(standalone, topic=f"{topic_name}-p")).load()
    assert df.rdd.getNumPartitions() == 3
    assert sorted(r.value.decode() for r in df.collect()) == sorted(f"p{i}" for i in range(30))

    # A stream picks up partitions added to the topic after it first ran.
    grow_out, grow_ckpt = str(tmp_path / "grow-out"), str(tmp_path / "grow-ckpt")

    def run_partitioned() -> None:
        stream = spark.readStream.format("pulsar").options(
            **_opts(standalone, topic=f"{topic_name}-p", startingOffsets="earliest")
        )
        q = stream.load().writeStream.format("parquet").option("path", grow_out)
        q.option("checkpointLocation", grow_ckpt).trigger(availableNow=True).start().awaitTermination(120)

    run_partitioned()
    _admin(standalone, "POST", f"persistent/public/default/{base}-p/partitions", 4)
    _produce(client, f"{topic_name}-p", [f"q{i}" for i in range(8)])
    run_partitioned()
    grown = spark.read.parquet(grow_out).collect()
    assert sorted(r.value.decode() for r in grown) == sorted([f"p{i}" for i in range(30)] + [f"q{i}" for i in range(8)])
    assert f"{topic_name}-p-partition-3" in {r["__topic"] for r in grown}

    # A pattern stream picks up a topic created after the query first ran.
    _produce(client, f"{topic_name}-x1", ["x1-a", "x1-b"])
    pattern = f"persistent://public/default/{base}-x.*"
    out, ckpt = str(tmp_path / "out"), str(tmp_path / "ckpt")

    def run() -> None:
        stream = spark.readStream.format("pulsar").options(
            **_opts(standalone, topicsPattern=pattern, startingOffsets="earliest")
        )
        q = stream.load().writeStream.format("parquet").option("path", out)
        q.option("checkpointLocation", ckpt).trigger(availableNow=True).start().awaitTermination(120)

    run()
    _produce(client, f"{topic_name}-x2", ["x2-a"])
    _produce(client, f"{topic_name}-x1", ["x1-c"])
    run()
    got = sorted(r.value.decode() for r in spark.read.parquet(out).collect())
    assert got == ["x1-a", "x1-b", "x1-c", "x2-a"]


def test_stream_available_now_read_limits(
    spark: Any, standalone: StandaloneProcess, client: Any, topic_name: str, tmp_path: Path
) -> None:
    _produce(client, topic_name, [f"s{i:02d}" for i in range(25)])
    out, ckpt = str(tmp_path / "out"), str(tmp_path / "ckpt")
    stream = spark.readStream.format("pulsar").options(
        **_opts(
            standalone,
            topic=topic_name,
            startingOffsets="earliest",
            maxRecordsPerTrigger="10",
            commitSubscription="spark-progress",
        )
    )
    q = stream.load().writeStream.format("parquet").option("path", out).option("checkpointLocation", ckpt)
    query = q.trigger(availableNow=True).start()
    query.awaitTermination(120)
    rows = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert rows == [10, 10, 5]
    got = sorted(r.value.decode() for r in spark.read.parquet(out).collect())
    assert got == [f"s{i:02d}" for i in range(25)]
    # The durable subscription follows committed batches only: Spark tells the source that batch N is
    # committed when it plans batch N+1 (or restarts), so the last batch of this run is still backlog.
    with urllib.request.urlopen(f"{standalone.http_url}/admin/v2/persistent/{topic_name[13:]}/stats") as r:
        stats = json.load(r)
    assert stats["subscriptions"]["spark-progress"]["msgBacklog"] == 5

    # maxBytesPerTrigger: 3-byte values, 12 bytes a trigger -> at most 4 rows a batch.
    _produce(client, topic_name, [f"t{i:02d}" for i in range(6)])
    by_bytes = spark.readStream.format("pulsar").options(
        **_opts(standalone, topic=topic_name, startingOffsets="earliest", maxBytesPerTrigger="12")
    )
    q2 = by_bytes.load().writeStream.format("memory").queryName("bybytes").trigger(availableNow=True).start()
    q2.awaitTermination(120)
    assert max(p["numInputRows"] for p in q2.recentProgress) == 4
    assert spark.sql("select count(*) c from bybytes").collect()[0].c == 31


def test_sink_exactly_once_when_batch_replayed(
    spark: Any, standalone: StandaloneProcess, client: Any, topic_name: str, tmp_path: Path
) -> None:
    tenant_ns = "public/spark-dedup"
    try:
        _admin(standalone, "PUT", f"namespaces/{tenant_ns}")
    except urllib.error.HTTPError as exc:
        assert exc.code == 409
    _admin(standalone, "POST", f"namespaces/{tenant_ns}/deduplication", True)
    name = topic_name.split("/")[-1]
    src, dst = f"persistent://{tenant_ns}/{name}-in", f"persistent://{tenant_ns}/{name}-out"
    _produce(client, src, [f"e{i}" for i in range(6)])
    _produce(client, src, [f"e{i}" for i in range(6, 12)], partition_key="K", properties={"p": "v"})
    # A partitioned target: replayed rows must be routed to the same partitions to be deduplicated.
    _admin(standalone, "PUT", f"persistent/{tenant_ns}/{name}-out/partitions", 3)
    ckpt = tmp_path / "ckpt"

    def run() -> None:
        stream = spark.readStream.format("pulsar").options(
            **_opts(standalone, topic=src, startingOffsets="earliest", maxRecordsPerTrigger="5")
        )
        w = stream.load().select("value", "__key", "__messageProperties").writeStream.format("pulsar")
        w = w.option("service.url", standalone.service_url).option("topic", dst)
        w.option("checkpointLocation", str(ckpt)).trigger(availableNow=True).start().awaitTermination(120)

    run()
    # Forget that the last micro-batch committed: the restarted query replays it with the same offsets.
    commits = sorted(ckpt.joinpath("commits").glob("[0-9]*"), key=lambda p: int(p.name))
    assert len(commits) == 3
    commits[-1].unlink()
    commits[-1].with_name(f".{commits[-1].name}.crc").unlink(missing_ok=True)
    run()
    got = spark.read.format("pulsar").options(**_opts(standalone, topic=dst)).load().collect()
    assert sorted(r.value.decode() for r in got) == sorted(f"e{i}" for i in range(12))
    keyed = {r.value.decode(): (r["__key"], r["__messageProperties"]) for r in got}
    assert keyed["e7"] == ("K", {"p": "v"}) and keyed["e1"] == (None, {})
    assert len({r["__topic"] for r in got}) > 1  # spread over the partitions


@pytest.mark.slow
def test_exactly_once_across_driver_kill9(
    client: Any, standalone: StandaloneProcess, topic_name: str, tmp_path: Path
) -> None:
    values = [f"k{i:03d}" for i in range(60)]
    _produce(client, topic_name, values[:40])
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(spark_env())
    cmd = [
        sys.executable,
        str(REPO / "examples" / "topic_to_parquet.py"),
        "--master=local[2]",
        f"--service-url={standalone.service_url}",
        f"--admin-url={standalone.http_url}",
        f"--topics={topic_name}",
        "--starting-offsets=earliest",
        "--max-records-per-trigger=7",
        f"--output={out}",
        f"--checkpoint={ckpt}",
    ]
    log = open(tmp_path / "driver.log", "wb")  # noqa: SIM115 - closed below
    driver = subprocess.Popen([*cmd, "--trigger=once-per:1 second"], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            done = list(ckpt.joinpath("commits").glob("[0-9]*")) if ckpt.joinpath("commits").exists() else []
            if len(done) >= 2:
                break
            assert driver.poll() is None, (tmp_path / "driver.log").read_text()[-3000:]
            time.sleep(0.2)
        else:
            pytest.fail("driver made no progress:\n" + (tmp_path / "driver.log").read_text()[-3000:])
        _produce(client, topic_name, values[40:])
        driver.send_signal(signal.SIGKILL)  # mid-stream, maybe mid-batch
        driver.wait(30)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait(30)
    rerun = subprocess.run(
        [*cmd, "--trigger=available-now"], env=env, stdout=log, stderr=subprocess.STDOUT, timeout=180
    )
    log.close()
    assert rerun.returncode == 0, (tmp_path / "driver.log").read_text()[-3000:]
    import pyarrow.parquet as pq

    committed = _committed_files(out)
    got = sorted(v.decode() for f in committed for v in pq.read_table(f).column("value").to_pylist())
    assert got == values, f"{len(got)} rows, {len(set(got))} distinct"


def _committed_files(out: Path) -> list[str]:
    """Files the Parquet sink committed (its _spark_metadata log), as Spark readers see them."""
    files: list[str] = []
    for entry in sorted(out.joinpath("_spark_metadata").glob("[0-9]*"), key=lambda p: int(p.name.split(".")[0])):
        for line in entry.read_text().splitlines()[1:]:
            rec = json.loads(line)
            if rec.get("action", "add") == "add":
                files.append(rec["path"].removeprefix("file://"))
    return files


def test_fail_on_data_loss(spark: Any, standalone: StandaloneProcess, client: Any, topic_name: str) -> None:
    _produce(client, topic_name, ["d0", "d1", "d2"])
    # Ledger 0 is older than this topic's first ledger: as if retention had trimmed it under the query.
    gone = json.dumps({topic_name: "0:0"})
    strict = spark.read.format("pulsar").options(**_opts(standalone, topic=topic_name, startingOffsets=gone))
    with pytest.raises(Exception, match="no longer available"):
        strict.load().collect()
    lenient = spark.read.format("pulsar").options(
        **_opts(standalone, topic=topic_name, startingOffsets=gone, failOnDataLoss="false")
    )
    assert [r.value.decode() for r in lenient.load().collect()] == ["d0", "d1", "d2"]


def _raw_produce(broker: StandaloneProcess, topic: str, stamped: list[tuple[bytes, int]]) -> None:
    """One non-batched entry per value with the given publish time (ms): several in one millisecond."""
    from magnetar.broker.protocol import pulsar_api_pb2 as pb
    from magnetar.broker.protocol.frames import build_entry
    from tests.rawclient import RawClient, T

    raw = RawClient(broker.port)
    try:
        raw.connect()
        assert raw.create_producer(topic).type == T.PRODUCER_SUCCESS
        for seq, (value, publish_time) in enumerate(stamped):
            meta = pb.MessageMetadata(producer_name="raw-spark", sequence_id=seq, publish_time=publish_time)
            raw.send_message(1, seq, value, build_entry(meta, value))
            assert raw.recv_until(T.SEND_RECEIPT).send_receipt.sequence_id == seq
    finally:
        raw.close()


def test_empty_ranges_give_no_rows(
    spark: Any, standalone: StandaloneProcess, client: Any, topic_name: str, tmp_path: Path
) -> None:
    """Nothing to read is 0 rows (batch) / an empty micro-batch (stream), never an executor AssertionError."""
    _admin(standalone, "PUT", f"persistent/{topic_name[13:]}-empty")  # exists, never produced to
    _produce(client, topic_name, ["x0", "x1"])
    future = str(int(time.time() * 1000) + 3_600_000)
    cases = [
        {"topic": f"{topic_name}-empty"},
        {"topic": f"{topic_name}-missing"},
        {"topic": topic_name, "startingOffsets": json.dumps({topic_name: "latest"})},
        {"topic": topic_name, "startingTime": future},
    ]
    for extra in cases:
        df = spark.read.format("pulsar").options(**_opts(standalone, **extra)).load()
        assert df.collect() == [], extra
    stream = spark.readStream.format("pulsar").options(**_opts(standalone, topic=f"{topic_name}-missing"))
    q = stream.load().writeStream.format("memory").queryName("emptystream").trigger(availableNow=True).start()
    q.awaitTermination(120)
    assert q.exception() is None
    assert spark.sql("select count(*) c from emptystream").collect()[0].c == 0


def test_time_boundaries_in_one_millisecond(spark: Any, standalone: StandaloneProcess, topic_name: str) -> None:
    """startingTime=T includes every message published at T, endingTime=T excludes them all."""
    t = int(time.time() * 1000) - 60_000
    _raw_produce(standalone, topic_name, [(b"m0", t - 5), (b"m1", t), (b"m2", t), (b"m3", t + 1)])

    def values(**extra: str) -> list[str]:
        df = spark.read.format("pulsar").options(**_opts(standalone, topic=topic_name, **extra)).load()
        return [r.value.decode() for r in df.collect()]

    assert values(startingTime=str(t)) == ["m1", "m2", "m3"]
    assert values(endingTime=str(t + 1)) == ["m0", "m1", "m2"]
    assert values(endingTime=str(t)) == ["m0"]
    assert values(startingTime=str(t), endingTime=str(t + 1)) == ["m1", "m2"]


def test_typed_topics_read_and_written(spark: Any, standalone: StandaloneProcess, client: Any, topic_name: str) -> None:
    """JSON and Avro topics read as typed columns; the sink encodes typed columns with the topic's schema."""
    from pulsar.schema import AvroSchema, Double, Integer, JsonSchema, Record, String

    class Order(Record):
        name = String()
        qty = Integer()
        price = Double()

    probe = client.create_producer(f"{topic_name}-probe", schema=JsonSchema(Order))
    probe.close()
    try:
        urllib.request.urlopen(f"{standalone.http_url}/admin/v2/schemas/{topic_name[13:]}-probe/schema").close()
    except urllib.error.HTTPError as exc:
        pytest.skip(f"the broker does not serve GET /admin/v2/schemas/.../schema yet ({exc.code})")
    for kind, schema_cls in (("json", JsonSchema), ("avro", AvroSchema)):
        src, dst = f"{topic_name}-{kind}", f"{topic_name}-{kind}-out"
        producer = client.create_producer(src, schema=schema_cls(Order))
        for i in range(3):
            producer.send(Order(name=f"o{i}", qty=i, price=i + 0.5))
        producer.close()
        client.create_producer(dst, schema=schema_cls(Order)).close()  # the target's schema
        df = spark.read.format("pulsar").options(**_opts(standalone, topic=src)).load()
        assert [f.name for f in df.schema.fields[:3]] == ["name", "qty", "price"], kind
        assert dict(df.dtypes)["qty"] == "int" and "value" not in df.columns
        assert [(r.name, r.qty, r.price) for r in df.collect()] == [("o0", 0, 0.5), ("o1", 1, 1.5), ("o2", 2, 2.5)]
        df.where("qty > 0").selectExpr("upper(name) as name", "qty * 10 as qty", "price").write.format(
            "pulsar"
        ).options(**_opts(standalone, topic=dst)).mode("append").save()
        reader = client.create_reader(dst, pulsar_earliest(), schema=schema_cls(Order))
        got = [reader.read_next(10_000).value() for _ in range(2)]
        reader.close()
        assert [(o.name, o.qty, o.price) for o in got] == [("O1", 10, 1.5), ("O2", 20, 2.5)], kind
    # Topics with different schemas: an error naming the option that reads them as raw bytes.
    mixed = _opts(standalone, topics=f"{topic_name}-json,{topic_name}")
    _produce(client, topic_name, ["raw"])
    with pytest.raises(Exception, match="allowDifferentTopicSchemas"):
        spark.read.format("pulsar").options(**mixed).load()
    raw = spark.read.format("pulsar").options(**mixed, allowDifferentTopicSchemas="true").load()
    assert raw.count() == 4 and dict(raw.dtypes)["value"] == "binary"


def pulsar_earliest() -> Any:
    import pulsar

    return pulsar.MessageId.earliest


def _batches_with_rows(query: Any) -> list[int]:
    """Rows of each micro-batch the running query has completed (idle reports left out)."""
    reports = {int(p["batchId"]): int(p["numInputRows"]) for p in query.recentProgress}
    return [rows for _, rows in sorted(reports.items()) if rows]


def _wait_rows(query: Any, rows: int, timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while sum(_batches_with_rows(query)) < rows:
        assert query.exception() is None, query.exception()
        assert time.monotonic() < deadline, f"{_batches_with_rows(query)} after {timeout} s, expected {rows} rows"
        time.sleep(0.1)
    return _batches_with_rows(query)


def test_stream_min_records_per_trigger_and_max_trigger_delay(
    spark: Any, standalone: StandaloneProcess, client: Any, topic_name: str
) -> None:
    # Spark's default trigger (a micro-batch as soon as the source reports new data): minRecordsPerTrigger holds
    # micro-batches back until that many rows are available ...
    stream = spark.readStream.format("pulsar").options(
        **_opts(standalone, topic=topic_name, startingOffsets="earliest", minRecordsPerTrigger="50")
    )
    _produce(client, topic_name, ["first"])
    query = stream.load().writeStream.format("noop").start()
    try:
        _wait_rows(query, 1, 60)  # the query's first call admits what is there (as Kafka's source)
        _produce(client, topic_name, [f"a{i}" for i in range(20)])
        time.sleep(3.0)
        assert _batches_with_rows(query) == [1]  # 20 < 50: no micro-batch (the default delay is 15 minutes)
        _produce(client, topic_name, [f"b{i}" for i in range(40)])
        assert _wait_rows(query, 61, 60) == [1, 60]
    finally:
        query.stop()

    # ... unless maxTriggerDelay has passed since the last one: then fewer rows make a micro-batch.
    stream = spark.readStream.format("pulsar").options(
        **_opts(
            standalone,
            topic=f"{topic_name}-delay",
            startingOffsets="earliest",
            minRecordsPerTrigger="1000",
            maxTriggerDelay="3s",
        )
    )
    _produce(client, f"{topic_name}-delay", ["x"])  # the topic exists before the query starts
    started = time.monotonic()
    query = stream.load().writeStream.format("noop").start()
    try:
        _wait_rows(query, 1, 60)  # the first call admits what is there
        _produce(client, f"{topic_name}-delay", [f"y{i}" for i in range(10)], batching=True)
        assert _wait_rows(query, 11, 60) == [1, 10]  # 10 < 1000 rows, admitted once the delay passed
        assert time.monotonic() - started >= 3.0  # the first admission came after the start, this one 3 s later
    finally:
        query.stop()
