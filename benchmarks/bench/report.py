"""Reporting: result tables, design-target checks and ratios between two brokers."""

from __future__ import annotations

import statistics
from typing import Any

from benchmarks.bench.results import ScenarioResult, TargetResult

# Design targets printed beside the results.
TARGET_BATCHED_US_PER_MSG = 1.0
TARGET_NONBATCHED_MSGS_PER_CPU_S = 20_000.0
TARGET_P99_MS = 20.0
TARGET_P99_RATE = 2000


def fmt(v: float | None, spec: str) -> str:
    if v is None:
        return "-"
    if v == float("inf"):
        return "inf"
    return format(v, spec)


# Foreign CPU load (cores) above which a row is marked as measured on a busy machine.
NOISY_OTHER_CORES = 0.3


def _noisy(r: ScenarioResult) -> bool:
    return r.other_cores is not None and r.other_cores > NOISY_OTHER_CORES


COLUMNS = [
    # header, width, getter
    ("scenario", 22, lambda r: r.label),
    ("msgs", 9, lambda r: f"{r.messages:,}"),
    ("secs", 6, lambda r: fmt(r.wall_s, ".2f")),
    ("msg/s", 9, lambda r: fmt(r.msgs_per_s, ",.0f")),
    ("MB/s", 7, lambda r: fmt(r.mb_per_s, ".1f")),
    ("brkCPU-s", 8, lambda r: fmt(r.broker_cpu_s, ".2f")),
    ("brkCores", 8, lambda r: fmt(r.broker_cores, ".2f")),
    ("sys%", 4, lambda r: fmt(r.broker_sys_pct, ".0f")),
    ("brk-us/msg", 10, lambda r: fmt(r.broker_us_per_msg, ".2f")),
    ("msg/brkCPU-s", 12, lambda r: fmt(r.msgs_per_broker_cpu_s, ",.0f")),
    ("cliCores", 8, lambda r: fmt(r.client_cores, ".2f")),
    ("othCores", 8, lambda r: fmt(r.other_cores, ".2f") + ("!" if _noisy(r) else " ")),
    ("p50ms", 7, lambda r: fmt((r.latency_ms or {}).get("p50"), ".2f")),
    ("p99ms", 7, lambda r: fmt((r.latency_ms or {}).get("p99"), ".2f")),
    ("p99.9ms", 7, lambda r: fmt((r.latency_ms or {}).get("p99.9"), ".2f")),
    ("maxms", 7, lambda r: fmt((r.latency_ms or {}).get("max"), ".1f")),
    ("rssMed", 6, lambda r: fmt(r.rss_median_mib, ".0f")),
    ("rssPeak", 7, lambda r: fmt(r.rss_peak_mib, ".0f")),
    ("err", 4, lambda r: str(r.errors)),
]


def format_table(t: TargetResult) -> str:
    """A fixed-width table of one target's scenarios, with notes and failures below it."""
    lines = [
        f"== {t.target} {t.version} | {t.service_url} | pid {t.pid or '-'} | idle broker "
        f"{fmt(t.idle_broker_cores, '.3f')} cores | listening {', '.join(t.listening) or '?'}"
    ]
    if t.error:
        lines.append(f"   FAILED: {t.error}")
    head = " ".join(h.rjust(w) if i else h.ljust(w) for i, (h, w, _) in enumerate(COLUMNS))
    lines += [head, "-" * len(head)]
    for r in t.scenarios:
        if r.error:
            lines.append(f"{r.label.ljust(22)} ERROR: {r.error.strip().splitlines()[-1]}")
            continue
        lines.append(" ".join(g(r).rjust(w) if i else g(r).ljust(w) for i, (_, w, g) in enumerate(COLUMNS)))
    if any(_noisy(r) for r in t.scenarios if not r.error):
        lines.append(
            f"! = other processes kept more than {NOISY_OTHER_CORES} cores busy during that row: "
            "throughput and latency there are suspect"
        )
    notes = [f"  {r.label}: {r.note}" for r in t.scenarios if r.note and not r.error]
    if t.rss_samples:
        lines.append(
            f"broker RSS (MiB, process tree VmRSS every ~0.5 s during the rows): idle {fmt(t.idle_rss_mib, '.0f')}, "
            f"whole run median {fmt(t.rss_median_mib, '.0f')} / peak {fmt(t.rss_peak_mib, '.0f')} "
            f"({t.rss_samples} samples)"
        )
    if notes:
        lines += ["notes:", *notes]
    return "\n".join(lines)


