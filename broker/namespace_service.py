"""Several brokers on one metadata store: which broker serves a topic, lookups, hand-over.

Pulsar's ``NamespaceService`` in short. A topic belongs to a namespace bundle (broker/bundles.py);
a bundle is served by the broker holding its ownership key (broker/ownership.py), taken on the first
lookup: a broker that does not own an unowned bundle redirects the lookup to the leader
(``authoritative=false``), the leader picks the least loaded broker and redirects there
(``authoritative=true``), and that broker takes the key. A found owner is answered with ``Connect``
to the owner's URL, as Pulsar does.

Safety: every key lives with this broker's session (an etcd lease). When the lease can no longer be
proved alive (``Session.valid_until`` passed, e.g. the process was paused past the TTL), this broker
stops writing at once (:meth:`may_write`), fences its managed ledgers locally and closes their topics
without flushing anything, then joins again under a new session with no bundles. The next owner
opens each managed ledger with recovery, which fences the old writer's ledger on the bookies, and
metadata writes of a stale owner fail their compare-and-swap.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from magnetar.broker.broker_registry import BrokerInfo, BrokerRegistry
from magnetar.broker.bundles import Bundle, bundles_of, find_bundle
from magnetar.broker.errors import BrokerError
from magnetar.broker.listeners import web_address
from magnetar.broker.ownership import Owner, OwnershipCache
from magnetar.broker.policies import Policies, parse_stored
from magnetar.broker.policies.store import namespace_path
from magnetar.broker.protocol import pulsar_api_pb2 as pb
from magnetar.broker.topic_name import TopicName
from magnetar.common.tasks import TaskSet
from magnetar.metadata.api import MetadataError, Session

if TYPE_CHECKING:
    from magnetar.broker.service import BrokerService

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LookupAnswer:
    """A lookup's result: connect to ``broker_url``, or redirect (ask that broker again)."""

    redirect: bool
    broker_url: str
    broker_url_tls: str
    http_url: str
    authoritative: bool
    #: The ``https://`` web service URL of that broker ("" without HTTPS).
    http_url_tls: str = ""


@dataclass(slots=True)
class _Pending:
    """Bundles the leader assigned to a broker since its last load report."""

    count: int = 0
    since: float = field(default_factory=time.monotonic)


