"""``benchmarks.bench --broker-cpus`` and ``--latency-broker-cpus``: brokers on their own CPUs (every row, or
only the latency rows), clients on the others."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.bench.brokers import MagnetarBroker, broker_apart, cpu_affinity, parse_cpus
from benchmarks.bench.main import main, parse_args
from tests.conftest import StandaloneProcess

USABLE = os.sched_getaffinity(0)
needs_two_cpus = pytest.mark.skipif(len(USABLE) < 2, reason="pinning can only be seen with two usable CPUs")


def _thread_affinities(pid: int) -> dict[int, set[int]]:
    """Each thread's allowed CPUs, from /proc."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        out[int(tid)] = os.sched_getaffinity(int(tid))
    return out


def test_cpu_lists_parse_as_taskset_takes_them() -> None:
    assert parse_cpus("0") == {0}
    assert parse_cpus("0,2-3") == {0, 2, 3}
    assert parse_cpus(" 1 , 1") == {1}
    for bad in ("", "x", "3-1", "-1", "0,,1"):
        with pytest.raises(ValueError):
            parse_cpus(bad)


def test_broker_cpus_must_leave_the_clients_a_cpu_and_need_a_started_broker() -> None:
    assert parse_args([]).broker_cpus is None
    with pytest.raises(SystemExit):
        parse_args(["--broker-cpus", ",".join(map(str, sorted(USABLE)))])
    with pytest.raises(SystemExit):
        parse_args(["--broker-cpus", str(max(USABLE) + 1000)])
    with pytest.raises(SystemExit):
        parse_args(["--broker-cpus", "0", "--service-url", "pulsar://127.0.0.1:6650"])
    if len(USABLE) >= 2:
        assert parse_args(["--broker-cpus", str(min(USABLE))]).broker_cpus == {min(USABLE)}


@needs_two_cpus
def test_affinity_is_the_blocks_and_then_given_back() -> None:
    one = frozenset({min(USABLE)})
    with cpu_affinity(one):
        assert os.sched_getaffinity(0) == one
    assert os.sched_getaffinity(0) == USABLE
    with cpu_affinity(None):
        assert os.sched_getaffinity(0) == USABLE


@needs_two_cpus
def test_a_pinned_broker_runs_every_thread_on_its_cpus(tmp_path: Path) -> None:
    # A real standalone: its journal, checkpoint and metadata threads start after the pinning.
    one = frozenset({max(USABLE)})
    broker = MagnetarBroker(tmp_path, None, "")
    broker.cpus = one
    broker.start()
    try:
        assert broker.pid is not None
        threads = _thread_affinities(broker.pid)
        assert len(threads) >= 4, threads  # loop, journal writer, checkpoint, metadata
        assert all(cpus == one for cpus in threads.values()), threads
    finally:
        broker.stop()
    assert os.sched_getaffinity(0) == USABLE  # the test process itself is not left pinned


def test_latency_broker_cpus_must_leave_the_clients_a_cpu_and_pin_one_way_only() -> None:
    assert parse_args([]).latency_broker_cpus is None
    with pytest.raises(SystemExit):
        parse_args(["--latency-broker-cpus", ",".join(map(str, sorted(USABLE)))])
    with pytest.raises(SystemExit):
        parse_args(["--latency-broker-cpus", "x"])
    with pytest.raises(SystemExit):  # an external broker can be moved only if its PID is known
        parse_args(["--latency-broker-cpus", "0", "--service-url", "pulsar://127.0.0.1:6650"])
    if len(USABLE) >= 2:
        one = str(min(USABLE))
        with pytest.raises(SystemExit):
            parse_args(["--latency-broker-cpus", one, "--broker-cpus", one])
        assert parse_args(["--latency-broker-cpus", one]).latency_broker_cpus == {int(one)}
        external = ["--service-url", "pulsar://127.0.0.1:6650", "--broker-pid", "1", "--latency-broker-cpus", one]
        assert parse_args(external).latency_broker_cpus == {int(one)}


_THREADS_AND_A_CHILD = """
import subprocess, sys, threading, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
for _ in range(3):
    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
print(child.pid, flush=True)
time.sleep(60)
"""


@needs_two_cpus
def test_broker_apart_moves_every_thread_of_the_tree_and_gives_the_cpus_back() -> None:
    # A real process tree: a parent with four threads and a child process.
    proc = subprocess.Popen([sys.executable, "-c", _THREADS_AND_A_CHILD], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        child = int(proc.stdout.readline())
        one = frozenset({max(USABLE)})
        with broker_apart(proc.pid, one):
            parent_threads = _thread_affinities(proc.pid)
            assert len(parent_threads) >= 4, parent_threads
            assert all(cpus == one for cpus in parent_threads.values()), parent_threads
            assert all(cpus == one for cpus in _thread_affinities(child).values())
            assert os.sched_getaffinity(0) == USABLE - one  # the clients this process starts go elsewhere
        assert all(cpus == USABLE for cpus in _thread_affinities(proc.pid).values())
        assert all(cpus == USABLE for cpus in _thread_affinities(child).values())
        assert os.sched_getaffinity(0) == USABLE
        with broker_apart(proc.pid, None):  # off: nothing moves
            assert os.sched_getaffinity(0) == USABLE
    finally:
        proc.kill()
        proc.wait(timeout=10)
    with broker_apart(proc.pid, frozenset({max(USABLE)})):  # a broker already gone: the row goes on unpinned
        assert os.sched_getaffinity(0) == USABLE


@needs_two_cpus
def test_only_the_latency_rows_run_apart(standalone: StandaloneProcess, tmp_path: Path) -> None:
    assert standalone.proc is not None
    one = str(max(USABLE))
    out = tmp_path / "run.json"
    argv = ["--service-url", standalone.service_url, "--broker-pid", str(standalone.proc.pid)]
    argv += ["--scenarios", "publish-1KB,latency-300", "--sizes", "1024", "--duration", "1", "--producers", "1"]
    argv += ["--rates", "300", "--latency-duration", "2", "--latency-broker-cpus", one, "--json", str(out)]
    assert main(argv) == 0
    report = json.loads(out.read_text())
    assert f"latency rows with the broker on {one}" in "\n".join(report["header"])
    rows = {r["name"]: r for r in report["targets"][0]["scenarios"]}
    assert rows["publish-1KB"]["broker_cpus"] is None
    assert rows["latency-300"]["broker_cpus"] == one
    assert f"broker on CPU {one}, clients on the others" in rows["latency-300"]["note"]
    assert rows["latency-300"]["errors"] == 0 and rows["latency-300"]["latency_ms"]["samples"] > 0
    # Afterwards the broker and this process have every CPU again.
    assert all(cpus == USABLE for cpus in _thread_affinities(standalone.proc.pid).values())
    assert os.sched_getaffinity(0) == USABLE
