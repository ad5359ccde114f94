"""The reconciliation engine against a real ``magnetar standalone`` broker, with the Kubernetes side faked
(no kopf): dependency waits, unmanaged fields, drift, partitions, conflicts, deletion policies, errors."""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import urllib.request
from typing import Any

import pytest

from magnetar.operator import reconcile as rc
from magnetar.operator.admin import AdminClient
from magnetar.operator.clusteraccess import ClusterAccess, ssl_context
from magnetar.operator.config import OperatorConfig
from magnetar.operator.engine import Engine, Resource, make_claim
from magnetar.operator.specs import RetentionPolicySpec
from tests.conftest import StandaloneProcess

_uid = itertools.count()


class FakeEnv:
    """The engine's Environment without Kubernetes: claims and RetentionPolicies kept in dicts."""

    def __init__(self, url: str) -> None:
        self.config = OperatorConfig(cluster_url_template=url)
        self.resources: list[Resource] = []
        self.policies: dict[tuple[str, str], RetentionPolicySpec] = {}
        self.secrets: dict[tuple[str, str, str], str | Exception] = {}
        self.events: list[tuple[str, str, str]] = []
        #: MagnetarClusters by (namespace, name) -> Ready
        self.clusters: dict[tuple[str, str], bool | ClusterAccess] = {("default", "magnetar"): True}
        self._admins: dict[tuple[str, str | None], AdminClient] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    def claims(self, key: tuple[str, ...]) -> list[rc.Claim]:
        found = []
        for res in self.resources:
            body = {"metadata": {"namespace": res.namespace, "name": res.name, "uid": res.uid,
                                 "creationTimestamp": res.created,
                                 "deletionTimestamp": res.deleted_at or None}, "spec": res.spec}  # fmt: skip
            made = make_claim(res.kind, body, self.config)
            if made and key in made[1].values():
                found.append(made[0])
        return found

    def retention_policy(self, namespace: str, name: str) -> RetentionPolicySpec | None:
        return self.policies.get((namespace, name))

    async def secret_value(self, namespace: str, name: str, key: str) -> str | None:
        value = self.secrets.get((namespace, name, key))
        if isinstance(value, Exception):
            raise value
        return value

    def cluster_ready(self, namespace: str, name: str) -> bool | None:
        access = self.cluster_access(namespace, name)
        return None if access is None else access.ready

    def cluster_access(self, namespace: str, name: str) -> ClusterAccess | None:
        value = self.clusters.get((namespace, name))
        return value if isinstance(value, ClusterAccess) or value is None else ClusterAccess(ready=value)

    def event(self, resource: Resource, type_: str, reason: str, message: str) -> None:
        self.events.append((type_, reason, message))

    def admin(self, url: str, token: str | None, ca: str | None = None) -> AdminClient:
        tls = ssl_context(ca) if url.startswith("https") else None
        return self._admins.setdefault((url, token, ca), AdminClient(url, token, tls=tls))

    def lock(self, uid: str) -> asyncio.Lock:
        return self._locks.setdefault(uid, asyncio.Lock())

    async def close(self) -> None:
        for client in self._admins.values():
            await client.close()

    def add(self, kind: str, name: str, spec: dict[str, Any], created: str = "2026-01-01T00:00:00Z") -> Resource:
        res = Resource(kind, "default", name, uid=f"uid-{next(_uid)}", created=created,
                       spec={"clusterRef": {"name": "magnetar"}, **spec})  # fmt: skip
        self.resources.append(res)
        return res


@pytest.fixture
async def env(standalone: StandaloneProcess) -> Any:
    fake = FakeEnv(standalone.http_url)
    yield fake
    await fake.close()