class NamespaceService:
    """Bundle ownership, lookups and hand-over of one cluster broker."""

    def __init__(self, service: BrokerService) -> None:
        self.service = service
        config = service.config
        self.store = service.store
        self.ttl_s = max(2.0, config.metadata_store_session_timeout_millis / 1000)
        me = BrokerInfo(
            broker_id=web_address(config),
            web_service_url=service.web_service_url,
            web_service_url_tls=service.web_service_url_tls,
            pulsar_service_url=service.broker_service_url,
            pulsar_service_url_tls=service.broker_service_url_tls,
            advertised_listeners={
                name: {"brokerServiceUrl": lst.broker_service_url or "",
                       "brokerServiceUrlTls": lst.broker_service_url_tls or ""}
                for name, lst in service.listeners.advertised.items()
            },
        )  # fmt: skip
        self.me = me
        self.registry = BrokerRegistry(
            self.store, me, self._load_counts, config.load_balancer_report_update_min_interval_millis / 1000
        )
        self.ownership = OwnershipCache(self.store, me)
        self._session: Session | None = None
        #: False from the moment the lease may have expired until this broker joined again.
        self._lease_ok = False
        #: False once shutdown began (readiness probe, lookups never pick this broker).
        self.ready = False
        self._unloading: set[Bundle] = set()
        self._pending: dict[str, _Pending] = {}
        self.tasks = TaskSet("namespace service", logger=log)
        self._rejoin_lock = asyncio.Lock()

    @property
    def broker_id(self) -> str:
        return self.me.broker_id

    # ------------------------------------------------------------------ life cycle
    async def start(self) -> None:
        self.ready = True  # before joining: the first load report must not say "draining"
        await self._join()
        self.tasks.spawn(self._watch_lease(), name="lease watchdog")
        if self.service.config.load_balancer_enabled:
            from magnetar.broker.load_manager import LoadManager

            self.load_manager: LoadManager | None = LoadManager(self)
            self.tasks.spawn(self.load_manager.run(), name="load manager")
        else:
            self.load_manager = None

    async def _join(self) -> None:
        session = await self.store.create_session(self.ttl_s)
        self._session = session
        self.ownership.set_session(session)
        await self.registry.register(session)
        self._lease_ok = True
        log.info("broker %s joined the cluster (lease %x, ttl %ss)", self.broker_id, session.id, self.ttl_s)

    def may_write(self) -> bool:
        """Whether this broker's lease is surely alive (checked per entry before persisting)."""
        session = self._session
        return self._lease_ok and session is not None and time.monotonic() < session.valid_until

    async def _watch_lease(self) -> None:
        interval = min(0.25, self.ttl_s / 8)
        while True:
            await asyncio.sleep(interval)
            if self._lease_ok and not self.may_write():
                await self._on_lease_lost()

    async def _on_lease_lost(self) -> None:
        """Stop serving everything without writing, then join again under a new session."""
        async with self._rejoin_lock:
            self._lease_ok = False
            old = self._session
            log.error("broker %s lost its lease: closing every topic without writing", self.broker_id)
            self.ownership.forget_all()
            for topic in self.service.loaded_topics():
                fence = getattr(topic.ledger, "fence", None) if hasattr(topic, "ledger") else None
                if fence is not None:
                    fence("this broker lost its ownership lease")
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self.service.unload_topic(topic), 10)
            if old is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(old.close(), 5)
            while True:
                try:
                    await self._join()
                    return
                except MetadataError as e:
                    log.warning("re-joining the cluster failed: %s", e)
                    await asyncio.sleep(1)

    async def shutdown(self) -> None:
        """Graceful shutdown: not ready, no longer leader, every bundle unloaded, registration removed."""
        self.ready = False
        self.tasks.cancel()  # the watchdog and the load manager (this may run inside neither)
        await self.registry.close()
        if self._lease_ok:
            await self.registry.resign()
            for bundle in self.ownership.owned:
                with contextlib.suppress(Exception):
                    await self.unload_bundle(bundle)
            await self.registry.unregister()
        if self._session is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._session.close(), 5)
        await self.tasks.close(grace=1)

    # ------------------------------------------------------------------ bundles
    async def bundles(self, namespace: str, *, fresh: bool = False) -> list[Bundle]:
        """The namespace's bundles, from the policy cache or (``fresh``) from the store itself."""
        if fresh:
            stored = await self.store.get(namespace_path(namespace))
            policies = parse_stored(Policies, json.loads(stored.data)) if stored is not None else None
        else:
            policies = await self.service.policies.namespace(namespace)
        boundaries = policies.bundles.boundaries if policies is not None and policies.bundles is not None else None
        return bundles_of(namespace, boundaries)

    async def bundle_of(self, topic: TopicName) -> Bundle:
        return find_bundle(await self.bundles(topic.namespace), str(topic))

    def topics_of(self, bundle: Bundle) -> list[Any]:
        """Loaded topics served through ``bundle``."""
        from magnetar.broker.bundles import topic_hash

        return [
            t for t in self.service.loaded_topics()
            if t.name.namespace == bundle.namespace and bundle.contains(topic_hash(str(t.name)))
        ]  # fmt: skip

    async def check_owned(self, topic: TopicName) -> None:
        """Refuse to load a topic this broker does not own (the client looks it up again)."""
        bundle = await self.bundle_of(topic)
        if not self.ownership.owns(bundle) or bundle in self._unloading or not self.may_write():
            raise BrokerError(f"Namespace bundle for topic ({topic}) not served by this instance. "
                              "Please redo the lookup.", pb.ServiceNotReady)  # fmt: skip

    # ------------------------------------------------------------------ lookups
    async def lookup(self, topic: TopicName, authoritative: bool, listener: str) -> LookupAnswer:
        """Where ``topic`` is served (see the module docstring)."""
        bundle = await self.bundle_of(topic)
        if bundle in self._unloading or not self._lease_ok:
            raise BrokerError(f"Bundle {bundle.key} is being unloaded", pb.ServiceNotReady)
        if self.ownership.owns(bundle):
            return self._connect_me(listener)
        owner = await self.ownership.owner(bundle)
        if owner is not None and not (owner.broker_id == self.broker_id and owner.session != self._session_id):
            return self._answer(owner, listener, redirect=False, authoritative=True)
        if authoritative and self.ready:
            return await self._acquire(bundle, listener)
        leader = await self.registry.leader()
        if leader is not None and leader.broker_id != self.broker_id:
            return self._redirect(leader, listener, authoritative=False)
        candidate = await self.select_broker(bundle)
        if candidate is None or candidate.broker_id == self.broker_id:
            if not self.ready:
                raise BrokerError("This broker is shutting down", pb.ServiceNotReady)
            return await self._acquire(bundle, listener)
        return self._redirect(candidate, listener, authoritative=True)

    @property
    def _session_id(self) -> int:
        return self._session.id if self._session is not None else 0

    async def _acquire(self, bundle: Bundle, listener: str) -> LookupAnswer:
        # A policy cache a split (or the namespace's creation) has not reached yet could name a bundle that
        # overlaps others: only a bundle of the stored policies is ever taken.
        if bundle not in await self.bundles(bundle.namespace, fresh=True):
            raise BrokerError(f"Bundle {bundle.key} changed (split); redo the lookup", pb.ServiceNotReady)
        owner = await self.ownership.try_acquire(bundle)
        if owner.broker_id == self.broker_id and owner.session == self._session_id:
            self.registry.publish_soon()
            return self._connect_me(listener)
        return self._answer(owner, listener, redirect=False, authoritative=True)

    def _connect_me(self, listener: str) -> LookupAnswer:
        url, url_tls = self.service.lookup_urls(listener)
        return LookupAnswer(False, url, url_tls or "", self.me.web_service_url, True, self.me.web_service_url_tls)

    def _answer(self, owner: Owner, listener: str, *, redirect: bool, authoritative: bool) -> LookupAnswer:
        try:
            url, url_tls = owner.urls(listener)
        except KeyError:
            raise BrokerError(f"the broker do not have {listener} listener", pb.ServiceNotReady) from None
        return LookupAnswer(redirect, url, url_tls, owner.http_url, authoritative, owner.http_url_tls)

    def _redirect(self, broker: BrokerInfo, listener: str, *, authoritative: bool) -> LookupAnswer:
        try:
            url, url_tls = broker.urls(listener)
        except KeyError:
            raise BrokerError(f"the broker do not have {listener} listener", pb.ServiceNotReady) from None
        return LookupAnswer(True, url, url_tls, broker.web_service_url, authoritative, broker.web_service_url_tls)

    async def select_broker(self, bundle: Bundle, exclude: set[str] | None = None) -> BrokerInfo | None:
        """The least loaded live broker (fewest bundles, counting those assigned since its last report)."""
        brokers = [b for b in await self.registry.brokers() if not b.load.get("draining")]
        if exclude:
            brokers = [b for b in brokers if b.broker_id not in exclude] or brokers
        if not brokers:
            return None
        now = time.monotonic()
        report_s = self.service.config.load_balancer_report_update_min_interval_millis / 1000

        def score(b: BrokerInfo) -> tuple[int, int, str]:
            pending = self._pending.get(b.broker_id)
            extra = pending.count if pending is not None and now - pending.since < 2 * report_s else 0
            return (int(b.load.get("numBundles", 0)) + extra, int(b.load.get("numTopics", 0)), b.broker_id)

        best = min(brokers, key=score)
        pending = self._pending.get(best.broker_id)
        if pending is None or now - pending.since >= 2 * report_s:
            self._pending[best.broker_id] = pending = _Pending()
        pending.count += 1
        return best

    # ------------------------------------------------------------------ unload / split
    async def unload_bundle(self, bundle: Bundle) -> None:
        """Close the bundle's topics (flushing cursors, sealing ledgers) and release its key."""
        if not self.ownership.owns(bundle):
            return
        self._unloading.add(bundle)
        try:
            for topic in self.topics_of(bundle):
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self.service.unload_topic(topic), 30)
            await self.ownership.release(bundle)
        finally:
            self._unloading.discard(bundle)
        self.registry.publish_soon()

    async def split_bundle(
        self, bundle: Bundle, *, unload: bool, pieces: int = 2, at: int | None = None
    ) -> list[Bundle]:
        """Split an owned bundle: the children are owned by this broker, then the policy changes,
        then the parent key goes (so a lookup always finds an owner). ``unload`` also unloads them."""
        from magnetar.broker.bundles import split_boundaries

        if not self.ownership.owns(bundle):
            raise BrokerError(f"Bundle {bundle.key} is not owned by this broker", pb.ServiceNotReady)
        existing = await self.bundles(bundle.namespace, fresh=True)
        current = [f"0x{b.lower:08x}" for b in existing] + ["0xffffffff"]
        if bundle not in existing:
            raise ValueError(f"Bundle {bundle.key} does not exist")
        new = split_boundaries(current, bundle, pieces, at)
        children = [b for b in bundles_of(bundle.namespace, new) if bundle.lower <= b.lower and b.upper <= bundle.upper]
        for child in children:
            await self.ownership.try_acquire(child)

        def mutate(policies: Any) -> None:
            from magnetar.broker.policies.documents import BundlesData

            policies.bundles = BundlesData(boundaries=new, numBundles=len(new) - 1)

        await self.service.policies.update_namespace(bundle.namespace, mutate)
        await self.ownership.release(bundle)
        log.info("split bundle %s into %s", bundle.key, [c.range for c in children])
        if unload:
            for child in children:
                await self.unload_bundle(child)
        self.registry.publish_soon()
        return children

    def _load_counts(self) -> dict[str, Any]:
        topics = self.service.loaded_topics()
        owned = self.ownership.owned
        rate_in = sum(t.meter_in.msg_rate for t in topics if hasattr(t, "meter_in"))
        bytes_in = sum(t.meter_in.byte_rate for t in topics if hasattr(t, "meter_in"))
        subs = [s for t in topics for s in getattr(t, "subscriptions", {}).values()]
        return {
            "numTopics": len(topics),
            "numBundles": len(owned),
            "numProducers": sum(len(getattr(t, "producers", {})) for t in topics),
            "numConsumers": sum(len(s.consumers) for s in subs),
            "msgRateIn": rate_in,
            "msgRateOut": sum(s.meter_out.msg_rate for s in subs if hasattr(s, "meter_out")),
            "msgThroughputIn": bytes_in,
            "msgThroughputOut": sum(s.meter_out.byte_rate for s in subs if hasattr(s, "meter_out")),
            "bundles": sorted(b.key for b in owned),
            "draining": not self.ready,
        }
