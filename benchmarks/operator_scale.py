"""Operator reconcile throughput and admin calls per resource with thousands of Topics, against a real
``magnetar standalone`` on loopback (the reconciliation engine with an in-memory Kubernetes side: what is
measured is the operator's load on the broker, not kopf's watch handling).

    python -m benchmarks.operator_scale [--topics 5000] [--namespaces 10] [--concurrency 8] [--rate 200]

Phase ``start-up``: every Topic reconciled at once (as kopf resumes all resources on start), throttled by the
engine's limiter; phase ``drift``: one timed pass over every Topic (nothing to change). Prints resources/s,
admin calls per resource, namespace list calls per pass and the peak of admin calls in flight.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from magnetar.operator import reconcile as rc
from magnetar.operator.admin import AdminClient
from magnetar.operator.clusteraccess import ClusterAccess
from magnetar.operator.config import OperatorConfig
from magnetar.operator.engine import Engine, Resource, make_claim
from magnetar.operator.specs import RetentionPolicySpec


class CountingAdmin(AdminClient):
    """Counts admin calls, namespace list calls and the peak of calls in flight."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.lists = 0
        self.in_flight = 0
        self.peak = 0

    async def request(self, *args: Any, **kwargs: Any) -> Any:
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            return await super().request(*args, **kwargs)
        finally:
            self.in_flight -= 1

    async def list_topics(self, namespace: str, persistent: bool = True) -> list[str]:
        self.lists += 1
        return await super().list_topics(namespace, persistent)


class IndexedEnv:
    """The engine's Environment over a prebuilt claim index (dict lookups, as kopf's indexes are)."""

    def __init__(self, config: OperatorConfig, client: CountingAdmin) -> None:
        self.config = config
        self.client = client
        self.index: dict[tuple[str, ...], list[rc.Claim]] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    def add(self, res: Resource) -> None:
        body = {"metadata": {"namespace": res.namespace, "name": res.name, "uid": res.uid,
                             "creationTimestamp": res.created}, "spec": res.spec}  # fmt: skip
        made = make_claim(res.kind, body, self.config)
        assert made is not None
        for key in made[1].values():
            self.index.setdefault(key, []).append(made[0])

    def claims(self, key: tuple[str, ...]) -> list[rc.Claim]:
        return self.index.get(key, [])

    def retention_policy(self, namespace: str, name: str) -> RetentionPolicySpec | None:
        return None

    def cluster_ready(self, namespace: str, name: str) -> bool | None:
        return True  # the standalone stands in for a Ready MagnetarCluster

    def cluster_access(self, namespace: str, name: str) -> ClusterAccess | None:
        return ClusterAccess(ready=True)  # plaintext, no authentication

    async def secret_value(self, namespace: str, name: str, key: str) -> str | None:
        return None

    def event(self, resource: Resource, type_: str, reason: str, message: str) -> None:
        pass

    def admin(self, url: str, token: str | None, ca: str | None = None) -> AdminClient:
        return self.client

    def lock(self, uid: str) -> asyncio.Lock:
        return self._locks.setdefault(uid, asyncio.Lock())


async def measure(admin_url: str, topics: int, namespaces: int, concurrency: int, rate: float,
                  tenant: str = "scale") -> dict[str, dict[str, float]]:  # fmt: skip
    """Reconcile ``topics`` Topics spread over ``namespaces`` namespaces twice (start-up, drift pass)."""
    config = OperatorConfig(cluster_url_template=admin_url, max_concurrent_reconciles=concurrency,
                            reconciles_per_second=rate)  # fmt: skip
    client = CountingAdmin(admin_url)
    env = IndexedEnv(config, client)
    engine = Engine(env)
    target = {"clusterRef": {"name": "bench"}}
    setup = [Resource("Tenant", "default", tenant, uid="t", spec=target)]
    setup += [Resource("TopicNamespace", "default", f"ns{i}", uid=f"n{i}",
                       spec={"tenant": tenant, "name": f"ns{i}", **target}) for i in range(namespaces)]  # fmt: skip
    resources = [
        Resource("Topic", "default", f"t{i}", uid=f"u{i}",
                 spec={"namespace": f"{tenant}/ns{i % namespaces}", "policies": {"maxConsumers": 5}, **target})
        for i in range(topics)
    ]  # fmt: skip
    for res in setup + resources:
        env.add(res)
    for res in setup:
        outcome = await engine.reconcile(res)
        assert outcome.ready, outcome.message
    results: dict[str, dict[str, float]] = {}
    try:
        for phase in ("start-up", "drift"):
            client.calls = client.lists = client.peak = 0
            start = time.monotonic()
            outcomes = await asyncio.gather(*(engine.reconcile(r, "change" if phase == "start-up" else "timer")
                                              for r in resources))  # fmt: skip
            elapsed = time.monotonic() - start
            not_ready = [o for o in outcomes if not o.ready]
            assert not not_ready, f"{len(not_ready)} not ready, e.g. {not_ready[0].reason}: {not_ready[0].message}"
            results[phase] = {
                "seconds": round(elapsed, 2),
                "resources_per_second": round(topics / elapsed, 1),
                "admin_calls_per_resource": round(client.calls / topics, 2),
                "namespace_lists": client.lists,
                "peak_calls_in_flight": client.peak,
            }
    finally:
        await client.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--topics", type=int, default=5000)
    parser.add_argument("--namespaces", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rate", type=float, default=200.0, help="reconciles started per second (0: no limit)")
    parser.add_argument("--admin-url", help="an existing broker's admin URL (default: start a standalone)")
    args = parser.parse_args()
    if args.admin_url:
        results = asyncio.run(measure(args.admin_url, args.topics, args.namespaces, args.concurrency, args.rate))
    else:
        from tests.conftest import StandaloneProcess

        with tempfile.TemporaryDirectory() as tmp:
            broker = StandaloneProcess(Path(tmp) / "data")
            broker.start()
            try:
                results = asyncio.run(
                    measure(broker.http_url, args.topics, args.namespaces, args.concurrency, args.rate)
                )
            finally:
                broker.stop()
    for phase, numbers in results.items():
        print(phase, " ".join(f"{k}={v}" for k, v in numbers.items()))


if __name__ == "__main__":
    main()
