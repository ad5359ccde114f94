"""``benchmarks.bench --broker-cpus``: brokers on their own CPUs, clients on the others."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from benchmarks.bench.brokers import MagnetarBroker, cpu_affinity, parse_cpus
from benchmarks.bench.main import parse_args

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
