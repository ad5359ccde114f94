"""Generate the CustomResourceDefinitions in ``crds/`` (``python -m magnetar.operator.crdgen [DIR]``).

The four kinds share building blocks (target cluster, policies, status), so their schemas are
written once here and the YAML files are generated; ``tests/operator/test_crds.py`` checks the
committed files match this module. Schemas are structural (every field typed, no defaults: a
defaulted field would show as a diff to GitOps tools), validation beyond types is CEL
(``x-kubernetes-validations``), and CEL cost stays bounded (string lengths and list sizes capped).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

from magnetar.operator.config import GROUP, VERSION

CATEGORY = "magnetar"

#: Pulsar's allowed characters for tenant, namespace and cluster names.
PULSAR_NAME = r"^[-=:.A-Za-z0-9_]+$"

Schema = dict[str, Any]


def _str(description: str, **extra: Any) -> Schema:
    return {"type": "string", "description": description, **extra}


def _int(description: str, **extra: Any) -> Schema:
    return {"type": "integer", "format": "int64", "description": description, **extra}


def _int32(description: str, **extra: Any) -> Schema:
    return {"type": "integer", "format": "int32", "description": description, **extra}


def _bool(description: str) -> Schema:
    return {"type": "boolean", "description": description}


def _obj(description: str, properties: dict[str, Schema], required: list[str] | None = None, /, **extra: Any) -> Schema:
    out: Schema = {"type": "object", "description": description, "properties": properties}
    if required:
        out["required"] = required
    out.update(extra)
    return out


def _rule(rule: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"rule": rule, "message": message, **extra}


def _immutable(field: str, label: str) -> dict[str, Any]:
    # Spec-level (not field-level) so that adding or removing the field is also a change.
    return _rule(
        f"has(self.{field}) == has(oldSelf.{field}) && (!has(self.{field}) || self.{field} == oldSelf.{field})",
        f"{label} is immutable",
    )


# ---------------------------------------------------------------------------------------------- shared blocks
def name_field(what: str) -> Schema:
    return _str(
        f"Name of the Pulsar {what}; defaults to metadata.name. Immutable.",
        minLength=1,
        maxLength=253,
        pattern=PULSAR_NAME,
    )


def target_fields() -> dict[str, Schema]:
    """``clusterRef`` / ``connection``: which Magnetar cluster's admin API the resource is applied to."""
    return {
        "clusterRef": _obj(
            "A MagnetarCluster in the same Kubernetes namespace whose admin API manages this resource. "
            "Exactly one of clusterRef and connection. Immutable.",
            {"name": _str("Name of the MagnetarCluster.", minLength=1, maxLength=253)},
            ["name"],
        ),
        "connection": _obj(
            "An explicit admin endpoint, for clusters not managed as a MagnetarCluster. "
            "Exactly one of clusterRef and connection.",
            {
                "adminUrl": _str(
                    "Base URL of the admin REST API, e.g. http://magnetar-broker.magnetar.svc:8080.",
                    minLength=1,
                    maxLength=2048,
                    pattern=r"^https?://[^\s/]+(/.*)?$",
                ),
                "credentialsSecretRef": _obj(
                    "A Secret in the same namespace holding a token sent as 'Authorization: Bearer <token>'.",
                    {
                        "name": _str("Name of the Secret.", minLength=1, maxLength=253),
                        "key": _str("Key of the token in the Secret; defaults to 'token'.", minLength=1, maxLength=253),
                    },
                    ["name"],
                ),
            },
            ["adminUrl"],
        ),
    }


TARGET_RULES = [
    _rule("has(self.clusterRef) != has(self.connection)", "exactly one of clusterRef and connection must be set"),
    _rule(
        "has(self.clusterRef) == has(oldSelf.clusterRef) && "
        "(!has(self.clusterRef) || self.clusterRef.name == oldSelf.clusterRef.name)",
        "clusterRef is immutable (and a resource cannot switch between clusterRef and connection)",
    ),
    # Moving a resource to another cluster would orphan its object there and take over one here: create a
    # new resource instead (the same rule as clusterRef).
    _rule(
        "!has(self.connection) || !has(oldSelf.connection) || self.connection.adminUrl == oldSelf.connection.adminUrl",
        "connection.adminUrl is immutable: create a new resource to move it to another cluster",
    ),
]


