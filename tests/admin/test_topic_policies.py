"""Topic-level policies over real HTTP (``/admin/v2/persistent/.../<policy>``), and the
:class:`~magnetar.broker.policies.PolicyStore` the broker resolves effective values with."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest

from magnetar.broker.config import BrokerConfig
from magnetar.broker.errors import NamespaceNotFoundError, PolicyValidationError
from magnetar.broker.policies import (
    BacklogQuota,
    PersistencePolicies,
    Policies,
    PolicyStore,
    RetentionPolicies,
    TopicPolicies,
    parse_stored,
    resolve,
    validate_namespace_policies,
    validate_persistence,
    validate_retention,
)
from magnetar.broker.resources import Resources, initialize_standalone
from magnetar.broker.topic_name import TopicName
from magnetar.metadata.embedded import EmbeddedMetadataStore
from tests.admin.rest import call
from tests.conftest import StandaloneProcess

MB = 1024 * 1024


@pytest.fixture
def base(standalone: StandaloneProcess) -> str:
    return f"{standalone.http_url}/admin/v2"


@pytest.fixture
def ns(base: str) -> Iterator[str]:
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    assert call("PUT", f"{base}/tenants/{tenant}", {"allowedClusters": ["standalone"]}).status == 204
    assert call("PUT", f"{base}/namespaces/{tenant}/ns").status == 204
    yield f"{tenant}/ns"
    call("DELETE", f"{base}/tenants/{tenant}?force=true")


@pytest.fixture
def url(base: str, ns: str) -> str:
    """A non-partitioned topic's admin URL."""
    topic_url = f"{base}/persistent/{ns}/topic"
    assert call("PUT", topic_url).status == 204
    return topic_url


# ---------------------------------------------------------------------------------------- pre-validation
def test_topic_must_exist(base: str, ns: str) -> None:
    for method, path, body in [
        ("GET", "retention", None),
        ("POST", "retention", {"retentionTimeInMinutes": 1, "retentionSizeInMB": 1}),
        ("DELETE", "maxProducers", None),
        ("GET", "backlogQuotaMap", None),
    ]:
        reply = call(method, f"{base}/persistent/{ns}/missing/{path}", body)
        assert reply.status == 404 and reply.reason == f"Topic persistent://{ns}/missing not found", path
    unknown_ns = call("GET", f"{base}/persistent/{ns.split('/')[0]}/nope/topic/retention")
    assert unknown_ns.status == 404


def test_partitions_and_bad_names_are_refused(base: str, ns: str) -> None:
    assert call("PUT", f"{base}/persistent/{ns}/parted/partitions", 2).status == 204
    partition = call("GET", f"{base}/persistent/{ns}/parted-partition-0/retention")
    assert partition.status == 412 and partition.reason == "Not allowed to set/get topic policy for a partition"
    bad = call("GET", f"{base}/persistent/{ns}/a%2Fb/retention")
    assert bad.status == 412 and bad.reason == "Topic name is not valid"
    bad_tenant = call("GET", f"{base}/persistent/bad$t/ns/x/retention")
    assert bad_tenant.status == 412
    assert call("GET", f"{base}/persistent/{ns}/parted/retention?applied=perhaps").status == 400


def test_partitioned_topic_policies(base: str, ns: str) -> None:
    topic_url = f"{base}/persistent/{ns}/parted"
    assert call("PUT", f"{topic_url}/partitions", 3).status == 204
    assert call("POST", f"{topic_url}/maxProducers", 7).status == 204
    assert call("GET", f"{topic_url}/maxProducers").json == 7