def _admin(broker: StandaloneProcess, method: str, path: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"{broker.http_url}/admin/v2/{path}", data=data, method=method,
                                 headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(req, timeout=10) as resp:
        text = resp.read()
    return json.loads(text) if text else None


def _name(prefix: str) -> str:
    return f"{prefix}-{next(_uid)}-{id(object()) % 10000}"


async def test_tenant_created_then_roles_reverted_and_unmanaged_clusters_kept(
    env: FakeEnv, standalone: StandaloneProcess
) -> None:
    tenant = _name("ten")
    res = env.add("Tenant", tenant, {"adminRoles": ["ops"]})
    outcome = await Engine(env).reconcile(res)
    assert outcome.ready and outcome.changes == [f"created tenant {tenant}"]
    assert _admin(standalone, "GET", f"tenants/{tenant}") == {"adminRoles": ["ops"], "allowedClusters": ["standalone"]}
    _admin(standalone, "POST", f"tenants/{tenant}", {"adminRoles": ["intruder"], "allowedClusters": ["standalone"]})
    outcome = await Engine(env).reconcile(res, "timer")
    assert outcome.ready and len(outcome.changes) == 1
    assert _admin(standalone, "GET", f"tenants/{tenant}")["adminRoles"] == ["ops"]
    assert outcome.status["applied"] == {"adminRoles": ["ops"]}  # allowedClusters is not managed
    bad = env.add("Tenant", _name("ten"), {"allowedClusters": ["no-such-cluster"]})
    outcome = await Engine(env).reconcile(bad)
    assert (outcome.severity, outcome.reason) == ("permanent", rc.ADMIN_API_REJECTED)
    assert "Clusters do not exist" in outcome.message


async def test_namespace_waits_for_tenant_and_manages_only_its_fields(
    env: FakeEnv, standalone: StandaloneProcess
) -> None:
    tenant, ns = _name("ten"), "orders"
    spec = {"tenant": tenant, "name": ns, "policies": {"maxProducers": 3, "deduplication": True, "bundles": 2}}
    res = env.add("TopicNamespace", "ns", spec)
    outcome = await Engine(env).reconcile(res)
    assert (outcome.severity, outcome.reason) == ("transient", rc.TENANT_MISSING)
    assert outcome.status["pulsarName"] == f"{tenant}/{ns}"
    await Engine(env).reconcile(env.add("Tenant", tenant, {}))
    outcome = await Engine(env).reconcile(res)
    assert outcome.ready, outcome.message
    doc = _admin(standalone, "GET", f"namespaces/{tenant}/{ns}")
    assert doc["max_producers_per_topic"] == 3 and doc["deduplicationEnabled"] is True
    assert doc["bundles"]["numBundles"] == 2
    # Not managed: set behind the operator's back, stays.
    _admin(standalone, "POST", f"namespaces/{tenant}/{ns}/maxConsumersPerTopic", 42)
    # Managed: reverted.
    _admin(standalone, "POST", f"namespaces/{tenant}/{ns}/maxProducersPerTopic", 99)
    outcome = await Engine(env).reconcile(res, "timer")
    assert outcome.changes == [f"{tenant}/{ns} maxProducers: 99 -> 3"]
    doc = _admin(standalone, "GET", f"namespaces/{tenant}/{ns}")
    assert doc["max_producers_per_topic"] == 3 and doc["max_consumers_per_topic"] == 42
    # Removed from spec: no longer managed, left as it is.
    res.spec["policies"] = {"deduplication": True, "bundles": 2}
    _admin(standalone, "POST", f"namespaces/{tenant}/{ns}/maxProducersPerTopic", 7)
    outcome = await Engine(env).reconcile(res)
    assert outcome.ready and outcome.changes == [] and "maxProducers" not in outcome.status["applied"]
    assert _admin(standalone, "GET", f"namespaces/{tenant}/{ns}")["max_producers_per_topic"] == 7


async def test_topic_lifecycle_partitions_drift_and_retention_policy(
    env: FakeEnv, standalone: StandaloneProcess
) -> None:
    tenant = _name("ten")
    engine = Engine(env)
    topic_res = env.add("Topic", "events", {"namespace": f"{tenant}/ns", "partitions": 2,
                                            "retentionPolicyRef": {"name": "std"},
                                            "policies": {"maxConsumers": 5}})  # fmt: skip
    outcome = await engine.reconcile(topic_res)
    assert outcome.reason == rc.RETENTION_POLICY_MISSING
    env.policies[("default", "std")] = RetentionPolicySpec.model_validate(
        {"retention": {"timeInMinutes": 60, "sizeInMB": 10}, "messageTTLSeconds": 120}
    )
    outcome = await engine.reconcile(topic_res)
    assert (outcome.severity, outcome.reason) == ("transient", rc.NAMESPACE_MISSING)
    await engine.reconcile(env.add("Tenant", tenant, {}))
    assert (await engine.reconcile(env.add("TopicNamespace", "ns", {"tenant": tenant, "name": "ns"}))).ready
    outcome = await engine.reconcile(topic_res)
    assert outcome.ready, outcome.message
    topic = f"persistent/{tenant}/ns/events"
    assert _admin(standalone, "GET", f"{topic}/partitions") == {"partitions": 2}
    assert _admin(standalone, "GET", f"{topic}/maxConsumers") == 5
    assert _admin(standalone, "GET", f"{topic}/retention") == {"retentionTimeInMinutes": 60, "retentionSizeInMB": 10}
    assert _admin(standalone, "GET", f"{topic}/messageTTL") == 120
    # The policy changes: the next pass applies it.
    env.policies[("default", "std")] = RetentionPolicySpec.model_validate({"messageTTLSeconds": 300})
    outcome = await engine.propagate("default", "std", env.policies[("default", "std")])
    assert outcome.ready and outcome.status == {"referencedBy": 1, "appliedTo": 1}
    assert _admin(standalone, "GET", f"{topic}/messageTTL") == 300
    # Grow, then an impossible decrease: NotSupported, other policies still applied.
    topic_res.spec["partitions"] = 4
    assert (await engine.reconcile(topic_res)).ready
    assert _admin(standalone, "GET", f"{topic}/partitions") == {"partitions": 4}
    topic_res.spec["partitions"] = 3
    topic_res.spec["policies"] = {"maxConsumers": 6}
    outcome = await engine.reconcile(topic_res)
    assert (outcome.severity, outcome.reason) == ("permanent", rc.NOT_SUPPORTED)
    assert "cannot decrease" in outcome.message and outcome.status["partitions"] == 4
    assert _admin(standalone, "GET", f"{topic}/maxConsumers") == 6
    # Deleted behind the operator's back: recreated.
    topic_res.spec["partitions"] = 4
    _admin(standalone, "DELETE", f"{topic}/partitions?force=true")
    outcome = await engine.reconcile(topic_res, "timer")
    assert outcome.ready and outcome.changes[0].startswith("created topic")
    assert _admin(standalone, "GET", f"{topic}/partitions") == {"partitions": 4}
    # A non-partitioned topic cannot become partitioned.
    plain = env.add("Topic", "plain", {"namespace": f"{tenant}/ns"})
    assert (await engine.reconcile(plain)).ready
    plain.spec["partitions"] = 2
    outcome = await engine.reconcile(plain)
    assert outcome.reason == rc.NOT_SUPPORTED and "cannot change between" in outcome.message


async def test_conflicting_resources_and_deletion_policies(env: FakeEnv, standalone: StandaloneProcess) -> None:
    tenant = _name("ten")
    engine = Engine(env)
    await engine.reconcile(env.add("Tenant", tenant, {}))
    ns_res = env.add("TopicNamespace", "ns", {"tenant": tenant, "name": "ns"})
    await engine.reconcile(ns_res)
    first = env.add("Topic", "a", {"namespace": f"{tenant}/ns", "name": "shared"}, created="2026-01-01T00:00:00Z")
    second = env.add("Topic", "b", {"namespace": f"{tenant}/ns", "name": "shared"}, created="2026-01-02T00:00:00Z")
    assert (await engine.reconcile(first)).ready
    outcome = await engine.reconcile(second)
    assert (outcome.severity, outcome.reason) == ("permanent", rc.RESOURCE_CONFLICT)
    assert "Topic default/a" in outcome.message
    # Deleting the loser leaves the topic alone.
    assert (await engine.finalize(second)).ready
    env.resources.remove(second)
    topics = _admin(standalone, "GET", f"persistent/{tenant}/ns")
    assert f"persistent://{tenant}/ns/shared" in topics
    # The namespace waits for its topics' resources, in reverse dependency order.
    outcome = await engine.finalize(ns_res)
    assert (outcome.severity, outcome.reason) == ("transient", rc.DEPENDENTS_EXIST)
    assert "Topic default/a" in outcome.message
    # Retain: the resource goes, the topic stays; then the namespace is not empty.
    first.spec["deletionPolicy"] = "Retain"
    assert (await engine.finalize(first)).ready
    env.resources.remove(first)
    outcome = await engine.finalize(ns_res)
    assert outcome.reason == rc.DEPENDENTS_EXIST and "not empty" in outcome.message
    ns_res.annotations["magnetar.io/force-delete"] = "true"
    assert (await engine.finalize(ns_res)).ready
    env.resources.remove(ns_res)
    assert _admin(standalone, "GET", f"namespaces/{tenant}") == []
    # Delete of something already gone is done.
    again = await engine.finalize(ns_res)
    assert again.ready and "already gone" in again.message


async def test_unreachable_cluster_and_missing_credentials(env: FakeEnv) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    res = env.add("Tenant", _name("ten"), {})
    res.spec = {"connection": {"adminUrl": dead}}
    outcome = await Engine(env).reconcile(res)
    assert (outcome.severity, outcome.reason) == ("transient", rc.CLUSTER_UNREACHABLE)
    # Never reached Pulsar: deletion does not wait for the cluster.
    assert (await Engine(env).finalize(res)).ready
    res.status["applied"] = {}
    assert (await Engine(env).finalize(res)).reason == rc.CLUSTER_UNREACHABLE
    res.spec = {"connection": {"adminUrl": dead, "credentialsSecretRef": {"name": "token"}}}
    outcome = await Engine(env).reconcile(res)
    assert outcome.reason == rc.CREDENTIALS_MISSING and "default/token" in outcome.message


async def test_paused_resource_is_not_touched(env: FakeEnv, standalone: StandaloneProcess) -> None:
    res = env.add("Tenant", _name("ten"), {"adminRoles": ["x"]})
    res.annotations["magnetar.io/paused"] = "true"
    outcome = await Engine(env).reconcile(res)
    assert outcome.severity == "paused" and outcome.changes == []
    with pytest.raises(urllib.error.HTTPError):
        _admin(standalone, "GET", f"tenants/{res.name}")
    assert (await Engine(env).finalize(res)).ready  # paused: deletion leaves Pulsar alone


async def test_non_partitioned_topic_in_a_namespace_without_auto_creation(env: FakeEnv) -> None:
    tenant = _name("ten")
    engine = Engine(env)
    await engine.reconcile(env.add("Tenant", tenant, {}))
    ns_spec = {"tenant": tenant, "name": "ns", "policies": {"autoTopicCreation": {"allow": False}}}
    assert (await engine.reconcile(env.add("TopicNamespace", "ns", ns_spec))).ready
    outcome = await engine.reconcile(env.add("Topic", "plain", {"namespace": f"{tenant}/ns"}))
    assert outcome.ready, outcome.message


async def test_cluster_ref_waits_until_the_cluster_is_ready(env: FakeEnv, standalone: StandaloneProcess) -> None:
    tenant = _name("ten")
    res = env.add("Tenant", tenant, {"clusterRef": {"name": "later"}})
    outcome = await Engine(env).reconcile(res)
    assert (outcome.severity, outcome.reason) == ("transient", rc.CLUSTER_NOT_READY)
    assert "does not exist" in outcome.message
    env.clusters[("default", "later")] = False
    outcome = await Engine(env).reconcile(res)
    assert (outcome.reason, "is not Ready yet" in outcome.message) == (rc.CLUSTER_NOT_READY, True)
    with pytest.raises(urllib.error.HTTPError):
        _admin(standalone, "GET", f"tenants/{tenant}")
    env.clusters[("default", "later")] = True
    assert (await Engine(env).reconcile(res)).ready
    assert _admin(standalone, "GET", f"tenants/{tenant}")["adminRoles"] == []
