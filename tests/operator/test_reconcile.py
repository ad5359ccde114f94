"""Unit tests of the pure reconciliation logic: policy mapping and plans, status conditions, ownership,
topic actions, backoff and Events. No Kubernetes, no broker."""

from __future__ import annotations

from magnetar.operator import reconcile as rc
from magnetar.operator.config import OperatorConfig
from magnetar.operator.engine import Resource, claim_keys, events_for, make_claim, target_url
from magnetar.operator.policies import desired_policies, matches, namespace_observed, order_writes, plan_writes
from magnetar.operator.specs import (
    Policies,
    RetentionPolicySpec,
    TopicNamespaceSpec,
    TopicSpec,
    parse_spec,
    pulsar_name,
)


def test_desired_policies_map_spec_to_admin_json() -> None:
    policies = Policies.model_validate(
        {
            "retention": {"timeInMinutes": 60, "sizeInMB": 100},
            "messageTTLSeconds": 30,
            "backlogQuota": {"limitSizeBytes": 1000, "limitTimeSeconds": 120, "policy": "producer_exception"},
            "deduplication": True,
            "persistence": {"ensembleSize": 3, "writeQuorum": 2, "ackQuorum": 2},
            "delayedDelivery": {"enabled": True, "tickTimeMillis": 500},
            "maxProducers": 4,
            "maxConsumers": 5,
            "schemaCompatibilityStrategy": "FULL",
            "autoTopicCreation": {"allow": True, "type": "partitioned", "defaultNumPartitions": 2},
        }
    )
    assert desired_policies(policies) == {
        "retention": {"retentionTimeInMinutes": 60, "retentionSizeInMB": 100},
        "messageTTL": 30,
        "backlogQuota.destination_storage": {"limitSize": 1000, "policy": "producer_exception"},
        "backlogQuota.message_age": {"limitTime": 120, "policy": "producer_exception"},
        "deduplication": True,
        "persistence": {"bookkeeperEnsemble": 3, "bookkeeperWriteQuorum": 2, "bookkeeperAckQuorum": 2},
        "delayedDelivery": {"active": True, "tickTime": 500},
        "maxProducers": 4,
        "maxConsumers": 5,
        "schemaCompatibilityStrategy": "FULL",
        "autoTopicCreation": {"allowAutoTopicCreation": True, "topicType": "partitioned", "defaultNumPartitions": 2},
    }


def test_absent_fields_are_unmanaged_and_a_retention_policy_supplies_its_three() -> None:
    assert desired_policies(Policies()) == {}
    shared = RetentionPolicySpec.model_validate({"messageTTLSeconds": 9})
    inline = Policies.model_validate({"maxProducers": 1, "messageTTLSeconds": 1})
    # The policy replaces the inline retention fields (the CRD forbids both together anyway).
    assert desired_policies(inline, shared) == {"messageTTL": 9, "maxProducers": 1}


def test_matches_compares_only_managed_sub_fields() -> None:
    desired = {"bookkeeperEnsemble": 2, "bookkeeperWriteQuorum": 2, "bookkeeperAckQuorum": 1}
    observed = {**desired, "managedLedgerMaxMarkDeleteRate": 7.5}
    assert matches(desired, observed)
    assert not matches(desired, {**observed, "bookkeeperAckQuorum": 2})
    assert not matches(desired, None)
    assert not matches(True, 1)  # a bool is not an int
    assert matches(1.0, 1.0000000001)


def test_plan_writes_only_differences_and_merges_unmanaged_sub_fields() -> None:
    desired = {
        "maxProducers": 3,
        "persistence": {"bookkeeperEnsemble": 2, "bookkeeperWriteQuorum": 2, "bookkeeperAckQuorum": 2},
    }
    observed = {
        "maxProducers": 3,
        "persistence": {
            "bookkeeperEnsemble": 1,
            "bookkeeperWriteQuorum": 1,
            "bookkeeperAckQuorum": 1,
            "managedLedgerMaxMarkDeleteRate": 5.0,
        },
    }
    writes = plan_writes(desired, observed)
    assert [w.key for w in writes] == ["persistence"]
    assert writes[0].value["managedLedgerMaxMarkDeleteRate"] == 5.0  # kept, not managed
    assert writes[0].value["bookkeeperEnsemble"] == 2