# ---------------------------------------------------------------------------------------- each policy
def test_retention(url: str, base: str, ns: str) -> None:
    assert call("GET", f"{url}/retention").status == 204
    assert call("GET", f"{url}/retention?applied=true").json == {"retentionTimeInMinutes": 0, "retentionSizeInMB": 0}
    ns_retention = {"retentionTimeInMinutes": 60, "retentionSizeInMB": 10}
    assert call("POST", f"{base}/namespaces/{ns}/retention", ns_retention).status == 204
    assert call("GET", f"{url}/retention?applied=true").json == ns_retention
    mine = {"retentionTimeInMinutes": -1, "retentionSizeInMB": -1}
    assert call("POST", f"{url}/retention", mine).status == 204
    assert call("GET", f"{url}/retention").json == mine
    assert call("GET", f"{url}/retention?applied=true").json == mine
    bad = call("POST", f"{url}/retention", {"retentionTimeInMinutes": 0, "retentionSizeInMB": 5})
    assert bad.status == 400 and bad.reason.startswith("Invalid retention policy")
    for raw in (b"", b"{", b'{"retentionTimeInMinutes": "1"}', b'{"x": 1}'):
        assert call("POST", f"{url}/retention", raw=raw).status == 400
    assert call("DELETE", f"{url}/retention").status == 204
    assert call("GET", f"{url}/retention").status == 204


def test_message_ttl(url: str, base: str, ns: str) -> None:
    assert call("GET", f"{url}/messageTTL").status == 204
    assert call("GET", f"{url}/messageTTL?applied=true").json == 0
    assert call("POST", f"{base}/namespaces/{ns}/messageTTL", 30).status == 204
    assert call("GET", f"{url}/messageTTL?applied=true").json == 30
    assert call("POST", f"{url}/messageTTL?messageTTL=90").status == 204
    assert call("GET", f"{url}/messageTTL").json == 90
    for query, status in (("messageTTL=-1", 412), ("", 412), ("messageTTL=abc", 400), ("messageTTL=1.5", 400)):
        reply = call("POST", f"{url}/messageTTL?{query}")
        assert reply.status == status and reply.reason, query
    assert call("POST", f"{url}/messageTTL?messageTTL=99999999999").status == 400
    assert call("GET", f"{url}/messageTTL").json == 90
    assert call("DELETE", f"{url}/messageTTL").status == 204
    assert call("GET", f"{url}/messageTTL").status == 204


INTEGERS = [
    ("maxProducers", "maxProducers must be 0 or more"),
    ("maxConsumers", "maxConsumers must be 0 or more"),
    ("maxConsumersPerSubscription", "Invalid value for maxConsumersPerSubscription"),
    ("maxUnackedMessagesOnConsumer", "maxUnackedNum must be 0 or more"),
    ("maxUnackedMessagesOnSubscription", "maxUnackedNum must be 0 or more"),
    ("maxSubscriptionsPerTopic", "maxSubscriptionsPerTopic must be 0 or more"),
]


@pytest.mark.parametrize(("segment", "negative_reason"), INTEGERS)
def test_integer_policies(url: str, segment: str, negative_reason: str) -> None:
    assert call("GET", f"{url}/{segment}").status == 204
    assert isinstance(call("GET", f"{url}/{segment}?applied=true").json, int)
    assert call("POST", f"{url}/{segment}", 3).status == 204
    assert call("GET", f"{url}/{segment}").json == 3
    assert call("GET", f"{url}/{segment}?applied=true").json == 3
    negative = call("POST", f"{url}/{segment}", -1)
    assert negative.status == 412 and negative.reason == negative_reason
    for raw in (b"", b'"3"', b"3.0", b"false", b"[]"):
        assert call("POST", f"{url}/{segment}", raw=raw).status == 400, raw
    assert call("DELETE", f"{url}/{segment}").status == 204
    assert call("GET", f"{url}/{segment}").status == 204


def test_applied_values_come_from_the_namespace(url: str, base: str, ns: str) -> None:
    assert call("POST", f"{base}/namespaces/{ns}/maxProducersPerTopic", 11).status == 204
    assert call("POST", f"{base}/namespaces/{ns}/maxConsumersPerSubscription", 12).status == 204
    assert call("GET", f"{url}/maxProducers?applied=true").json == 11
    assert call("GET", f"{url}/maxConsumersPerSubscription?applied=true").json == 12
    assert call("GET", f"{url}/maxProducers").status == 204


