#!/usr/bin/env python3
"""Benchmark a Pulsar-protocol broker (Magnetar or pulsar-lite) with the official ``pulsar-client``.

Scenarios (all bounded in time or count):

* ``publish-<size>``          non-batched publish throughput, send_async with bounded outstanding messages
* ``publish-batched-<size>``  batched publish throughput (1000 msgs / 128 KiB / 10 ms batches)
* ``consume-<size>``          drain a pre-filled backlog of non-batched messages (one message per entry)
* ``consume-batched-<size>``  drain a pre-filled backlog written in batches
* ``latency-<rate>``          end-to-end latency at a fixed publish rate (timestamp in the payload)

For every scenario the broker's CPU time (utime+stime of the broker process tree, from /proc) is read
before and after the measured window, giving µs of broker CPU per message and messages per broker
CPU-second. Clients run in separate processes (``spawn``) so that the measuring process stays idle and
several producers can work in parallel: one Python producer process saturates at ~1.1 cores here.

Examples::

    python benchmarks/bench.py --target pulsar-lite
    python benchmarks/bench.py --target both --json /tmp/bench.json
    python benchmarks/bench.py --target magnetar --quick --scenarios publish,latency
    python benchmarks/bench.py --service-url pulsar://127.0.0.1:6650 --broker-pid 1234
"""

from __future__ import annotations

import argparse
import array
import contextlib
import importlib.metadata
import json
import multiprocessing as mp
import os
import platform
import queue
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pulsar

REPO_ROOT = Path(__file__).resolve().parent.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")
# Payload header of latency messages: monotonic send time (ns) and sequence number.
LATENCY_HEADER = struct.Struct("<QQ")

# Design targets printed beside the results.
TARGET_BATCHED_US_PER_MSG = 1.0
TARGET_NONBATCHED_MSGS_PER_CPU_S = 20_000.0
TARGET_P99_MS = 20.0
TARGET_P99_RATE = 2000


# --------------------------------------------------------------------------------------------------
# Parameters and results
# --------------------------------------------------------------------------------------------------


@dataclass
class Params:
    """Knobs shared by every target of one run, so that runs are comparable."""

    duration: float = 8.0  # seconds per publish scenario
    producers: int = 2  # producer processes for throughput scenarios
    max_pending: int = 1000  # outstanding messages per non-batched producer
    max_pending_batched: int = 20_000  # outstanding messages per batched producer
    sizes: list[int] = field(default_factory=lambda: [100, 1024])
    backlog: int = 200_000  # messages pre-filled for the non-batched consume scenario
    # Batched backlogs drain in well under a second; more messages keep broker CPU above /proc's 10 ms ticks.
    backlog_batched: int = 1_000_000
    consume_size: int = 100
    # pulsar-lite 0.2.0 stalls a backlog drain with 20000 (delivers ~9.4k, then nothing): keep 10000.
    receiver_queue: int = 10_000
    rates: list[int] = field(default_factory=lambda: [2000, 20_000])
    latency_duration: float = 10.0
    latency_warmup: float = 1.0  # seconds of latency samples discarded at the start
    latency_size: int = 100
    batch_max_messages: int = 1000
    batch_max_bytes: int = 128 * 1024
    batch_max_delay_ms: int = 10
    namespace: str = "public/default"
    timeout: float = 120.0  # hard limit for one scenario's workers


@dataclass
class ScenarioResult:
    """What one scenario measured against one broker."""

    name: str
    kind: str
    size: int
    batched: bool
    messages: int = 0
    wall_s: float = 0.0
    msgs_per_s: float = 0.0
    mb_per_s: float = 0.0
    broker_cpu_s: float | None = None
    broker_cores: float | None = None
    broker_sys_pct: float | None = None  # share of broker CPU spent in the kernel (syscalls, fsync)
    broker_us_per_msg: float | None = None
    msgs_per_broker_cpu_s: float | None = None
    client_cpu_s: float = 0.0
    client_cores: float = 0.0
    other_cores: float | None = None  # host CPU busy outside broker and clients (noise indicator)
    errors: int = 0
    target_rate: int | None = None
    latency_ms: dict[str, float] | None = None
    note: str = ""
    error: str | None = None


@dataclass
class TargetResult:
    """All scenarios of one broker."""

    target: str
    service_url: str = ""
    pid: int | None = None
    version: str = ""
    listening: list[str] = field(default_factory=list)
    idle_broker_cores: float | None = None
    startup_s: float | None = None
    scenarios: list[ScenarioResult] = field(default_factory=list)
    error: str | None = None


# --------------------------------------------------------------------------------------------------
# /proc helpers: CPU accounting and listening sockets of the broker's process tree
# --------------------------------------------------------------------------------------------------


def _read_stat(pid: int) -> tuple[int, list[str]] | None:
    """Return (ppid, fields after the command name) of /proc/PID/stat, or None if the process is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may contain spaces and parentheses: split after the last ')'.
    rest = raw[raw.rindex(")") + 2 :].split()
    return int(rest[1]), rest


def process_tree(root: int) -> list[int]:
    """PIDs of ``root`` and all its live descendants."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _read_stat(int(entry))
            if st is not None:
                children.setdefault(st[0], []).append(int(entry))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, []))
    return tree


def tree_cpu_seconds(root: int) -> tuple[float, float]:
    """(user, system) CPU seconds of the process tree rooted at ``root``.

    Live processes contribute their own times; reaped children are included through their parent's
    cutime/cstime, so a helper process that exits mid-run is still counted.
    """
    user = system = 0
    for pid in process_tree(root):
        st = _read_stat(pid)
        if st is not None:
            f = st[1]
            user += int(f[11]) + int(f[13])
            system += int(f[12]) + int(f[14])
    return user / CLK_TCK, system / CLK_TCK


def host_busy_seconds() -> float:
    """CPU seconds all processes on the machine spent busy (from /proc/stat), to spot foreign load."""
    vals = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)  # idle + iowait
    return (sum(vals[:8]) - idle) / CLK_TCK


def _decode_addr(hexaddr: str) -> str:
    """Decode an address:port column of /proc/net/tcp{,6}."""
    host, port = hexaddr.split(":")
    raw = bytes.fromhex(host)
    if len(raw) == 4:
        ip = socket.inet_ntop(socket.AF_INET, raw[::-1])
    else:
        # IPv6 is stored as four little-endian 32-bit words.
        words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
        ip = "[" + socket.inet_ntop(socket.AF_INET6, words) + "]"
    return f"{ip}:{int(port, 16)}"


