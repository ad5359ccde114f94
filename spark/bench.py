"""Throughput of the ``pulsar`` source: rows/s of a batch read, of an availableNow stream and of a
long-running stream in its steady state, from one topic.

    magnetar standalone --data-dir /tmp/bench-data &
    python -m magnetar.spark.bench --messages 300000 --size 100 --partitions 2

Produces ``--messages`` messages (batched) into a fresh partitioned topic, then times ``--rounds`` batch
reads and availableNow streaming queries, alternately, all into the ``noop`` sink (after one warm-up query
of each kind on a topic with as many partitions): rows per wall-clock second and rows per CPU-second of
the driver, Spark's JVM and its Python processes together (medians), and each part's CPU seconds.

Then the steady state (``--steady-rounds``): one streaming query (``--trigger`` processing-time interval),
started once and warmed up (a backlog of ``--warmup`` messages, then ``--steady-warmup-batches`` small
micro-batches, for at most ``--timeout`` s: the JVM's JIT compiles the code Spark runs once per micro-batch
only after a hundred or more), then per round ``--messages`` more produced *while it runs* by a separate
producer process (not counted), timed from the producer's first send until the query has reported all of
them processed (a query reports a micro-batch's progress after its commit-log entry). Its idle cost (CPU
per second with nothing to read) is measured before the rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Collection
from typing import Any


def _produce(service_url: str, topic: str, messages: int, size: int, ready: Callable[[], None] | None = None) -> float:
    """Produce ``messages`` of ``size`` bytes; seconds from the first send to the last one acknowledged.
    ``ready`` is called once connected, before the first send."""
    import pulsar

    client = pulsar.Client(service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    producer = client.create_producer(
        topic, batching_enabled=True, batching_max_messages=1000, block_if_queue_full=True, max_pending_messages=20000
    )
    payload = os.urandom(size)
    if ready is not None:
        ready()
    start = time.perf_counter()
    for _ in range(messages):
        producer.send_async(payload, None)
    producer.flush()
    took = time.perf_counter() - start
    client.close()
    return took


#: Parts of the Spark side whose CPU :func:`spark_cpu` reports.
PARTS = ("driver", "jvm", "executors", "planner")


def spark_cpu(exclude: Collection[int] = ()) -> dict[str, float]:
    """CPU seconds used so far by this process and all its descendants, by part: ``driver`` (this Python
    process), ``jvm`` (Spark's JVM itself), ``executors`` (PySpark's worker daemon and the workers it forks:
    the reads, and the batch planning calls) and ``planner`` (every other process the JVM starts, ended ones
    included: a streaming query's Python planner process, which Spark starts per query, and short helper
    commands).

    Rows per CPU-second is what a core delivers whatever else the machine runs, so it is reported next to
    the wall-clock rate (on a shared machine the latter mostly measures the neighbours). Processes in
    ``exclude`` (and their descendants) are left out while they run: the steady state's producer, a child
    of this process, until it is reaped (then its CPU is this process's ``cutime``). Linux /proc only.
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
        if chain[-1] != me or any(p in exclude for p in chain):
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


class ProgressCounter:
    """Rows a running streaming query has processed since the counter was made, from its progress reports.

    Polls ``lastProgress`` (one report: cheap); when micro-batches completed between two polls, the missed
    ones are taken from ``recentProgress`` (one JVM call per retained report, so only then). While idle,
    Spark reports every 10 s a batch with no data under the id of the batch that has not run yet: those
    count nothing and do not advance the batch counted last.
    """

    def __init__(self, query: Any) -> None:
        self.query = query
        last = query.lastProgress
        # The last batch counted (one that ran): an idle report names the next one.
        self.batch = -1 if last is None else int(last["batchId"]) - (0 if int(last["numInputRows"]) else 1)
        self.rows = 0
        self.batches = 0

    def poll(self) -> int:
        """Count the batches completed since the last poll; the rows counted so far."""
        last = self.query.lastProgress
        if last is None:
            return self.rows
        batch, rows = int(last["batchId"]), int(last["numInputRows"])
        if batch <= self.batch or (batch == self.batch + 1 and not rows):
            return self.rows  # nothing new, or an idle report right after the batch counted last
        reports = [last] if batch == self.batch + 1 else self.query.recentProgress
        for report in sorted(reports, key=lambda r: int(r["batchId"])):
            batch, rows = int(report["batchId"]), int(report["numInputRows"])
            if batch > self.batch and rows:
                self.rows += rows
                self.batches += 1
                self.batch = batch
        return self.rows

    def wait_for(self, rows: int, timeout: float, interval: float = 0.05) -> int:
        """Poll until ``rows`` are counted (TimeoutError after ``timeout`` s); the rows counted."""
        deadline = time.monotonic() + timeout
        while self.poll() < rows:
            if self.query.exception() is not None:
                raise RuntimeError(f"the streaming query failed: {self.query.exception()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the streaming query processed {self.rows} of {rows} rows in {timeout} s")
            time.sleep(interval)
        return self.rows


class Producer:
    """``--messages`` produced by a separate process (its CPU is not the Spark side's): started and connected
    first, then told to send, so the timed window starts at its first send."""

    def __init__(self, service_url: str, topic: str, messages: int, size: int, timeout: float) -> None:
        cmd = [sys.executable, "-m", "magnetar.spark.bench", "--service-url", service_url, "--produce-to", topic]
        cmd += ["--messages", str(messages), "--size", str(size)]
        self.timeout = timeout
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.stdin, self.stdout = self.proc.stdin, self.proc.stdout
        line = _read_line(self.stdout, timeout)
        if line.strip() != "ready":
            self.proc.kill()
            raise RuntimeError(f"the producer process did not connect: {line!r}")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def go(self) -> None:
        self.stdin.write("go\n")
        self.stdin.flush()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=10)

    def seconds(self) -> float:
        """Wait for the producer to finish (this reaps it); its seconds from the first send to the last ack."""
        try:
            line = _read_line(self.stdout, self.timeout)
            self.proc.wait(timeout=self.timeout)
        except BaseException:
            self.kill()
            raise
        if self.proc.returncode != 0:
            raise RuntimeError(f"the producer process failed ({self.proc.returncode})")
        return float(json.loads(line)["seconds"])