def design_checks(t: TargetResult) -> list[dict[str, Any]]:
    """Evaluate the design targets on one target's results (only rows that were run and have CPU data)."""
    checks: list[dict[str, Any]] = []
    for r in t.scenarios:
        if r.error:
            continue
        if r.kind in ("publish", "consume") and r.batched and r.broker_us_per_msg is not None:
            checks.append(
                {
                    "target": f"batched < {TARGET_BATCHED_US_PER_MSG:g} us broker CPU/msg",
                    "scenario": r.name,
                    "value": f"{r.broker_us_per_msg:.2f} us",
                    "pass": r.broker_us_per_msg < TARGET_BATCHED_US_PER_MSG,
                }
            )
        if r.kind in ("publish", "consume") and not r.batched and r.msgs_per_broker_cpu_s is not None:
            checks.append(
                {
                    "target": f"non-batched >= {TARGET_NONBATCHED_MSGS_PER_CPU_S:,.0f} msg/broker-CPU-s",
                    "scenario": r.name,
                    "value": f"{r.msgs_per_broker_cpu_s:,.0f}",
                    "pass": r.msgs_per_broker_cpu_s >= TARGET_NONBATCHED_MSGS_PER_CPU_S,
                }
            )
        if r.kind == "latency" and r.target_rate == TARGET_P99_RATE and r.latency_ms and "p99" in r.latency_ms:
            checks.append(
                {
                    "target": f"p99 <= {TARGET_P99_MS:g} ms at {TARGET_P99_RATE:,} msg/s",
                    "scenario": r.name,
                    "value": f"{r.latency_ms['p99']:.2f} ms",
                    "pass": r.latency_ms["p99"] <= TARGET_P99_MS,
                }
            )
    return checks


def format_checks(t: TargetResult, checks: list[dict[str, Any]]) -> str:
    """Design-target lines with PASS/FAIL marks."""
    if not checks:
        return f"design targets ({t.target}): nothing to check (no CPU data or scenarios not run)"
    lines = [f"design targets ({t.target}):"]
    for c in checks:
        lines.append(f"  [{'PASS' if c['pass'] else 'FAIL'}] {c['target']:<42} {c['scenario']:<22} {c['value']}")
    return "\n".join(lines)


def _div(x: float | None, y: float | None) -> float | None:
    return x / y if x and y else None


#: The figures of a ratio row, each a/b.
RATIO_FIELDS = ("msgs_per_s", "broker_us_per_msg", "msgs_per_broker_cpu_s", "p50", "p99", "rss_median", "rss_peak")


def _pair_ratios(ra: ScenarioResult, rb: ScenarioResult) -> dict[str, Any]:
    la, lb = ra.latency_ms or {}, rb.latency_ms or {}
    return {
        "msgs_per_s": _div(ra.msgs_per_s, rb.msgs_per_s),
        "broker_us_per_msg": _div(ra.broker_us_per_msg, rb.broker_us_per_msg),
        "msgs_per_broker_cpu_s": _div(ra.msgs_per_broker_cpu_s, rb.msgs_per_broker_cpu_s),
        "p50": _div(la.get("p50"), lb.get("p50")),
        "p99": _div(la.get("p99"), lb.get("p99")),
        "rss_median": _div(ra.rss_median_mib, rb.rss_median_mib),
        "rss_peak": _div(ra.rss_peak_mib, rb.rss_peak_mib),
        "noisy": _noisy(ra) or _noisy(rb),
    }


def median(values: list[float]) -> float | None:
    """The median (mean of the middle two for an even count), None for no values."""
    return statistics.median(values) if values else None


def ratios(a: TargetResult, b: TargetResult) -> list[dict[str, Any]]:
    """Per-scenario ratios a/b of throughput, broker CPU per message, latency and broker RSS (median and
    peak), then a ``(whole run)`` row with the RSS ratios over all rows.

    A scenario run several times (``--repeat``) is paired round by round, the rows that ran side by side,
    and each figure is the median of the pairs' ratios: ``rounds`` counts the pairs and ``cpu_range`` holds
    the lowest and highest msg/brkCPU-s ratio of them (the noise)."""
    by_round = {(r.name, r.round): r for r in b.scenarios if not r.error}
    pairs: dict[str, list[dict[str, Any]]] = {}
    for ra in a.scenarios:
        per = pairs.setdefault(ra.name, [])  # rows in the plan's order, even when a round's pair failed
        rb = by_round.get((ra.name, ra.round))
        if not ra.error and rb is not None:
            per.append(_pair_ratios(ra, rb))
    rows: list[dict[str, Any]] = []
    for name, per in pairs.items():
        if not per:
            continue
        row: dict[str, Any] = {"scenario": name}
        for key in RATIO_FIELDS:
            row[key] = median([p[key] for p in per if p[key] is not None])
        cpu = [p["msgs_per_broker_cpu_s"] for p in per if p["msgs_per_broker_cpu_s"] is not None]
        row.update(rounds=len(per), cpu_range=(min(cpu), max(cpu)) if cpu else None, noisy=any(p["noisy"] for p in per))
        rows.append(row)
    if rows and a.rss_samples and b.rss_samples:
        whole: dict[str, Any] = dict.fromkeys(rows[0], None)
        whole.update(
            scenario="(whole run)",
            rss_median=_div(a.rss_median_mib, b.rss_median_mib),
            rss_peak=_div(a.rss_peak_mib, b.rss_peak_mib),
            rounds=max(r["rounds"] for r in rows),
            noisy=False,
        )
        rows.append(whole)
    return rows


