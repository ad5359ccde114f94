"""The policy store: cached, watch-invalidated reads and compare-and-swap updates of the policy
documents in the metadata store.

Namespace policies live at ``/admin/policies/<tenant>/<ns>`` (Pulsar's path and ``Policies``
JSON); topic policies at ``/admin/topic-policies/<tenant>/<ns>/<domain>/<encoded topic>`` with
Pulsar's ``TopicPolicies`` field names. Partitions share their partitioned topic's policies.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import unquote

from pydantic import BaseModel

from magnetar.broker.config import BrokerConfig
from magnetar.broker.errors import ConcurrentModificationError, NamespaceNotFoundError
from magnetar.broker.policies.documents import Policies, TopicPolicies, parse_stored
from magnetar.broker.policies.resolution import EffectivePolicies, resolve
from magnetar.broker.topic_name import TopicName
from magnetar.metadata.api import NOT_EXISTS, BadVersionError, MetadataStore, NotFoundError, Notification

log = logging.getLogger(__name__)
_M = TypeVar("_M", bound=BaseModel)

POLICIES_ROOT = "/admin/policies"
TOPIC_POLICIES_ROOT = "/admin/topic-policies"


def namespace_path(ns: str) -> str:
    return f"{POLICIES_ROOT}/{ns}"


def topic_policies_path(topic: TopicName) -> str:
    """Where a topic's policies live; partitions map to their partitioned topic."""
    return f"{TOPIC_POLICIES_ROOT}/{topic.partitioned_base.persistence_name}"


class _Cache:
    """A bounded LRU of parsed documents with an epoch that makes invalidation race-free: a value read
    before an invalidation is never stored after it."""

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self.values: OrderedDict[str, Any] = OrderedDict()
        self.epoch = 0

    def get(self, key: str) -> tuple[bool, Any]:
        if key in self.values:
            self.values.move_to_end(key)
            return True, self.values[key]
        return False, None

    def put(self, key: str, value: Any, epoch: int) -> None:
        if epoch != self.epoch:
            return
        self.values[key] = value
        self.values.move_to_end(key)
        while len(self.values) > self.max_entries:
            self.values.popitem(last=False)

    def invalidate(self, key: str) -> None:
        self.epoch += 1
        self.values.pop(key, None)

    def clear(self) -> None:
        self.epoch += 1
        self.values.clear()


