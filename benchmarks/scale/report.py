"""Plain-text tables of scale results (pure functions of the result dicts)."""

from __future__ import annotations

from typing import Any

#: (key, header, format) of the columns of each measurement's table.
COLUMNS: dict[str, list[tuple[str, str, str]]] = {
    "topics": [
        ("topics", "topics", ",d"),
        ("rss_bytes", "RSS MiB", "mib"),
        ("rss_per_topic_kib", "KiB/topic", ".1f"),
        ("anon_per_topic_kib", "anon KiB/topic", ".1f"),
        ("create_s", "create s", ".1f"),
        ("create_cpu_ms_per_topic", "create ms CPU/topic", ".2f"),
        ("idle_cores", "idle cores", ".3f"),
        ("us_per_msg", "publish us/msg", ".1f"),
        ("msgs_per_s", "msg/s", ",.0f"),
    ],
    "subscriptions": [
        ("subscriptions", "subscriptions", ",d"),
        ("messages", "published", ",d"),
        ("us_per_msg", "us/msg published", ".1f"),
        ("rss_bytes", "RSS MiB", "mib"),
    ],
    "backlog": [
        ("backlog", "backlog msgs", ",d"),
        ("rss_bytes", "RSS MiB", "mib"),
        ("us_per_msg", "publish us/msg", ".1f"),
        ("msgs_per_s", "msg/s", ",.0f"),
    ],
}


def cell(value: Any, spec: str) -> str:
    """One formatted cell; unknown values print as '-'."""
    if value is None:
        return "-"
    if spec == "mib":
        return f"{value / 2**20:.1f}"
    return format(value, spec)


def markdown_table(kind: str, rows: list[dict[str, Any]]) -> str:
    """A Markdown table of one measurement's points."""
    cols = COLUMNS[kind]
    lines = ["| " + " | ".join(h for _, h, _ in cols) + " |", "|" + "---:|" * len(cols)]
    lines += ["| " + " | ".join(cell(r.get(k), spec) for k, _, spec in cols) + " |" for r in rows]
    return "\n".join(lines)


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, or None when either is unknown or b is zero."""
    return a / b if a is not None and b else None


def scale_summary(target: dict[str, Any]) -> dict[str, Any]:
    """The issue's scale targets for one broker: KiB per topic at the largest count, publish cost vs lone."""
    pts = [p for p in target.get("topics") or [] if p.get("topics")]
    if not pts:
        return {}
    lone, big = pts[0], pts[-1]
    return {
        "topics": big["topics"],
        "rss_per_topic_kib": big.get("rss_per_topic_kib"),
        "publish_vs_lone": ratio(big.get("us_per_msg"), lone.get("us_per_msg")),
    }