def _read_line(stream: Any, timeout: float) -> str:
    import selectors

    with selectors.DefaultSelector() as sel:
        sel.register(stream, selectors.EVENT_READ)
        if not sel.select(timeout):
            raise TimeoutError(f"no line from the producer process in {timeout} s")
    return str(stream.readline())


def _produce_child(service_url: str, topic: str, messages: int, size: int) -> int:
    """``--produce-to``: connect, say ``ready``, produce on ``go`` (a line on stdin), print the seconds."""

    def ready() -> None:
        print("ready", flush=True)
        sys.stdin.readline()

    took = _produce(service_url, topic, messages, size, ready)
    print(json.dumps({"seconds": took}), flush=True)
    return 0


def steady_round(query: Any, producer: Producer, rows: int, timeout: float) -> dict[str, float]:
    """One steady-state window: the Spark side's CPU and the wall time from the producer's first send until
    the running ``query`` has reported ``rows`` more rows processed; the producer's own seconds beside."""
    counter = ProgressCounter(query)
    cpu, start = spark_cpu((producer.pid,)), time.perf_counter()
    try:
        producer.go()
        counter.wait_for(rows, timeout)
    except BaseException:
        producer.kill()
        raise
    wall, cpu_end = time.perf_counter() - start, spark_cpu((producer.pid,))  # before the producer is reaped
    produce_s = producer.seconds()
    return {
        "rows": counter.rows,
        "wall": wall,
        "batches": counter.batches,
        "produce_s": produce_s,
        **{k: cpu_end[k] - cpu[k] for k in PARTS},
    }


def _create_partitioned(admin_url: str, name: str, partitions: int) -> None:
    req = urllib.request.Request(
        f"{admin_url}/admin/v2/persistent/public/default/{name}/partitions",
        data=str(partitions).encode(),
        method="PUT",
        headers={"Content-Type": "application/json"},
    )
    urllib.request.urlopen(req, timeout=30).close()