def format_ratios(a: str, b: str, rows: list[dict[str, Any]]) -> str:
    """Ratio table; for throughput higher is better for ``a``, for CPU/msg and latency lower is."""
    rounds = max((r.get("rounds") or 1 for r in rows), default=1)
    lines = [
        f"== ratio {a}/{b} (same run, same parameters; msg/s and msg/CPU-s: >1 favours {a}; "
        f"us/msg, latency and RSS: <1 favours {a})",
        f"{'scenario':<22} {'msg/s':>8} {'brk-us/msg':>10} {'msg/brkCPU-s':>12} {'p50':>7} {'p99':>7}"
        f" {'rss-med':>7} {'rss-peak':>8}" + (f" {'msg/brkCPU-s range':>18}" if rounds > 1 else ""),
    ]
    if rounds > 1:
        lines.insert(1, f"   medians of the ratios of {rounds} rounds, each pair of rows run side by side")
    for r in rows:
        spread = ""
        if rounds > 1 and r.get("cpu_range"):
            lo, hi = r["cpu_range"]
            spread = f" {f'{lo:.2f}-{hi:.2f}':>18}"
        lines.append(
            f"{r['scenario']:<22} {fmt(r['msgs_per_s'], '.2f'):>8} {fmt(r['broker_us_per_msg'], '.2f'):>10}"
            f" {fmt(r['msgs_per_broker_cpu_s'], '.2f'):>12} {fmt(r['p50'], '.2f'):>7}"
            f" {fmt(r['p99'], '.2f'):>7} {fmt(r.get('rss_median'), '.2f'):>7} {fmt(r.get('rss_peak'), '.2f'):>8}"
            f"{spread}{'  ! busy machine' if r['noisy'] else ''}"
        )
    return "\n".join(lines)


# Targets against the peer broker (a/b in the ratio table), as the performance work set them.
#: Scenario -> the least msg/brkCPU-s ratio.
PEER_CPU_TARGETS = {
    "publish-100B": 0.8,
    "publish-batched-100B": 1.0,
    "publish-batched-1KB": 1.0,
    "fanout-100B": 1.0,
    "fanout-batched-100B": 1.0,
}
#: The most broker RSS over the whole run (median), as a ratio.
PEER_RSS_TARGET = 1.5
#: Rate (msg/s) -> the most end-to-end p99 (ms) of ``latency-<rate>`` (persistent, fsync on).
PEER_P99_TARGETS = {2000: 10.0, 20_000: 20.0}
#: ``latency-<rate>`` at this rate must reach at least the peer's rate (1% slack for pacing jitter).
PEER_RATE_SCENARIO, PEER_RATE_SLACK = "latency-20000", 0.99


def peer_checks(rows: list[dict[str, Any]], a: TargetResult) -> list[dict[str, Any]]:
    """Evaluate the targets against the peer on the ratio rows (medians over rounds) and on ``a``'s latency
    rows (the median of its rounds' p99)."""
    by = {r["scenario"]: r for r in rows}
    checks: list[dict[str, Any]] = []

    def add(target: str, scenario: str, value: str, ok: bool) -> None:
        checks.append({"target": target, "scenario": scenario, "value": value, "pass": ok})

    for name, floor in PEER_CPU_TARGETS.items():
        v = by.get(name, {}).get("msgs_per_broker_cpu_s")
        if v is not None:
            add(f"msg/brkCPU-s >= {floor:g}x the peer's", name, f"{v:.2f}x", v >= floor)
    whole = by.get("(whole run)", {}).get("rss_median")
    if whole is not None:
        add(
            f"broker RSS median <= {PEER_RSS_TARGET:g}x the peer's",
            "(whole run)",
            f"{whole:.2f}x",
            whole <= PEER_RSS_TARGET,
        )
    for rate, ceiling in PEER_P99_TARGETS.items():
        name = f"latency-{rate}"
        p99 = median(
            [r.latency_ms["p99"] for r in a.scenarios if r.name == name and r.latency_ms and "p99" in r.latency_ms]
        )
        if p99 is not None:
            add(f"e2e p99 <= {ceiling:g} ms at {rate:,} msg/s", name, f"{p99:.2f} ms", p99 <= ceiling)
    rate = by.get(PEER_RATE_SCENARIO, {}).get("msgs_per_s")
    if rate is not None:
        add("rate >= the peer's", PEER_RATE_SCENARIO, f"{rate:.3f}x", rate >= PEER_RATE_SLACK)
    return checks


def format_peer_checks(a: str, b: str, checks: list[dict[str, Any]]) -> str:
    """PASS/FAIL lines of :func:`peer_checks`."""
    lines = [f"targets of {a} against {b}:"]
    for c in checks:
        lines.append(f"  [{'PASS' if c['pass'] else 'FAIL'}] {c['target']:<42} {c['scenario']:<22} {c['value']}")
    return "\n".join(lines)
