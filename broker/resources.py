"""Cluster, tenant, namespace and partitioned-topic records in the metadata store (Pulsar's paths and JSON)."""

from __future__ import annotations

import json
from typing import Any

from magnetar.broker.topic_name import TopicName
from magnetar.metadata.api import NOT_EXISTS, BadVersionError, MetadataStore

CLUSTERS = "/admin/clusters"
POLICIES = "/admin/policies"
PARTITIONED_TOPICS = "/admin/partitioned-topics"
MANAGED_LEDGERS = "/managed-ledgers"


def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()


class Resources:
    """Typed access to the admin records the broker needs."""

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

    # clusters
    async def get_cluster(self, name: str) -> dict[str, Any] | None:
        return await self._get_json(f"{CLUSTERS}/{name}")

    async def create_cluster(self, name: str, data: dict[str, Any]) -> bool:
        return await self._create_json(f"{CLUSTERS}/{name}", data)

    # tenants
    async def get_tenant(self, tenant: str) -> dict[str, Any] | None:
        return await self._get_json(f"{POLICIES}/{tenant}")

    async def create_tenant(self, tenant: str, info: dict[str, Any]) -> bool:
        return await self._create_json(f"{POLICIES}/{tenant}", info)

    # namespaces
    async def get_policies(self, namespace: str) -> dict[str, Any] | None:
        return await self._get_json(f"{POLICIES}/{namespace}")

    async def create_namespace(self, namespace: str, policies: dict[str, Any]) -> bool:
        return await self._create_json(f"{POLICIES}/{namespace}", policies)

    async def namespace_exists(self, namespace: str) -> bool:
        return await self.store.exists(f"{POLICIES}/{namespace}")

    # topics
    async def get_partitions(self, topic: TopicName) -> int:
        """Partition count of a partitioned topic, 0 if it is not one."""
        data = await self._get_json(self._partitioned_path(topic))
        return int(data["partitions"]) if data else 0

    async def create_partitioned_topic(self, topic: TopicName, partitions: int) -> bool:
        return await self._create_json(self._partitioned_path(topic), {"partitions": partitions})

    async def list_partitioned_topics(self, namespace: str, domain: str) -> list[str]:
        names = await self.store.get_children(f"{PARTITIONED_TOPICS}/{namespace}/{domain}")
        return [f"{domain}://{namespace}/{_decode(n)}" for n in names]

    async def list_persistent_topics(self, namespace: str) -> list[str]:
        """Stored (managed-ledger backed) topics of ``namespace``, as full names."""
        names = await self.store.get_children(f"{MANAGED_LEDGERS}/{namespace}/persistent")
        return [f"persistent://{namespace}/{_decode(n)}" for n in names]

    async def topic_stored(self, topic: TopicName) -> bool:
        return await self.store.exists(f"{MANAGED_LEDGERS}/{topic.persistence_name}")

    @staticmethod
    def _partitioned_path(topic: TopicName) -> str:
        return f"{PARTITIONED_TOPICS}/{topic.namespace}/{topic.domain}/{topic.persistence_name.rsplit('/', 1)[1]}"


def _decode(name: str) -> str:
    from urllib.parse import unquote

    return unquote(name)


def default_policies(cluster: str) -> dict[str, Any]:
    """A new namespace's policies (the subset of Pulsar's ``Policies`` JSON the broker reads)."""
    return {
        "replication_clusters": [cluster],
        "bundles": {"boundaries": ["0x00000000", "0xffffffff"], "numBundles": 1},
        "backlog_quota_map": {},
        "deleted": False,
    }


async def initialize_standalone(resources: Resources, cluster: str, service_url: str, web_url: str) -> None:
    """First start: cluster ``standalone``, tenant ``public``, namespace ``public/default`` (idempotent)."""
    await resources.create_cluster(cluster, {"serviceUrl": web_url, "brokerServiceUrl": service_url})
    await resources.create_tenant("public", {"adminRoles": [], "allowedClusters": [cluster]})
    await resources.create_namespace("public/default", default_policies(cluster))
