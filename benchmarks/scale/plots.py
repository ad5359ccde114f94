"""PNG plots of scale results (matplotlib, Agg backend).

python -m benchmarks.scale.plots RESULTS.json OUT_DIR    # redraw from a --json file
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

MIB = 2**20


Series = list[tuple[str, list, list]]


def _series(targets: list[dict[str, Any]], kind: str, x: str, y: str, scale: float = 1.0) -> Series:
    out = []
    for t in targets:
        pts = [p for p in t.get(kind) or [] if p.get(x) is not None and p.get(y) is not None]
        if pts:
            out.append((t["target"], [p[x] for p in pts], [p[y] / scale for p in pts]))
    return out


def plot_all(report: dict[str, Any], outdir: Path) -> list[Path]:
    """Draw every plot the results allow into ``outdir``; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    outdir.mkdir(parents=True, exist_ok=True)
    targets = report["targets"]
    written: list[Path] = []

    def axis(ax: Any, series: Series, xlabel: str, ylabel: str, logx: bool) -> None:
        for name, xs, ys in series:
            ax.plot(xs, ys, marker="o", label=name)
        if logx:
            ax.set_xscale("symlog", linthresh=1)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend()

    def save(fig: Any, name: str, title: str) -> None:
        fig.suptitle(title, fontsize=10)
        fig.tight_layout()
        path = outdir / name
        fig.savefig(path, dpi=80)
        plt.close(fig)
        written.append(path)

    plans = [
        ("scale-rss-topics.png", "Broker RSS vs idle topics (1 producer + 1 subscription each)", "topics", [
            ("topics", "rss_bytes", MIB, "RSS MiB"),
            ("topics", "rss_per_topic_kib", 1.0, "KiB per topic (RSS growth / topics)")]),
        ("scale-cpu-topics.png", "Broker CPU per non-batched 100 B publish to one of N topics", "topics", [
            ("topics", "us_per_msg", 1.0, "broker us / msg")]),
        ("scale-cpu-subscriptions.png", "Broker CPU per published message, delivered to every subscription",
         "subscriptions", [("subscriptions", "us_per_msg", 1.0, "broker us / published msg")]),
        ("scale-backlog.png", "Publish cost and RSS as one subscription's backlog grows", "backlog", [
            ("backlog", "us_per_msg", 1.0, "broker us / msg"), ("backlog", "rss_bytes", MIB, "RSS MiB")]),
    ]  # fmt: skip
    for name, title, kind, panels in plans:
        data = [(_series(targets, kind, x, y, scale), x, label) for x, y, scale, label in panels]
        if not any(s for s, _, _ in data):
            continue
        fig, axes = plt.subplots(1, len(data), figsize=(5 * len(data), 3.6), squeeze=False)
        for ax, (series, x, label) in zip(axes[0], data, strict=True):
            if label.startswith("KiB per topic"):
                ax.axhline(10, color="grey", linestyle="--", label="issue 19 target")
            axis(ax, series, x, label, logx=True)
        save(fig, name, title)
    return written


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print(__doc__)
        return 2
    for path in plot_all(json.loads(Path(args[0]).read_text()), Path(args[1])):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