class PolicyStore:
    """Cached, watch-invalidated access to namespace and topic policies, and their effective values.

    Safe to share across coroutines of one event loop; every method is non-blocking.
    """

    #: CAS attempts before an update gives up with 409 (Pulsar's "Concurrent modification").
    MAX_CAS_ATTEMPTS = 50

    def __init__(self, store: MetadataStore, config: BrokerConfig, *, max_cached: int = 65_536) -> None:
        self.store = store
        self.config = config
        self._namespaces = _Cache(max_cached)
        self._topics = _Cache(max_cached)
        self._listeners: list[Callable[[str], None]] = []
        self._unwatch = [
            store.watch(POLICIES_ROOT + "/", self._on_namespace_change),
            store.watch(TOPIC_POLICIES_ROOT + "/", self._on_topic_change),
        ]

    def close(self) -> None:
        """Stop watching the store (listeners are no longer called)."""
        for unwatch in self._unwatch:
            unwatch()
        self._unwatch.clear()

    # -- listeners
    def add_listener(self, callback: Callable[[str], None]) -> None:
        """Call ``callback(name)`` when a namespace's (``tenant/ns``) or a topic's (full name, of the
        partitioned topic for partitions) policies change, on this broker or any other."""
        self._listeners.append(callback)

    def _notify(self, name: str) -> None:
        for callback in list(self._listeners):
            try:
                callback(name)
            except Exception:
                log.exception("policy listener failed for %s", name)

    def _on_namespace_change(self, note: Notification) -> None:
        parts = note.path[len(POLICIES_ROOT) + 1 :].split("/")
        if len(parts) != 2:
            return  # a tenant record
        ns = "/".join(parts)
        self._namespaces.invalidate(ns)
        self._notify(ns)

    def _on_topic_change(self, note: Notification) -> None:
        parts = note.path[len(TOPIC_POLICIES_ROOT) + 1 :].split("/")
        if len(parts) != 4:
            return
        tenant, ns, domain, encoded = parts
        name = f"{domain}://{tenant}/{ns}/{unquote(encoded)}"
        self._topics.invalidate(name)
        self._notify(name)

    # -- namespaces
    async def namespace(self, ns: str) -> Policies | None:
        """The namespace's policies (a private copy), ``None`` if it does not exist."""
        value = await self._cached_namespace(ns)
        return None if value is None else value.model_copy(deep=True)

    async def namespace_view(self, ns: str) -> Policies | None:
        """The namespace's policies as cached, shared and not copied (for hot read-only checks such as
        authorization): callers must not mutate it. ``None`` if the namespace does not exist."""
        return await self._cached_namespace(ns)

    async def _cached(self, cache: _Cache, key: str, path: str, model: type[_M]) -> _M | None:
        # The shared cached object: callers must not mutate it.
        hit, value = cache.get(key)
        if not hit:
            epoch = cache.epoch
            stored = await self.store.get(path)
            value = None if stored is None else parse_stored(model, json.loads(stored.data))
            cache.put(key, value, epoch)
        return value

    async def _cached_namespace(self, ns: str) -> Policies | None:
        return await self._cached(self._namespaces, ns, namespace_path(ns), Policies)

    async def update_namespace(self, ns: str, mutate: Callable[[Policies], object]) -> Policies:
        """Apply ``mutate`` to the stored policies with compare-and-swap, retrying on conflicts.

        ``mutate`` may raise to abort; :class:`NamespaceNotFoundError` if the namespace does not exist,
        :class:`ConcurrentModificationError` after :attr:`MAX_CAS_ATTEMPTS` lost races.
        """
        path = namespace_path(ns)
        for _ in range(self.MAX_CAS_ATTEMPTS):
            stored = await self.store.get(path)
            if stored is None:
                raise NamespaceNotFoundError("Namespace does not exist")
            policies = parse_stored(Policies, json.loads(stored.data))
            mutate(policies)
            try:
                await self.store.put(path, _dumps(policies.to_json()), stored.stat.version)
            except BadVersionError:
                continue
            self._namespaces.invalidate(ns)
            return policies.model_copy(deep=True)
        raise ConcurrentModificationError("Concurrent modification")

    # -- topics
    async def topic(self, topic: TopicName) -> TopicPolicies | None:
        """The topic's own overrides (a private copy), ``None`` if it has none."""
        value = await self._cached_topic(topic)
        return None if value is None else value.model_copy(deep=True)

    async def _cached_topic(self, topic: TopicName) -> TopicPolicies | None:
        return await self._cached(self._topics, str(topic.partitioned_base), topic_policies_path(topic), TopicPolicies)

    async def update_topic(self, topic: TopicName, mutate: Callable[[TopicPolicies], object]) -> TopicPolicies:
        """Apply ``mutate`` to the topic's overrides (created if absent) with compare-and-swap; a document
        left without any override is removed."""
        path = topic_policies_path(topic)
        for _ in range(self.MAX_CAS_ATTEMPTS):
            stored = await self.store.get(path)
            policies = TopicPolicies() if stored is None else parse_stored(TopicPolicies, json.loads(stored.data))
            mutate(policies)
            try:
                if policies.is_empty():
                    if stored is not None:
                        await self.store.delete(path, stored.stat.version)
                else:
                    expected = NOT_EXISTS if stored is None else stored.stat.version
                    await self.store.put(path, _dumps(policies.to_json()), expected)
            except (BadVersionError, NotFoundError):
                continue
            self._topics.invalidate(str(topic.partitioned_base))
            return policies.model_copy(deep=True)
        raise ConcurrentModificationError("Concurrent modification")

    async def delete_topic_policies(self, topic: TopicName) -> None:
        """Forget a topic's overrides (e.g. when the topic is deleted)."""
        with contextlib.suppress(NotFoundError):
            await self.store.delete(topic_policies_path(topic))
        self._topics.invalidate(str(topic.partitioned_base))

    async def delete_namespace_topic_policies(self, ns: str) -> None:
        """Forget the overrides of every topic of a namespace."""
        await self.store.delete_recursive(f"{TOPIC_POLICIES_ROOT}/{ns}")
        self._topics.clear()

    # -- effective values
    async def effective(self, topic: TopicName) -> EffectivePolicies:
        """Everything the broker enforces for ``topic``, resolved topic > namespace > configuration."""
        ns, tp = await asyncio.gather(self._cached_namespace(topic.namespace), self._cached_topic(topic))
        return resolve(self.config, ns, tp)


def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()