def _spark_python_lib() -> str:
    """How Spark's Python processes import pyspark (see spark/precompile.py): ``"zip"`` as pip ships it,
    ``"zip+bytecode"`` after ``precompile``, ``"unpacked"`` after ``precompile --unpack``."""
    import zipfile

    import pyspark

    home = os.environ.get("SPARK_HOME") or os.path.dirname(pyspark.__file__)
    lib = os.path.join(home, "python", "lib", "pyspark.zip")
    if os.path.isdir(lib):
        return "unpacked"
    with zipfile.ZipFile(lib) as z:
        return "zip+bytecode" if any(n.endswith(".pyc") for n in z.namelist()) else "zip"


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
    p.add_argument("--steady-rounds", type=int, default=3, help="steady-state rounds of a running stream (0: none)")
    p.add_argument("--trigger", default="0 seconds", help="the steady stream's processing-time trigger interval")
    p.add_argument(
        "--steady-warmup-batches", type=int, default=150, help="micro-batches the steady stream runs before it is timed"
    )
    p.add_argument(
        "--steady-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a source option of the steady stream (repeatable), e.g. minRecordsPerTrigger=100000",
    )
    p.add_argument("--timeout", type=float, default=300.0, help="seconds any one wait may take")
    p.add_argument("--produce-to", help=argparse.SUPPRESS)  # internal: the steady state's producer process
    args = p.parse_args(argv)
    if args.produce_to:
        return _produce_child(args.service_url, args.produce_to, args.messages, args.size)

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    name = f"spark-bench-{uuid.uuid4().hex[:8]}"
    topic = f"persistent://public/default/{name}"
    # The warm-up topic has as many partitions, so both runs find as many Python workers already started.
    _create_partitioned(args.admin_url, name, args.partitions)
    _create_partitioned(args.admin_url, f"{name}-warmup", args.partitions)
    produce_s = _produce(args.service_url, topic, args.messages, args.size)
    _produce(args.service_url, f"{topic}-warmup", args.warmup, args.size)
    if args.steady_rounds:
        _create_partitioned(args.admin_url, f"{name}-steady", args.partitions)
        _produce(args.service_url, f"{topic}-steady", args.warmup, args.size)  # its warm-up backlog

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
    steady, idle = _steady(spark, args, {**opts, "topic": f"{topic}-steady"}) if args.steady_rounds else ([], {})
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
        **_steady_result(steady, idle, b, args.trigger),
        **({"steady_options": args.steady_option} if args.steady_option else {}),
        "load_average": [round(x, 1) for x in os.getloadavg()],
        "spark_python_lib": _spark_python_lib(),
    }
    print(json.dumps(result))
    counts = [r["rows"] for r in streams + steady]
    return 0 if rows == args.messages and all(n == args.messages for n in counts) else 1


def _steady(
    spark: Any, args: argparse.Namespace, conn: dict[str, str]
) -> tuple[list[dict[str, float]], dict[str, float]]:
    """The steady-state rounds of one long-running stream (see the module docstring), and its idle CPU
    per second by part."""
    reader = spark.readStream.format("pulsar").options(**conn, startingOffsets="earliest").load()
    query = reader.writeStream.format("noop").trigger(processingTime=args.trigger).start()
    try:
        ProgressCounter(query).wait_for(args.warmup, args.timeout)  # the backlog: at least one micro-batch
        _run_batches(query, args.service_url, conn["topic"], args.steady_warmup_batches, args.timeout)
        options = dict(o.split("=", 1) for o in args.steady_option)
        if options:
            # Options such as minRecordsPerTrigger would hold the warm-up's small micro-batches back: the JVM
            # was warmed up by the query above (its JIT-compiled code serves every query); this one, with the
            # options, starts where it ended.
            query.stop()
            reader = spark.readStream.format("pulsar").options(**conn, **options, startingOffsets="latest").load()
            query = reader.writeStream.format("noop").trigger(processingTime=args.trigger).start()
            time.sleep(3.0)  # started: its planner process is up and has made its first call
        idle_s = 3.0
        cpu = spark_cpu()
        time.sleep(idle_s)
        idle = {k: round((v - cpu[k]) / idle_s, 3) for k, v in spark_cpu().items()}
        runs = []
        for _ in range(args.steady_rounds):
            producer = Producer(args.service_url, conn["topic"], args.messages, args.size, args.timeout)
            runs.append(steady_round(query, producer, args.messages, args.timeout))
        return runs, idle
    finally:
        query.stop()


def _run_batches(query: Any, service_url: str, topic: str, batches: int, timeout: float) -> None:
    """Have the running ``query`` run ``batches`` small micro-batches (1000 messages each), or as many as
    ``timeout`` s allow: the JVM compiles the code Spark runs once per micro-batch only after it ran often."""
    import pulsar

    client = pulsar.Client(service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        producer = client.create_producer(topic, batching_enabled=True, batching_max_messages=1000)
        counter = ProgressCounter(query)
        deadline = time.monotonic() + timeout
        while counter.batches < batches and time.monotonic() < deadline:
            for _ in range(1000):
                producer.send_async(b"w" * 100, None)
            producer.flush()
            counter.wait_for(counter.rows + 1000, timeout, interval=0.01)
    finally:
        client.close()


def _steady_result(
    runs: list[dict[str, float]], idle: dict[str, float], batch: dict[str, Any], trigger: str
) -> dict[str, Any]:
    if not runs:
        return {}
    summary = _summary(runs)
    mid = sorted(runs, key=lambda r: sum(r[k] for k in PARTS))[(len(runs) - 1) // 2]
    return {
        **{f"steady_{k}": v for k, v in summary.items()},
        "steady_trigger": trigger,
        "steady_micro_batches": int(mid["batches"]),
        "steady_produce_msgs_per_s": round(mid["rows"] / mid["produce_s"]),
        "steady_idle_cpu_s_per_s": idle,
        "steady_vs_batch_per_cpu_s": round(summary["rows_per_cpu_s"] / batch["rows_per_cpu_s"], 2),
    }


if __name__ == "__main__":
    sys.exit(main())
