"""``/admin/v2/namespaces`` over real HTTP against the session's standalone broker: lifecycle, topic
listing and every namespace policy endpoint, success and error paths."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest

from tests.admin.rest import call
from tests.conftest import StandaloneProcess

MB = 1024 * 1024


@pytest.fixture
def base(standalone: StandaloneProcess) -> str:
    return f"{standalone.http_url}/admin/v2"


@pytest.fixture
def tenant(base: str) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:8]}"
    assert call("PUT", f"{base}/tenants/{name}", {"allowedClusters": ["standalone"]}).status == 204
    yield name
    call("DELETE", f"{base}/tenants/{name}?force=true")


@pytest.fixture
def ns(base: str, tenant: str) -> str:
    """A fresh namespace: ``tenant/ns``."""
    assert call("PUT", f"{base}/namespaces/{tenant}/ns").status == 204
    return f"{tenant}/ns"


@pytest.fixture
def url(base: str, ns: str) -> str:
    return f"{base}/namespaces/{ns}"


# ---------------------------------------------------------------------------------------- lifecycle
def test_list_namespaces(base: str, tenant: str) -> None:
    assert call("GET", f"{base}/namespaces/{tenant}").json == []
    for name in ("b", "a"):
        assert call("PUT", f"{base}/namespaces/{tenant}/{name}").status == 204
    assert call("GET", f"{base}/namespaces/{tenant}").json == [f"{tenant}/a", f"{tenant}/b"]
    assert "public/default" in call("GET", f"{base}/namespaces/public").json
    missing = call("GET", f"{base}/namespaces/no-such-tenant")
    assert missing.status == 404 and missing.reason == "Tenant not found"
    bad = call("GET", f"{base}/namespaces/bad$tenant")
    assert bad.status == 412 and bad.reason == "Tenant name is not valid"


def test_default_policies_document(url: str) -> None:
    got = call("GET", url)
    assert got.status == 200
    doc = got.json
    assert doc["replication_clusters"] == ["standalone"]
    assert doc["bundles"] == {"boundaries": ["0x00000000", "0xffffffff"], "numBundles": 1}
    assert doc["auth_policies"] == {"namespace_auth": {}, "destination_auth": {}, "subscription_auth_roles": {}}
    assert doc["backlog_quota_map"] == {} and doc["deleted"] is False
    assert doc["schema_compatibility_strategy"] == "UNDEFINED" and doc["subscription_auth_mode"] == "None"
    assert doc["offload_threshold"] == -1 and doc["is_allow_auto_update_schema"] is True
    # Unset policies are omitted (Pulsar's NON_NULL serialisation).
    assert "retention_policies" not in doc and "message_ttl_in_seconds" not in doc


def test_create_with_policies(base: str, tenant: str) -> None:
    body = {
        "retention_policies": {"retentionTimeInMinutes": 60, "retentionSizeInMB": 100},
        "message_ttl_in_seconds": 30,
        "bundles": {"numBundles": 4},
        "deduplicationEnabled": True,
        "properties": {"team": "a"},
    }
    assert call("PUT", f"{base}/namespaces/{tenant}/p", body).status == 204
    doc = call("GET", f"{base}/namespaces/{tenant}/p").json
    assert doc["retention_policies"] == {"retentionTimeInMinutes": 60, "retentionSizeInMB": 100}
    assert doc["message_ttl_in_seconds"] == 30 and doc["deduplicationEnabled"] is True
    assert doc["bundles"] == {
        "boundaries": ["0x00000000", "0x40000000", "0x80000000", "0xc0000000", "0xffffffff"],
        "numBundles": 4,
    }
    assert doc["properties"] == {"team": "a"}


def test_create_accepts_a_full_pulsar_policies_document(base: str, tenant: str, url: str) -> None:
    # What Pulsar's own clients send: a complete Policies JSON (e.g. read back from another namespace).
    doc = call("GET", url).json
    assert call("PUT", f"{base}/namespaces/{tenant}/copy", doc).status == 204
    assert call("GET", f"{base}/namespaces/{tenant}/copy").json == doc


def test_create_accepts_the_go_admin_clients_document(base: str, tenant: str) -> None:
    # pulsar-client-go (pulsarctl, the Terraform provider) serialises every field: nulls, "" enums and
    # antiAffinityGroup, which Pulsar ignores.
    body = {
        "bundles": None, "persistence": None, "retention_policies": None, "schema_validation_enforced": False,
        "deduplicationEnabled": None, "deleted": False, "encryption_required": False,
        "message_ttl_in_seconds": 45, "max_producers_per_topic": None, "compaction_threshold": None,
        "offload_threshold": -1, "offload_deletion_lag_ms": None, "antiAffinityGroup": "",
        "replication_clusters": None, "latency_stats_sample_rate": {}, "backlog_quota_map": {},
        "topicDispatchRate": {}, "publishMaxMessageRate": {}, "clusterSubscribeRate": {},
        "autoTopicCreationOverride": None, "schema_auto_update_compatibility_strategy": "Full",
        "schema_compatibility_strategy": "", "subscription_auth_mode": "None", "is_allow_auto_update_schema": None,
        "auth_policies": {"namespace_auth": None, "destination_auth": None, "subscription_auth_roles": None},
    }  # fmt: skip
    assert call("PUT", f"{base}/namespaces/{tenant}/go", body).status == 204
    doc = call("GET", f"{base}/namespaces/{tenant}/go").json
    assert doc["message_ttl_in_seconds"] == 45 and doc["replication_clusters"] == ["standalone"]
    assert doc["schema_compatibility_strategy"] == "UNDEFINED" and "antiAffinityGroup" not in doc


def test_create_errors(base: str, tenant: str, ns: str) -> None:
    again = call("PUT", f"{base}/namespaces/{ns}")
    assert again.status == 409 and again.reason == "Namespace already exists"
    no_tenant = call("PUT", f"{base}/namespaces/no-such-tenant/x")
    assert no_tenant.status == 404 and no_tenant.reason == "Tenant does not exist"
    for name in ("a$b", "a%20b", "a%2Fb"):
        bad = call("PUT", f"{base}/namespaces/{tenant}/{name}")
        assert bad.status == 412 and bad.reason == "Namespace name is not valid", name
    not_allowed = call("PUT", f"{base}/namespaces/{tenant}/y", {"replication_clusters": ["other"]})
    assert not_allowed.status == 403
    assert not_allowed.reason == f"Cluster [other] is not in the list of allowed clusters list for tenant [{tenant}]"
    ttl = call("PUT", f"{base}/namespaces/{tenant}/y", {"message_ttl_in_seconds": -1})
    assert ttl.status == 412 and ttl.reason == "Invalid value for message TTL"
    for raw in (b"{", b'{"nope": 1}', b'{"message_ttl_in_seconds": "5"}', b"[1]", b'{"retention_policies": 3}'):
        assert call("PUT", f"{base}/namespaces/{tenant}/y", raw=raw).status == 400, raw
    retention = call("PUT", f"{base}/namespaces/{tenant}/y", {"retention_policies": {"retentionTimeInMinutes": 5}})
    assert retention.status == 400 and retention.reason.startswith("Invalid retention policy")
    persistence = call("PUT", f"{base}/namespaces/{tenant}/y", {"persistence": {"bookkeeperEnsemble": 0}})
    assert persistence.status == 400 and persistence.reason == "Bookkeeper-Ensemble must be <= 5 and > 0."
    bundles = call(
        "PUT", f"{base}/namespaces/{tenant}/y", {"bundles": {"boundaries": ["0x10", "0xffffffff"], "numBundles": 1}}
    )
    assert bundles.status == 400 and "do not cover the whole hash range" in bundles.reason
    assert call("GET", f"{base}/namespaces/{tenant}/y").status == 404


def test_missing_namespace(base: str, tenant: str) -> None:
    url = f"{base}/namespaces/{tenant}/missing"
    for method, path, body in [
        ("GET", "", None),
        ("GET", "/retention", None),
        ("POST", "/messageTTL", 5),
        ("DELETE", "/messageTTL", None),
        ("GET", "/backlogQuotaMap", None),
        ("POST", "/retention", {"retentionTimeInMinutes": 1, "retentionSizeInMB": 1}),
        ("GET", "/topics", None),
    ]:
        reply = call(method, url + path, body)
        assert reply.status == 404 and reply.reason == "Namespace does not exist", (method, path)
    gone = call("DELETE", url)
    assert gone.status == 404 and gone.reason == f"Namespace {tenant}/missing does not exist."


# ---------------------------------------------------------------------------------------- topics and deletion
def test_list_topics_modes_and_system_topics(base: str, ns: str, url: str) -> None:
    assert call("GET", f"{url}/topics").json == []
    for topic in ("a", "b"):
        assert call("PUT", f"{base}/persistent/{ns}/{topic}").status == 204
    refused = call("PUT", f"{base}/persistent/{ns}/__change_events")  # system topics are the broker's
    assert refused.status == 400 and refused.reason == "Cannot create topic in system topic format!"
    # A topic-policy change makes the broker write its event to the namespace's __change_events.
    assert call("POST", f"{base}/persistent/{ns}/a/messageTTL?messageTTL=60").status == 204
    for _ in range(100):
        listed = call("GET", f"{url}/topics?includeSystemTopic=true").json
        if f"persistent://{ns}/__change_events" in listed:
            break
        time.sleep(0.05)
    expected = [f"persistent://{ns}/a", f"persistent://{ns}/b"]
    assert call("GET", f"{url}/topics").json == expected
    assert call("GET", f"{url}/topics?mode=ALL").json == expected
    assert call("GET", f"{url}/topics?mode=NON_PERSISTENT").json == []
    with_system = call("GET", f"{url}/topics?mode=PERSISTENT&includeSystemTopic=true").json
    assert with_system == sorted([*expected, f"persistent://{ns}/__change_events"])
    assert call("GET", f"{url}/topics?mode=SOME").status == 400
    assert call("GET", f"{url}/topics?includeSystemTopic=maybe").status == 400


def test_delete_refused_while_topics_exist_unless_forced(base: str, ns: str, url: str) -> None:
    assert call("PUT", f"{base}/persistent/{ns}/plain").status == 204
    assert call("PUT", f"{base}/persistent/{ns}/parted/partitions", 3).status == 204
    assert call("POST", f"{url}/retention", {"retentionTimeInMinutes": 1, "retentionSizeInMB": 1}).status == 204
    refused = call("DELETE", url)
    assert refused.status == 409 and refused.reason == "Cannot delete non empty namespace"
    assert call("GET", url).status == 200
    assert call("DELETE", f"{url}?force=true").status == 204
    assert call("GET", url).status == 404
    assert ns not in call("GET", f"{base}/namespaces/{ns.split('/')[0]}").json
    # Recreated, it starts empty: no topics, no partitioned topics, no policies.
    assert call("PUT", url).status == 204
    assert call("GET", f"{url}/topics?mode=ALL").json == []
    assert call("GET", f"{base}/persistent/{ns}/partitioned").json == []
    assert call("GET", f"{url}/retention").status == 204


def test_delete_empty_namespace_and_system_topics_only(base: str, ns: str, url: str) -> None:
    assert call("PUT", f"{base}/persistent/{ns}/a").status == 204
    assert call("POST", f"{base}/persistent/{ns}/a/messageTTL?messageTTL=60").status == 204  # -> __change_events
    for _ in range(100):
        if f"persistent://{ns}/__change_events" in call("GET", f"{url}/topics?includeSystemTopic=true").json:
            break
        time.sleep(0.05)
    assert call("DELETE", f"{base}/persistent/{ns}/a").status == 204
    assert call("GET", f"{url}/topics?includeSystemTopic=true").json == [f"persistent://{ns}/__change_events"]
    assert call("DELETE", url).status == 204
    assert call("GET", url).status == 404
    assert call("DELETE", f"{url}?force=oops").status in (400, 404)


# ---------------------------------------------------------------------------------------- scalar policies
SCALARS = [
    ("messageTTL", "message_ttl_in_seconds", 120, "Invalid value for message TTL, message TTL must >= 0"),
    ("subscriptionExpirationTime", "subscription_expiration_time_minutes", 30,
     "Invalid value for subscription expiration time"),
    ("maxProducersPerTopic", "max_producers_per_topic", 3, "maxProducersPerTopic must be 0 or more"),
    ("maxConsumersPerTopic", "max_consumers_per_topic", 4, "maxConsumersPerTopic must be 0 or more"),
    ("maxConsumersPerSubscription", "max_consumers_per_subscription", 2,
     "maxConsumersPerSubscription must be 0 or more"),
    ("maxUnackedMessagesPerConsumer", "max_unacked_messages_per_consumer", 10,
     "maxUnackedMessagesPerConsumer must be 0 or more"),
    ("maxUnackedMessagesPerSubscription", "max_unacked_messages_per_subscription", 20,
     "maxUnackedMessagesPerSubscription must be 0 or more"),
    ("maxSubscriptionsPerTopic", "max_subscriptions_per_topic", 5, "maxSubscriptionsPerTopic must be 0 or more"),
]  # fmt: skip


@pytest.mark.parametrize(("segment", "field", "value", "negative_reason"), SCALARS)
def test_integer_policy(url: str, segment: str, field: str, value: int, negative_reason: str) -> None:
    assert call("GET", f"{url}/{segment}").status == 204
    assert call("POST", f"{url}/{segment}", value).status == 204
    got = call("GET", f"{url}/{segment}")
    assert got.status == 200 and got.json == value
    assert call("GET", url).json[field] == value
    negative = call("POST", f"{url}/{segment}", -1)
    assert negative.status == 412 and negative.reason == negative_reason
    for raw in (b"", b'"5"', b"true", b"1.5", b"{}", b"null", b"2147483648", b"x"):
        assert call("POST", f"{url}/{segment}", raw=raw).status == 400, raw
    assert call("GET", f"{url}/{segment}").json == value
    assert call("DELETE", f"{url}/{segment}").status == 204
    assert call("GET", f"{url}/{segment}").status == 204
    assert field not in call("GET", url).json


def test_deduplication(url: str) -> None:
    assert call("GET", f"{url}/deduplication").status == 204
    assert call("POST", f"{url}/deduplication", True).status == 204
    assert call("GET", f"{url}/deduplication").json is True
    assert call("POST", f"{url}/deduplication", False).status == 204
    assert call("GET", f"{url}/deduplication").json is False
    for raw in (b"1", b'"true"', b""):
        assert call("POST", f"{url}/deduplication", raw=raw).status == 400
    assert call("DELETE", f"{url}/deduplication").status == 204
    assert call("GET", f"{url}/deduplication").status == 204


# ---------------------------------------------------------------------------------------- structured policies
OBJECTS = [
    ("retention", "retention_policies", {"retentionTimeInMinutes": -1, "retentionSizeInMB": 1024}),
    ("persistence", "persistence",
     {"bookkeeperEnsemble": 3, "bookkeeperWriteQuorum": 2, "bookkeeperAckQuorum": 2,
      "managedLedgerMaxMarkDeleteRate": 1.5}),
    ("autoTopicCreation", "autoTopicCreationOverride",
     {"allowAutoTopicCreation": True, "topicType": "partitioned", "defaultNumPartitions": 2}),
    ("autoSubscriptionCreation", "autoSubscriptionCreationOverride", {"allowAutoSubscriptionCreation": False}),
    ("delayedDelivery", "delayed_delivery_policies", {"tickTime": 500, "active": True, "maxDeliveryDelayInMillis": 0}),
    ("inactiveTopicPolicies", "inactive_topic_policies",
     {"inactiveTopicDeleteMode": "delete_when_subscriptions_caught_up", "maxInactiveDurationSeconds": 60,
      "deleteWhileInactive": True}),
]  # fmt: skip


@pytest.mark.parametrize(("segment", "field", "value"), OBJECTS)
def test_structured_policy(url: str, segment: str, field: str, value: dict) -> None:
    assert call("GET", f"{url}/{segment}").status == 204
    assert call("POST", f"{url}/{segment}", value).status == 204
    got = call("GET", f"{url}/{segment}")
    assert got.status == 200 and got.json == value
    assert call("GET", url).json[field] == value
    for raw in (b"", b"{", b'{"unknown": 1}', b"[]", b"5"):
        bad = call("POST", f"{url}/{segment}", raw=raw)
        assert bad.status == 400 and bad.reason, raw
    assert call("DELETE", f"{url}/{segment}").status == 204
    assert call("GET", f"{url}/{segment}").status == 204


@pytest.mark.parametrize(
    ("segment", "body"),
    [
        ("retention", {"retentionTimeInMinutes": "60"}),
        ("persistence", {"bookkeeperEnsemble": 2.5}),
        ("autoTopicCreation", {"allowAutoTopicCreation": "yes"}),
        ("delayedDelivery", {"tickTime": 1e30}),
        ("inactiveTopicPolicies", {"inactiveTopicDeleteMode": "sometimes"}),
        ("autoSubscriptionCreation", {"allowAutoSubscriptionCreation": "false"}),
        ("persistence", {"managedLedgerMaxMarkDeleteRate": float("nan")}),
    ],
)
def test_structured_policy_wrong_types(url: str, segment: str, body: dict) -> None:
    reply = call("POST", f"{url}/{segment}", body)
    assert reply.status == 400 and reply.reason.startswith("Invalid request body")


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ({"retentionTimeInMinutes": -2, "retentionSizeInMB": 1}, "Invalid retention policy: time limit must be >= -1"),
        ({"retentionTimeInMinutes": 1, "retentionSizeInMB": -5}, "Invalid retention policy: size limit must be >= -1"),
        ({"retentionTimeInMinutes": 0, "retentionSizeInMB": 10}, "Invalid retention policy: Setting a single time"),
    ],
)
def test_retention_validation(url: str, body: dict, reason: str) -> None:
    reply = call("POST", f"{url}/retention", body)
    assert reply.status == 400 and reply.reason.startswith(reason)


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ({"bookkeeperEnsemble": 1, "bookkeeperWriteQuorum": 2, "bookkeeperAckQuorum": 1},
         "Bookkeeper Ensemble (1) >= WriteQuorum (2) >= AckQuorum (1)"),
        ({"bookkeeperEnsemble": 2, "bookkeeperWriteQuorum": 1, "bookkeeperAckQuorum": 2},
         "Bookkeeper Ensemble (2) >= WriteQuorum (1) >= AckQuorum (2)"),
        ({"bookkeeperEnsemble": 6, "bookkeeperWriteQuorum": 1, "bookkeeperAckQuorum": 1},
         "Bookkeeper-Ensemble must be <= 5 and > 0."),
        ({"bookkeeperEnsemble": 1, "bookkeeperWriteQuorum": 0, "bookkeeperAckQuorum": 1},
         "Bookkeeper-WriteQuorum must be <= 5 and > 0."),
        ({"bookkeeperEnsemble": 1, "bookkeeperWriteQuorum": 1, "bookkeeperAckQuorum": 0},
         "Bookkeeper-AckQuorum must be <= 5 and > 0."),
    ],
)  # fmt: skip
def test_persistence_validation(url: str, body: dict, reason: str) -> None:
    reply = call("POST", f"{url}/persistence", body)
    assert reply.status == 400 and reply.reason == reason
    assert call("GET", f"{url}/persistence").status == 204


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        ({"allowAutoTopicCreation": True, "topicType": "sharded"}, "Unknown topic type [sharded]"),
        ({"allowAutoTopicCreation": True}, "Unknown topic type [None]"),
        ({"allowAutoTopicCreation": True, "topicType": "partitioned"},
         "[defaultNumPartitions] cannot be null when the type is partitioned."),
        ({"allowAutoTopicCreation": True, "topicType": "partitioned", "defaultNumPartitions": 0},
         "[defaultNumPartitions] cannot be less than 1 for partition type."),
        ({"allowAutoTopicCreation": True, "topicType": "non-partitioned", "defaultNumPartitions": 2},
         "[defaultNumPartitions] is not allowed to be set when the type is non-partition."),
    ],
)  # fmt: skip
def test_auto_topic_creation_validation(url: str, body: dict, detail: str) -> None:
    reply = call("POST", f"{url}/autoTopicCreation", body)
    assert reply.status == 412
    assert reply.reason == f"Invalid configuration for autoTopicCreationOverride. the detail is {detail}"


def test_auto_topic_creation_disabled_needs_no_type(url: str) -> None:
    assert call("POST", f"{url}/autoTopicCreation", {"allowAutoTopicCreation": False}).status == 204
    assert call("GET", f"{url}/autoTopicCreation").json == {"allowAutoTopicCreation": False}


# ---------------------------------------------------------------------------------------- backlog quotas
def test_backlog_quotas(url: str) -> None:
    assert call("GET", f"{url}/backlogQuotaMap").json == {}
    size = {"limitSize": 100 * MB, "policy": "producer_request_hold"}
    assert call("POST", f"{url}/backlogQuota", size).status == 204
    age = {"limitTime": 3600, "policy": "consumer_backlog_eviction"}
    assert call("POST", f"{url}/backlogQuota?backlogQuotaType=message_age", age).status == 204
    assert call("GET", f"{url}/backlogQuotaMap").json == {
        "destination_storage": {"limit": 100 * MB, "limitSize": 100 * MB, "limitTime": 0,
                                "policy": "producer_request_hold"},
        "message_age": {"limit": 0, "limitSize": 0, "limitTime": 3600, "policy": "consumer_backlog_eviction"},
    }  # fmt: skip
    # The deprecated "limit" is an alias of limitSize.
    assert call("POST", f"{url}/backlogQuota", {"limit": 5 * MB, "policy": "producer_exception"}).status == 204
    assert call("GET", f"{url}/backlogQuotaMap").json["destination_storage"]["limitSize"] == 5 * MB
    assert call("DELETE", f"{url}/backlogQuota?backlogQuotaType=message_age").status == 204
    assert list(call("GET", f"{url}/backlogQuotaMap").json) == ["destination_storage"]
    assert call("DELETE", f"{url}/backlogQuota").status == 204
    assert call("GET", f"{url}/backlogQuotaMap").json == {}


def test_backlog_quota_with_empty_policy(url: str) -> None:
    assert call("POST", f"{url}/backlogQuota", {"limitSize": 1, "limitTime": 0, "policy": ""}).status == 204
    assert call("GET", f"{url}/backlogQuotaMap").json == {
        "destination_storage": {"limit": 1, "limitSize": 1, "limitTime": 0}
    }


def test_backlog_quota_errors(url: str) -> None:
    bad_type = call("POST", f"{url}/backlogQuota?backlogQuotaType=bogus", {"limitSize": 1})
    assert bad_type.status == 400 and "backlogQuotaType" in bad_type.reason
    assert call("DELETE", f"{url}/backlogQuota?backlogQuotaType=bogus").status == 400
    for body in ({"policy": "drop_everything"}, {"limitSize": "1"}, {"limitTime": 2**40}, {"extra": 1}):
        assert call("POST", f"{url}/backlogQuota", body).status == 400, body
    assert call("POST", f"{url}/backlogQuota", raw=b"").status == 400


def test_retention_and_backlog_quota_must_agree(url: str) -> None:
    assert call("POST", f"{url}/backlogQuota", {"limitSize": 100 * MB, "policy": "producer_request_hold"}).status == 204
    too_small = call("POST", f"{url}/retention", {"retentionTimeInMinutes": -1, "retentionSizeInMB": 50})
    assert too_small.status == 412
    assert too_small.reason == "Retention Quota must exceed configured backlog quota for namespace."
    assert call("GET", f"{url}/retention").status == 204
    assert call("POST", f"{url}/retention", {"retentionTimeInMinutes": -1, "retentionSizeInMB": 1024}).status == 204
    too_big = call("POST", f"{url}/backlogQuota", {"limitSize": 2048 * MB, "policy": "producer_request_hold"})
    assert too_big.status == 412
    assert too_big.reason == (
        "Backlog Quota exceeds configured retention quota for namespace. Please increase retention quota and retry"
    )
    assert call("GET", f"{url}/backlogQuotaMap").json["destination_storage"]["limitSize"] == 100 * MB
    # Time: a storage quota's limitTime must stay under the retention time.
    assert call("POST", f"{url}/retention", {"retentionTimeInMinutes": 10, "retentionSizeInMB": -1}).status == 204
    too_long = call("POST", f"{url}/backlogQuota", {"limitTime": 600, "policy": "producer_request_hold"})
    assert too_long.status == 412
    assert call("POST", f"{url}/backlogQuota", {"limitTime": 599, "policy": "producer_request_hold"}).status == 204


# ---------------------------------------------------------------------------------------- schema compatibility
def test_schema_compatibility_strategy(url: str) -> None:
    assert call("GET", f"{url}/schemaCompatibilityStrategy").json == "UNDEFINED"
    assert call("PUT", f"{url}/schemaCompatibilityStrategy", "BACKWARD_TRANSITIVE").status == 204
    assert call("GET", f"{url}/schemaCompatibilityStrategy").json == "BACKWARD_TRANSITIVE"
    assert call("GET", url).json["schema_compatibility_strategy"] == "BACKWARD_TRANSITIVE"
    for raw in (b'"SOMETIMES"', b"3", b"", b'"backward"'):
        assert call("PUT", f"{url}/schemaCompatibilityStrategy", raw=raw).status == 400, raw
    assert call("GET", f"{url}/schemaCompatibilityStrategy").json == "BACKWARD_TRANSITIVE"


def test_openapi_documents_namespace_operations(base: str) -> None:
    doc = call("GET", f"{base}/openapi.json").json
    paths = doc["paths"]
    assert set(paths["/admin/v2/namespaces/{tenant}/{namespace}"]) == {"get", "put", "delete"}
    assert set(paths["/admin/v2/namespaces/{tenant}/{namespace}/retention"]) == {"get", "post", "delete"}
    assert set(paths["/admin/v2/namespaces/{tenant}/{namespace}/schemaCompatibilityStrategy"]) == {"get", "put"}
    post_quota = paths["/admin/v2/namespaces/{tenant}/{namespace}/backlogQuota"]["post"]
    assert any(p["name"] == "backlogQuotaType" and p["in"] == "query" for p in post_quota["parameters"])
    assert "requestBody" in post_quota
