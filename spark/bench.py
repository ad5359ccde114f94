"""Throughput of the ``pulsar`` source: rows/s of a batch read and of an availableNow stream from one topic.

    magnetar standalone --data-dir /tmp/bench-data &
    python -m magnetar.spark.bench --messages 300000 --size 100 --partitions 2

Produces ``--messages`` messages (batched) into a fresh partitioned topic, then times a batch read and an
availableNow streaming query, both into the ``noop`` sink (both after one warm-up query): rows per
wall-clock second and rows per CPU-second of the driver, Spark's JVM and its Python workers together (and
the JVM's share of that CPU).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.request
import uuid


def _produce(service_url: str, topic: str, messages: int, size: int) -> float:
    import pulsar

    client = pulsar.Client(service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    producer = client.create_producer(
        topic, batching_enabled=True, batching_max_messages=1000, block_if_queue_full=True, max_pending_messages=20000
    )
    payload = os.urandom(size)
    start = time.perf_counter()
    for _ in range(messages):
        producer.send_async(payload, None)
    producer.flush()
    took = time.perf_counter() - start
    client.close()
    return took


def tree_cpu_seconds() -> tuple[float, float]:
    """CPU seconds used so far by this process and all its descendants (Spark's JVM, its Python workers), and
    the JVM's share of them.

    Rows per CPU-second is what a core delivers whatever else the machine runs, so it is reported next to
    the wall-clock rate (on a shared machine the latter mostly measures the neighbours). Linux /proc only.
    """
    tick = os.sysconf("SC_CLK_TCK")
    parents: dict[int, int] = {}
    times: dict[int, int] = {}
    java: set[int] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                head, tail = f.read().rsplit(")", 1)
        except OSError:
            continue  # exited meanwhile
        fields = tail.split()
        parents[int(entry)] = int(fields[1])
        times[int(entry)] = sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
        if head.endswith("(java"):
            java.add(int(entry))
    me = os.getpid()
    total = jvm = 0
    for pid in times:
        p = pid
        while p > 1 and p != me:
            p = parents.get(p, 0)
        if p == me:
            total += times[pid]
            jvm += times[pid] if pid in java else 0
    return total / tick, jvm / tick


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--service-url", default="pulsar://localhost:6650")
    p.add_argument("--admin-url", default="http://localhost:8080")
    p.add_argument("--messages", type=int, default=300_000)
    p.add_argument("--size", type=int, default=100)
    p.add_argument("--partitions", type=int, default=2)
    p.add_argument("--master", default="local[2]")
    p.add_argument("--warmup", type=int, default=20_000, help="messages of the warm-up query (JIT, workers)")
    args = p.parse_args(argv)

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    name = f"spark-bench-{uuid.uuid4().hex[:8]}"
    topic = f"persistent://public/default/{name}"
    req = urllib.request.Request(
        f"{args.admin_url}/admin/v2/persistent/public/default/{name}/partitions",
        data=str(args.partitions).encode(),
        method="PUT",
        headers={"Content-Type": "application/json"},
    )
    urllib.request.urlopen(req, timeout=30).close()
    produce_s = _produce(args.service_url, topic, args.messages, args.size)
    _produce(args.service_url, f"{topic}-warmup", args.warmup, args.size)

    from pyspark.sql import SparkSession

    from magnetar.spark import register

    spark = (
        SparkSession.builder.master(args.master)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    opts = {"service.url": args.service_url, "admin.url": args.admin_url, "topic": topic}

    # Warm-up (JVM and its JIT, Python workers) on a smaller topic read whole by both query kinds: a limit()
    # would make Spark close the worker's pipe mid-partition, which PySpark reports with a (harmless)
    # BrokenPipeError traceback.
    warm = {**opts, "topic": f"{topic}-warmup"}
    spark.read.format("pulsar").options(**warm).load().write.format("noop").mode("overwrite").save()
    stream = spark.readStream.format("pulsar").options(**warm, startingOffsets="earliest").load()
    stream.writeStream.format("noop").trigger(availableNow=True).start().awaitTermination()
    # Both queries end in the `noop` sink, so they convert the same rows (count() could skip that).
    (cpu, jvm), start = tree_cpu_seconds(), time.perf_counter()
    spark.read.format("pulsar").options(**opts).load().write.format("noop").mode("overwrite").save()
    batch_s, (cpu_end, jvm_end) = time.perf_counter() - start, tree_cpu_seconds()
    batch_cpu, batch_jvm = cpu_end - cpu, jvm_end - jvm
    rows = spark.read.format("pulsar").options(**opts).load().count()

    (cpu, jvm), start = tree_cpu_seconds(), time.perf_counter()
    stream = spark.readStream.format("pulsar").options(**opts, startingOffsets="earliest").load()
    query = stream.writeStream.format("noop").trigger(availableNow=True).start()
    query.awaitTermination()
    stream_s, (cpu_end, jvm_end) = time.perf_counter() - start, tree_cpu_seconds()
    stream_cpu, stream_jvm = cpu_end - cpu, jvm_end - jvm
    stream_rows = sum(p["numInputRows"] for p in query.recentProgress)
    spark.stop()
    result = {
        "messages": args.messages,
        "size": args.size,
        "partitions": args.partitions,
        "produce_msgs_per_s": round(args.messages / produce_s),
        "batch_rows": rows,
        "batch_rows_per_s": round(rows / batch_s),
        "batch_rows_per_cpu_s": round(rows / batch_cpu),
        "batch_jvm_cpu_share": round(batch_jvm / batch_cpu, 2),
        "stream_rows": stream_rows,
        "stream_rows_per_s": round(stream_rows / stream_s),
        "stream_rows_per_cpu_s": round(stream_rows / stream_cpu),
        "stream_jvm_cpu_share": round(stream_jvm / stream_cpu, 2),
        "load_average": [round(x, 1) for x in os.getloadavg()],
    }
    print(json.dumps(result))
    return 0 if rows == stream_rows == args.messages else 1


if __name__ == "__main__":
    sys.exit(main())