def deletion_policy() -> Schema:
    return _str(
        "What happens to the Pulsar object when this resource is deleted: Delete (the default) removes it, "
        "Retain leaves it in place. A 404 while deleting counts as done.",
        enum=["Delete", "Retain"],
    )


def retention_block() -> Schema:
    return _obj(
        "Keep acknowledged messages this long and this much (Pulsar's RetentionPolicies). -1 means unlimited; "
        "both 0 means no retention; one 0 with the other non-zero is refused by Pulsar.",
        {
            "timeInMinutes": _int32("Retention time in minutes (-1 = unlimited).", minimum=-1, maximum=2**31 - 1),
            "sizeInMB": _int("Retention size in MiB (-1 = unlimited).", minimum=-1, maximum=2**40),
        },
        ["timeInMinutes", "sizeInMB"],
        **{
            "x-kubernetes-validations": [
                _rule(
                    "(self.timeInMinutes == 0) == (self.sizeInMB == 0)",
                    "set both timeInMinutes and sizeInMB to 0 to disable retention, or neither "
                    "(use -1 for an unlimited dimension)",
                )
            ]
        },
    )


def backlog_quota_block() -> Schema:
    return _obj(
        "Backlog quota: the largest backlog (unacknowledged data) by size and/or by age, and what happens "
        "when it is exceeded. limitSizeBytes is Pulsar's destination_storage quota, limitTimeSeconds its "
        "message_age quota; both use the same action.",
        {
            "limitSizeBytes": _int("Largest backlog in bytes (-1 = unlimited).", minimum=-1),
            "limitTimeSeconds": _int32("Oldest backlog message age in seconds (-1 = unlimited).", minimum=-1),
            "policy": _str(
                "Action when the quota is exceeded.",
                enum=["producer_request_hold", "producer_exception", "consumer_backlog_eviction"],
            ),
        },
        ["policy"],
        **{
            "x-kubernetes-validations": [
                _rule(
                    "has(self.limitSizeBytes) || has(self.limitTimeSeconds)",
                    "a backlog quota needs limitSizeBytes or limitTimeSeconds",
                )
            ]
        },
    )


#: Pulsar refuses a backlog quota at or above retention (only dimensions with a positive retention count).
RETENTION_VS_QUOTA = _rule(
    "!has(self.retention) || !has(self.backlogQuota) || ("
    "(!has(self.backlogQuota.limitSizeBytes) || self.retention.sizeInMB <= 0 || "
    "self.backlogQuota.limitSizeBytes < self.retention.sizeInMB * 1048576) && "
    "(!has(self.backlogQuota.limitTimeSeconds) || self.retention.timeInMinutes <= 0 || "
    "self.backlogQuota.limitTimeSeconds < self.retention.timeInMinutes * 60))",
    "retention must exceed the backlog quota (retention.sizeInMB MiB > backlogQuota.limitSizeBytes, "
    "retention.timeInMinutes minutes > backlogQuota.limitTimeSeconds)",
)


def retention_fields() -> dict[str, Schema]:
    return {
        "retention": retention_block(),
        "messageTTLSeconds": _int32(
            "Messages older than this are acknowledged automatically (0 = never expire).", minimum=0
        ),
        "backlogQuota": backlog_quota_block(),
    }


