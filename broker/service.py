"""The broker service: owns topics, accepts binary-protocol connections, answers lookups."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from magnetar.broker.auth.authorization import AuthorizationService
from magnetar.broker.auth.live import LivePermissions
from magnetar.broker.auth.service import AuthenticationService
from magnetar.broker.compaction import CompactionService
from magnetar.broker.config import BrokerConfig
from magnetar.broker.connection import ServerConnection
from magnetar.broker.errors import (
    BrokerError,
    ConcurrentModificationError,
    ServiceNotReadyError,
    TopicBusyError,
    TopicExistsError,
    TopicNotFoundError,
)
from magnetar.broker.housekeeping import Housekeeper, enforce_backlog_quota
from magnetar.broker.listeners import (
    advertised_host,
    own_broker_service_url,
    own_broker_service_url_tls,
    own_web_service_urls,
    parse_listeners,
    uses_tls,
)
from magnetar.broker.namespace_service import LookupAnswer, NamespaceService
from magnetar.broker.nonpersistent import NonPersistentTopic
from magnetar.broker.policies import PolicyStore
from magnetar.broker.protocol import pulsar_api_pb2 as pb
from magnetar.broker.publish_buffer import PublishBuffer
from magnetar.broker.resources import Resources
from magnetar.broker.schemas import SchemaRegistry
from magnetar.broker.stats import sample_topic
from magnetar.broker.system_topics import ChangeEvents, check_user_creatable
from magnetar.broker.tls import ReloadingServerContext, TlsSettings
from magnetar.broker.topic import PersistentTopic
from magnetar.broker.topic_list import TopicListService
from magnetar.broker.topic_name import TopicName
from magnetar.common.loop_probe import LoopProbe
from magnetar.common.tasks import TaskSet
from magnetar.managed_ledger.api import InitialPosition, ManagedLedgerConfig, ManagedLedgerFactory
from magnetar.metadata.api import BadVersionError, MetadataStore, NotFoundError

log = logging.getLogger(__name__)

Mode = pb.CommandGetTopicsOfNamespace
_PRODUCER_NAME_COUNTER = "/counters/producer-name"
#: Partition ceiling when maxNumPartitionsPerPartitionedTopic is 0 (Pulsar has none; a huge count would
#: only exhaust the broker).
MAX_PARTITIONS = 100_000


class BrokerService:
    """Topics by name, loaded on demand from the managed-ledger factory."""

    def __init__(self, config: BrokerConfig, store: MetadataStore, ledgers: ManagedLedgerFactory) -> None:
        self.config = config
        self.listeners = parse_listeners(config)
        #: Who clients are (None: ``authenticationEnabled`` is off); a bad key or file fails the start here.
        self.authentication = AuthenticationService.from_config(config)
        #: Host name in this broker's own URLs (advertisedAddress or the internal listener's host).
        self.advertised_host = advertised_host(config)
        self.store = store
        self.ledgers = ledgers
        self.resources = Resources(store)
        self.policies = PolicyStore(store, config)
        self.schemas = SchemaRegistry(store, self.policies, config)
        self.compaction = CompactionService(self)
        self.change_events = ChangeEvents(self)
        self.policies.add_listener(self._on_policies_changed)
        #: What each authenticated role may do; live producers and consumers are re-checked on changes.
        self.authorization = AuthorizationService(config, store, self.policies)
        self.live_permissions = LivePermissions(self)
        self.housekeeper = Housekeeper(self)
        #: The debug event-loop lag / GC pause probe (``eventLoopProbeIntervalMs``), or None when off.
        self.loop_probe: LoopProbe | None = None
        if config.event_loop_probe_interval_ms > 0:
            self.loop_probe = LoopProbe(
                config.event_loop_probe_interval_ms / 1000, config.event_loop_lag_warn_ms / 1000
            )
        #: Bookie auto-recovery running in this broker (cluster mode), for its status and metrics.
        self.auto_recovery: Any = None
        self.connections: set[ServerConnection] = set()
        self.publish_buffer = PublishBuffer(
            config.max_message_publish_buffer_size_in_mb * 1024 * 1024, self._publish_buffer_changed
        )
        #: Topic-list watchers (WATCH_TOPIC_LIST) of every connection, fed from the metadata store.
        self.topic_lists = TopicListService(store)
        #: Loaded topics by name; a topic being loaded is in ``_loading`` until its load task finishes
        #: (the finished task is not kept: it would cost ~0.5 KiB per topic for nothing).
        self._topics: dict[str, PersistentTopic] = {}
        self._loading: dict[str, asyncio.Task[PersistentTopic]] = {}
        #: Topics being unloaded, until their close ends: a load of the same name waits for it, so the old
        #: instance cannot close the managed ledger under the new one (Pulsar drops a topic once closed).
        self._closing: dict[str, asyncio.Future[None]] = {}
        self._server: asyncio.base_events.Server | None = None  # brokerServicePort (None: TLS only)
        self._tls_server: asyncio.base_events.Server | None = None  # brokerServicePortTls
        #: The TLS listeners' certificate (binary and HTTPS), reloaded as its files rotate; ``None``: no TLS port.
        self.tls: ReloadingServerContext | None = None
        if uses_tls(config):
            self.tls = ReloadingServerContext(TlsSettings.of_broker(config), config.tls_cert_refresh_check_duration_sec)
        self._extra_servers: list[asyncio.base_events.Server] = []  # bindAddresses
        self._producer_seq = itertools.count()
        #: The broker's own background work (stats, policy re-application, unloads, consumer detaches).
        self.tasks = TaskSet("broker service")
        self._instance = 0
        #: Bundle ownership and lookups among several brokers (cluster mode); ``None``: this broker
        #: serves everything (standalone).
        self.namespaces: NamespaceService | None = None

    def _publish_buffer_changed(self) -> None:
        """The broker-wide publish buffer started or stopped throttling: every connection re-decides."""
        for conn in list(self.connections):
            conn.update_reading()

    @property
    def broker_service_url(self) -> str:
        """``pulsar://`` URL of this broker ("" in TLS-only mode)."""
        return own_broker_service_url(self.config, self.listeners, self.port)

    @property
    def broker_service_url_tls(self) -> str:
        """``pulsar+ssl://`` URL of this broker ("" without a TLS port)."""
        return own_broker_service_url_tls(self.config, self.listeners, self.tls_port)

    @property
    def web_service_url(self) -> str:
        """``http://`` URL of this broker's web service ("" in HTTPS-only mode)."""
        return own_web_service_urls(self.config)[0]

    @property
    def web_service_url_tls(self) -> str:
        """``https://`` URL of this broker's web service ("" without an HTTPS port)."""
        return own_web_service_urls(self.config)[1]

    def lookup_urls(self, listener_name: str) -> tuple[str, str | None]:
        """``brokerServiceUrl`` and ``brokerServiceUrlTls`` a lookup answers with: the named listener's
        (Pulsar's ServiceNotReady when this broker has no listener of that name), else this broker's own."""
        if not listener_name:
            return self.broker_service_url, self.broker_service_url_tls or None
        listener = self.listeners.advertised.get(listener_name)
        if listener is None:
            raise ServiceNotReadyError(f"the broker do not have {listener_name} listener")
        return listener.broker_service_url or "", listener.broker_service_url_tls

    @property
    def port(self) -> int | None:
        """The plaintext binary port (``None``: TLS only)."""
        if self._server is not None and self._server.sockets:
            return self._server.sockets[0].getsockname()[1]
        return self.config.broker_service_port

    @property
    def tls_port(self) -> int | None:
        """The TLS binary port (``None``: no TLS listener)."""
        if self._tls_server is not None and self._tls_server.sockets:
            return self._tls_server.sockets[0].getsockname()[1]
        return self.config.broker_service_port_tls

    async def start(self) -> None:
        """Reserve a producer-name prefix and start listening on the binary port."""
        self._instance = await self._next_instance()
        loop = asyncio.get_running_loop()
        self.tasks.spawn(self._sample_stats(), name="stats")
        self.housekeeper.start()
        if self.loop_probe is not None:
            self.loop_probe.start()
        if self.tls is not None:
            await self.tls.start()
        if self.config.broker_service_port is not None:
            self._server = await loop.create_server(
                lambda: ServerConnection(self),
                self.config.bind_address,
                self.config.broker_service_port,
                reuse_address=True,
                backlog=1024,
            )
            log.info("broker listening on %s:%d (%s)", self.config.bind_address, self.port, self.broker_service_url)
        if self.config.broker_service_port_tls is not None and self.tls is not None:
            self._tls_server = await loop.create_server(
                lambda: ServerConnection(self),
                self.config.bind_address,
                self.config.broker_service_port_tls,
                reuse_address=True,
                backlog=1024,
                ssl=self.tls.listener_context,
                ssl_handshake_timeout=10,
            )
            log.info(
                "broker listening with TLS on %s:%d (%s)",
                self.config.bind_address,
                self.tls_port,
                self.broker_service_url_tls,
            )
        for bind in self.listeners.bind_addresses:
            server = await loop.create_server(
                functools.partial(ServerConnection, self, bind.listener_name),
                bind.host,
                bind.port,
                reuse_address=True,
                backlog=1024,
                ssl=self.tls.listener_context if bind.tls and self.tls is not None else None,
            )
            self._extra_servers.append(server)
            log.info("broker listening on %s:%d for listener %s", bind.host, bind.port, bind.listener_name)
        if self.config.metadata_store_url:  # a cluster broker shares topics with the others
            namespaces = NamespaceService(self)
            await namespaces.start()
            self.namespaces = namespaces

    def _on_policies_changed(self, name: str) -> None:
        """A namespace's or topic's policies changed (here or on another broker): re-apply them."""
        affected = [
            t for t in self.loaded_topics() if name in (t.name.namespace, str(t.name), str(t.name.partitioned_base))
        ]
        if affected:
            self.tasks.spawn(self._reapply(affected), name="reapply policies")

    async def _reapply(self, topics: list[PersistentTopic]) -> None:
        for topic in topics:
            try:
                eff = await self.policies.effective(topic.name)
                topic.apply_policies(eff)
                await topic.sync_deduplication()
                await enforce_backlog_quota(topic, eff)
                trim = getattr(topic.ledger, "trim", None)
                if trim is not None:
                    await trim()  # retention may have shrunk
            except Exception:
                log.exception("re-applying policies to %s failed", topic.name)

    async def _sample_stats(self) -> None:
        interval = max(1, self.config.stats_update_frequency_in_secs)
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            for topic in self.loaded_topics():
                sample_topic(topic, now)

    async def _next_instance(self) -> int:
        """A number unique to this broker start, so generated producer names never repeat."""
        for _ in range(20):
            current = await self.store.get(_PRODUCER_NAME_COUNTER)
            value = int(current.data) + 1 if current else 0
            try:
                await self.store.put(
                    _PRODUCER_NAME_COUNTER, str(value).encode(), current.stat.version if current else -1
                )
            except BadVersionError:
                continue
            return value
        raise RuntimeError("could not allocate a producer-name prefix")

    def new_producer_name(self) -> str:
        """Pulsar-style generated name: ``<cluster>-<broker instance>-<sequence>``."""
        return f"{self.config.cluster_name}-{self._instance}-{next(self._producer_seq)}"

    # ------------------------------------------------------------------ namespaces and lookups
    async def check_namespace(self, topic: TopicName) -> None:
        if not await self.resources.namespace_exists(topic.namespace):
            raise TopicNotFoundError(f"Namespace {topic.namespace} does not exist")

    async def partitioned_metadata(self, topic: TopicName, auto_create: bool = True) -> int:
        """Partition count (0 = non-partitioned), auto-creating a partitioned topic when configured to."""
        await self.check_namespace(topic)
        if topic.partition_index >= 0:
            return 0
        partitions = await self.resources.get_partitions(topic)
        if partitions:
            return partitions
        if not auto_create or not topic.persistent:
            return 0
        eff = await self.policies.effective(topic)
        if (
            eff.allow_auto_topic_creation
            and eff.auto_topic_creation_type == "partitioned"
            and not await self.resources.topic_stored(topic)
        ):
            await self.resources.create_partitioned_topic(topic, eff.default_num_partitions)
            return await self.resources.get_partitions(topic)
        return 0

    async def lookup(self, topic: TopicName, authoritative: bool, listener_name: str) -> LookupAnswer:
        """Where ``topic`` is served: this broker (standalone: always), another owner, or a redirect."""
        await self.check_namespace(topic)
        if self.namespaces is not None:
            return await self.namespaces.lookup(topic, authoritative, listener_name)
        if self.config.metadata_store_url:
            raise BrokerError("The broker is starting", pb.ServiceNotReady)
        url, url_tls = self.lookup_urls(listener_name)
        return LookupAnswer(False, url, url_tls or "", self.web_service_url, True, self.web_service_url_tls)

    def may_write(self) -> bool:
        """Whether this broker may persist now (cluster mode: its ownership lease is surely alive)."""
        if self.namespaces is None:
            return not self.config.metadata_store_url
        return self.namespaces.may_write()

    async def list_topics(self, namespace: str, mode: int = Mode.PERSISTENT) -> list[str]:
        """Topics of a namespace for GET_TOPICS_OF_NAMESPACE (partitions listed individually)."""
        tenant, _, ns = namespace.partition("/")
        TopicName.parse(f"persistent://{tenant}/{ns}/x")  # validates the namespace name
        if not await self.resources.namespace_exists(namespace):
            raise TopicNotFoundError(f"Namespace {namespace} does not exist")
        found: set[str] = set()
        if mode in (Mode.PERSISTENT, Mode.ALL):
            found.update(await self.resources.list_persistent_topics(namespace))
        for key, topic in self._topics.items():
            name = topic.name
            if name.namespace == namespace and (mode == Mode.ALL or (mode == Mode.PERSISTENT) == name.persistent):
                found.add(key)
        return sorted(found)

    # ------------------------------------------------------------------ topics
    async def get_topic(self, name: TopicName, *, create: bool, explicit: bool = False) -> PersistentTopic:
        """The loaded topic, loading (and if allowed creating) it on first use.

        ``explicit`` creation (the admin API) does not depend on the auto-creation policy.
        """
        key = str(name)
        topic = self._topics.get(key)
        if topic is None:
            load = self._loading.get(key)
            if load is None:
                # One load per topic, in a task of its own: a client that disconnects (cancelling its request)
                # can neither cancel a load other clients wait for nor leave the managed ledger half-opened.
                load = asyncio.get_running_loop().create_task(self._load(name, create, explicit), name=f"load {key}")
                self._loading[key] = load
                load.add_done_callback(functools.partial(self._load_done, key))
            topic = await asyncio.shield(load)
        if topic.closed:
            if self._topics.get(key) is topic:
                del self._topics[key]
            return await self.get_topic(name, create=create, explicit=explicit)
        return topic

    def _load_done(self, key: str, load: asyncio.Task[PersistentTopic]) -> None:
        """A loaded topic moves to ``_topics``; a failed load is forgotten (the next request tries
        again; its error reached its waiters)."""
        if self._loading.get(key) is load:
            del self._loading[key]
            if not load.cancelled() and load.exception() is None:
                self._topics[key] = load.result()

    async def _load(self, name: TopicName, create: bool, explicit: bool = False) -> PersistentTopic:
        closing = self._closing.get(str(name))
        if closing is not None:
            try:
                await asyncio.wait_for(asyncio.shield(closing), self.config.topic_load_timeout_seconds)
            except TimeoutError:
                raise ServiceNotReadyError(f"Topic {name} is still being closed") from None
        # A cluster broker serves nothing before it joined.
        if self.namespaces is None and self.config.metadata_store_url:
            raise BrokerError("The broker is starting", pb.ServiceNotReady)
        await self.check_namespace(name)  # once per load, before ownership (an unknown namespace is not owned)
        if self.namespaces is not None:
            await self.namespaces.check_owned(name)
        if not name.persistent:
            return await self._load_non_persistent(name, create, explicit)  # type: ignore[return-value]
        if name.partition_index < 0 and await self.resources.get_partitions(name) > 0:
            raise TopicNotFoundError(f"{name} is a partitioned topic: use its partitions")
        eff = await self.policies.effective(name)
        if not await self.resources.topic_stored(name):
            # A partition of an existing partitioned topic may always be created; others need auto-creation.
            is_declared_partition = (
                name.partition_index >= 0
                and await self.resources.get_partitions(name.partitioned_base) > name.partition_index
            )
            allowed = create and (explicit or is_declared_partition or eff.allow_auto_topic_creation)
            if not allowed:
                raise TopicNotFoundError(f"Topic {name} does not exist")
        ledger = await self.ledgers.open(name.persistence_name, self.managed_ledger_config())
        topic = PersistentTopic(self, name, ledger)
        topic.apply_policies(eff)
        await topic.initialize()
        log.debug("loaded topic %s", name)
        return topic

    async def _load_non_persistent(self, name: TopicName, create: bool, explicit: bool) -> NonPersistentTopic:
        """A non-persistent topic exists while it is loaded; creating it follows auto-creation rules
        (its namespace was checked by :meth:`_load`)."""
        eff = await self.policies.effective(name)
        if not create or not (explicit or eff.allow_auto_topic_creation):
            raise TopicNotFoundError(f"Topic {name} does not exist")
        topic = NonPersistentTopic(self, name)
        topic.apply_policies(eff)
        return topic

    def managed_ledger_config(self) -> ManagedLedgerConfig:
        c = self.config
        return ManagedLedgerConfig(
            ensemble_size=c.managed_ledger_default_ensemble_size,
            write_quorum=c.managed_ledger_default_write_quorum,
            ack_quorum=c.managed_ledger_default_ack_quorum,
            max_entries_per_ledger=c.managed_ledger_max_entries_per_ledger,
            max_size_per_ledger_bytes=c.managed_ledger_max_size_per_ledger_mbytes * 1024 * 1024,
            min_ledger_rollover_seconds=c.managed_ledger_min_ledger_rollover_time_minutes * 60,
            max_ledger_rollover_seconds=c.managed_ledger_max_ledger_rollover_time_minutes * 60,
            retention_time_seconds=c.default_retention_time_in_minutes * 60,
            retention_size_bytes=c.default_retention_size_in_mb * 1024 * 1024,
            cursor_flush_interval_seconds=c.managed_ledger_cursor_flush_interval_ms / 1000,
            max_unacked_ranges_to_persist=c.managed_ledger_max_unacked_ranges_to_persist,
            max_batch_deleted_index_to_persist=c.managed_ledger_max_batch_deleted_index_to_persist,
        )

    # ------------------------------------------------------------------ topic administration
    def loaded_topic(self, name: TopicName) -> PersistentTopic | None:
        return self._topics.get(str(name))

    async def topic_exists(self, name: TopicName) -> bool:
        return self.loaded_topic(name) is not None or await self.resources.topic_stored(name)

    async def create_topic(self, name: TopicName) -> PersistentTopic:
        """Create a non-partitioned topic (admin ``PUT``); 409 if it (or a partitioned one) exists."""
        check_user_creatable(name)
        await self.check_namespace(name)
        if await self.topic_exists(name) or (
            name.partition_index < 0 and await self.resources.get_partitions(name) > 0
        ):
            raise TopicExistsError("This topic already exists")
        return await self.get_topic(name, create=True, explicit=True)

    async def create_partitioned_topic(self, name: TopicName, partitions: int) -> None:
        """Declare a partitioned topic; partitions are created on first use."""
        check_user_creatable(name)
        await self.check_namespace(name)
        if partitions <= 0:
            raise BrokerError("Number of partitions should be more than 0", http_status=406)
        self._check_partition_limit(partitions)
        if name.partition_index >= 0:
            raise BrokerError("Partitioned topic name must not end in -partition-N", http_status=412)
        if await self.topic_exists(name):
            raise TopicExistsError("This topic already exists")
        if not await self.resources.create_partitioned_topic(name, partitions):
            raise TopicExistsError("This topic already exists")

    async def update_partitions(self, name: TopicName, partitions: int) -> None:
        """Grow a partitioned topic; existing subscriptions are created on the new partitions
        (at their start) so their consumers see every message."""
        path = self._partitioned_path(name)
        value = await self.store.get(path)
        if value is None:
            raise TopicNotFoundError("Partitioned topic does not exist")
        current = int(json.loads(value.data)["partitions"])
        self._check_partition_limit(partitions)
        if partitions <= current:
            # Pulsar answers 422: partitions can only grow.
            raise BrokerError(
                "Number of new partitions must be greater than existing number of partitions", http_status=422
            )
        # New partitions are created now only if subscriptions must be carried over; otherwise on first use.
        subscriptions = await self._subscription_names(name.partition(0))
        for index in range(current, partitions) if subscriptions else ():
            topic = await self.get_topic(name.partition(index), create=True)
            for sub in subscriptions:
                await topic.ledger.open_cursor(sub, InitialPosition.EARLIEST)
            await topic.initialize()
        try:
            await self.store.put(path, json.dumps({"partitions": partitions}).encode(), value.stat.version)
        except BadVersionError:
            raise ConcurrentModificationError("Partitioned topic was updated concurrently") from None

    def _check_partition_limit(self, partitions: int) -> None:
        limit = self.config.max_num_partitions_per_partitioned_topic or MAX_PARTITIONS
        if partitions > limit:
            raise BrokerError(f"Number of partitions should be less than or equal to {limit}", http_status=412)

    async def existing_partitions(self, name: TopicName) -> list[TopicName]:
        """Partitions of ``name`` that exist (stored or loaded), in index order — one metadata listing,
        not one lookup per declared partition."""
        stored = await self.resources.list_persistent_topics(name.namespace) if name.persistent else []
        found = {TopicName.parse(t) for t in stored} | {t.name for t in self.loaded_topics()}
        parts = [t for t in found if t.partition_index >= 0 and t.partitioned_base == name]
        return sorted(parts, key=lambda t: t.partition_index)

    async def _subscription_names(self, name: TopicName) -> list[str]:
        topic = self.loaded_topic(name)
        if topic is not None:
            return [s for s, sub in topic.subscriptions.items() if sub.durable]
        if not await self.resources.topic_stored(name):
            return []
        topic = await self.get_topic(name, create=False)
        return [s for s, sub in topic.subscriptions.items() if sub.durable]

    async def delete_topic(self, name: TopicName, force: bool = False) -> None:
        """Delete a topic (all partitions of a partitioned one) with its data and schema.

        Refused with 412 while clients are connected unless ``force``, which disconnects them.
        """
        partitions = await self.resources.get_partitions(name) if name.partition_index < 0 else 0
        if partitions:
            for part in await self.existing_partitions(name):
                await self._delete_one(part, force, missing_ok=True)
            with contextlib.suppress(NotFoundError):
                await self.store.delete(self._partitioned_path(name))
        else:
            await self._delete_one(name, force, missing_ok=False)
        await self.schemas.delete_schemas(name)
        await self.policies.delete_topic_policies(name)
        await self.authorization.remove_topic_permissions(name)

    async def _delete_one(self, name: TopicName, force: bool, missing_ok: bool) -> None:
        async with self._retiring(str(name)):  # loads wait for the whole deletion, the ledger's included
            topic = self.loaded_topic(name)
            if topic is not None:
                if not force and topic.has_connected_clients():
                    raise TopicBusyError("Topic has active producers/subscriptions")
                await self.compaction.forget(topic, str(name))
                await self._close_loaded(topic)
            if not name.persistent:
                if topic is None and not missing_ok:
                    raise TopicNotFoundError("Topic not found")
                return
            elif not await self.resources.topic_stored(name):
                if missing_ok:
                    return
                raise TopicNotFoundError("Topic not found")
            await self.ledgers.delete(name.persistence_name)

    @staticmethod
    def _partitioned_path(name: TopicName) -> str:
        return Resources._partitioned_path(name)

    def loaded_topics(self) -> list[PersistentTopic]:
        return list(self._topics.values())

    async def unload_topic(self, topic: PersistentTopic) -> None:
        """Close ``topic`` and forget it; a load of the same name meanwhile waits for the close to end."""
        async with self._retiring(str(topic.name)):
            await self._close_loaded(topic)

    async def _close_loaded(self, topic: PersistentTopic) -> None:
        key = str(topic.name)
        if self._topics.get(key) is topic:
            del self._topics[key]
        await self.compaction.unloaded(key)
        await topic.close()

    @contextlib.asynccontextmanager
    async def _retiring(self, key: str) -> AsyncIterator[None]:
        """While the body closes (or deletes) topic ``key``, its loads wait: a new instance must not open the
        managed ledger the old one is closing or deleting (Pulsar drops a topic from its cache once closed)."""
        previous = self._closing.get(key)
        done = asyncio.get_running_loop().create_future()
        self._closing[key] = done
        try:
            if previous is not None:  # an earlier retirement of the same name ends first
                await asyncio.shield(previous)
            yield
        finally:
            if self._closing.get(key) is done:
                del self._closing[key]
            done.set_result(None)

    async def close(self) -> None:
        """Stop accepting, close client connections and every topic (flushing cursors).

        A cluster broker first unloads its bundles so other brokers take them over at once."""
        if self.namespaces is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.namespaces.shutdown(), self.config.broker_shutdown_timeout_ms / 1000)
        self.tasks.cancel()
        await self.housekeeper.close()
        if self.loop_probe is not None:
            self.loop_probe.close()
        await self.compaction.close()
        await self.change_events.close()
        self.authorization.close()
        self.policies.close()
        self.topic_lists.close()
        if self.authentication is not None:
            await self.authentication.close()
        servers = [*self._extra_servers, *(s for s in (self._server, self._tls_server) if s is not None)]
        for server in servers:
            server.close()
        if self.tls is not None:
            await self.tls.close()
        loading = [load for load in self._loading.values() if not load.done()]
        for load in loading:
            load.cancel()
        if loading:
            await asyncio.wait(loading, timeout=5)
        for topic in self.loaded_topics():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(topic.close(), 10)
        self._topics.clear()
        self._loading.clear()
        for conn in list(self.connections):
            conn.close()
        for server in servers:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(server.wait_closed(), 5)
        await self.tasks.close()