def test_retention_and_quota_are_ordered_so_pulsar_accepts_each_step() -> None:
    grow = plan_writes(
        {
            "retention": {"retentionTimeInMinutes": 100, "retentionSizeInMB": 100},
            "backlogQuota.destination_storage": {"limitSize": 50 * 1024 * 1024, "policy": "producer_request_hold"},
        },
        {
            "retention": {"retentionTimeInMinutes": 10, "retentionSizeInMB": 10},
            "backlogQuota.destination_storage": {"limitSize": 5 * 1024 * 1024, "policy": "producer_request_hold"},
        },
    )
    assert [w.key for w in grow] == ["retention", "backlogQuota.destination_storage"]
    shrink = plan_writes(
        {
            "retention": {"retentionTimeInMinutes": 10, "retentionSizeInMB": 10},
            "backlogQuota.destination_storage": {"limitSize": 5 * 1024 * 1024, "policy": "producer_request_hold"},
        },
        {
            "retention": {"retentionTimeInMinutes": 100, "retentionSizeInMB": 100},
            "backlogQuota.destination_storage": {"limitSize": 50 * 1024 * 1024, "policy": "producer_request_hold"},
        },
    )
    assert [w.key for w in shrink] == ["backlogQuota.destination_storage", "retention"]
    assert order_writes([], {}) == []


def test_namespace_observed_reads_the_policies_document() -> None:
    doc = {
        "retention_policies": {"retentionTimeInMinutes": 1, "retentionSizeInMB": 2},
        "backlog_quota_map": {"message_age": {"limitTime": 5, "policy": "producer_exception"}},
        "max_producers_per_topic": 7,
        "schema_compatibility_strategy": "UNDEFINED",
    }
    observed = namespace_observed(doc)
    assert observed["retention"] == {"retentionTimeInMinutes": 1, "retentionSizeInMB": 2}
    assert observed["backlogQuota.message_age"]["limitTime"] == 5
    assert observed["backlogQuota.destination_storage"] is None
    assert observed["maxProducers"] == 7 and observed["messageTTL"] is None


def test_conditions_follow_kstatus() -> None:
    ready = rc.conditions(None, rc.ok(), 3, "T1")
    assert [(c["type"], c["status"], c["reason"]) for c in ready] == [
        ("Ready", "True", "Synced"),
        ("Reconciling", "False", "Synced"),
        ("Stalled", "False", "Synced"),
    ]
    assert all(c["observedGeneration"] == 3 for c in ready)
    waiting = rc.conditions(ready, rc.waiting(rc.NAMESPACE_MISSING, "ns missing"), 3, "T2")
    assert [(c["status"], c["reason"]) for c in waiting] == [
        ("False", "NamespaceMissing"),
        ("True", "NamespaceMissing"),
        ("False", "Synced"),
    ]
    assert waiting[0]["lastTransitionTime"] == "T2" and waiting[2]["lastTransitionTime"] == "T1"  # Stalled unchanged
    stuck = rc.conditions(waiting, rc.stalled(rc.NOT_SUPPORTED, "no"), 4, "T3")
    assert [(c["status"], c["reason"]) for c in stuck] == [
        ("False", "NotSupported"),
        ("False", "Synced"),
        ("True", "NotSupported"),
    ]
    paused = rc.conditions(ready, rc.Outcome("paused", rc.PAUSED, "paused"), 5, "T4")
    assert paused[0] == ready[0]  # Ready kept as it was
    assert (paused[1]["status"], paused[1]["reason"]) == ("False", "ReconciliationPaused")


def test_status_patch_is_empty_when_nothing_changed_and_nulls_unmanaged_keys() -> None:
    first = rc.status_patch({}, rc.ok(applied={"a": 1, "b": 2}), 1, "T1")
    assert first["observedGeneration"] == 1 and first["lastReconcileTime"] == "T1"
    status = {k: v for k, v in first.items()}
    assert rc.status_patch(status, rc.ok(applied={"a": 1, "b": 2}), 1, "T2") == {}
    dropped = rc.status_patch(status, rc.ok(applied={"a": 1}), 1, "T3")
    assert dropped["applied"] == {"a": 1, "b": None}  # merge patch removes b
    paused = rc.status_patch(status, rc.Outcome("paused", rc.PAUSED, "p"), 2, "T4")
    assert "observedGeneration" not in paused  # a paused resource did not reconcile generation 2


def test_owner_is_the_oldest_claim() -> None:
    old = rc.Claim("Topic", "a", "x", "u1", "2026-01-01T00:00:00Z", "persistent://t/n/x", "url")
    new = rc.Claim("Topic", "a", "y", "u2", "2026-01-02T00:00:00Z", "persistent://t/n/x", "url")
    assert rc.owner([new, old]) is old
    assert rc.conflict([new, old], "u1") is None
    assert rc.conflict([new, old], "u2") is old
    assert rc.conflict([], "u2") is None
    tie = rc.Claim("Topic", "a", "w", "u3", old.created, old.pulsar_name, "url")
    assert rc.owner([old, tie]) is tie  # same second: namespace/name decide, deterministically


