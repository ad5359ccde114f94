"""``benchmarks.bench`` latency scenario: end-to-end latency from the actual and from the scheduled send time,
and the producer's publish latency (send -> receipt)."""

from __future__ import annotations

from benchmarks.bench.brokers import ExternalBroker
from benchmarks.bench.results import Params
from benchmarks.bench.scenarios import Bench
from tests.conftest import StandaloneProcess


def test_latency_is_measured_from_the_send_and_from_the_schedule(standalone: StandaloneProcess) -> None:
    params = Params(latency_duration=1.5, latency_warmup=0.2, rates=[400], receiver_queue=1000)
    bench = Bench(ExternalBroker(standalone.service_url, None), params, "t-latency")
    res = bench.latency("latency-400", 400)
    assert res.error is None and res.errors == 0
    sent, sched = res.latency_ms, res.latency_from_schedule_ms
    assert sent is not None and sched is not None
    assert sent["samples"] == sched["samples"] >= 400
    # A message is never sent before its scheduled time: measured from the schedule it is no faster.
    assert sched["p50"] >= sent["p50"] and sched["max"] >= sent["max"]
    assert "from the scheduled send time p50/p99" in res.note
    # Publish latency (send -> receipt) at the producer, one sample per acknowledged send after the warm-up.
    publish = res.publish_latency_ms
    assert publish is not None and publish["samples"] == res.messages - 80
    assert 0 < publish["p50"] <= publish["p99"] <= publish["max"] < 5_000
    assert "publish (send -> receipt) p50/p99" in res.note


def test_the_non_persistent_control_row_stores_nothing(standalone: StandaloneProcess) -> None:
    """``latency-np-<rate>``: the same clients on a non-persistent topic (the floor the clients and the machine set)."""
    import urllib.request

    from benchmarks.bench.scenarios import scenario_plan

    params = Params(latency_duration=1.0, latency_warmup=0.2, rates=[300], receiver_queue=1000)
    assert [n for n, _ in scenario_plan(params, ["latency-np"])] == ["latency-np-300"]
    assert "latency-np-300" not in [n for n, _ in scenario_plan(params, [])]  # only when asked for
    bench = Bench(ExternalBroker(standalone.service_url, None), params, "t-latency-np")
    res = bench.latency("latency-np-300", 300, "non-persistent")
    assert res.error is None and res.errors == 0 and res.latency_ms is not None
    assert res.latency_ms["samples"] >= 200
    url = f"{standalone.http_url}/admin/v2/non-persistent/public/default/bench-latency-np-300-t-latency-np/stats"
    with urllib.request.urlopen(url, timeout=10) as r:
        assert b'"msgInCounter"' in r.read()  # the row really went to a non-persistent topic
