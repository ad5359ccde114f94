"""``benchmarks.bench --repeat``: rounds paired side by side, medians of their ratios, and the targets against
the peer evaluated on them."""

from __future__ import annotations

import json
import signal
import urllib.request
from pathlib import Path

import pytest

from benchmarks.bench.brokers import MagnetarBroker
from benchmarks.bench.main import main, parse_args
from benchmarks.bench.report import format_peer_checks, format_ratios, format_table, peer_checks, ratios
from benchmarks.bench.results import ScenarioResult, TargetResult
from tests.conftest import StandaloneProcess


def _row(name: str, rnd: int, per_cpu_s: float, **kw: object) -> ScenarioResult:
    r = ScenarioResult(name, "publish", 100, False, messages=10, msgs_per_s=100.0, msgs_per_broker_cpu_s=per_cpu_s)
    r.round = rnd
    for k, v in kw.items():
        setattr(r, k, v)
    return r


def test_rounds_pair_side_by_side_and_give_the_median_ratio_and_its_range() -> None:
    a = TargetResult("magnetar", scenarios=[_row("publish-100B", 1, 10.0), _row("publish-100B", 2, 30.0)])
    a.scenarios += [_row("publish-100B", 3, 20.0), _row("publish-100B", 4, 99.0)]
    b = TargetResult("pulsar-lite", scenarios=[_row("publish-100B", n, 10.0) for n in (1, 2, 3)])
    b.scenarios.append(_row("publish-100B", 4, 10.0, error="boom"))  # a failed row pairs with nothing
    rows = ratios(a, b)
    assert len(rows) == 1
    row = rows[0]
    assert row["rounds"] == 3 and row["msgs_per_broker_cpu_s"] == 2.0 and row["cpu_range"] == (1.0, 3.0)
    text = format_ratios("magnetar", "pulsar-lite", rows)
    assert "medians of the ratios of 3 rounds" in text and "1.00-3.00" in text
    # One round: the table is as it always was (no range column).
    one = ratios(
        TargetResult("a", scenarios=[_row("publish-100B", 1, 8.0)]),
        TargetResult("b", scenarios=[_row("publish-100B", 1, 10.0)]),
    )
    assert one[0]["msgs_per_broker_cpu_s"] == 0.8 and "range" not in format_ratios("a", "b", one)
    # Rows keep the plan's order even when a scenario's first round has no pair.
    a.scenarios.insert(0, _row("consume-100B", 1, 5.0))
    a.scenarios.insert(1, _row("fanout-100B", 1, 5.0))
    a.scenarios.append(_row("consume-100B", 2, 5.0))
    b.scenarios += [_row("consume-100B", 1, 5.0, error="boom"), _row("consume-100B", 2, 5.0)]
    assert [r["scenario"] for r in ratios(a, b)] == ["consume-100B", "publish-100B"]
    # Each round's row keeps its own line in the target's table.
    assert "publish-100B#2" in format_table(a) and "publish-100B#3" in format_table(a)


def test_targets_against_the_peer() -> None:
    def lat(rate: int, rnd: int, p99: float, msgs_per_s: float) -> ScenarioResult:
        r = ScenarioResult(f"latency-{rate}", "latency", 100, False, msgs_per_s=msgs_per_s, target_rate=rate)
        r.round, r.latency_ms = rnd, {"p50": 1.0, "p99": p99}
        return r

    def target(
        name: str,
        cpu: tuple[float, float],
        p99s: tuple[float, ...],
        rates: tuple[float, ...],
        p99_2000: float,
        rss: float,
    ) -> TargetResult:
        rows = [_row("publish-100B", 1, cpu[0]), _row("publish-batched-100B", 1, cpu[1])]
        rows += [lat(20_000, n, p99, rate) for n, (p99, rate) in enumerate(zip(p99s, rates, strict=True), 1)]
        rows.append(lat(2000, 1, p99_2000, 2000.0))
        return TargetResult(name, scenarios=rows, rss_median_mib=rss, rss_samples=10)

    a = target("magnetar", (8.0, 9.9), (25.0, 15.0, 18.0), (19_900.0, 20_000.0, 20_000.0), 10.5, 150.0)
    b = target("pulsar-lite", (10.0, 10.0), (9.0, 9.0, 9.0), (20_000.0,) * 3, 1.0, 100.0)
    checks = {c["scenario"] + " " + c["target"]: c for c in peer_checks(ratios(a, b), a)}
    assert checks["publish-100B msg/brkCPU-s >= 0.8x the peer's"]["pass"]  # exactly 0.8
    assert not checks["publish-batched-100B msg/brkCPU-s >= 1x the peer's"]["pass"]  # 0.99
    assert checks["(whole run) broker RSS median <= 1.5x the peer's"]["pass"]  # exactly 1.5
    # The median of the rounds' p99 (25, 15, 18 -> 18), not the worst or the first.
    p99 = checks["latency-20000 e2e p99 <= 20 ms at 20,000 msg/s"]
    assert p99["pass"] and p99["value"] == "18.00 ms"
    assert not checks["latency-2000 e2e p99 <= 10 ms at 2,000 msg/s"]["pass"]
    assert checks["latency-20000 rate >= the peer's"]["pass"]  # median rate ratio 1.0
    text = format_peer_checks("magnetar", "pulsar-lite", list(checks.values()))
    assert "[FAIL]" in text and "[PASS]" in text


def test_repeat_runs_the_plan_n_times(standalone: StandaloneProcess, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--repeat", "0"])
    argv = ["--service-url", standalone.service_url, "--scenarios", "publish-100B", "--duration", "0.5"]
    existing = set(_bench_topics(standalone))  # the shared broker keeps other tests' topics
    before = signal.getsignal(signal.SIGTERM)
    try:
        rc = main([*argv, "--producers", "1", "--repeat", "2"])
    finally:
        signal.signal(signal.SIGTERM, before)  # main() takes SIGTERM over, as a command should
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "publish-100B #2 ..." in out
    table = out[out.index("== external") :]
    assert "\npublish-100B " in table and "\npublish-100B#2 " in table and "publish-100B#3" not in table
    # A broker that cannot be restarted between rounds gives each round topics of its own.
    topics = [t for t in _bench_topics(standalone) if t not in existing]
    ends = {len(t.rsplit("-", 1)[-1]) for t in topics}
    assert len(topics) == 2 and ends == {8, 1} and any(t.endswith("-2") for t in topics), topics  # <id>, <id>-2


def _bench_topics(standalone: StandaloneProcess) -> list[str]:
    with urllib.request.urlopen(f"{standalone.http_url}/admin/v2/persistent/public/default", timeout=10) as resp:
        return [t for t in json.load(resp) if "/bench-publish-100B-" in t]


def test_a_started_broker_is_fresh_in_each_round(tmp_path: Path) -> None:
    broker = MagnetarBroker(tmp_path, None, "")
    first: list[tuple[str, Path]] = []
    try:
        for _ in range(2):
            broker.start()
            first.append((broker.service_url, broker.workdir))
            broker.stop()
    finally:
        broker.stop()
    (url1, dir1), (url2, dir2) = first
    assert url1 != url2 and dir1 == tmp_path and dir2 == tmp_path / "round2"
    assert (dir1 / "data").is_dir() and (dir2 / "data").is_dir()  # each its own data, the first left as it was
