"""``magnetar.spark.bench`` accounting (no Spark, no broker): the steady state's row counting from a running
query's progress reports, and the Spark side's CPU leaving out the producer process."""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

import pytest

from magnetar.spark.bench import ProgressCounter, spark_cpu


class FakeQuery:
    """``lastProgress`` / ``recentProgress`` of a running query, as reports (dicts) set by the test."""

    def __init__(self, reports: list[dict[str, int]]) -> None:
        self.reports = reports
        self.recent_calls = 0

    @property
    def lastProgress(self) -> dict[str, int] | None:
        return self.reports[-1] if self.reports else None

    @property
    def recentProgress(self) -> list[dict[str, int]]:
        self.recent_calls += 1
        return list(self.reports[-100:])

    def exception(self) -> None:
        return None

    def add(self, batch: int, rows: int) -> None:
        self.reports.append({"batchId": batch, "numInputRows": rows})


def test_progress_counter_counts_batches_after_it_was_made() -> None:
    query = FakeQuery([])
    query.add(3, 500)  # the warm-up: before the counter, not counted
    query.add(4, 0)  # idle report: names batch 4, which has not run yet
    counter = ProgressCounter(query)
    assert counter.poll() == 0
    query.add(4, 100)  # batch 4 runs after all: counted although an idle report named it
    assert counter.poll() == 100
    assert counter.poll() == 100  # the same report again: not twice
    assert query.recent_calls == 0  # one batch at a time: lastProgress is enough
    query.add(5, 20)
    query.add(6, 30)
    query.add(7, 10)
    assert counter.poll() == 160  # batches 5 and 6 missed between polls: taken from recentProgress
    assert query.recent_calls == 1
    query.add(8, 0)  # idle again
    assert counter.poll() == 160
    assert query.recent_calls == 1
    query.add(8, 5)
    assert counter.poll() == 165
    assert counter.batches == 5


def test_progress_counter_starts_on_a_query_without_reports() -> None:
    query = FakeQuery([])
    counter = ProgressCounter(query)
    assert counter.poll() == 0
    query.add(0, 7)
    assert counter.wait_for(7, timeout=1) == 7


def test_progress_counter_wait_is_bounded() -> None:
    counter = ProgressCounter(FakeQuery([]))
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="0 of 10 rows"):
        counter.wait_for(10, timeout=0.2, interval=0.01)
    assert time.monotonic() - start < 5


def _busy_child(seconds: float) -> Any:
    """A child process that burns ``seconds`` of CPU, says so, then sleeps (not reaped until killed)."""
    code = (
        "import time, sys\n"
        f"end = time.process_time() + {seconds}\n"
        "while time.process_time() < end: pass\n"
        "print('done', flush=True)\n"
        "time.sleep(60)\n"
    )
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)


@pytest.mark.parametrize("excluded", [True, False])
def test_spark_cpu_leaves_out_excluded_processes(excluded: bool) -> None:
    before = spark_cpu()
    child = _busy_child(0.4)
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "done"  # blocks until the child has burnt its CPU
        after = spark_cpu((child.pid,) if excluded else ())
    finally:
        child.kill()
        child.wait(timeout=10)
    # A child that is not a JVM's or a PySpark daemon's counts as the driver's.
    counted = after["driver"] - before["driver"]
    if excluded:
        assert counted < 0.2
    else:
        assert counted >= 0.35