def test_deduplication(url: str, base: str, ns: str) -> None:
    assert call("GET", f"{url}/deduplicationEnabled").status == 204
    assert call("GET", f"{url}/deduplicationEnabled?applied=true").json is False
    assert call("POST", f"{base}/namespaces/{ns}/deduplication", True).status == 204
    assert call("GET", f"{url}/deduplicationEnabled?applied=true").json is True
    assert call("POST", f"{url}/deduplicationEnabled", False).status == 204
    assert call("GET", f"{url}/deduplicationEnabled").json is False
    assert call("POST", f"{url}/deduplicationEnabled", raw=b'"no"').status == 400
    assert call("DELETE", f"{url}/deduplicationEnabled").status == 204
    assert call("GET", f"{url}/deduplicationEnabled").status == 204


STRUCTURED = [
    ("persistence", {"bookkeeperEnsemble": 1, "bookkeeperWriteQuorum": 1, "bookkeeperAckQuorum": 1,
                     "managedLedgerMaxMarkDeleteRate": 0.0}),
    ("inactiveTopicPolicies", {"inactiveTopicDeleteMode": "delete_when_no_subscriptions",
                               "maxInactiveDurationSeconds": 120, "deleteWhileInactive": True}),
    ("autoSubscriptionCreation", {"allowAutoSubscriptionCreation": False}),
    ("delayedDelivery", {"tickTime": 250, "active": False, "maxDeliveryDelayInMillis": 60000}),
]  # fmt: skip


@pytest.mark.parametrize(("segment", "value"), STRUCTURED)
def test_structured_policies(url: str, segment: str, value: dict) -> None:
    assert call("GET", f"{url}/{segment}").status == 204
    applied = call("GET", f"{url}/{segment}?applied=true")
    assert applied.status == 200 and isinstance(applied.json, dict)
    assert call("POST", f"{url}/{segment}", value).status == 204
    assert call("GET", f"{url}/{segment}").json == value
    assert call("GET", f"{url}/{segment}?applied=true").json == value
    for raw in (b"", b"{", b'{"unknown": true}', b"7"):
        assert call("POST", f"{url}/{segment}", raw=raw).status == 400, raw
    assert call("DELETE", f"{url}/{segment}").status == 204
    assert call("GET", f"{url}/{segment}").status == 204


def test_applied_defaults_follow_the_broker(url: str) -> None:
    assert call("GET", f"{url}/persistence?applied=true").json["bookkeeperEnsemble"] == 1
    assert call("GET", f"{url}/delayedDelivery?applied=true").json == {
        "tickTime": 1000,
        "active": True,
        "maxDeliveryDelayInMillis": 0,
    }
    assert call("GET", f"{url}/autoSubscriptionCreation?applied=true").json == {"allowAutoSubscriptionCreation": True}


def test_invalid_structured_values(url: str) -> None:
    bad_quorum = call(
        "POST", f"{url}/persistence", {"bookkeeperEnsemble": 1, "bookkeeperWriteQuorum": 2, "bookkeeperAckQuorum": 1}
    )
    assert (
        bad_quorum.status == 400 and bad_quorum.reason == "Bookkeeper Ensemble (1) >= WriteQuorum (2) >= AckQuorum (1)"
    )
    assert call("POST", f"{url}/delayedDelivery", {"tickTime": -5, "active": True}).status == 412
    assert call("POST", f"{url}/inactiveTopicPolicies", {"inactiveTopicDeleteMode": "never"}).status == 400


def test_schema_compatibility_strategy(url: str, base: str, ns: str) -> None:
    assert call("GET", f"{url}/schemaCompatibilityStrategy").status == 204
    assert call("GET", f"{url}/schemaCompatibilityStrategy?applied=true").json == "FULL"
    assert call("PUT", f"{base}/namespaces/{ns}/schemaCompatibilityStrategy", "FORWARD").status == 204
    assert call("GET", f"{url}/schemaCompatibilityStrategy?applied=true").json == "FORWARD"
    assert call("PUT", f"{url}/schemaCompatibilityStrategy", "ALWAYS_COMPATIBLE").status == 204
    assert call("GET", f"{url}/schemaCompatibilityStrategy").json == "ALWAYS_COMPATIBLE"
    assert call("PUT", f"{url}/schemaCompatibilityStrategy", "NONE").status == 400
    assert call("DELETE", f"{url}/schemaCompatibilityStrategy").status == 204
    assert call("GET", f"{url}/schemaCompatibilityStrategy").status == 204


