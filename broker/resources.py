"""Cluster, tenant, namespace and partitioned-topic records in the metadata store (Pulsar's paths and JSON).

Paths: ``/admin/clusters/<cluster>`` (``ClusterData``), ``/admin/policies/<tenant>`` (``TenantInfo``),
``/admin/policies/<tenant>/<ns>`` (``Policies``), ``/admin/partitioned-topics/<tenant>/<ns>/<domain>/<topic>``,
``/managed-ledgers/<tenant>/<ns>/persistent/<topic>`` (one per stored topic).
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import unquote

from magnetar.broker.policies import TOPIC_POLICIES_ROOT, Policies, default_namespace_policies
from magnetar.broker.topic_name import TopicName
from magnetar.metadata.api import NOT_EXISTS, BadVersionError, MetadataStore, NotFoundError

CLUSTERS = "/admin/clusters"
POLICIES = "/admin/policies"
PARTITIONED_TOPICS = "/admin/partitioned-topics"
MANAGED_LEDGERS = "/managed-ledgers"
SCHEMAS = "/schemas"
#: Pulsar's pseudo-cluster of global namespaces; never listed.
GLOBAL_CLUSTER = "global"


def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


class Resources:
    """Typed access to the admin records the broker and the admin API need."""

    def __init__(self, store: MetadataStore) -> None:
        self.store = store

    async def _get_json(self, path: str) -> Any | None:
        value = await self.store.get(path)
        return None if value is None else json.loads(value.data)

    async def _create_json(self, path: str, value: Any) -> bool:
        """Create ``path`` unless it exists; returns whether it was created."""
        try:
            await self.store.put(path, _dumps(value), NOT_EXISTS)
        except BadVersionError:
            return False
        return True

    async def _replace_json(self, path: str, value: Any) -> bool:
        """Overwrite an existing ``path``; returns False if it does not exist."""
        for _ in range(20):
            current = await self.store.get(path)
            if current is None:
                return False
            try:
                await self.store.put(path, _dumps(value), current.stat.version)
            except BadVersionError:
                continue
            return True
        raise BadVersionError(f"{path} keeps changing")

    async def _delete(self, path: str) -> bool:
        try:
            await self.store.delete(path)
        except NotFoundError:
            return False
        return True

    async def _children_with_data(self, path: str) -> list[str]:
        # Placeholders (parents of deeper keys) are listed by get_children; skip them.
        names = await self.store.get_children(path)
        return [n for n in names if await self.store.exists(f"{path}/{n}")]

    # ------------------------------------------------------------------ clusters
    async def list_clusters(self) -> list[str]:
        return [c for c in await self._children_with_data(CLUSTERS) if c != GLOBAL_CLUSTER]

    async def get_cluster(self, name: str) -> dict[str, Any] | None:
        return await self._get_json(f"{CLUSTERS}/{name}")

    async def create_cluster(self, name: str, data: dict[str, Any]) -> bool:
        return await self._create_json(f"{CLUSTERS}/{name}", data)

    async def update_cluster(self, name: str, data: dict[str, Any]) -> bool:
        return await self._replace_json(f"{CLUSTERS}/{name}", data)

    async def delete_cluster(self, name: str) -> bool:
        return await self._delete(f"{CLUSTERS}/{name}")

    # ------------------------------------------------------------------ tenants
    async def list_tenants(self) -> list[str]:
        return await self._children_with_data(POLICIES)

    async def get_tenant(self, tenant: str) -> dict[str, Any] | None:
        return await self._get_json(f"{POLICIES}/{tenant}")

    async def create_tenant(self, tenant: str, info: dict[str, Any]) -> bool:
        return await self._create_json(f"{POLICIES}/{tenant}", info)

    async def update_tenant(self, tenant: str, info: dict[str, Any]) -> bool:
        return await self._replace_json(f"{POLICIES}/{tenant}", info)

    async def delete_tenant(self, tenant: str) -> None:
        """Remove the tenant record and whatever is left of its namespaces' data."""
        for root in (PARTITIONED_TOPICS, MANAGED_LEDGERS, TOPIC_POLICIES_ROOT, SCHEMAS):
            await self.store.delete_recursive(f"{root}/{tenant}")
        await self.store.delete_recursive(f"{POLICIES}/{tenant}")

    # ------------------------------------------------------------------ namespaces
    async def list_namespaces(self, tenant: str) -> list[str]:
        """Namespaces of ``tenant`` as ``tenant/ns``."""
        return [f"{tenant}/{n}" for n in await self._children_with_data(f"{POLICIES}/{tenant}")]

    async def get_policies(self, namespace: str) -> dict[str, Any] | None:
        return await self._get_json(f"{POLICIES}/{namespace}")

    async def create_namespace(self, namespace: str, policies: dict[str, Any] | Policies) -> bool:
        """Create the namespace with Pulsar-shaped ``Policies`` JSON; False if it exists."""
        if isinstance(policies, Policies):
            policies = policies.to_json()
        return await self._create_json(f"{POLICIES}/{namespace}", policies)

    async def namespace_exists(self, namespace: str) -> bool:
        return await self.store.exists(f"{POLICIES}/{namespace}")

    async def delete_namespace(self, namespace: str) -> None:
        """Remove the namespace's policies and every record left under it (topics must be gone)."""
        for root in (PARTITIONED_TOPICS, MANAGED_LEDGERS, TOPIC_POLICIES_ROOT, SCHEMAS):
            await self.store.delete_recursive(f"{root}/{namespace}")
        await self.store.delete_recursive(f"{POLICIES}/{namespace}")

    # ------------------------------------------------------------------ topics
    async def get_partitions(self, topic: TopicName) -> int:
        """Partition count of a partitioned topic, 0 if it is not one."""
        data = await self._get_json(self._partitioned_path(topic))
        return int(data["partitions"]) if data else 0

    async def create_partitioned_topic(self, topic: TopicName, partitions: int) -> bool:
        return await self._create_json(self._partitioned_path(topic), {"partitions": partitions})

    async def list_partitioned_topics(self, namespace: str, domain: str) -> list[str]:
        names = await self.store.get_children(f"{PARTITIONED_TOPICS}/{namespace}/{domain}")
        return [f"{domain}://{namespace}/{unquote(n)}" for n in names]

    async def list_persistent_topics(self, namespace: str) -> list[str]:
        """Stored (managed-ledger backed) topics of ``namespace``, as full names."""
        names = await self.store.get_children(f"{MANAGED_LEDGERS}/{namespace}/persistent")
        return [f"persistent://{namespace}/{unquote(n)}" for n in names]

    async def topic_stored(self, topic: TopicName) -> bool:
        return await self.store.exists(f"{MANAGED_LEDGERS}/{topic.persistence_name}")

    @staticmethod
    def _partitioned_path(topic: TopicName) -> str:
        return f"{PARTITIONED_TOPICS}/{topic.namespace}/{topic.domain}/{topic.persistence_name.rsplit('/', 1)[1]}"


def default_policies(cluster: str) -> dict[str, Any]:
    """A new namespace's ``Policies`` JSON, replicated to ``cluster``."""
    return default_namespace_policies(cluster).to_json()


async def initialize_standalone(
    resources: Resources, cluster: str, service_url: str, web_url: str, service_url_tls: str = "", web_url_tls: str = ""
) -> None:
    """First start: cluster ``standalone``, tenant ``public``, namespace ``public/default`` (idempotent).
    The cluster's URLs are those of the listeners that are on (TLS ones only when TLS is)."""
    urls = {
        "serviceUrl": web_url,
        "serviceUrlTls": web_url_tls,
        "brokerServiceUrl": service_url,
        "brokerServiceUrlTls": service_url_tls,
    }
    await resources.create_cluster(cluster, {k: v for k, v in urls.items() if v})
    await resources.create_tenant("public", {"adminRoles": [], "allowedClusters": [cluster]})
    await resources.create_namespace("public/default", default_policies(cluster))
