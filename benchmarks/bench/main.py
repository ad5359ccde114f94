"""The command line: ``python -m benchmarks.bench`` (see the package docstring)."""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import benchmarks.bench
from benchmarks.bench.brokers import (
    Broker,
    ExternalBroker,
    MagnetarBroker,
    ManagedBroker,
    PulsarLiteBroker,
    broker_apart,
    parse_cpus,
    pkg_version,
)
from benchmarks.bench.memory import MIB, SAMPLE_INTERVAL, RssSampler, rss_summary
from benchmarks.bench.procfs import is_loopback, listening_addresses, tree_rss_bytes
from benchmarks.bench.report import (
    design_checks,
    fmt,
    format_checks,
    format_peer_checks,
    format_ratios,
    format_table,
    peer_checks,
    ratios,
)
from benchmarks.bench.results import Params, ScenarioResult, TargetResult
from benchmarks.bench.scenarios import Bench, scenario_plan
from benchmarks.bench.workers import LATENCY_HEADER

#: The first paragraph of the package docstring.
DESCRIPTION = (benchmarks.bench.__doc__ or "").split("\n\n")[0]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Command-line options."""
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.bench", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--target",
        choices=["magnetar", "pulsar-lite", "both"],
        default="magnetar",
        help="broker(s) to start; 'both' runs magnetar then pulsar-lite and prints ratios",
    )
    ap.add_argument(
        "--interleave",
        action="store_true",
        help="with --target both: keep both brokers up and alternate them per scenario (less drift)",
    )
    ap.add_argument("--service-url", help="benchmark an already-running broker instead of starting one")
    ap.add_argument("--broker-pid", type=int, help="with --service-url: PID whose CPU time to account")
    ap.add_argument(
        "--scenarios",
        default="",
        help="comma list of groups (publish,batched,consume,fanout,latency) or scenario names",
    )
    ap.add_argument("--quick", action="store_true", help="short smoke run (~20 s per target)")
    ap.add_argument("--duration", type=float, help="seconds per publish scenario (default 8, quick 2)")
    ap.add_argument("--producers", type=int, help="producer processes for throughput scenarios (default 2)")
    ap.add_argument("--sizes", help="payload sizes in bytes for publish scenarios (default 100,1024)")
    ap.add_argument("--backlog", type=int, help="messages pre-filled for consume (default 200000; batched: 5x)")
    ap.add_argument("--fanout-subscriptions", type=int, help="subscriptions of the fan-out scenarios (default 4)")
    ap.add_argument(
        "--fanout-messages", type=int, help="messages published per fan-out scenario (default 200000; batched: 5x)"
    )
    ap.add_argument("--rates", help="latency scenario rates in msg/s (default 2000,20000)")
    ap.add_argument("--latency-duration", type=float, help="seconds per latency scenario (default 10)")
    ap.add_argument("--max-pending", type=int, help="outstanding msgs per non-batched producer (default 1000)")
    ap.add_argument("--namespace", default="public/default", help="tenant/namespace for bench topics")
    ap.add_argument("--json", metavar="FILE", help="write machine-readable results here")
    ap.add_argument("--workdir", help="where brokers keep data/logs (default: a temp dir, removed at the end)")
    ap.add_argument("--keep", action="store_true", help="keep the work dir (data and broker logs)")
    ap.add_argument("--pulsar-lite-bin", help="path of the pulsar-lite binary (default: from the package)")
    ap.add_argument("--magnetar-cmd", help="command starting magnetar (default: 'magnetar' on PATH)")
    ap.add_argument("--magnetar-args", default="", help="extra arguments for 'magnetar standalone'")
    ap.add_argument(
        "--magnetar-no-fsync",
        action="store_true",
        help="run magnetar with journalSyncData=false (no fdatasync per group commit), for a like-for-like "
        "CPU comparison with pulsar-lite, which does not fsync; durability is then not Pulsar's",
    )
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        metavar="N",
        help="run the scenarios N times (with --interleave: N rounds of side-by-side pairs); the ratio table "
        "then gives the median of the rounds' ratios and their range",
    )
    ap.add_argument(
        "--broker-cpus",
        metavar="LIST",
        help="run the brokers on these CPUs (taskset syntax, e.g. 0) and the clients on all the others, as when "
        "clients run on other machines: on a small machine clients and broker otherwise take each other's cores",
    )
    ap.add_argument(
        "--latency-broker-cpus",
        metavar="LIST",
        help="for the latency rows only, move the broker under test onto these CPUs (taskset syntax, e.g. 0) "
        "and start that row's clients on all the others; the other rows share every CPU. A latency row then "
        "times the broker and not the clients' contention with it, as when clients run on other machines",
    )
    args = ap.parse_args(argv)
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    if args.latency_broker_cpus is not None:
        if args.broker_cpus is not None:
            ap.error("--latency-broker-cpus and --broker-cpus: pin every row, or only the latency rows")
        if args.service_url and args.broker_pid is None:
            ap.error("--latency-broker-cpus with --service-url needs --broker-pid")
        args.latency_broker_cpus = _broker_cpus(ap, "--latency-broker-cpus", args.latency_broker_cpus)
    if args.broker_cpus is not None:
        if args.service_url:
            ap.error("--broker-cpus applies to brokers this script starts, not to --service-url")
        args.broker_cpus = _broker_cpus(ap, "--broker-cpus", args.broker_cpus)
    return args


def _broker_cpus(ap: argparse.ArgumentParser, option: str, text: str) -> frozenset[int]:
    """``option``'s CPU list, which must leave the clients a CPU of this process's (else a usage error)."""
    try:
        cpus = parse_cpus(text)
    except ValueError as exc:
        ap.error(f"{option}: {exc}")
    usable = os.sched_getaffinity(0)
    if not cpus <= usable or not usable - cpus:
        ap.error(f"{option} must leave a CPU for the clients among {sorted(usable)}")
    return cpus


def build_params(args: argparse.Namespace) -> Params:
    """Params from defaults, --quick and explicit overrides (explicit wins)."""
    p = Params(namespace=args.namespace)
    if args.quick:
        p.duration, p.latency_duration, p.latency_warmup = 2.0, 3.0, 0.5
        p.backlog, p.backlog_batched = 20_000, 100_000
        p.fanout_messages, p.fanout_messages_batched = 20_000, 100_000
    if args.duration is not None:
        p.duration = args.duration
    if args.producers is not None:
        p.producers = max(1, args.producers)
    if args.sizes:
        p.sizes = [int(x) for x in args.sizes.split(",")]
    if args.backlog is not None:
        p.backlog = args.backlog
        p.backlog_batched = 5 * args.backlog
    if args.fanout_subscriptions is not None:
        p.fanout_subscriptions = max(1, args.fanout_subscriptions)
    if args.fanout_messages is not None:
        p.fanout_messages = args.fanout_messages
        p.fanout_messages_batched = 5 * args.fanout_messages
    if args.rates:
        p.rates = [int(x) for x in args.rates.split(",")]
    if args.latency_duration is not None:
        p.latency_duration = args.latency_duration
    if args.max_pending is not None:
        p.max_pending = args.max_pending
    if p.latency_size < LATENCY_HEADER.size:
        p.latency_size = LATENCY_HEADER.size
    return p


class TargetRun:
    """One broker's part of a run: start it, run scenarios into ``result``, stop it.

    ``result`` is filled in place so that an interrupted run still reports what it measured; a broker
    that fails to start or dies marks the target failed and skips its remaining scenarios. The broker's
    RSS is sampled in the background during each row (see ``benchmarks.bench.memory``).
    """

    def __init__(self, broker: Broker, params: Params, run_id: str, latency_cpus: frozenset[int] | None = None) -> None:
        self.broker = broker
        #: CPUs the broker is moved to for latency rows (``--latency-broker-cpus``), or None.
        self.latency_cpus = latency_cpus
        self.bench = Bench(broker, params, run_id)
        self.result = TargetResult(target=broker.name, service_url=broker.service_url)
        self.sampler_interval = SAMPLE_INTERVAL
        self._rss_samples: list[int] = []  # every row's samples, for the whole-run figures

    def rss_bytes(self) -> int | None:
        """The broker process tree's VmRSS now, or None without a PID."""
        pid = self.broker.pid
        return tree_rss_bytes(pid) if pid else None

    def start(self) -> None:
        """Start the broker, check where it listens, measure its idle CPU (on the first start only)."""
        b, tr = self.broker, self.result
        if tr.error:
            return
        try:
            t0 = time.monotonic()
            print(f"[{b.name}] starting ...", flush=True)
            b.start()
            first = tr.startup_s is None
            if first:
                tr.startup_s = time.monotonic() - t0
            tr.pid, tr.version, tr.service_url = b.pid, b.version(), b.service_url
            if b.pid:
                tr.listening = listening_addresses(b.pid)
                wide = [a for a in tr.listening if not is_loopback(a)]
                if wide:
                    print(f"[{b.name}] WARNING: listening beyond loopback: {wide}", flush=True)
            if first:
                tr.idle_broker_cores = self.bench.idle_cores()
                idle = self.rss_bytes()
                tr.idle_rss_mib = idle / MIB if idle else None
        except Exception as exc:
            tr.pid, tr.error = b.pid, f"{exc}"
            print(f"[{b.name}] FAILED: {exc}", flush=True)
            b.stop()

    def run(self, name: str, runner: Callable[[Bench], ScenarioResult], rnd: int = 1) -> None:
        """Run one scenario (its ``rnd``-th time); its failure is recorded and does not stop the others."""
        b, tr = self.broker, self.result
        if tr.error:
            return
        if not b.alive():
            tr.error = f"broker died before {name}\n{b.log_tail()}"
            print(f"[{b.name}] FAILED: {tr.error}", flush=True)
            return
        print(f"[{b.name}] {name}{f' #{rnd}' if rnd > 1 else ''} ...", flush=True)
        self.bench.round = rnd
        sampler = RssSampler(self.rss_bytes, self.sampler_interval)
        sampler.start()
        apart = self.latency_cpus if name.startswith("latency-") else None
        try:
            with broker_apart(b.pid, apart):
                r = runner(self.bench)
            if apart is not None:
                r.broker_cpus = _cpu_list(apart)
                r.note += f"; broker on CPU {r.broker_cpus}, clients on the others"
        except Exception as exc:
            r = ScenarioResult(name, "?", 0, False, error=str(exc) or repr(exc))
        finally:
            samples = sampler.stop()
        r.round = rnd
        self._record_rss(r, samples)
        tr.scenarios.append(r)
        if r.error:
            print(f"[{b.name}] {name} FAILED: {r.error.strip().splitlines()[-1]}", flush=True)
        else:
            print(
                f"[{b.name}] {name}: {r.messages:,} msgs, {r.msgs_per_s:,.0f} msg/s, broker "
                f"{fmt(r.broker_us_per_msg, '.2f')} us/msg, RSS median/peak {fmt(r.rss_median_mib, '.0f')}/"
                f"{fmt(r.rss_peak_mib, '.0f')} MiB",
                flush=True,
            )

    def _record_rss(self, r: ScenarioResult, samples: list[int]) -> None:
        """Put a row's RSS figures on the row, and update the run's."""
        row = rss_summary(samples)
        if row is not None:
            r.rss_median_mib, r.rss_peak_mib = row
            r.rss_samples = len(samples)
        self._rss_samples += samples
        run = rss_summary(self._rss_samples)
        if run is not None:
            tr = self.result
            tr.rss_median_mib, tr.rss_peak_mib = run
            tr.rss_samples = len(self._rss_samples)

    def stop(self) -> None:
        """Stop the broker (idempotent)."""
        self.broker.stop()


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; returns a process exit code."""
    args = parse_args(argv)
    params = build_params(args)
    plan = scenario_plan(params, [s.strip() for s in args.scenarios.split(",") if s.strip()])
    given = sys.argv[1:] if argv is None else argv
    command = shlex.join([sys.executable, "-m", "benchmarks.bench", *given])
    run_id = uuid.uuid4().hex[:8]

    # SIGTERM gets the same orderly shutdown as Ctrl-C.
    def on_term(_sig: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)

    cpus_line = "cpus: broker and clients share them all"
    if args.broker_cpus:
        # This process and every client worker it starts stay off the brokers' CPUs.
        os.sched_setaffinity(0, os.sched_getaffinity(0) - args.broker_cpus)
        cpus_line = f"cpus: brokers on {_cpu_list(args.broker_cpus)}, clients on {_cpu_list(os.sched_getaffinity(0))}"
    elif args.latency_broker_cpus:
        cpus_line = (
            f"cpus: latency rows with the broker on {_cpu_list(args.latency_broker_cpus)} and the clients on "
            f"{_cpu_list(os.sched_getaffinity(0) - args.latency_broker_cpus)}; the other rows share them all"
        )

    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="magnetar-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    header = [
        f"command: {command}",
        f"started: {time.strftime('%Y-%m-%d %H:%M:%S %z')}  host: {platform.node()}  cpus: {os.cpu_count()}  "
        f"loadavg: {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
        f"python {platform.python_version()}  pulsar-client {pkg_version('pulsar-client')}  workdir: {workdir}",
        cpus_line,
        f"params: {json.dumps(asdict(params))}",
        f"scenarios: {', '.join(n for n, _ in plan)}",
    ]
    print("\n".join(header), flush=True)

    brokers: list[Broker]
    if args.service_url:
        brokers = [ExternalBroker(args.service_url, args.broker_pid)]
    else:
        names = ["magnetar", "pulsar-lite"] if args.target == "both" else [args.target]
        brokers = []
        for n in names:
            managed: ManagedBroker
            if n == "magnetar":
                managed = MagnetarBroker(
                    workdir / "magnetar", args.magnetar_cmd, args.magnetar_args, not args.magnetar_no_fsync
                )
            else:
                managed = PulsarLiteBroker(workdir / "pulsar-lite", args.pulsar_lite_bin)
            managed.cpus = args.broker_cpus
            brokers.append(managed)

    runs = [TargetRun(b, params, run_id, args.latency_broker_cpus) for b in brokers]
    results = [r.result for r in runs]
    interrupted = False
    try:
        # Each round starts its brokers afresh (new data, new ports): a round is a run of its own, and a broker
        # is not left to carry one round's backlogs (or a wedged state) into the next.
        if args.interleave:
            # Both brokers up at once; each scenario runs on one, then the other, so that load from
            # outside (other sessions on the shared cores) hits both sides of a ratio alike.
            for rnd in range(1, args.repeat + 1):
                for r in runs:
                    r.start()
                for name, runner in plan:
                    for r in runs:
                        r.run(name, runner, rnd)
                for r in runs:
                    r.stop()
        else:
            for r in runs:
                for rnd in range(1, args.repeat + 1):
                    r.start()
                    for name, runner in plan:
                        r.run(name, runner, rnd)
                    r.stop()
    except KeyboardInterrupt:
        interrupted = True
        print("\ninterrupted: stopping brokers", flush=True)
    finally:
        for b in brokers:
            b.stop()
        if not args.keep and not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)

    report = {
        "command": command,
        "header": header,
        "params": asdict(params),
        "interrupted": interrupted,
        "targets": [],
        "ratios": None,
    }
    print()
    for t in results:
        checks = design_checks(t)
        print(format_table(t))
        print(format_checks(t, checks))
        print()
        report["targets"].append({**asdict(t), "design_targets": checks})
    by_name = {t.target: t for t in results}
    if "magnetar" in by_name and "pulsar-lite" in by_name:
        rows = ratios(by_name["magnetar"], by_name["pulsar-lite"])
        print(format_ratios("magnetar", "pulsar-lite", rows))
        checks = peer_checks(rows, by_name["magnetar"])
        print(format_peer_checks("magnetar", "pulsar-lite", checks))
        report["ratios"] = {"numerator": "magnetar", "denominator": "pulsar-lite", "rows": rows, "targets": checks}
    print(f"\ncommand: {command}")
    if args.broker_cpus or args.latency_broker_cpus:
        print(f"note: {cpus_line}; other load on the machine still shares them. Compare ratios within one run.")
    else:
        print("note: 2 shared, noisy cores; clients and broker compete for them. Compare ratios within one run.")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2, default=str) + "\n")
        print(f"json: {args.json}")
    failed = interrupted or any(t.error or any(r.error for r in t.scenarios) for t in results)
    return 1 if failed else 0


def _cpu_list(cpus: frozenset[int] | set[int]) -> str:
    return ",".join(map(str, sorted(cpus)))