def policies_block(namespace: bool) -> Schema:
    """The Pulsar policies a TopicNamespace (``namespace=True``) or a Topic sets. Absent fields are unmanaged."""
    per = "per topic" if namespace else "on the topic"
    props: dict[str, Schema] = {
        **retention_fields(),
        "deduplication": _bool("Broker-side message deduplication."),
        "persistence": _obj(
            "BookKeeper replication for new ledgers: ensemble E >= write quorum Qw >= ack quorum Qa >= 1.",
            {
                "ensembleSize": _int32("Bookies each ledger is striped over (E).", minimum=1),
                "writeQuorum": _int32("Copies of each entry (Qw).", minimum=1),
                "ackQuorum": _int32("Copies acknowledged before a write succeeds (Qa).", minimum=1),
                "markDeleteRateLimit": {
                    "type": "number",
                    "description": "Largest rate of mark-delete (cursor) writes per second (0 = unlimited).",
                    "minimum": 0,
                },
            },
            ["ensembleSize", "writeQuorum", "ackQuorum"],
            **{
                "x-kubernetes-validations": [
                    _rule(
                        "self.ensembleSize >= self.writeQuorum && self.writeQuorum >= self.ackQuorum",
                        "persistence needs ensembleSize >= writeQuorum >= ackQuorum",
                    )
                ]
            },
        ),
        "delayedDelivery": _obj(
            "Delayed message delivery.",
            {
                "enabled": _bool("Whether delayed delivery is active."),
                "tickTimeMillis": _int("Tick time of the delayed-delivery tracker in milliseconds.", minimum=0),
                "maxDelayMillis": _int("Longest allowed delivery delay in milliseconds (0 = no limit).", minimum=0),
            },
            ["enabled"],
        ),
        "maxProducers": _int32(
            f"Most producers {per} (0 = unlimited).",
            minimum=0,
        ),
        "maxConsumers": _int32(
            f"Most consumers {per} (0 = unlimited).",
            minimum=0,
        ),
        "schemaCompatibilityStrategy": _str(
            "Schema compatibility strategy.",
            enum=[
                "UNDEFINED",
                "ALWAYS_INCOMPATIBLE",
                "ALWAYS_COMPATIBLE",
                "BACKWARD",
                "FORWARD",
                "FULL",
                "BACKWARD_TRANSITIVE",
                "FORWARD_TRANSITIVE",
                "FULL_TRANSITIVE",
            ],
        ),
    }
    if namespace:
        props["autoTopicCreation"] = _obj(
            "Override of the broker's automatic topic creation for this namespace.",
            {
                "allow": _bool("Whether producers and consumers may create topics by using them."),
                "type": _str("Kind of topic created.", enum=["partitioned", "non-partitioned"]),
                "defaultNumPartitions": _int32("Partitions of auto-created partitioned topics.", minimum=1),
            },
            ["allow"],
            **{
                "x-kubernetes-validations": [
                    _rule("!self.allow || has(self.type)", "type is required when allow is true"),
                    _rule(
                        "!has(self.type) || self.type != 'partitioned' || has(self.defaultNumPartitions)",
                        "defaultNumPartitions is required for partitioned auto-creation",
                    ),
                    _rule(
                        "!has(self.type) || self.type != 'non-partitioned' || !has(self.defaultNumPartitions)",
                        "defaultNumPartitions is only allowed for partitioned auto-creation",
                    ),
                ]
            },
        )
        props["bundles"] = _int32(
            "Number of bundles (hash ranges) the namespace is created with. Only applied at creation; "
            "immutable (bundles are split by the broker afterwards).",
            minimum=1,
            maximum=1024,
        )
    description = (
        "Namespace policies (Pulsar's admin API). A field left out is not managed: the operator neither sets "
        "nor resets it, and removing a field stops managing it."
        if namespace
        else "Topic-level policy overrides (Pulsar's topic policies). A field left out is not managed: the "
        "namespace's value applies."
    )
    return _obj(description, props, **{"x-kubernetes-validations": [RETENTION_VS_QUOTA]})


RETENTION_REF = _obj(
    "A RetentionPolicy in the same namespace supplying retention, messageTTLSeconds and backlogQuota; its "
    "changes propagate to every resource referencing it. Excludes those three fields inline.",
    {"name": _str("Name of the RetentionPolicy.", minLength=1, maxLength=253)},
    ["name"],
)

REF_EXCLUDES_INLINE = _rule(
    "!has(self.retentionPolicyRef) || !has(self.policies) || "
    "(!has(self.policies.retention) && !has(self.policies.messageTTLSeconds) && !has(self.policies.backlogQuota))",
    "retentionPolicyRef and inline policies.retention / messageTTLSeconds / backlogQuota are mutually exclusive",
)


