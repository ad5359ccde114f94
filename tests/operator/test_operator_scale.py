"""Scale: 200 Topics in 4 namespaces against a real ``magnetar standalone`` (the 5,000-Topic figures come
from ``python -m benchmarks.operator_scale``, see docs/operator.md): admin calls per resource stay O(1) (a
drift pass does not list a namespace per topic) and start-up respects the reconcile limiter."""

from __future__ import annotations

from benchmarks.operator_scale import measure
from tests.conftest import StandaloneProcess


async def test_admin_calls_per_topic_stay_constant(standalone: StandaloneProcess) -> None:
    results = await measure(standalone.http_url, topics=200, namespaces=4, concurrency=4, rate=0, tenant="scale200")
    startup, drift = results["start-up"], results["drift"]
    # create: list (shared), partitions, create, policy read + write
    assert startup["admin_calls_per_resource"] <= 4.1, results
    assert startup["namespace_lists"] <= 4, results
    assert startup["peak_calls_in_flight"] <= 4, results
    # drift: partitions and one policy read per topic; namespace lists shared (none within the cache period)
    assert drift["admin_calls_per_resource"] <= 2.05, results
    assert drift["namespace_lists"] <= 4, results