def test_backlog_quotas_and_retention(url: str, base: str, ns: str) -> None:
    applied = call("GET", f"{url}/backlogQuotaMap?applied=true").json
    assert set(applied) == {"destination_storage", "message_age"}
    assert call("GET", f"{url}/backlogQuotaMap").json == {}
    quota = {"limitSize": 10 * MB, "limitTime": 0, "policy": "producer_exception"}
    assert call("POST", f"{url}/backlogQuota", quota).status == 204
    assert call("GET", f"{url}/backlogQuotaMap").json == {"destination_storage": {"limit": 10 * MB, **quota}}
    small = call("POST", f"{url}/retention", {"retentionTimeInMinutes": -1, "retentionSizeInMB": 5})
    assert small.status == 412
    assert small.reason == (
        "Retention Quota must exceed configured backlog quota for topic. Please increase retention quota and retry"
    )
    assert call("POST", f"{url}/retention", {"retentionTimeInMinutes": -1, "retentionSizeInMB": 20}).status == 204
    big = call("POST", f"{url}/backlogQuota", {"limitSize": 30 * MB, "policy": "producer_exception"})
    assert big.status == 412
    assert big.reason == (
        "Backlog Quota exceeds configured retention quota for topic. Please increase retention quota and retry"
    )
    age = {"limitTime": 30, "policy": "producer_request_hold"}
    assert call("POST", f"{url}/backlogQuota?backlogQuotaType=message_age", age).status == 204
    assert set(call("GET", f"{url}/backlogQuotaMap").json) == {"destination_storage", "message_age"}
    assert call("POST", f"{url}/backlogQuota?backlogQuotaType=size", quota).status == 400
    assert call("DELETE", f"{url}/backlogQuota?backlogQuotaType=message_age").status == 204
    assert call("DELETE", f"{url}/backlogQuota").status == 204
    assert call("GET", f"{url}/backlogQuotaMap").json == {}
    # The namespace's quota bounds a topic retention too.
    assert call("DELETE", f"{url}/retention").status == 204
    assert call("POST", f"{base}/namespaces/{ns}/backlogQuota", {"limitSize": 50 * MB}).status == 204
    assert call("POST", f"{url}/retention", {"retentionTimeInMinutes": -1, "retentionSizeInMB": 10}).status == 412


# ---------------------------------------------------------------------------------------- PolicyStore
@pytest.fixture
async def store() -> AsyncIterator[EmbeddedMetadataStore]:
    s = EmbeddedMetadataStore(":memory:")
    await s.start()
    await initialize_standalone(Resources(s), "standalone", "pulsar://localhost:6650", "http://localhost:8080")
    yield s
    await s.close()


TOPIC = TopicName.parse("persistent://public/default/orders")


async def test_effective_defaults_come_from_the_broker_config(store: EmbeddedMetadataStore) -> None:
    config = BrokerConfig(default_retention_time_in_minutes=5, max_producers_per_topic=9)
    config.apply(
        {"maxConsumersPerTopic": "4", "brokerDeduplicationEnabled": "true", "ttlDurationDefaultInSeconds": "7"}
    )
    eff = await PolicyStore(store, config).effective(TOPIC)
    assert eff.retention_time_minutes == 5 and eff.retention_size_mb == 0
    assert eff.max_producers_per_topic == 9 and eff.max_consumers_per_topic == 4
    assert eff.deduplication_enabled is True and eff.message_ttl_seconds == 7
    assert eff.backlog_quota_size is None and eff.backlog_quota_time is None
    assert eff.allow_auto_topic_creation is True and eff.auto_topic_creation_type == "non-partitioned"
    assert eff.delayed_delivery_enabled is True and eff.delayed_delivery_tick_ms == 1000
    assert (eff.ensemble_size, eff.write_quorum, eff.ack_quorum) == (1, 1, 1)
    assert eff.schema_compatibility_strategy == "FULL"
    assert eff.inactive_topic_delete_mode == "delete_when_no_subscriptions"
    assert eff.max_unacked_messages_per_consumer == 50_000


