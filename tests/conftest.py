"""Shared fixtures: real ``magnetar standalone`` processes on free loopback ports."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.ports import free_port


class StandaloneProcess:
    """A ``magnetar standalone`` subprocess with its own data dir and ports."""

    def __init__(
        self, data_dir: Path, extra_config: dict[str, str] | None = None, advertised_address: str | None = "127.0.0.1"
    ) -> None:
        self.data_dir = data_dir
        #: ``--advertised-address`` (None: not given, e.g. when advertisedListeners name the hosts).
        self.advertised_address = advertised_address
        self.port = free_port()
        self.http_port = free_port()
        self.extra_config = extra_config or {}
        #: More command-line arguments (after the usual ones, so ``--<settingName>`` flags win).
        self.extra_args: list[str] = []
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir.parent / f"{data_dir.name}.log"

    @property
    def service_url(self) -> str:
        return f"pulsar://127.0.0.1:{self.port}"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def start(self, timeout: float = 30.0) -> None:
        env = dict(os.environ)
        env.update({f"MAGNETAR_{k}": v for k, v in self.extra_config.items()})
        env.setdefault("MAGNETAR_LOG_LEVEL", "INFO")
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child owns it until it exits
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "magnetar.cli.main",
                "standalone",
                "--data-dir",
                str(self.data_dir),
                "--port",
                str(self.port),
                "--http-port",
                str(self.http_port),
                "--bind-address",
                "127.0.0.1",
                *(["--advertised-address", self.advertised_address] if self.advertised_address else []),
                *self.extra_args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"standalone exited with {self.proc.returncode}:\n{self.log()}")
            if self.healthy():
                return
            time.sleep(0.1)
        raise RuntimeError(f"standalone did not become healthy in {timeout}s:\n{self.log()}")

    def healthy(self) -> bool:
        """Whether the broker answers its probe, open with authentication on too (a TLS-only broker's subclass
        asks over HTTPS)."""
        try:
            with urllib.request.urlopen(f"{self.http_url}/status.html", timeout=1) as r:
                return r.status == 200
        except OSError:
            return False

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-8000:]
        except OSError:
            return ""

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM and wait: returns the exit code."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
            raise

    def restart(self) -> None:
        self.stop()
        self.start()


class ExternalBroker(StandaloneProcess):
    """An already-running broker (``MAGNETAR_TEST_BROKER=PORT,HTTP_PORT``), e.g. to compare with Apache Pulsar."""

    def __init__(self, spec: str) -> None:
        super().__init__(Path("/nonexistent"))
        port, http_port = spec.split(",")
        self.port, self.http_port = int(port), int(http_port)

    def start(self, timeout: float = 30.0) -> None:
        pass

    def stop(self, timeout: float = 30.0) -> int:
        return 0


@pytest.fixture(scope="session")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneProcess]:
    """One broker shared by the tests that do not restart or reconfigure it."""
    external = os.environ.get("MAGNETAR_TEST_BROKER")
    if external:
        yield ExternalBroker(external)
        return
    node = StandaloneProcess(tmp_path_factory.mktemp("standalone") / "data")
    node.start()
    yield node
    code = node.stop()
    assert code == 0, f"standalone exited with {code} on SIGTERM:\n{node.log()}"


@pytest.fixture
def fresh_standalone(tmp_path: Path) -> Iterator[StandaloneProcess]:
    """A broker of its own, for tests that kill, restart or reconfigure it."""
    node = StandaloneProcess(tmp_path / "data")
    yield node
    if node.proc is not None and node.proc.poll() is None:
        node.stop()


@pytest.fixture
def client(standalone: StandaloneProcess) -> Iterator[object]:
    import pulsar

    c = pulsar.Client(standalone.service_url, operation_timeout_seconds=10, logger=_quiet_logger())
    yield c
    c.close()


def _quiet_logger() -> object:
    import pulsar

    return pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)


@pytest.fixture
def topic_name(request: pytest.FixtureRequest) -> str:
    """A topic name unique to the test."""
    safe = "".join(c if c.isalnum() else "-" for c in request.node.name)[:60]
    return f"persistent://public/default/{safe}-{time.monotonic_ns() % 10**9}"