def status_block(extra: dict[str, Schema] | None = None) -> Schema:
    condition = _obj(
        "A condition of the resource (Ready, Reconciling or Stalled).",
        {
            "type": _str("Ready, Reconciling or Stalled.", maxLength=64),
            "status": _str("True, False or Unknown.", enum=["True", "False", "Unknown"]),
            "reason": _str("CamelCase reason, e.g. Synced, ClusterUnreachable, NamespaceMissing.", maxLength=128),
            "message": _str("Human-readable detail.", maxLength=32768),
            "lastTransitionTime": _str("When the status last changed.", format="date-time"),
            "observedGeneration": _int("metadata.generation the condition was computed for."),
        },
        ["type", "status"],
    )
    props: dict[str, Schema] = {
        "observedGeneration": _int("The metadata.generation last reconciled."),
        "conditions": {
            "type": "array",
            "description": "Ready / Reconciling / Stalled, kstatus-style.",
            "items": condition,
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["type"],
        },
        "pulsarName": _str("The Pulsar object managed (tenant, tenant/namespace or full topic name)."),
        "adminUrl": _str("The admin API the resource was applied to."),
        "applied": {
            "type": "object",
            "description": "What the operator set and keeps in place (field -> value). A field dropped from spec "
            "is dropped here and left as it is in Pulsar.",
            "x-kubernetes-preserve-unknown-fields": True,
        },
        "lastReconcileTime": _str(
            "When the operator last changed this status (a drift check that finds nothing writes nothing).",
            format="date-time",
        ),
    }
    props.update(extra or {})
    return _obj("Observed state, written by the operator only.", props)


def ready_columns() -> list[dict[str, Any]]:
    return [
        {"name": "Ready", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].status'},
        {"name": "Reason", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].reason'},
    ]


AGE = {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}


