"""Throughput of the ``pulsar`` source: rows/s of a batch read and of an availableNow stream from one topic.

    magnetar standalone --data-dir /tmp/bench-data &
    python -m magnetar.spark.bench --messages 300000 --size 100 --partitions 2

Produces ``--messages`` messages (batched) into a fresh partitioned topic, then times ``--rounds`` batch
reads and availableNow streaming queries, alternately, all into the ``noop`` sink (after one warm-up query
of each kind on a topic with as many partitions): rows per wall-clock second and rows per CPU-second of
the driver, Spark's JVM and its Python processes together (medians), and each part's CPU seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable
from typing import Any


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


#: Parts of the Spark side whose CPU :func:`spark_cpu` reports.
PARTS = ("driver", "jvm", "executors", "planner")


def spark_cpu() -> dict[str, float]:
    """CPU seconds used so far by this process and all its descendants, by part: ``driver`` (this Python
    process), ``jvm`` (Spark's JVM itself), ``executors`` (PySpark's worker daemon and the workers it forks:
    the reads, and the batch planning calls) and ``planner`` (every other process the JVM starts, ended ones
    included: a streaming query's Python planner process, which Spark starts per query, and short helper
    commands).

    Rows per CPU-second is what a core delivers whatever else the machine runs, so it is reported next to
    the wall-clock rate (on a shared machine the latter mostly measures the neighbours). Linux /proc only.
    """
    tick = os.sysconf("SC_CLK_TCK")
    parents: dict[int, int] = {}
    own: dict[int, int] = {}
    reaped: dict[int, int] = {}
    names: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            with open(f"/proc/{pid}/stat") as f:
                head, tail = f.read().rsplit(")", 1)
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue  # exited meanwhile
        fields = tail.split()
        parents[pid] = int(fields[1])
        own[pid] = int(fields[11]) + int(fields[12])  # utime stime
        reaped[pid] = int(fields[13]) + int(fields[14])  # cutime cstime: children that ended
        names[pid] = "java" if head.endswith("(java") else ("daemon" if b"pyspark.daemon" in cmd else "")
    me = os.getpid()
    out = dict.fromkeys(PARTS, 0.0)
    for pid in own:
        chain = [pid]
        while chain[-1] > 1 and chain[-1] != me:
            chain.append(parents.get(chain[-1], 0))
        if chain[-1] != me:
            continue
        kinds = [names[p] for p in chain[:-1]]
        if pid == me:
            parts = ("driver", "driver")
        elif kinds[0] == "java":
            parts = ("jvm", "planner")  # the JVM's ended children: planner processes, helper commands
        elif "daemon" in kinds:
            parts = ("executors", "executors")
        elif "java" in kinds:
            parts = ("planner", "planner")
        else:
            parts = ("driver", "driver")
        out[parts[0]] += own[pid] / tick
        out[parts[1]] += reaped[pid] / tick
    return out


def _timed(run: Callable[[], int]) -> dict[str, float]:
    """Run a query; its rows, wall-clock seconds and the CPU seconds of each part of the Spark side."""
    cpu, start = spark_cpu(), time.perf_counter()
    rows = run()
    wall, cpu_end = time.perf_counter() - start, spark_cpu()
    return {"rows": rows, "wall": wall, **{k: cpu_end[k] - cpu[k] for k in PARTS}}


def _summary(runs: list[dict[str, float]]) -> dict[str, Any]:
    """Median rates over the runs (the run with the median CPU), and the spread of rows per CPU-second."""
    per_cpu = sorted(r["rows"] / sum(r[k] for k in PARTS) for r in runs)
    mid = sorted(runs, key=lambda r: sum(r[k] for k in PARTS))[(len(runs) - 1) // 2]  # the lower median
    total = sum(mid[k] for k in PARTS)
    return {
        "rows": int(mid["rows"]),
        "rows_per_s": round(mid["rows"] / mid["wall"]),
        "rows_per_cpu_s": round(mid["rows"] / total),
        "rows_per_cpu_s_range": [round(per_cpu[0]), round(per_cpu[-1])],
        "cpu_s": {k: round(mid[k], 2) for k in PARTS},
    }


def _create_partitioned(admin_url: str, name: str, partitions: int) -> None:
    req = urllib.request.Request(
        f"{admin_url}/admin/v2/persistent/public/default/{name}/partitions",
        data=str(partitions).encode(),
        method="PUT",
        headers={"Content-Type": "application/json"},
    )
    urllib.request.urlopen(req, timeout=30).close()


def _zips_compiled() -> bool:
    """Whether the pyspark.zip Spark's Python processes import carries bytecode (see spark/precompile.py)."""
    import zipfile

    import pyspark

    home = os.environ.get("SPARK_HOME") or os.path.dirname(pyspark.__file__)
    with zipfile.ZipFile(os.path.join(home, "python", "lib", "pyspark.zip")) as z:
        return any(n.endswith(".pyc") for n in z.namelist())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--service-url", default="pulsar://localhost:6650")
    p.add_argument("--admin-url", default="http://localhost:8080")
    p.add_argument("--messages", type=int, default=300_000)
    p.add_argument("--size", type=int, default=100)
    p.add_argument("--partitions", type=int, default=2)
    p.add_argument("--master", default="local[2]")
    p.add_argument("--warmup", type=int, default=20_000, help="messages of the warm-up queries (JIT, workers)")
    p.add_argument("--rounds", type=int, default=3, help="batch reads and streams timed, alternately")
    args = p.parse_args(argv)

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    name = f"spark-bench-{uuid.uuid4().hex[:8]}"
    topic = f"persistent://public/default/{name}"
    # The warm-up topic has as many partitions, so both runs find as many Python workers already started.
    _create_partitioned(args.admin_url, name, args.partitions)
    _create_partitioned(args.admin_url, f"{name}-warmup", args.partitions)
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

    # Both query kinds end in the `noop` sink, so they convert the same rows (count() could skip that).
    def batch(conn: dict[str, str]) -> int:
        spark.read.format("pulsar").options(**conn).load().write.format("noop").mode("overwrite").save()
        return -1  # the noop sink reports no count: counted once separately

    def stream(conn: dict[str, str]) -> int:
        reader = spark.readStream.format("pulsar").options(**conn, startingOffsets="earliest").load()
        query = reader.writeStream.format("noop").trigger(availableNow=True).start()
        query.awaitTermination()
        return sum(p["numInputRows"] for p in query.recentProgress)

    # Warm-up (JVM and its JIT, Python workers) on a smaller topic read whole by both query kinds: a limit()
    # would make Spark close the worker's pipe mid-partition, which PySpark reports with a (harmless)
    # BrokenPipeError traceback.
    warm = {**opts, "topic": f"{topic}-warmup"}
    batch(warm)
    stream(warm)
    rows = spark.read.format("pulsar").options(**opts).load().count()
    batches, streams = [], []
    for _ in range(args.rounds):
        timed = _timed(lambda: batch(opts))
        timed["rows"] = rows
        batches.append(timed)
        streams.append(_timed(lambda: stream(opts)))
    spark.stop()
    b, s = _summary(batches), _summary(streams)
    result = {
        "messages": args.messages,
        "size": args.size,
        "partitions": args.partitions,
        "rounds": args.rounds,
        "produce_msgs_per_s": round(args.messages / produce_s),
        **{f"batch_{k}": v for k, v in b.items()},
        **{f"stream_{k}": v for k, v in s.items()},
        "stream_vs_batch_per_cpu_s": round(s["rows_per_cpu_s"] / b["rows_per_cpu_s"], 2),
        "load_average": [round(x, 1) for x in os.getloadavg()],
        "spark_zips_compiled": _zips_compiled(),
    }
    print(json.dumps(result))
    return 0 if rows == args.messages and all(r["rows"] == args.messages for r in streams) else 1


if __name__ == "__main__":
    sys.exit(main())
