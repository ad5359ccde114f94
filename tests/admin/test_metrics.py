"""``/metrics``: Prometheus text with Pulsar's metric names and labels."""

from __future__ import annotations

import re
import time

import pulsar
import pytest

from tests.admin.rest import call
from tests.conftest import StandaloneProcess

SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (-?[0-9.eE+-]+|NaN)$")


def _parse(text: str) -> dict[str, list[tuple[str, float]]]:
    series: dict[str, list[tuple[str, float]]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = SAMPLE.match(line)
        assert m, f"not a valid exposition line: {line!r}"
        series.setdefault(m.group(1), []).append((m.group(2) or "", float(m.group(3))))
    return series


def test_metrics_expose_topic_and_subscription_series(
    standalone: StandaloneProcess, client: pulsar.Client, topic_name: str
) -> None:
    producer = client.create_producer(topic_name, batching_enabled=False)
    consumer = client.subscribe(topic_name, "metrics-sub", initial_position=pulsar.InitialPosition.Earliest)
    for i in range(7):
        producer.send(f"x{i}".encode())
    consumer.acknowledge(consumer.receive(timeout_millis=5000))
    reply = call("GET", f"{standalone.http_url}/metrics")
    assert reply.status == 200 and reply.headers["Content-Type"].startswith("text/plain")
    series = _parse(reply.body.decode())
    label = f'topic="{topic_name}"'
    ours = {name: [v for lbl, v in rows if label in lbl] for name, rows in series.items()}
    assert ours["pulsar_in_messages_total"] == [7.0]
    assert ours["pulsar_producers_count"] == [1.0] and ours["pulsar_consumers_count"] == [1.0]
    assert ours["pulsar_storage_size"][0] > 0
    backlog = [
        v for lbl, v in series["pulsar_subscription_back_log"] if label in lbl and 'subscription="metrics-sub"' in lbl
    ]
    assert backlog and backlog[0] >= 6
    assert any('namespace="public/default"' in lbl for lbl, _ in series["pulsar_topics_count"])
    assert series["process_cpu_seconds_total"][0][1] > 0 and series["process_resident_memory_bytes"][0][1] > 0


def test_event_loop_probe_metrics_only_with_the_debug_setting(
    standalone: StandaloneProcess, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """``eventLoopProbeIntervalMs`` adds loop-lag and GC-pause histograms; off by default."""
    default = _parse(call("GET", f"{standalone.http_url}/metrics").body.decode())
    assert "magnetar_event_loop_lag_seconds_count" not in default
    node = StandaloneProcess(tmp_path_factory.mktemp("loop-probe") / "data", {"eventLoopProbeIntervalMs": "5"})
    node.start()
    try:
        deadline = time.monotonic() + 10
        while True:  # the probe ticks every 5 ms: a few ticks after start
            series = _parse(call("GET", f"{node.http_url}/metrics").body.decode())
            count = series.get("magnetar_event_loop_lag_seconds_count", [("", 0.0)])[0][1]
            if count >= 3 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert count >= 3
        inf = [v for lbl, v in series["magnetar_event_loop_lag_seconds_bucket"] if 'le="+Inf"' in lbl]
        assert inf == [count]
        gens = {lbl for lbl, _ in series["magnetar_gc_pause_seconds_count"]}
        assert {f'generation="{g}"' in " ".join(gens) for g in range(3)} == {True}
    finally:
        node.stop()


def test_objects_alive_after_start_up_are_frozen_out_of_gc(standalone: StandaloneProcess) -> None:
    """A server freezes what it holds once started (gc.freeze: modules, classes, routes, settings), so
    collections under load do not walk them again; /metrics shows that and the collector's counters
    (the Python client's names)."""
    series = _parse(call("GET", f"{standalone.http_url}/metrics").body.decode())
    assert series["magnetar_gc_frozen_objects"][0][1] > 10_000
    for name in ("python_gc_collections_total", "python_gc_objects_collected_total"):
        assert sorted(lbl for lbl, _ in series[name]) == [f'{{generation="{g}"}}' for g in range(3)]
    assert sum(v for _, v in series["python_gc_collections_total"]) >= 1  # startup's own gc.collect()
