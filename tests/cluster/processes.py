"""Processes of a local test cluster: ``magnetar broker`` instances against a real etcd."""

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

from tests.etcd_server import free_port


class ClusterBroker:
    """``magnetar broker`` against the cluster's etcd (``name`` keeps the logs of several apart)."""

    def __init__(self, log_dir: Path, metadata_url: str, extra: dict[str, str], name: str = "broker") -> None:
        self.metadata_url = metadata_url
        self.port, self.http_port = free_port(), free_port()
        self.extra = extra
        self.log_path = log_dir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def service_url(self) -> str:
        return f"pulsar://127.0.0.1:{self.port}"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def broker_id(self) -> str:
        """The id the broker registers under (advertised host and web service port)."""
        return f"127.0.0.1:{self.http_port}"

    def start(self, timeout: float = 30.0) -> None:
        env = dict(os.environ)
        env.update({f"MAGNETAR_{k}": v for k, v in self.extra.items()})
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child owns it
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "magnetar.cli.main", "broker", "--metadata-url", self.metadata_url,
             "--cluster", "test-cluster", "--port", str(self.port), "--http-port", str(self.http_port),
             "--bind-address", "127.0.0.1", "--advertised-address", "127.0.0.1"],
            stdout=log, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"broker exited:\n{self.log_path.read_text()[-4000:]}")
            try:
                with urllib.request.urlopen(f"{self.http_url}/admin/v2/brokers/health", timeout=1):
                    return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"broker not healthy:\n{self.log_path.read_text()[-4000:]}")

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def pause(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def stop(self, timeout: float = 30.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)  # a paused broker cannot handle SIGTERM
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def get_json(self, path: str, timeout: float = 10.0) -> Any:
        """GET on this broker's web service (redirects followed), decoded."""
        with urllib.request.urlopen(f"{self.http_url}{path}", timeout=timeout) as r:
            body = r.read()
        return json.loads(body) if body else None


def initialize_cluster(metadata_url: str) -> None:
    """``magnetar initialize-cluster-metadata`` for cluster ``test-cluster`` in the store at ``metadata_url``."""
    done = subprocess.run(
        [sys.executable, "-m", "magnetar.cli.main", "initialize-cluster-metadata", "--cluster", "test-cluster",
         "--metadata-url", metadata_url, "--web-service-url", "http://127.0.0.1:8080",
         "--broker-service-url", "pulsar://127.0.0.1:6650"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
