"""The command line: ``python -m benchmarks.scale`` (see the package docstring)."""

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
from dataclasses import asdict
from pathlib import Path
from typing import Any

import benchmarks.scale
from benchmarks.bench.brokers import Broker, MagnetarBroker, PulsarLiteBroker, pkg_version
from benchmarks.scale.plots import plot_all
from benchmarks.scale.report import markdown_table, scale_summary
from benchmarks.scale.scenarios import Scale, ScaleParams

MEASUREMENTS = ("topics", "load", "subs", "backlog")


def _ints(text: str) -> list[int]:
    return [int(x.replace("_", "")) for x in text.split(",") if x.strip()]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.scale",
        description=(benchmarks.scale.__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--target", choices=["magnetar", "pulsar-lite", "both"], default="magnetar")
    ap.add_argument("--only", default="", help=f"comma list of measurements ({','.join(MEASUREMENTS)}); default all")
    ap.add_argument("--quick", action="store_true", help="small counts (topics 1,100; 100 loads; subs 1,10)")
    ap.add_argument("--topics", type=_ints, help="topic counts (default 1,100,1000)")
    ap.add_argument("--load-topics", type=int, help="topics loaded and unloaded (default 1000)")
    ap.add_argument("--subs", type=_ints, help="subscription counts on one topic (default 1,10,100)")
    ap.add_argument("--backlog", type=_ints, help="backlog levels in messages (default 0,100000)")
    ap.add_argument("--publish-count", type=int, help="non-batched messages per measured publish (default 20000)")
    ap.add_argument("--fill-timeout", type=float, help="seconds bound on filling one backlog step (default 120)")
    ap.add_argument("--json", metavar="FILE", help="write results here")
    ap.add_argument("--plots", metavar="DIR", help="write PNG plots here")
    ap.add_argument("--workdir", help="broker data/logs (default: a temp dir, removed at the end)")
    ap.add_argument("--magnetar-cmd", help="command starting magnetar (default: 'magnetar' on PATH)")
    ap.add_argument("--magnetar-args", default="", help="extra arguments for 'magnetar standalone'")
    return ap.parse_args(argv)


def build_params(args: argparse.Namespace) -> ScaleParams:
    p = ScaleParams()
    if args.quick:
        p.topic_counts, p.load_topics, p.sub_counts = [1, 100], 100, [1, 10]
        p.backlog_levels, p.publish_count, p.settle = [0, 20_000], 5000, 1.0
    for attr, value in (
        ("topic_counts", args.topics),
        ("load_topics", args.load_topics),
        ("sub_counts", args.subs),
        ("backlog_levels", args.backlog),
        ("publish_count", args.publish_count),
        ("fill_timeout", args.fill_timeout),
    ):
        if value is not None:
            setattr(p, attr, value)
    return p


def run_target(broker: Broker, params: ScaleParams, run_id: str, only: list[str]) -> dict[str, Any]:
    """Start one broker, run the measurements, stop it; a failed measurement is recorded, not fatal."""
    out: dict[str, Any] = {"target": broker.name}

    def log(msg: str) -> None:
        print(f"[{broker.name}] {msg}", flush=True)

    log("starting ...")
    broker.start()
    out["version"] = broker.version()
    admin = f"http://127.0.0.1:{broker.http_port}" if isinstance(broker, MagnetarBroker) else None
    scale = Scale(broker, params, run_id, admin)
    try:
        out["rss_start_bytes"] = scale.rss()
        steps = {
            "topics": ("topics", scale.topics),
            "load": ("load_unload", scale.load_unload),
            "subs": ("subscriptions", scale.subscriptions),
            "backlog": ("backlog", scale.backlog),
        }
        for name in only:
            key, fn = steps[name]
            log(f"{name} ...")
            try:
                out[key] = fn(log)
            except Exception as exc:
                out.setdefault("errors", {})[key] = repr(exc)
                log(f"{name} FAILED: {exc!r}")
            if not broker.alive():
                out.setdefault("errors", {})["broker"] = broker.log_tail()
                break
    finally:
        # Closing a client holding 20,000 producers and consumers can time out: the results stand.
        try:
            scale.close()
        except Exception as exc:
            log(f"closing the client failed: {exc!r}")
        broker.stop()
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    params = build_params(args)
    only = [x.strip() for x in args.only.split(",") if x.strip()] or list(MEASUREMENTS)
    if unknown := set(only) - set(MEASUREMENTS):
        raise SystemExit(f"unknown measurement(s) {sorted(unknown)}; choose from {MEASUREMENTS}")
    given = sys.argv[1:] if argv is None else argv
    command = shlex.join(["python", "-m", "benchmarks.scale", *given])

    def on_term(_sig: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="magnetar-scale-"))
    header = (
        f"command: {command}\nstarted: {time.strftime('%Y-%m-%d %H:%M:%S %z')}  cpus: {os.cpu_count()}  "
        f"loadavg: {' '.join(f'{x:.2f}' for x in os.getloadavg())}  python {platform.python_version()}  "
        f"pulsar-client {pkg_version('pulsar-client')}\nparams: {json.dumps(asdict(params))}"
    )
    print(header, flush=True)
    names = ["magnetar", "pulsar-lite"] if args.target == "both" else [args.target]
    targets: list[dict[str, Any]] = []
    run_id = uuid.uuid4().hex[:8]
    interrupted = False
    try:
        for n in names:
            broker: Broker = (
                MagnetarBroker(workdir / n, args.magnetar_cmd, args.magnetar_args)
                if n == "magnetar"
                else PulsarLiteBroker(workdir / n, None)
            )
            try:
                targets.append(run_target(broker, params, run_id, only))
            except KeyboardInterrupt:
                raise
            except Exception as exc:
                targets.append({"target": n, "errors": {"start": repr(exc)}})
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)

    report = {"command": command, "header": header, "params": asdict(params), "targets": targets}
    for t in targets:
        print(f"\n## {t['target']} {t.get('version', '')}")
        for kind, key in (("topics", "topics"), ("subscriptions", "subscriptions"), ("backlog", "backlog")):
            if t.get(key):
                print(f"\n{markdown_table(kind, t[key])}")
        if t.get("load_unload"):
            print(f"\nload/unload: {json.dumps(t['load_unload'])}")
        t["summary"] = scale_summary(t)
        print(f"\nsummary: {json.dumps(t['summary'])}")
        for k, v in (t.get("errors") or {}).items():
            print(f"ERROR {k}: {v}")
    print(f"\ncommand: {command}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
        print(f"json: {args.json}")
    if args.plots:
        for path in plot_all(report, Path(args.plots)):
            print(f"plot: {path}")
    return 1 if interrupted or any(t.get("errors") for t in targets) else 0
