"""Brokers under test: started here (Magnetar, pulsar-lite) or already running."""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pulsar

from benchmarks.bench.procfs import CpuTimes, free_port, set_tree_affinity, tree_cpu_seconds

REPO_ROOT = Path(__file__).resolve().parents[2]


def parse_cpus(text: str) -> frozenset[int]:
    """A CPU list as ``taskset -c`` takes it (``0``, ``0,2``, ``1-3``); raises ValueError."""
    cpus: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        first, last = int(lo), int(hi or lo)
        if first < 0 or last < first:
            raise ValueError(f"bad CPU range {part!r}")
        cpus.update(range(first, last + 1))
    if not cpus:
        raise ValueError("empty CPU list")
    return frozenset(cpus)


@contextlib.contextmanager
def cpu_affinity(cpus: frozenset[int] | None) -> Iterator[None]:
    """Run the calling thread on ``cpus`` inside the block (a process it starts there inherits them)."""
    if cpus is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


@contextlib.contextmanager
def broker_apart(pid: int | None, cpus: frozenset[int] | None) -> Iterator[None]:
    """Inside the block, the process tree ``pid`` runs on ``cpus`` and this process, with the client
    processes it starts there, on the other CPUs; both get their CPUs back afterwards."""
    if cpus is None or pid is None:
        yield
        return
    try:
        theirs = os.sched_getaffinity(pid)
    except OSError:  # gone: the row will say so
        yield
        return
    set_tree_affinity(pid, cpus)
    try:
        with cpu_affinity(frozenset(os.sched_getaffinity(0) - cpus)):
            yield
    finally:
        set_tree_affinity(pid, theirs)


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

    def cpu_seconds(self) -> CpuTimes | None:
        """Cumulative CPU seconds of the broker process tree, or None when unknown."""
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
        self.base_workdir = workdir
        self.starts = 0
        #: CPUs the broker process (all its threads) may run on; None: wherever the kernel likes.
        self.cpus: frozenset[int] | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self._place(workdir)

    def _place(self, workdir: Path) -> None:
        """Where the next start keeps its data and log, and the free ports it listens on."""
        self.workdir = workdir
        self.log_path = workdir / "broker.log"
        self.port = free_port()
        self.http_port = free_port()
        self.service_url = f"pulsar://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        """The argv that starts the broker."""
        raise NotImplementedError

    def env(self) -> dict[str, str] | None:
        """The broker's environment (None: this script's)."""
        return None

    def start(self) -> None:
        """Launch the process and wait until a client can publish through it.

        A second start (the next round of ``--repeat``) is a fresh broker: new data directory, new ports."""
        self.starts += 1
        if self.starts > 1:
            self._place(self.base_workdir / f"round{self.starts}")
        self.workdir.mkdir(parents=True, exist_ok=True)
        argv = self.command()
        with open(self.log_path, "ab") as log:
            log.write(f"$ {shlex.join(argv)}\n".encode())
            log.flush()
            # Own session: Ctrl-C reaches only this script, which then stops the broker in order.
            with cpu_affinity(self.cpus):  # the child inherits it, and so do all the threads it makes
                self.proc = subprocess.Popen(
                    argv, stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir, start_new_session=True, env=self.env()
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
        return pkg_version("pulsar-lite")


class MagnetarBroker(ManagedBroker):
    """``magnetar standalone`` from this repository."""

    name = "magnetar"

    def __init__(self, workdir: Path, cmd: str | None, extra: str, journal_sync: bool = True) -> None:
        super().__init__(workdir)
        #: False: the standalone bookie does not fdatasync its journal (``journalSyncData=false``), to
        #: compare CPU like for like with a broker that does not fsync (pulsar-lite).
        self.journal_sync = journal_sync
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

    def env(self) -> dict[str, str] | None:
        """``MAGNETAR_journalSyncData=false`` when the journal is not to be synced."""
        if self.journal_sync:
            return None
        return {**os.environ, "MAGNETAR_journalSyncData": "false"}

    def version(self) -> str:
        """Package version plus the git revision of the checkout (and "no fsync" when so run)."""
        rev = ""
        with contextlib.suppress(OSError, subprocess.CalledProcessError):
            rev = subprocess.run(
                ["git", "-C", str(REPO_ROOT), "rev-parse", "--short", "HEAD"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
        nosync = "" if self.journal_sync else "journalSyncData=false"
        return " ".join(x for x in (pkg_version("magnetar"), rev, nosync) if x)


def find_pulsar_lite() -> str:
    """Locate the pulsar-lite binary shipped inside the PyPI package, or on PATH."""
    with contextlib.suppress(ImportError, FileNotFoundError):
        from pulsar_lite.binary_finder import find_pulsar_lite_binary

        return find_pulsar_lite_binary()
    found = shutil.which("pulsar-lite")
    if not found:
        raise RuntimeError("pulsar-lite binary not found (pip install pulsar-lite, or --pulsar-lite-bin)")
    return found


def pkg_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return ""


def pulsar_client(url: str) -> pulsar.Client:
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
        client = pulsar_client(url)
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