def listening_addresses(root: int) -> list[str]:
    """TCP addresses on which the process tree listens (to check it stays on loopback)."""
    inodes: set[str] = set()
    for pid in process_tree(root):
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if link.startswith("socket:["):
                        inodes.add(link[8:-1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                cols = line.split()
                if cols[3] == "0A" and cols[9] in inodes:  # 0A = LISTEN
                    found.append(_decode_addr(cols[1]))
    return sorted(set(found))


def is_loopback(addr: str) -> bool:
    """True for 127.0.0.0/8, ::1 and IPv4-mapped loopback listen addresses."""
    host = addr.rsplit(":", 1)[0].strip("[]")
    return host.startswith("127.") or host in ("::1", "localhost") or host.startswith("::ffff:127.")


def free_port() -> int:
    """A currently unused loopback TCP port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------------------------------
# Brokers
# --------------------------------------------------------------------------------------------------


class Broker:
    """A broker under test; subclasses start one or attach to an existing one."""

    name = "external"

    def __init__(self) -> None:
        self.service_url = ""
        self.pid: int | None = None

    def start(self) -> None:
        """Start the broker (no-op for an existing one)."""

    def stop(self) -> None:
        """Stop the broker if this script started it."""

    def cpu_seconds(self) -> tuple[float, float] | None:
        """Cumulative (user, system) CPU seconds of the broker process tree, or None when unknown."""
        return tree_cpu_seconds(self.pid) if self.pid else None

    def version(self) -> str:
        """Version string for the report."""
        return ""

    def alive(self) -> bool:
        """False once a broker started by this script has exited."""
        return True

    def log_tail(self, lines: int = 30) -> str:
        """Last lines of the broker's log, for error reports."""
        return ""


class ExternalBroker(Broker):
    """An already-running broker given by --service-url (CPU only with --broker-pid)."""

    def __init__(self, url: str, pid: int | None) -> None:
        super().__init__()
        self.service_url = url
        self.pid = pid


class ManagedBroker(Broker):
    """A broker process started and stopped by this script, in its own process group."""

    ready_timeout = 60.0

    def __init__(self, workdir: Path) -> None:
        super().__init__()
        self.workdir = workdir
        self.port = free_port()
        self.http_port = free_port()
        self.service_url = f"pulsar://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / "broker.log"

    def command(self) -> list[str]:
        """The argv that starts the broker."""
        raise NotImplementedError

    def start(self) -> None:
        """Launch the process and wait until a client can publish through it."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        argv = self.command()
        with open(self.log_path, "ab") as log:
            log.write(f"$ {shlex.join(argv)}\n".encode())
            log.flush()
            # Own session: Ctrl-C reaches only this script, which then stops the broker in order.
            self.proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir, start_new_session=True
            )
        self.pid = self.proc.pid
        deadline = time.monotonic() + self.ready_timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}\n{self.log_tail()}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), 0.5):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} did not open port {self.port}\n{self.log_tail()}")
            time.sleep(0.1)
        try:
            probe_broker(self.service_url, max(5.0, deadline - time.monotonic()))
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}\n{self.log_tail()}") from None

    def stop(self) -> None:
        """SIGTERM the process group, SIGKILL it if it lingers."""
        if self.proc is None or self.proc.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(wait)
                return
            except subprocess.TimeoutExpired:
                continue

    def alive(self) -> bool:
        """False once the broker process has exited."""
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        """Last lines of the broker's log."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


class PulsarLiteBroker(ManagedBroker):
    """PyPI ``pulsar-lite`` (Rust, RocksDB), bound to loopback including its metrics endpoint."""

    name = "pulsar-lite"

    def __init__(self, workdir: Path, binary: str | None) -> None:
        super().__init__(workdir)
        self.binary = binary or find_pulsar_lite()

    def command(self) -> list[str]:
        """pulsar-lite argv; without the config its metrics server binds 0.0.0.0:8080."""
        config = self.workdir / "pulsar-lite.toml"
        config.write_text(f'[metrics]\naddr = "127.0.0.1:{self.http_port}"\n')
        # --db-path names a file prefix (pulsar-lite appends ".rocksdb"), so keep it inside workdir.
        return [
            self.binary,
            "--config",
            str(config),
            "--addr",
            f"127.0.0.1:{self.port}",
            "--db-path",
            str(self.workdir / "data"),
            "--log-level",
            # "error": at warn it logs a line per message published while a subscription has no consumer.
            "error",
        ]

    def version(self) -> str:
        """Installed pulsar-lite package version."""
        return _pkg_version("pulsar-lite")


class MagnetarBroker(ManagedBroker):
    """``magnetar standalone`` from this repository."""

    name = "magnetar"

    def __init__(self, workdir: Path, cmd: str | None, extra: str) -> None:
        super().__init__(workdir)
        if cmd:
            self.base = shlex.split(cmd)
        elif shutil.which("magnetar"):
            self.base = [shutil.which("magnetar") or "magnetar"]
        else:
            self.base = [sys.executable, "-m", "magnetar.cli.main"]
        self.extra = shlex.split(extra)

    def command(self) -> list[str]:
        """magnetar standalone argv with a private data dir and free ports."""
        return [
            *self.base,
            "standalone",
            "--data-dir",
            str(self.workdir / "data"),
            "--port",
            str(self.port),
            "--http-port",
            str(self.http_port),
            # It binds 0.0.0.0 by default; benchmark traffic stays on loopback.
            "--bind-address",
            "127.0.0.1",
            "--advertised-address",
            "127.0.0.1",
            # Per-message logging would be measured as broker CPU.
            "--log-level",
            "WARNING",
            *self.extra,
        ]

    def version(self) -> str:
        """Package version plus the git revision of the checkout."""
        rev = ""
        with contextlib.suppress(OSError, subprocess.CalledProcessError):
            rev = subprocess.run(
                ["git", "-C", str(REPO_ROOT), "rev-parse", "--short", "HEAD"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
        return " ".join(x for x in (_pkg_version("magnetar"), rev) if x)


def find_pulsar_lite() -> str:
    """Locate the pulsar-lite binary shipped inside the PyPI package, or on PATH."""
    with contextlib.suppress(ImportError, FileNotFoundError):
        from pulsar_lite.binary_finder import find_pulsar_lite_binary

        return find_pulsar_lite_binary()
    found = shutil.which("pulsar-lite")
    if not found:
        raise RuntimeError("pulsar-lite binary not found (pip install pulsar-lite, or --pulsar-lite-bin)")
    return found


def _pkg_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return ""


def _client(url: str) -> pulsar.Client:
    """A client with quiet logging (errors still surface as counted failures)."""
    return pulsar.Client(
        url,
        operation_timeout_seconds=30,
        io_threads=1,
        logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
    )


def probe_broker(url: str, timeout: float) -> None:
    """Publish and consume one message, retrying until ``timeout``: the port alone is not readiness."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        client = _client(url)
        try:
            topic = f"persistent://public/default/bench-probe-{uuid.uuid4().hex[:8]}"
            consumer = client.subscribe(topic, "probe", initial_position=pulsar.InitialPosition.Earliest)
            client.create_producer(topic).send(b"probe")
            consumer.acknowledge(consumer.receive(10_000))
            return
        except Exception as exc:
            last = exc
            time.sleep(0.5)
        finally:
            client.close()
    raise RuntimeError(f"broker at {url} not usable: {last!r}")


# --------------------------------------------------------------------------------------------------
# Worker processes. Each reports ("ready", None), waits for the shared go event, runs, and reports
# ("done", dict) or ("error", traceback) on the queue. They ignore SIGINT: the parent ends them.
# --------------------------------------------------------------------------------------------------


def _worker_main(body: Callable[..., dict[str, Any]], wid: int, out: Any, go: Any, kw: dict[str, Any]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:

        def ready() -> None:
            out.put((wid, "ready", None))
            go.wait()

        out.put((wid, "done", body(ready=ready, **kw)))
    except BaseException:
        out.put((wid, "error", traceback.format_exc()))


def _await_callbacks(acked: list[int], sent: int, timeout: float = 60.0) -> None:
    """Wait until every send callback has run: flush() can return before the last callbacks do."""
    deadline = time.monotonic() + timeout
    while sum(acked) < sent and time.monotonic() < deadline:
        time.sleep(0.001)


def producer_worker(
    ready: Callable[[], None],
    url: str,
    topic: str,
    size: int,
    batched: bool,
    max_pending: int,
    batch: tuple[int, int, int],
    duration: float | None = None,
    count: int | None = None,
) -> dict[str, Any]:
    """Publish as fast as the bounded outstanding window allows, for ``duration`` s or ``count`` msgs."""
    client = _client(url)
    producer = client.create_producer(
        topic,
        batching_enabled=batched,
        batching_max_messages=batch[0],
        batching_max_allowed_size_in_bytes=batch[1],
        batching_max_publish_delay_ms=batch[2],
        # The client blocks send_async when this many are unacknowledged: the bounded window.
        max_pending_messages=max_pending,
        block_if_queue_full=True,
        send_timeout_millis=60_000,
    )
    payload = b"x" * size
    acked = [0, 0]  # ok, failed

    failures: set[str] = set()

    def on_sent(res: pulsar.Result, _msg_id: Any) -> None:
        if res == pulsar.Result.Ok:
            acked[0] += 1
        else:
            acked[1] += 1
            failures.add(str(res))

    ready()
    cpu0, t0 = time.process_time(), time.monotonic()
    sent = 0
    end = t0 + duration if duration is not None else float("inf")
    limit = count if count is not None else sys.maxsize
    chunk = 100  # check the clock once per chunk, not per message
    while sent < limit and time.monotonic() < end:
        for _ in range(min(chunk, limit - sent)):
            producer.send_async(payload, on_sent)
        sent += min(chunk, limit - sent)
    producer.flush()
    _await_callbacks(acked, sent)
    t1, cpu1 = time.monotonic(), time.process_time()
    result = {
        "sent": sent,
        "acked": acked[0],
        "errors": acked[1] + sent - sum(acked),
        "error_kinds": sorted(failures) + (["no callback"] if sum(acked) < sent else []),
        "t0": t0,
        "t1": t1,
        "cpu": cpu1 - cpu0,
    }
    client.close()
    return result


def consumer_worker(
    ready: Callable[[], None],
    url: str,
    topic: str,
    subscription: str,
    count: int,
    receiver_queue: int,
    timeout: float,
) -> dict[str, Any]:
    """Subscribe after the go signal and receive+ack ``count`` messages from the backlog."""
    client = _client(url)
    ready()
    cpu0, t0 = time.process_time(), time.monotonic()
    consumer = client.subscribe(
        topic,
        subscription,
        receiver_queue_size=receiver_queue,
        initial_position=pulsar.InitialPosition.Earliest,
    )
    got, nbytes = 0, 0
    deadline = t0 + timeout
    while got < count and time.monotonic() < deadline:
        try:
            msg = consumer.receive(1000)
        except pulsar.Timeout:
            continue
        nbytes += len(msg.data())
        consumer.acknowledge(msg)
        got += 1
    t1, cpu1 = time.monotonic(), time.process_time()
    result = {"received": got, "bytes": nbytes, "t0": t0, "t1": t1, "cpu": cpu1 - cpu0}
    client.close()
    return result


def paced_producer_worker(
    ready: Callable[[], None], url: str, topic: str, size: int, rate: int, duration: float
) -> dict[str, Any]:
    """Publish non-batched at ``rate`` msg/s, stamping each payload with its monotonic send time."""
    client = _client(url)
    producer = client.create_producer(
        topic, batching_enabled=False, max_pending_messages=10_000, block_if_queue_full=True
    )
    pad = b"x" * max(0, size - LATENCY_HEADER.size)
    acked = [0, 0]

    failures: set[str] = set()

    def on_sent(res: pulsar.Result, _msg_id: Any) -> None:
        if res == pulsar.Result.Ok:
            acked[0] += 1
        else:
            acked[1] += 1
            failures.add(str(res))

    ready()
    cpu0 = time.process_time()
    start = time.monotonic_ns()
    end = start + int(duration * 1e9)
    sent = 0
    while True:
        now = time.monotonic_ns()
        if now >= end:
            break
        # Send whatever is due by now: pacing by schedule keeps the long-run rate exact even though
        # sleep() granularity is coarser than the inter-message gap at 20k msg/s.
        due = (now - start) * rate // 1_000_000_000
        while sent < due:
            producer.send_async(LATENCY_HEADER.pack(time.monotonic_ns(), sent) + pad, on_sent)
            sent += 1
        time.sleep(0.0002)
    producer.flush()
    _await_callbacks(acked, sent)
    t1 = time.monotonic_ns()
    result = {
        "sent": sent,
        "acked": acked[0],
        "errors": acked[1] + sent - sum(acked),
        "error_kinds": sorted(failures) + (["no callback"] if sum(acked) < sent else []),
        "t0": start / 1e9,
        "t1": t1 / 1e9,
        "cpu": time.process_time() - cpu0,
    }
    client.close()
    return result


def latency_consumer_worker(
    ready: Callable[[], None],
    url: str,
    topic: str,
    receiver_queue: int,
    skip: int,
    expected: Any,
    timeout: float,
) -> dict[str, Any]:
    """Receive until the producer's count (set in ``expected`` by the parent) arrived or time is up.

    Returns latencies in ns (as bytes of an int64 array) of messages with sequence >= ``skip``.
    """
    client = _client(url)
    consumer = client.subscribe(
        topic,
        "latency",
        receiver_queue_size=receiver_queue,
        initial_position=pulsar.InitialPosition.Earliest,
    )
    lat = array.array("q")
    got = 0
    ready()
    cpu0, t0 = time.process_time(), time.monotonic()
    idle_since: float | None = None
    while time.monotonic() < t0 + timeout:
        want = expected.value
        if 0 <= want <= got:
            break
        try:
            msg = consumer.receive(200)
        except pulsar.Timeout:
            # Producer finished and nothing more arrives: give up on lost messages after 5 s.
            now = time.monotonic()
            idle_since = idle_since or now
            if want >= 0 and now - idle_since > 5.0:
                break
            continue
        now_ns = time.monotonic_ns()
        idle_since = None
        sent_ns, seq = LATENCY_HEADER.unpack_from(msg.data())
        if seq >= skip:
            lat.append(now_ns - sent_ns)
        consumer.acknowledge(msg)
        got += 1
    result = {
        "received": got,
        "latencies": lat.tobytes(),
        "t0": t0,
        "t1": time.monotonic(),
        "cpu": time.process_time() - cpu0,
    }
    client.close()
    return result


# --------------------------------------------------------------------------------------------------
# Orchestration
# --------------------------------------------------------------------------------------------------

CTX = mp.get_context("spawn")  # never fork a process that may hold C++ client threads


@dataclass
class Window:
    """What the parent saw around one measured run of workers."""

    t_go: float
    t_done: float
    cpu_s: float | None
    sys_s: float | None
    host_busy_s: float
    results: list[dict[str, Any]]


class WorkerError(RuntimeError):
    """A worker failed or timed out."""


def run_workers(
    broker: Broker,
    jobs: list[tuple[Callable[..., dict[str, Any]], dict[str, Any]]],
    timeout: float,
    on_done: Callable[[int, dict[str, Any]], None] | None = None,
) -> Window:
    """Start workers, release them together once all are ready, and measure broker CPU around the run."""
    out = CTX.Queue()
    go = CTX.Event()
    procs = [
        CTX.Process(target=_worker_main, args=(body, i, out, go, kw), daemon=True) for i, (body, kw) in enumerate(jobs)
    ]
    for p in procs:
        p.start()
    try:
        results: dict[int, dict[str, Any]] = {}
        deadline = time.monotonic() + 60.0

        def collect(kind: str) -> tuple[int, Any]:
            while True:
                try:
                    wid, got, payload = out.get(timeout=0.5)
                except queue.Empty:
                    if time.monotonic() > deadline:
                        raise WorkerError(f"workers timed out waiting for '{kind}'") from None
                    dead = [p for p in procs if p.exitcode not in (None, 0)]
                    if dead:
                        raise WorkerError(f"worker exited with {dead[0].exitcode}") from None
                    continue
                if got == "error":
                    raise WorkerError(payload)
                if got != kind:
                    raise WorkerError(f"unexpected worker message {got!r} while waiting for {kind!r}")
                return wid, payload

        for _ in procs:
            collect("ready")
        cpu0, host0 = broker.cpu_seconds(), host_busy_seconds()
        t_go = time.monotonic()
        go.set()
        deadline = t_go + timeout
        for _ in procs:
            wid, res = collect("done")
            results[wid] = res
            if on_done:
                on_done(wid, res)
        t_done = time.monotonic()
        cpu1, host1 = broker.cpu_seconds(), host_busy_seconds()
        ordered = [results[i] for i in range(len(procs))]
        if cpu0 is None or cpu1 is None:
            return Window(t_go, t_done, None, None, host1 - host0, ordered)
        sys_s = cpu1[1] - cpu0[1]
        return Window(t_go, t_done, cpu1[0] - cpu0[0] + sys_s, sys_s, host1 - host0, ordered)
    except BaseException:
        for p in procs:  # failure or Ctrl-C: do not wait for workers to finish their run
            p.terminate()
        raise
    finally:
        for p in procs:
            p.join(10.0)
            if p.is_alive():
                p.terminate()
                p.join(5.0)
        out.close()


def _split(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def _error_kinds(results: list[dict[str, Any]]) -> str:
    kinds = sorted({k for r in results for k in r.get("error_kinds", [])})
    return f"; send errors: {', '.join(kinds)}" if kinds else ""


def _fill_cpu(res: ScenarioResult, win: Window, wall: float) -> None:
    """Derive rates and broker CPU figures from a measured window."""
    res.wall_s = wall
    res.msgs_per_s = res.messages / wall if wall > 0 else 0.0
    res.mb_per_s = res.messages * res.size / wall / 1e6 if wall > 0 else 0.0
    res.client_cpu_s = sum(r["cpu"] for r in win.results)
    res.client_cores = res.client_cpu_s / wall if wall > 0 else 0.0
    span = win.t_done - win.t_go
    if span > 0 and win.cpu_s is not None:  # without broker CPU the broker itself would count as "other"
        # Whatever the machine did besides this broker and these clients: other sessions, kernel work.
        other = win.host_busy_s - (win.cpu_s or 0.0) - res.client_cpu_s
        res.other_cores = max(0.0, other / span)
    if win.cpu_s is not None and res.messages:
        res.broker_cpu_s = win.cpu_s
        res.broker_sys_pct = 100.0 * (win.sys_s or 0.0) / win.cpu_s if win.cpu_s > 0 else 0.0
        res.broker_cores = win.cpu_s / (win.t_done - win.t_go)
        # Zero means below the 1/CLK_TCK resolution of /proc: leave both figures unknown, not 0 or inf.
        if win.cpu_s > 0:
            res.broker_us_per_msg = win.cpu_s / res.messages * 1e6
            res.msgs_per_broker_cpu_s = res.messages / win.cpu_s


class Bench:
    """Runs the scenarios of one run against one broker."""

    def __init__(self, broker: Broker, params: Params, run_id: str) -> None:
        self.broker = broker
        self.p = params
        self.run_id = run_id
        self.batch = (params.batch_max_messages, params.batch_max_bytes, params.batch_max_delay_ms)

    def topic(self, name: str) -> str:
        """A fresh topic per scenario so that no scenario sees another's data."""
        return f"persistent://{self.p.namespace}/bench-{name}-{self.run_id}"

    def publish(self, name: str, size: int, batched: bool, duration: float) -> ScenarioResult:
        """Publish throughput with ``producers`` processes on one topic."""
        res = ScenarioResult(name, "publish", size, batched)
        pending = self.p.max_pending_batched if batched else self.p.max_pending
        topic = self.topic(name)
        kw = dict(
            url=self.broker.service_url,
            topic=topic,
            size=size,
            batched=batched,
            max_pending=pending,
            batch=self.batch,
            duration=duration,
        )
        win = run_workers(self.broker, [(producer_worker, kw)] * self.p.producers, self.p.timeout)
        res.messages = sum(r["acked"] for r in win.results)
        res.errors = sum(r["errors"] for r in win.results)
        _fill_cpu(res, win, max(r["t1"] for r in win.results) - win.t_go)
        res.note = f"{self.p.producers} producer procs, {pending} outstanding each" + _error_kinds(win.results)
        return res

    def consume(self, name: str, batched: bool) -> ScenarioResult:
        """Pre-fill a backlog (unmeasured), then drain it with one consumer (measured)."""
        size = self.p.consume_size
        count = self.p.backlog_batched if batched else self.p.backlog
        res = ScenarioResult(name, "consume", size, batched)
        topic = self.topic(name)
        url = self.broker.service_url
        # The durable subscription must exist before the fill so that the backlog is retained.
        client = _client(url)
        try:
            client.subscribe(topic, "bench", initial_position=pulsar.InitialPosition.Earliest).close()
        finally:
            client.close()
        pending = self.p.max_pending_batched if batched else self.p.max_pending
        fill_jobs = [
            (
                producer_worker,
                dict(
                    url=url,
                    topic=topic,
                    size=size,
                    batched=batched,
                    max_pending=pending,
                    batch=self.batch,
                    count=n,
                ),
            )
            for n in _split(count, self.p.producers)
        ]
        fill = run_workers(self.broker, fill_jobs, self.p.timeout)
        filled = sum(r["acked"] for r in fill.results)
        fill_wall = max(r["t1"] for r in fill.results) - fill.t_go
        kw = dict(
            url=url,
            topic=topic,
            subscription="bench",
            count=filled,
            receiver_queue=self.p.receiver_queue,
            timeout=self.p.timeout - 10,
        )
        win = run_workers(self.broker, [(consumer_worker, kw)], self.p.timeout)
        r = win.results[0]
        res.messages = r["received"]
        res.errors = filled - r["received"] + sum(x["errors"] for x in fill.results)
        _fill_cpu(res, win, r["t1"] - win.t_go)
        res.note = (
            f"backlog {filled} filled at {filled / fill_wall:,.0f} msg/s; 1 consumer, queue {self.p.receiver_queue}"
            + _error_kinds(fill.results)
        )
        return res

    def latency(self, name: str, rate: int) -> ScenarioResult:
        """Paced producer and a consumer in separate processes; latency = receive time - send time."""
        size, duration = self.p.latency_size, self.p.latency_duration
        res = ScenarioResult(name, "latency", size, False, target_rate=rate)
        topic = self.topic(name)
        url = self.broker.service_url
        expected = CTX.Value("q", -1)

        def on_done(wid: int, r: dict[str, Any]) -> None:
            if wid == 0:  # the producer: now the consumer knows how many to wait for
                expected.value = r["acked"]

        skip = int(rate * self.p.latency_warmup)
        jobs = [
            (paced_producer_worker, dict(url=url, topic=topic, size=size, rate=rate, duration=duration)),
            (
                latency_consumer_worker,
                dict(
                    url=url,
                    topic=topic,
                    receiver_queue=self.p.receiver_queue,
                    skip=skip,
                    expected=expected,
                    timeout=duration + 60,
                ),
            ),
        ]
        win = run_workers(self.broker, jobs, duration + 90, on_done=on_done)
        prod, cons = win.results
        res.messages = prod["acked"]
        res.errors = prod["errors"] + max(0, prod["acked"] - cons["received"])
        _fill_cpu(res, win, cons["t1"] - win.t_go)
        achieved = prod["sent"] / (prod["t1"] - prod["t0"])
        res.msgs_per_s = achieved  # the meaningful rate here is what the paced producer achieved
        res.mb_per_s = achieved * size / 1e6
        lat = array.array("q")
        lat.frombytes(cons["latencies"])
        res.latency_ms = percentiles(lat)
        res.note = f"achieved {achieved:,.0f}/{rate:,} msg/s; first {skip} msgs ({self.p.latency_warmup:g} s) excluded"
        if achieved < 0.95 * rate:
            res.note += "; PRODUCER COULD NOT KEEP THE RATE"
        res.note += _error_kinds([prod])
        return res

    def idle_cores(self, seconds: float = 2.0) -> float | None:
        """Broker CPU while nothing is sent (background timers, compaction)."""
        c0 = self.broker.cpu_seconds()
        if c0 is None:
            return None
        time.sleep(seconds)
        c1 = self.broker.cpu_seconds()
        return None if c1 is None else (sum(c1) - sum(c0)) / seconds


def percentiles(samples_ns: array.array) -> dict[str, float]:
    """p50/p99/p99.9/max in milliseconds (nearest-rank)."""
    if not samples_ns:
        return {"samples": 0}
    s = sorted(samples_ns)
    n = len(s)

    def pct(q: float) -> float:
        return s[min(n - 1, max(0, int(q * n + 0.999999) - 1))] / 1e6

    return {
        "samples": n,
        "p50": pct(0.50),
        "p99": pct(0.99),
        "p99.9": pct(0.999),
        "max": s[-1] / 1e6,
        "mean": sum(s) / n / 1e6,
    }


# --------------------------------------------------------------------------------------------------
# Scenario selection
# --------------------------------------------------------------------------------------------------


def _size_label(size: int) -> str:
    return f"{size // 1024}KB" if size % 1024 == 0 else f"{size}B"


def scenario_plan(params: Params, selected: list[str]) -> list[tuple[str, Callable[[Bench], ScenarioResult]]]:
    """Ordered (name, runner) list; ``selected`` holds scenario names or groups."""
    groups: dict[str, list[tuple[str, Callable[[Bench], ScenarioResult]]]] = {
        "publish": [],
        "batched": [],
        "consume": [],
        "latency": [],
    }
    for size in params.sizes:
        n = f"publish-{_size_label(size)}"
        groups["publish"].append((n, lambda b, n=n, size=size: b.publish(n, size, False, b.p.duration)))
    for size in params.sizes:
        n = f"publish-batched-{_size_label(size)}"
        groups["batched"].append((n, lambda b, n=n, size=size: b.publish(n, size, True, b.p.duration)))
    label = _size_label(params.consume_size)
    groups["consume"] = [
        (f"consume-{label}", lambda b: b.consume(f"consume-{label}", False)),
        (f"consume-batched-{label}", lambda b: b.consume(f"consume-batched-{label}", True)),
    ]
    for rate in params.rates:
        n = f"latency-{rate}"
        groups["latency"].append((n, lambda b, n=n, rate=rate: b.latency(n, rate)))
    plan: list[tuple[str, Callable[[Bench], ScenarioResult]]] = []
    everything = [item for g in groups.values() for item in g]
    for want in selected or list(groups):
        matches = groups.get(want) or [item for item in everything if item[0] == want]
        if not matches:
            names = ", ".join([*groups, *(n for n, _ in everything)])
            raise SystemExit(f"unknown scenario {want!r}; choose from: {names}")
        plan.extend(m for m in matches if m not in plan)
    return plan


# --------------------------------------------------------------------------------------------------
# Reporting
# --------------------------------------------------------------------------------------------------


def _fmt(v: float | None, spec: str) -> str:
    if v is None:
        return "-"
    if v == float("inf"):
        return "inf"
    return format(v, spec)


# Foreign CPU load (cores) above which a row is marked as measured on a busy machine.
NOISY_OTHER_CORES = 0.3


def _noisy(r: ScenarioResult) -> bool:
    return r.other_cores is not None and r.other_cores > NOISY_OTHER_CORES


COLUMNS = [
    # header, width, getter
    ("scenario", 22, lambda r: r.name),
    ("msgs", 9, lambda r: f"{r.messages:,}"),
    ("secs", 6, lambda r: _fmt(r.wall_s, ".2f")),
    ("msg/s", 9, lambda r: _fmt(r.msgs_per_s, ",.0f")),
    ("MB/s", 7, lambda r: _fmt(r.mb_per_s, ".1f")),
    ("brkCPU-s", 8, lambda r: _fmt(r.broker_cpu_s, ".2f")),
    ("brkCores", 8, lambda r: _fmt(r.broker_cores, ".2f")),
    ("sys%", 4, lambda r: _fmt(r.broker_sys_pct, ".0f")),
    ("brk-us/msg", 10, lambda r: _fmt(r.broker_us_per_msg, ".2f")),
    ("msg/brkCPU-s", 12, lambda r: _fmt(r.msgs_per_broker_cpu_s, ",.0f")),
    ("cliCores", 8, lambda r: _fmt(r.client_cores, ".2f")),
    ("othCores", 8, lambda r: _fmt(r.other_cores, ".2f") + ("!" if _noisy(r) else " ")),
    ("p50ms", 7, lambda r: _fmt((r.latency_ms or {}).get("p50"), ".2f")),
    ("p99ms", 7, lambda r: _fmt((r.latency_ms or {}).get("p99"), ".2f")),
    ("p99.9ms", 7, lambda r: _fmt((r.latency_ms or {}).get("p99.9"), ".2f")),
    ("maxms", 7, lambda r: _fmt((r.latency_ms or {}).get("max"), ".1f")),
    ("err", 4, lambda r: str(r.errors)),
]


def format_table(t: TargetResult) -> str:
    """A fixed-width table of one target's scenarios, with notes and failures below it."""
    lines = [
        f"== {t.target} {t.version} | {t.service_url} | pid {t.pid or '-'} | idle broker "
        f"{_fmt(t.idle_broker_cores, '.3f')} cores | listening {', '.join(t.listening) or '?'}"
    ]
    if t.error:
        lines.append(f"   FAILED: {t.error}")
    head = " ".join(h.rjust(w) if i else h.ljust(w) for i, (h, w, _) in enumerate(COLUMNS))
    lines += [head, "-" * len(head)]
    for r in t.scenarios:
        if r.error:
            lines.append(f"{r.name.ljust(22)} ERROR: {r.error.strip().splitlines()[-1]}")
            continue
        lines.append(" ".join(g(r).rjust(w) if i else g(r).ljust(w) for i, (_, w, g) in enumerate(COLUMNS)))
    if any(_noisy(r) for r in t.scenarios if not r.error):
        lines.append(
            f"! = other processes kept more than {NOISY_OTHER_CORES} cores busy during that row: "
            "throughput and latency there are suspect"
        )
    notes = [f"  {r.name}: {r.note}" for r in t.scenarios if r.note and not r.error]
    if notes:
        lines += ["notes:", *notes]
    return "\n".join(lines)


def design_checks(t: TargetResult) -> list[dict[str, Any]]:
    """Evaluate the design targets on one target's results (only rows that were run and have CPU data)."""
    checks: list[dict[str, Any]] = []
    for r in t.scenarios:
        if r.error:
            continue
        if r.kind in ("publish", "consume") and r.batched and r.broker_us_per_msg is not None:
            checks.append(
                {
                    "target": f"batched < {TARGET_BATCHED_US_PER_MSG:g} us broker CPU/msg",
                    "scenario": r.name,
                    "value": f"{r.broker_us_per_msg:.2f} us",
                    "pass": r.broker_us_per_msg < TARGET_BATCHED_US_PER_MSG,
                }
            )
        if r.kind in ("publish", "consume") and not r.batched and r.msgs_per_broker_cpu_s is not None:
            checks.append(
                {
                    "target": f"non-batched >= {TARGET_NONBATCHED_MSGS_PER_CPU_S:,.0f} msg/broker-CPU-s",
                    "scenario": r.name,
                    "value": f"{r.msgs_per_broker_cpu_s:,.0f}",
                    "pass": r.msgs_per_broker_cpu_s >= TARGET_NONBATCHED_MSGS_PER_CPU_S,
                }
            )
        if r.kind == "latency" and r.target_rate == TARGET_P99_RATE and r.latency_ms and "p99" in r.latency_ms:
            checks.append(
                {
                    "target": f"p99 <= {TARGET_P99_MS:g} ms at {TARGET_P99_RATE:,} msg/s",
                    "scenario": r.name,
                    "value": f"{r.latency_ms['p99']:.2f} ms",
                    "pass": r.latency_ms["p99"] <= TARGET_P99_MS,
                }
            )
    return checks


def format_checks(t: TargetResult, checks: list[dict[str, Any]]) -> str:
    """Design-target lines with PASS/FAIL marks."""
    if not checks:
        return f"design targets ({t.target}): nothing to check (no CPU data or scenarios not run)"
    lines = [f"design targets ({t.target}):"]
    for c in checks:
        lines.append(f"  [{'PASS' if c['pass'] else 'FAIL'}] {c['target']:<42} {c['scenario']:<22} {c['value']}")
    return "\n".join(lines)


def ratios(a: TargetResult, b: TargetResult) -> list[dict[str, Any]]:
    """Per-scenario ratios a/b of throughput, broker CPU per message and latency."""
    by_name = {r.name: r for r in b.scenarios if not r.error}
    rows = []
    for ra in a.scenarios:
        rb = by_name.get(ra.name)
        if ra.error or rb is None:
            continue

        def div(x: float | None, y: float | None) -> float | None:
            return x / y if x and y else None

        la, lb = ra.latency_ms or {}, rb.latency_ms or {}
        rows.append(
            {
                "scenario": ra.name,
                "msgs_per_s": div(ra.msgs_per_s, rb.msgs_per_s),
                "broker_us_per_msg": div(ra.broker_us_per_msg, rb.broker_us_per_msg),
                "msgs_per_broker_cpu_s": div(ra.msgs_per_broker_cpu_s, rb.msgs_per_broker_cpu_s),
                "p50": div(la.get("p50"), lb.get("p50")),
                "p99": div(la.get("p99"), lb.get("p99")),
                "noisy": _noisy(ra) or _noisy(rb),
            }
        )
    return rows


def format_ratios(a: str, b: str, rows: list[dict[str, Any]]) -> str:
    """Ratio table; for throughput higher is better for ``a``, for CPU/msg and latency lower is."""
    lines = [
        f"== ratio {a}/{b} (same run, same parameters; msg/s and msg/CPU-s: >1 favours {a}; "
        f"us/msg and latency: <1 favours {a})",
        f"{'scenario':<22} {'msg/s':>8} {'brk-us/msg':>10} {'msg/brkCPU-s':>12} {'p50':>7} {'p99':>7}",
    ]
    for r in rows:
        lines.append(
            f"{r['scenario']:<22} {_fmt(r['msgs_per_s'], '.2f'):>8} {_fmt(r['broker_us_per_msg'], '.2f'):>10}"
            f" {_fmt(r['msgs_per_broker_cpu_s'], '.2f'):>12} {_fmt(r['p50'], '.2f'):>7}"
            f" {_fmt(r['p99'], '.2f'):>7}{'  ! busy machine' if r['noisy'] else ''}"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Command-line options."""
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--target",
        choices=["magnetar", "pulsar-lite", "both"],
        default="magnetar",
        help="broker(s) to start; 'both' runs magnetar then pulsar-lite and prints ratios",
    )
    ap.add_argument(
        "--interleave",
        action="store_true",
        help="with --target both: keep both brokers up and alternate them per scenario (less drift)",
    )
    ap.add_argument("--service-url", help="benchmark an already-running broker instead of starting one")
    ap.add_argument("--broker-pid", type=int, help="with --service-url: PID whose CPU time to account")
    ap.add_argument(
        "--scenarios",
        default="",
        help="comma list of groups (publish,batched,consume,latency) or scenario names",
    )
    ap.add_argument("--quick", action="store_true", help="short smoke run (~20 s per target)")
    ap.add_argument("--duration", type=float, help="seconds per publish scenario (default 8, quick 2)")
    ap.add_argument("--producers", type=int, help="producer processes for throughput scenarios (default 2)")
    ap.add_argument("--sizes", help="payload sizes in bytes for publish scenarios (default 100,1024)")
    ap.add_argument("--backlog", type=int, help="messages pre-filled for consume (default 200000; batched: 5x)")
    ap.add_argument("--rates", help="latency scenario rates in msg/s (default 2000,20000)")
    ap.add_argument("--latency-duration", type=float, help="seconds per latency scenario (default 10)")
    ap.add_argument("--max-pending", type=int, help="outstanding msgs per non-batched producer (default 1000)")
    ap.add_argument("--namespace", default="public/default", help="tenant/namespace for bench topics")
    ap.add_argument("--json", metavar="FILE", help="write machine-readable results here")
    ap.add_argument("--workdir", help="where brokers keep data/logs (default: a temp dir, removed at the end)")
    ap.add_argument("--keep", action="store_true", help="keep the work dir (data and broker logs)")
    ap.add_argument("--pulsar-lite-bin", help="path of the pulsar-lite binary (default: from the package)")
    ap.add_argument("--magnetar-cmd", help="command starting magnetar (default: 'magnetar' on PATH)")
    ap.add_argument("--magnetar-args", default="", help="extra arguments for 'magnetar standalone'")
    return ap.parse_args(argv)


def build_params(args: argparse.Namespace) -> Params:
    """Params from defaults, --quick and explicit overrides (explicit wins)."""
    p = Params(namespace=args.namespace)
    if args.quick:
        p.duration, p.latency_duration, p.latency_warmup = 2.0, 3.0, 0.5
        p.backlog, p.backlog_batched = 20_000, 100_000
    if args.duration is not None:
        p.duration = args.duration
    if args.producers is not None:
        p.producers = max(1, args.producers)
    if args.sizes:
        p.sizes = [int(x) for x in args.sizes.split(",")]
    if args.backlog is not None:
        p.backlog = args.backlog
        p.backlog_batched = 5 * args.backlog
    if args.rates:
        p.rates = [int(x) for x in args.rates.split(",")]
    if args.latency_duration is not None:
        p.latency_duration = args.latency_duration
    if args.max_pending is not None:
        p.max_pending = args.max_pending
    if p.latency_size < LATENCY_HEADER.size:
        p.latency_size = LATENCY_HEADER.size
    return p


class TargetRun:
    """One broker's part of a run: start it, run scenarios into ``result``, stop it.

    ``result`` is filled in place so that an interrupted run still reports what it measured; a broker
    that fails to start or dies marks the target failed and skips its remaining scenarios.
    """

    def __init__(self, broker: Broker, params: Params, run_id: str) -> None:
        self.broker = broker
        self.bench = Bench(broker, params, run_id)
        self.result = TargetResult(target=broker.name, service_url=broker.service_url)

    def start(self) -> None:
        """Start the broker, check where it listens, measure its idle CPU."""
        b, tr = self.broker, self.result
        try:
            t0 = time.monotonic()
            print(f"[{b.name}] starting ...", flush=True)
            b.start()
            tr.startup_s = time.monotonic() - t0
            tr.pid, tr.version = b.pid, b.version()
            if b.pid:
                tr.listening = listening_addresses(b.pid)
                wide = [a for a in tr.listening if not is_loopback(a)]
                if wide:
                    print(f"[{b.name}] WARNING: listening beyond loopback: {wide}", flush=True)
            tr.idle_broker_cores = self.bench.idle_cores()
        except Exception as exc:
            tr.pid, tr.error = b.pid, f"{exc}"
            print(f"[{b.name}] FAILED: {exc}", flush=True)
            b.stop()

    def run(self, name: str, runner: Callable[[Bench], ScenarioResult]) -> None:
        """Run one scenario; its failure is recorded and does not stop the others."""
        b, tr = self.broker, self.result
        if tr.error:
            return
        if not b.alive():
            tr.error = f"broker died before {name}\n{b.log_tail()}"
            print(f"[{b.name}] FAILED: {tr.error}", flush=True)
            return
        print(f"[{b.name}] {name} ...", flush=True)
        try:
            r = runner(self.bench)
        except Exception as exc:
            r = ScenarioResult(name, "?", 0, False, error=str(exc) or repr(exc))
        tr.scenarios.append(r)
        if r.error:
            print(f"[{b.name}] {name} FAILED: {r.error.strip().splitlines()[-1]}", flush=True)
        else:
            print(
                f"[{b.name}] {name}: {r.messages:,} msgs, {r.msgs_per_s:,.0f} msg/s, broker "
                f"{_fmt(r.broker_us_per_msg, '.2f')} us/msg",
                flush=True,
            )

    def stop(self) -> None:
        """Stop the broker (idempotent)."""
        self.broker.stop()


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; returns a process exit code."""
    args = parse_args(argv)
    params = build_params(args)
    plan = scenario_plan(params, [s.strip() for s in args.scenarios.split(",") if s.strip()])
    command = shlex.join([sys.executable, *sys.argv]) if argv is None else shlex.join(["bench.py", *argv])
    run_id = uuid.uuid4().hex[:8]

    # SIGTERM gets the same orderly shutdown as Ctrl-C.
    def on_term(_sig: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)

    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="magnetar-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    header = [
        f"command: {command}",
        f"started: {time.strftime('%Y-%m-%d %H:%M:%S %z')}  host: {platform.node()}  cpus: {os.cpu_count()}  "
        f"loadavg: {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
        f"python {platform.python_version()}  pulsar-client {_pkg_version('pulsar-client')}  workdir: {workdir}",
        f"params: {json.dumps(asdict(params))}",
        f"scenarios: {', '.join(n for n, _ in plan)}",
    ]
    print("\n".join(header), flush=True)

    brokers: list[Broker]
    if args.service_url:
        brokers = [ExternalBroker(args.service_url, args.broker_pid)]
    else:
        names = ["magnetar", "pulsar-lite"] if args.target == "both" else [args.target]
        brokers = []
        for n in names:
            if n == "magnetar":
                brokers.append(MagnetarBroker(workdir / "magnetar", args.magnetar_cmd, args.magnetar_args))
            else:
                brokers.append(PulsarLiteBroker(workdir / "pulsar-lite", args.pulsar_lite_bin))

    runs = [TargetRun(b, params, run_id) for b in brokers]
    results = [r.result for r in runs]
    interrupted = False
    try:
        if args.interleave:
            # Both brokers up at once; each scenario runs on one, then the other, so that load from
            # outside (other sessions on the shared cores) hits both sides of a ratio alike.
            for r in runs:
                r.start()
            for name, runner in plan:
                for r in runs:
                    r.run(name, runner)
        else:
            for r in runs:
                r.start()
                for name, runner in plan:
                    r.run(name, runner)
                r.stop()
    except KeyboardInterrupt:
        interrupted = True
        print("\ninterrupted: stopping brokers", flush=True)
    finally:
        for b in brokers:
            b.stop()
        if not args.keep and not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)

    report = {
        "command": command,
        "header": header,
        "params": asdict(params),
        "interrupted": interrupted,
        "targets": [],
        "ratios": None,
    }
    print()
    for t in results:
        checks = design_checks(t)
        print(format_table(t))
        print(format_checks(t, checks))
        print()
        report["targets"].append({**asdict(t), "design_targets": checks})
    by_name = {t.target: t for t in results}
    if "magnetar" in by_name and "pulsar-lite" in by_name:
        rows = ratios(by_name["magnetar"], by_name["pulsar-lite"])
        print(format_ratios("magnetar", "pulsar-lite", rows))
        report["ratios"] = {"numerator": "magnetar", "denominator": "pulsar-lite", "rows": rows}
    print(f"\ncommand: {command}")
    print("note: 2 shared, noisy cores; clients and broker compete for them. Compare ratios within one run.")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2, default=str) + "\n")
        print(f"json: {args.json}")
    failed = interrupted or any(t.error or any(r.error for r in t.scenarios) for t in results)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