def test_tenant_update_keeps_unmanaged_fields() -> None:
    observed = {"adminRoles": ["b", "a"], "allowedClusters": ["c1"]}
    assert rc.tenant_update(None, None, observed) is None
    assert rc.tenant_update(["a", "b"], None, observed) is None
    assert rc.tenant_update(["z"], None, observed) == {"adminRoles": ["z"], "allowedClusters": ["c1"]}
    assert rc.tenant_update(None, ["c2", "c1"], observed) == {"adminRoles": ["a", "b"], "allowedClusters": ["c1", "c2"]}


def test_topic_actions() -> None:
    assert rc.topic_action(0, False, 0) == "create"
    assert rc.topic_action(3, False, 0) == "create"
    assert rc.topic_action(3, True, 2) == "grow"
    assert rc.topic_action(2, True, 3) == "decrease"
    assert rc.topic_action(0, True, 3) == "kind-mismatch"
    assert rc.topic_action(2, True, 0) == "kind-mismatch"
    assert rc.topic_action(0, True, 0) == rc.topic_action(4, True, 4) == "none"


def test_backoff_grows_and_is_capped() -> None:
    assert [rc.backoff(i, 1, 10) for i in range(6)] == [1, 2, 4, 8, 10, 10]
    assert rc.backoff(10_000, 0.5, 30) == 30


def test_pulsar_names_and_targets() -> None:
    config = OperatorConfig(cluster_url_template="http://{name}-broker.{namespace}.svc:8080")
    ns_spec = parse_spec("TopicNamespace", {"tenant": "t", "clusterRef": {"name": "c"}})
    assert isinstance(ns_spec, TopicNamespaceSpec)
    assert pulsar_name("TopicNamespace", ns_spec, "meta-name") == "t/meta-name"
    assert target_url(config, "prod", ns_spec) == "http://c-broker.prod.svc:8080"
    topic = parse_spec("Topic", {"namespace": "t/n", "name": "x", "persistent": False,
                                 "connection": {"adminUrl": "http://h:1/"}})  # fmt: skip
    assert isinstance(topic, TopicSpec)
    assert pulsar_name("Topic", topic, "ignored") == "non-persistent://t/n/x"
    assert target_url(config, "prod", topic) == "http://h:1"
    keys = claim_keys("Topic", "u", topic, "non-persistent://t/n/x")
    assert keys["parent"] == ("TopicNamespace-children", "u", "t/n")


def test_make_claim_indexes_the_retention_policy_reference() -> None:
    body = {
        "metadata": {"namespace": "ns", "name": "topic-a", "uid": "u", "creationTimestamp": "T"},
        "spec": {"namespace": "t/n", "clusterRef": {"name": "c"}, "retentionPolicyRef": {"name": "std"}},
    }
    made = make_claim("Topic", body, OperatorConfig(cluster_url_template="http://x"))
    assert made is not None
    claim, keys = made
    assert claim.pulsar_name == "persistent://t/n/topic-a"
    assert keys["own"] == ("Topic", "http://x", "persistent://t/n/topic-a")
    assert keys["ref"] == ("RetentionPolicy-users", "ns", "std")
    assert make_claim("Topic", {"metadata": {}, "spec": {}}, OperatorConfig()) is None  # unreadable spec


def test_events_for_changes_drift_problems_and_unmanaged_fields() -> None:
    ready_status = {"conditions": rc.conditions(None, rc.ok(), 1, "T"), "applied": {"a": 1, "b": 2}}
    drift = rc.ok(applied={"a": 1, "b": 2})
    drift.changes = ["maxProducers: 9 -> 3"]
    assert events_for(ready_status, drift, "timer") == [("Warning", "DriftCorrected", "maxProducers: 9 -> 3")]
    assert events_for({}, drift, "timer")[0][1] == "Applied"  # never in sync before: not drift
    assert events_for(ready_status, drift, "change")[0][:2] == ("Normal", "Applied")
    assert events_for(ready_status, rc.ok(applied={"a": 1}), "change") == [
        ("Normal", "Unmanaged", "no longer in spec, left as they are: b")
    ]
    problem = rc.waiting(rc.CLUSTER_UNREACHABLE, "down")
    assert events_for(ready_status, problem, "change") == [("Warning", "ClusterUnreachable", "down")]
    again = {"conditions": rc.conditions(None, problem, 1, "T")}
    assert events_for(again, problem, "change") == []  # the same problem is not re-posted on every retry


def test_resource_from_body() -> None:
    res = Resource.from_body(
        "Topic",
        {
            "metadata": {
                "namespace": "n",
                "name": "x",
                "uid": "u",
                "generation": 4,
                "annotations": {"magnetar.io/paused": "true"},
                "deletionTimestamp": "T",
            },
            "spec": {"namespace": "a/b"},
        },
    )
    assert (res.generation, res.paused, res.deleting, res.ref) == (4, True, True, "Topic n/x")