async def test_topic_overrides_namespace_overrides_config(store: EmbeddedMetadataStore) -> None:
    policies = PolicyStore(store, BrokerConfig())

    def ns_mutation(p: Policies) -> None:
        p.retention_policies = RetentionPolicies(retentionTimeInMinutes=10, retentionSizeInMB=100)
        p.message_ttl_in_seconds = 60
        p.max_producers_per_topic = 2
        p.backlog_quota_map["destination_storage"] = BacklogQuota(limitSize=MB, policy="producer_exception")
        p.schema_auto_update_compatibility_strategy = "Backward"

    await policies.update_namespace("public/default", ns_mutation)
    eff = await policies.effective(TOPIC)
    assert (eff.retention_time_minutes, eff.retention_size_mb, eff.message_ttl_seconds) == (10, 100, 60)
    assert eff.max_producers_per_topic == 2
    assert eff.backlog_quota_size is not None and eff.backlog_quota_size.limitSize == MB
    assert eff.schema_compatibility_strategy == "BACKWARD"

    def topic_mutation(tp: TopicPolicies) -> None:
        tp.messageTTLInSeconds = 5
        tp.maxProducerPerTopic = 0
        tp.schemaCompatibilityStrategy = "FORWARD"

    await policies.update_topic(TOPIC, topic_mutation)
    eff = await policies.effective(TOPIC.partition(3))  # partitions share their topic's policies
    assert eff.message_ttl_seconds == 5 and eff.max_producers_per_topic == 0
    assert eff.retention_time_minutes == 10 and eff.schema_compatibility_strategy == "FORWARD"

    await policies.update_topic(TOPIC, lambda tp: setattr(tp, "messageTTLInSeconds", None))
    assert (await policies.topic(TOPIC)).messageTTLInSeconds is None  # type: ignore[union-attr]
    await policies.delete_topic_policies(TOPIC)
    assert await policies.topic(TOPIC) is None
    assert (await policies.effective(TOPIC)).message_ttl_seconds == 60


async def test_empty_topic_policies_are_removed(store: EmbeddedMetadataStore) -> None:
    policies = PolicyStore(store, BrokerConfig())
    await policies.update_topic(TOPIC, lambda tp: setattr(tp, "maxConsumerPerTopic", 3))
    path = "/admin/topic-policies/public/default/persistent/orders"
    assert json.loads((await store.get(path)).data) == {"backLogQuotaMap": {}, "maxConsumerPerTopic": 3}  # type: ignore[union-attr]
    await policies.update_topic(TOPIC, lambda tp: setattr(tp, "maxConsumerPerTopic", None))
    assert await store.get(path) is None


async def test_update_of_missing_namespace_is_404(store: EmbeddedMetadataStore) -> None:
    policies = PolicyStore(store, BrokerConfig())
    with pytest.raises(NamespaceNotFoundError) as info:
        await policies.update_namespace("public/missing", lambda p: None)
    assert info.value.http_status == 404
    assert await policies.namespace("public/missing") is None


async def test_concurrent_updates_are_not_lost(store: EmbeddedMetadataStore) -> None:
    # Two brokers (two stores' worth of caches) bumping one counter concurrently: CAS keeps every increment.
    a, b = PolicyStore(store, BrokerConfig()), PolicyStore(store, BrokerConfig())

    def bump(p: Policies) -> None:
        p.max_producers_per_topic = (p.max_producers_per_topic or 0) + 1

    await asyncio.gather(*(s.update_namespace("public/default", bump) for s in [a, b] * 10))
    assert (await a.namespace("public/default")).max_producers_per_topic == 20  # type: ignore[union-attr]
    assert (await b.namespace("public/default")).max_producers_per_topic == 20  # type: ignore[union-attr]


