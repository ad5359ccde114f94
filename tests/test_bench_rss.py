"""``benchmarks.bench`` broker RSS: sampled in the background during each row, summarised per row and
over the run, compared between the two brokers."""

from __future__ import annotations

import subprocess
import sys
import time

from benchmarks.bench.brokers import ExternalBroker
from benchmarks.bench.main import TargetRun
from benchmarks.bench.memory import MIB, RssSampler, rss_summary
from benchmarks.bench.procfs import tree_rss_bytes
from benchmarks.bench.report import format_ratios, format_table, ratios
from benchmarks.bench.results import Params, ScenarioResult, TargetResult


def test_summary_is_median_and_peak_in_mib() -> None:
    assert rss_summary([]) is None
    assert rss_summary([10 * MIB, 30 * MIB, 20 * MIB]) == (20.0, 30.0)
    # Even count: the mean of the two middle samples.
    assert rss_summary([10 * MIB, 20 * MIB, 40 * MIB, 100 * MIB]) == (30.0, 100.0)


def test_sampler_reads_until_stopped_and_skips_unknown_reads() -> None:
    reads = iter([5 * MIB, None, 7 * MIB] + [6 * MIB] * 1000)
    sampler = RssSampler(lambda: next(reads), interval=0.01)
    sampler.start()
    deadline = time.monotonic() + 5.0
    while len(sampler.samples) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    samples = sampler.stop()
    assert samples[:3] == [5 * MIB, 7 * MIB, 6 * MIB]  # the unknown read (process gone) left out
    n = len(samples)
    time.sleep(0.05)
    assert len(sampler.samples) == n  # stopped: no more reads
    assert not sampler.running


def test_sampler_is_bounded() -> None:
    sampler = RssSampler(lambda: MIB, interval=0.0, max_samples=50)
    sampler.start()
    deadline = time.monotonic() + 5.0
    while sampler.running and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not sampler.running  # ends by itself once full
    assert len(sampler.stop()) == 50


# A stand-in broker: a child interpreter that allocates N MiB of resident ballast per input line.
# A child, not this process: the bench samples a process *tree*, and late in a full run pytest's tree
# holds the session's Spark JVM and standalone broker (~2.3 GB), whose RSS moves on its own between
# samples; that once put a row's peak above the RSS read after it.
_BALLAST_CHILD = """
import sys
ballast = []
for line in sys.stdin:
    ballast.append(bytearray(int(line) * 1024 * 1024))  # zero-filled: resident
    print("ok", flush=True)
"""


def test_each_row_and_the_run_get_the_broker_rss() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", _BALLAST_CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    stdin, stdout = child.stdin, child.stdout
    assert stdin is not None and stdout is not None
    try:
        run = TargetRun(ExternalBroker("pulsar://127.0.0.1:1", child.pid), Params(), "t-rss")
        run.sampler_interval = 0.05

        def row(name: str, grow_mib: int) -> ScenarioResult:
            def runner(_bench: object) -> ScenarioResult:
                stdin.write(f"{grow_mib}\n")
                stdin.flush()
                assert stdout.readline().strip() == "ok"
                time.sleep(0.3)
                return ScenarioResult(name, "publish", 100, False, messages=1)

            run.run(name, runner)
            return run.result.scenarios[-1]

        a = row("a", 1)
        b = row("b", 64)
        after = tree_rss_bytes(child.pid) / MIB
    finally:
        child.kill()
        child.wait(timeout=10)
    for r in (a, b):
        assert r.rss_samples is not None and r.rss_samples >= 3
        assert r.rss_median_mib is not None and r.rss_peak_mib is not None
        # The child only grows; a little slack for the interpreter's own allocator.
        assert 0 < r.rss_median_mib <= r.rss_peak_mib <= after + 4
    assert a.rss_peak_mib < 60  # type: ignore[operator]  # the child, not this process, was sampled
    assert b.rss_peak_mib >= a.rss_peak_mib + 60  # type: ignore[operator]
    t = run.result
    assert t.rss_peak_mib == b.rss_peak_mib
    assert t.rss_samples == a.rss_samples + b.rss_samples  # type: ignore[operator]
    assert t.rss_median_mib is not None and a.rss_median_mib <= t.rss_median_mib <= b.rss_peak_mib  # type: ignore[operator]
    assert "rssMed" in format_table(t) and f"{b.rss_peak_mib:.0f}" in format_table(t)


def test_ratio_table_has_the_rss_ratios() -> None:
    def target(name: str, med: float, peak: float) -> TargetResult:
        r = ScenarioResult("publish-100B", "publish", 100, False, messages=10, msgs_per_s=10.0)
        r.rss_median_mib, r.rss_peak_mib, r.rss_samples = med, peak, 10
        return TargetResult(name, scenarios=[r], rss_median_mib=med + 1, rss_peak_mib=peak + 10, rss_samples=10)

    a, b = target("magnetar", 150.0, 180.0), target("pulsar-lite", 60.0, 120.0)
    rows = ratios(a, b)
    assert rows[0]["rss_median"] == 2.5 and rows[0]["rss_peak"] == 1.5
    assert rows[-1]["scenario"] == "(whole run)"
    assert rows[-1]["rss_median"] == 151 / 61 and rows[-1]["rss_peak"] == 190 / 130
    text = format_ratios("magnetar", "pulsar-lite", rows)
    assert "rss-med" in text and "rss-peak" in text and " 2.50 " in text and "(whole run)" in text
