"""Throughput of the ``pulsar`` source: rows/s of a batch read and of an availableNow stream from one topic.

    magnetar standalone --data-dir /tmp/bench-data &
    python -m magnetar.spark.bench --messages 300000 --size 100 --partitions 2

Produces ``--messages`` messages (batched) into a fresh partitioned topic, then times ``count()`` of a batch
read and an availableNow streaming query into the ``noop`` sink (both after one warm-up query).
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--service-url", default="pulsar://localhost:6650")
    p.add_argument("--admin-url", default="http://localhost:8080")
    p.add_argument("--messages", type=int, default=300_000)
    p.add_argument("--size", type=int, default=100)
    p.add_argument("--partitions", type=int, default=2)
    p.add_argument("--master", default="local[2]")
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
    _produce(args.service_url, f"{topic}-warmup", 100, args.size)

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

    # Warm-up (JVM, Python workers) on a small topic read whole: a limit() would make Spark close the
    # worker's pipe mid-partition, which PySpark reports with a (harmless) BrokenPipeError traceback.
    spark.read.format("pulsar").options(**{**opts, "topic": f"{topic}-warmup"}).load().count()
    start = time.perf_counter()
    rows = spark.read.format("pulsar").options(**opts).load().count()
    batch_s = time.perf_counter() - start

    start = time.perf_counter()
    stream = spark.readStream.format("pulsar").options(**opts, startingOffsets="earliest").load()
    query = stream.writeStream.format("noop").trigger(availableNow=True).start()
    query.awaitTermination()
    stream_s = time.perf_counter() - start
    stream_rows = sum(p["numInputRows"] for p in query.recentProgress)
    spark.stop()
    result = {
        "messages": args.messages,
        "size": args.size,
        "partitions": args.partitions,
        "produce_msgs_per_s": round(args.messages / produce_s),
        "batch_rows": rows,
        "batch_rows_per_s": round(rows / batch_s),
        "stream_rows": stream_rows,
        "stream_rows_per_s": round(stream_rows / stream_s),
    }
    print(json.dumps(result))
    return 0 if rows == stream_rows == args.messages else 1


if __name__ == "__main__":
    sys.exit(main())