async def test_watches_invalidate_caches_and_notify_listeners(store: EmbeddedMetadataStore) -> None:
    reader, writer = PolicyStore(store, BrokerConfig()), PolicyStore(store, BrokerConfig())
    seen: list[str] = []
    reader.add_listener(seen.append)
    assert (await reader.effective(TOPIC)).message_ttl_seconds == 0  # now cached
    await writer.update_namespace("public/default", lambda p: setattr(p, "message_ttl_in_seconds", 33))
    assert (await reader.effective(TOPIC)).message_ttl_seconds == 33
    await writer.update_topic(TOPIC, lambda tp: setattr(tp, "messageTTLInSeconds", 44))
    assert (await reader.effective(TOPIC)).message_ttl_seconds == 44
    assert seen == ["public/default", str(TOPIC)]
    # A direct store write (e.g. another broker's admin call) is seen too; a tenant change is not a namespace.
    await store.put("/admin/policies/public", b'{"adminRoles":[],"allowedClusters":["standalone"]}')
    assert seen == ["public/default", str(TOPIC)]
    reader.close()
    await writer.update_namespace("public/default", lambda p: setattr(p, "message_ttl_in_seconds", 1))
    assert len(seen) == 2


async def test_returned_policies_are_private_copies(store: EmbeddedMetadataStore) -> None:
    policies = PolicyStore(store, BrokerConfig())
    first = await policies.namespace("public/default")
    assert first is not None
    first.message_ttl_in_seconds = 999
    assert (await policies.namespace("public/default")).message_ttl_in_seconds is None  # type: ignore[union-attr]


def test_stored_documents_from_newer_versions_still_parse() -> None:
    data = {"replication_clusters": ["a"], "future_field": 1, "retention_policies": {"retentionTimeInMinutes": 1,
            "retentionSizeInMB": 2, "futureNested": True}}  # fmt: skip
    parsed = parse_stored(Policies, data)
    assert parsed.replication_clusters == ["a"] and parsed.retention_policies.retentionSizeInMB == 2  # type: ignore[union-attr]


def test_resolve_auto_topic_creation_override() -> None:
    ns = Policies.model_validate(
        {"autoTopicCreationOverride": {"allowAutoTopicCreation": True, "topicType": "partitioned",
                                       "defaultNumPartitions": 4}}
    )  # fmt: skip
    eff = resolve(BrokerConfig(), ns, None)
    assert (eff.allow_auto_topic_creation, eff.auto_topic_creation_type, eff.default_num_partitions) == (
        True,
        "partitioned",
        4,
    )
    off = resolve(BrokerConfig(), Policies.model_validate({"autoTopicCreationOverride": {}}), None)
    assert off.allow_auto_topic_creation is False and off.auto_topic_creation_type == "non-partitioned"


# ---------------------------------------------------------------------------------------- validation
def test_validation_raises_the_domain_error_with_pulsars_status() -> None:
    config = BrokerConfig()
    with pytest.raises(PolicyValidationError, match="size limit must be >= -1") as info:
        validate_retention(RetentionPolicies(retentionTimeInMinutes=1, retentionSizeInMB=-2))
    assert info.value.http_status == 400
    with pytest.raises(PolicyValidationError, match="Bookkeeper-Ensemble must be <= 5") as info:
        validate_persistence(PersistencePolicies(bookkeeperEnsemble=6), config)
    assert info.value.http_status == 400
    with pytest.raises(PolicyValidationError, match="Invalid value for message TTL") as info:
        validate_namespace_policies(Policies(message_ttl_in_seconds=-1), config)
    assert info.value.http_status == 412


def test_policies_package_does_not_import_the_http_layer() -> None:
    code = (
        "import sys, magnetar.broker.policies; "
        "print(sorted(m for m in sys.modules if m.startswith(('magnetar.broker.admin', 'aiohttp'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"