def crd(kind: str, plural: str, short: list[str], description: str, spec: Schema, status: Schema,
        columns: list[dict[str, Any]]) -> dict[str, Any]:  # fmt: skip
    """One CRD document."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{plural}.{GROUP}",
            "labels": {"app.kubernetes.io/name": "magnetar-operator", "app.kubernetes.io/part-of": "magnetar"},
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": short,
                "categories": [CATEGORY],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": columns,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": description,
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": _str("APIVersion of this representation of an object."),
                                "kind": _str("Kind of the object."),
                                "metadata": {"type": "object"},
                                "spec": spec,
                                "status": status,
                            },
                        }
                    },
                }
            ],
        },
    }


# ---------------------------------------------------------------------------------------------- the kinds
def tenant_crd() -> dict[str, Any]:
    spec = _obj(
        "Desired state of a Pulsar tenant.",
        {
            "name": name_field("tenant"),
            **target_fields(),
            "adminRoles": {
                "type": "array",
                "description": "Roles allowed to administer the tenant. Left out: not managed.",
                "items": {"type": "string", "description": "A role name.", "minLength": 1, "maxLength": 253},
                "maxItems": 256,
                "x-kubernetes-list-type": "set",
            },
            "allowedClusters": {
                "type": "array",
                "description": "Pulsar clusters the tenant's namespaces may use. Left out: every cluster of the "
                "target at creation, not managed afterwards.",
                "items": _str("A Pulsar cluster name.", minLength=1, maxLength=253, pattern=PULSAR_NAME),
                "minItems": 1,
                "maxItems": 64,
                "x-kubernetes-list-type": "set",
            },
            "deletionPolicy": deletion_policy(),
        },
        **{"x-kubernetes-validations": [*TARGET_RULES, _immutable("name", "name")]},
    )
    columns = [{"name": "Tenant", "type": "string", "jsonPath": ".status.pulsarName"}, *ready_columns(), AGE]
    return crd(
        "Tenant", "tenants", ["mtenant"],
        "A Pulsar tenant (admin roles and allowed clusters) on a Magnetar cluster.",
        spec, status_block(), columns,
    )  # fmt: skip


def topic_namespace_crd() -> dict[str, Any]:
    spec = _obj(
        "Desired state of a Pulsar namespace (tenant/name) and its policies.",
        {
            "tenant": _str(
                "The Pulsar tenant the namespace belongs to. Immutable.",
                minLength=1,
                maxLength=253,
                pattern=PULSAR_NAME,
            ),
            "name": name_field("namespace (the part after tenant/)"),
            **target_fields(),
            "retentionPolicyRef": RETENTION_REF,
            "policies": policies_block(namespace=True),
            "deletionPolicy": deletion_policy(),
        },
        ["tenant"],
        **{
            "x-kubernetes-validations": [
                *TARGET_RULES,
                _immutable("name", "name"),
                _rule("self.tenant == oldSelf.tenant", "tenant is immutable"),
                REF_EXCLUDES_INLINE,
                _rule(
                    "(has(self.policies) && has(self.policies.bundles)) == "
                    "(has(oldSelf.policies) && has(oldSelf.policies.bundles)) && "
                    "(!(has(self.policies) && has(self.policies.bundles)) || "
                    "self.policies.bundles == oldSelf.policies.bundles)",
                    "policies.bundles is immutable (only applied when the namespace is created)",
                ),
            ]
        },
    )
    columns = [
        {"name": "Namespace", "type": "string", "jsonPath": ".status.pulsarName"},
        *ready_columns(),
        {"name": "Retention", "type": "string", "jsonPath": ".spec.retentionPolicyRef.name", "priority": 1},
        {"name": "Deletion", "type": "string", "jsonPath": ".spec.deletionPolicy", "priority": 1},
        AGE,
    ]
    return crd(
        "TopicNamespace", "topicnamespaces", ["mns", "tns"],
        "A Pulsar namespace (tenant/name) and its policies on a Magnetar cluster.",
        spec, status_block(), columns,
    )  # fmt: skip


def topic_crd() -> dict[str, Any]:
    spec = _obj(
        "Desired state of a Pulsar topic.",
        {
            "namespace": _str(
                "The Pulsar namespace, as tenant/namespace. Immutable.",
                minLength=3,
                maxLength=507,
                pattern=r"^[-=:.A-Za-z0-9_]+/[-=:.A-Za-z0-9_]+$",
            ),
            "name": name_field("topic (the local name)"),
            "persistent": _bool("persistent:// (true, the default) or non-persistent:// topic. Immutable."),
            "partitions": _int32(
                "Number of partitions; 0 (the default) is a non-partitioned topic. May only grow; a "
                "non-partitioned topic stays non-partitioned.",
                minimum=0,
                maximum=10000,
                **{"x-kubernetes-validations": [_rule("self >= oldSelf", "partitions may only grow")]},
            ),
            **target_fields(),
            "retentionPolicyRef": RETENTION_REF,
            "policies": policies_block(namespace=False),
            "deletionPolicy": deletion_policy(),
        },
        ["namespace"],
        **{
            "x-kubernetes-validations": [
                *TARGET_RULES,
                _immutable("name", "name"),
                _rule("self.namespace == oldSelf.namespace", "namespace is immutable"),
                _rule(
                    "(has(self.persistent) ? self.persistent : true) == "
                    "(has(oldSelf.persistent) ? oldSelf.persistent : true)",
                    "persistent is immutable",
                ),
                _rule(
                    "(has(self.partitions) ? self.partitions : 0) >= "
                    "(has(oldSelf.partitions) ? oldSelf.partitions : 0)",
                    "partitions may only grow",
                ),
                _rule(
                    "(has(oldSelf.partitions) && oldSelf.partitions > 0) || "
                    "!has(self.partitions) || self.partitions == 0",
                    "a non-partitioned topic cannot become partitioned",
                ),
                _rule(
                    "!has(self.persistent) || self.persistent || "
                    "(!has(self.policies) && !has(self.retentionPolicyRef))",
                    "topic policies apply to persistent topics only",
                ),
                REF_EXCLUDES_INLINE,
            ]
        },
    )
    status = status_block({"partitions": _int32("Partitions observed in Pulsar (0 = non-partitioned).")})
    columns = [
        {"name": "Topic", "type": "string", "jsonPath": ".status.pulsarName"},
        {"name": "Partitions", "type": "integer", "jsonPath": ".status.partitions"},
        *ready_columns(),
        {"name": "Deletion", "type": "string", "jsonPath": ".spec.deletionPolicy", "priority": 1},
        AGE,
    ]
    return crd(
        "Topic", "topics", ["mtopic"],
        "A Pulsar topic (partitions and topic-level policies) on a Magnetar cluster.",
        spec, status, columns,
    )  # fmt: skip


def retention_policy_crd() -> dict[str, Any]:
    spec = _obj(
        "Retention, message TTL and backlog quota shared by the TopicNamespaces and Topics referencing it. "
        "A field left out is not managed on the referencing resources.",
        retention_fields(),
        **{"x-kubernetes-validations": [RETENTION_VS_QUOTA]},
    )
    status = _obj(
        "Observed state, written by the operator only.",
        {
            "observedGeneration": _int("The metadata.generation last propagated."),
            "conditions": status_block()["properties"]["conditions"],
            "referencedBy": _int32("Number of TopicNamespaces and Topics referencing this policy."),
            "appliedTo": _int32("Referencing resources the current generation has been applied to."),
            "lastReconcileTime": _str("When the policy was last propagated.", format="date-time"),
        },
    )
    columns = [
        {"name": "Retention-Minutes", "type": "integer", "jsonPath": ".spec.retention.timeInMinutes"},
        {"name": "Retention-MB", "type": "integer", "jsonPath": ".spec.retention.sizeInMB"},
        {"name": "TTL", "type": "integer", "jsonPath": ".spec.messageTTLSeconds"},
        {"name": "Used-By", "type": "integer", "jsonPath": ".status.referencedBy"},
        *ready_columns(),
        AGE,
    ]
    return crd(
        "RetentionPolicy", "retentionpolicies", ["mrp"],
        "Reusable retention, message TTL and backlog quota for TopicNamespaces and Topics.",
        spec, status, columns,
    )  # fmt: skip


def peering_crds() -> list[dict[str, Any]]:
    """kopf's peering kinds (``kopf.dev/v1``): running operator replicas see each other there and only the
    highest-priority one works (HA by standby replicas)."""
    out = []
    for kind, plural, scope in (
        ("ClusterKopfPeering", "clusterkopfpeerings", "Cluster"),
        ("KopfPeering", "kopfpeerings", "Namespaced"),
    ):
        out.append(
            {
                "apiVersion": "apiextensions.k8s.io/v1",
                "kind": "CustomResourceDefinition",
                "metadata": {
                    "name": f"{plural}.kopf.dev",
                    "labels": {"app.kubernetes.io/name": "magnetar-operator", "app.kubernetes.io/part-of": "magnetar"},
                },
                "spec": {
                    "group": "kopf.dev",
                    "scope": scope,
                    "names": {"kind": kind, "listKind": f"{kind}List", "plural": plural, "singular": kind.lower()},
                    "versions": [
                        {
                            "name": "v1",
                            "served": True,
                            "storage": True,
                            "schema": {
                                "openAPIV3Schema": {
                                    "type": "object",
                                    "description": "Operator replicas announce themselves here (kopf peering).",
                                    "properties": {
                                        "status": {
                                            "type": "object",
                                            "description": "Peer id -> priority, last seen, lease; written by kopf.",
                                            "x-kubernetes-preserve-unknown-fields": True,
                                        }
                                    },
                                }
                            },
                        }
                    ],
                },
            }
        )
    return out


def _magnetar_cluster_crd() -> dict[str, Any]:
    from magnetar.operator.clustercrd import magnetar_cluster_crd  # it builds on this module's blocks

    return magnetar_cluster_crd()


ALL = {
    "magnetarcluster": _magnetar_cluster_crd,
    "tenant": tenant_crd,
    "topicnamespace": topic_namespace_crd,
    "topic": topic_crd,
    "retentionpolicy": retention_policy_crd,
}

HEADER = "# Generated by `python -m magnetar.operator.crdgen crds/`; edit operator/crdgen.py, not this file.\n"


PEERING_FILE = "kopf.dev_peerings.yaml"


def _dump(doc: dict[str, Any]) -> str:
    return yaml.safe_dump(doc, sort_keys=False, width=120, allow_unicode=True)


def render(kind: str) -> str:
    """The YAML text of one CRD file."""
    return HEADER + _dump(ALL[kind]())


def render_peering() -> str:
    return HEADER + "---\n".join(_dump(doc) for doc in peering_crds())


def file_name(kind: str) -> str:
    return f"{GROUP}_{kind}.yaml"


def rendered() -> dict[str, str]:
    """File name -> text of every generated CRD file."""
    files = {file_name(kind): render(kind) for kind in ALL}
    files[PEERING_FILE] = render_peering()
    return files


def main(argv: list[str] | None = None) -> int:
    out = Path((argv or sys.argv[1:] or ["crds"])[0])
    out.mkdir(parents=True, exist_ok=True)
    for name, text in rendered().items():
        (out / name).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
