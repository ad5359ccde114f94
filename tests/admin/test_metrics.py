"""``/metrics``: Prometheus text with Pulsar's metric names and labels."""

from __future__ import annotations

import re

import pulsar

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
