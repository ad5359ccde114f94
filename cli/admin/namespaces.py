"""``magnetar admin namespaces ...``: namespaces and their policies."""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from typing import Any

from magnetar.admin_client.client import AdminClient
from magnetar.admin_client.paths import api_path, namespace_path
from magnetar.cli.admin import permissions
from magnetar.cli.admin.values import NAMESPACE, RETENTION_SIZE, RETENTION_TIME, SIZE, TIME
from magnetar.cli.admin.verbs import Handler, UsageError, body, enable_flags, verb


def _ns_path(ns: tuple[str, str], suffix: str = "") -> str:
    return namespace_path(*ns) + suffix


def _set_auto_topic_creation(c: AdminClient, a: argparse.Namespace) -> Any:
    override: dict[str, Any] = {"allowAutoTopicCreation": a.enable}
    if a.enable:
        override["topicType"] = a.type
        if a.type == "partitioned":
            if a.num_partitions is None:
                raise UsageError("--num-partitions is required with --type partitioned")
            override["defaultNumPartitions"] = a.num_partitions
    return c.call("POST", _ns_path(a.namespace, "/autoTopicCreation"), body=override)


def add_verbs(sub: argparse._SubParsersAction, common: list[argparse.ArgumentParser]) -> None:
    g = sub.add_parser("namespaces", help="Operations on namespaces").add_subparsers(
        dest="verb", required=True, metavar="VERB"
    )

    def ns_verb(name: str, text: str, handler: Handler, aliases: Iterable[str] = ()) -> argparse.ArgumentParser:
        p = verb(g, name, text, handler, aliases=aliases, parents=common)
        p.add_argument("namespace", type=NAMESPACE, help="tenant/namespace")
        return p

    def get_and_remove(name: str, what: str, suffix: str) -> None:
        """``get-NAME`` and ``remove-NAME`` of the policy at ``suffix``."""
        ns_verb(f"get-{name}", f"Get the {what}", lambda c, a: c.get(_ns_path(a.namespace, suffix)))
        ns_verb(f"remove-{name}", f"Remove the {what}", lambda c, a: c.call("DELETE", _ns_path(a.namespace, suffix)))

    p = verb(
        g,
        "list",
        "List the namespaces of a tenant",
        lambda c, a: c.get(api_path("namespaces", a.tenant)),
        parents=common,
    )
    p.add_argument("tenant")
    ns_verb("topics", "List the topics of a namespace", lambda c, a: c.get(_ns_path(a.namespace, "/topics")))
    ns_verb("policies", "Get a namespace's policies", lambda c, a: c.get(_ns_path(a.namespace)))
    ns_verb("create", "Create a namespace", lambda c, a: c.call("PUT", _ns_path(a.namespace)))
    p = ns_verb(
        "delete",
        "Delete a namespace",
        lambda c, a: c.call("DELETE", _ns_path(a.namespace), query={"force": a.force or None}),
    )
    p.add_argument("-f", "--force", action="store_true", help="delete its topics too")

    # retention
    p = ns_verb(
        "set-retention",
        "Set the retention policy",
        lambda c, a: c.call(
            "POST",
            _ns_path(a.namespace, "/retention"),
            body={"retentionTimeInMinutes": a.time, "retentionSizeInMB": a.size},
        ),
    )
    p.add_argument(
        "-t",
        "--time",
        type=RETENTION_TIME,
        required=True,
        help="retention time: 120 (seconds), 10m, 3h, 2d, 5w; 0 none, -1 infinite",
    )
    p.add_argument(
        "-s",
        "--size",
        type=RETENTION_SIZE,
        required=True,
        help="retention size: 4096 (bytes), 10M, 16G, 3T; 0 none, -1 infinite",
    )
    get_and_remove("retention", "retention policy", "/retention")

    # message TTL
    p = ns_verb(
        "set-message-ttl",
        "Set the message TTL",
        lambda c, a: c.call("POST", _ns_path(a.namespace, "/messageTTL"), body=a.ttl),
    )
    p.add_argument(
        "-ttl",
        "--ttl",
        "--messageTTL",
        dest="ttl",
        type=TIME,
        required=True,
        help="TTL: 120 (seconds), 10m, 1h, 2d; 0 disables",
    )
    get_and_remove("message-ttl", "message TTL", "/messageTTL")

    # backlog quota
    p = ns_verb(
        "set-backlog-quota",
        "Set a backlog quota",
        lambda c, a: c.call(
            "POST",
            _ns_path(a.namespace, "/backlogQuota"),
            query={"backlogQuotaType": a.type},
            body=body(limitSize=a.limit_size, limitTime=a.limit_time, policy=a.policy),
        ),
    )
    p.add_argument(
        "-l", "--limit-size", "--limitSize", "--limit", dest="limit_size", type=SIZE, help="size limit: 10M, 16G"
    )
    p.add_argument(
        "-lt",
        "--limit-time",
        "--limitTime",
        dest="limit_time",
        type=TIME,
        help="message age limit: 3600 (seconds), 100m, 3h, 2d",
    )
    p.add_argument(
        "-p",
        "--policy",
        required=True,
        choices=["producer_request_hold", "producer_exception", "consumer_backlog_eviction"],
    )
    p.add_argument("-t", "--type", default="destination_storage", choices=["destination_storage", "message_age"])
    ns_verb(
        "get-backlog-quotas", "Get the backlog quotas", lambda c, a: c.get(_ns_path(a.namespace, "/backlogQuotaMap"))
    )
    p = ns_verb(
        "remove-backlog-quota",
        "Remove a backlog quota",
        lambda c, a: c.call("DELETE", _ns_path(a.namespace, "/backlogQuota"), query={"backlogQuotaType": a.type}),
    )
    p.add_argument("-t", "--type", default="destination_storage", choices=["destination_storage", "message_age"])

    # deduplication
    p = ns_verb(
        "set-deduplication",
        "Enable or disable deduplication",
        lambda c, a: c.call("POST", _ns_path(a.namespace, "/deduplication"), body=a.enable),
    )
    enable_flags(p, "deduplication")
    get_and_remove("deduplication", "deduplication setting", "/deduplication")

    # auto topic creation
    p = ns_verb("set-auto-topic-creation", "Override the broker's topic auto-creation", _set_auto_topic_creation)
    enable_flags(p, "topic auto-creation")
    p.add_argument("-t", "--type", default="non-partitioned", choices=["partitioned", "non-partitioned"])
    p.add_argument("-n", "--num-partitions", type=int, help="partitions of auto-created partitioned topics")
    get_and_remove("auto-topic-creation", "topic auto-creation override", "/autoTopicCreation")

    # persistence
    p = ns_verb(
        "set-persistence",
        "Set the persistence policy",
        lambda c, a: c.call(
            "POST",
            _ns_path(a.namespace, "/persistence"),
            body={
                "bookkeeperEnsemble": a.bookkeeper_ensemble,
                "bookkeeperWriteQuorum": a.bookkeeper_write_quorum,
                "bookkeeperAckQuorum": a.bookkeeper_ack_quorum,
                "managedLedgerMaxMarkDeleteRate": a.ml_mark_delete_max_rate,
            },
        ),
    )
    p.add_argument("-e", "--bookkeeper-ensemble", type=int, required=True, help="bookies per ledger")
    p.add_argument("-w", "--bookkeeper-write-quorum", type=int, required=True, help="copies of each entry")
    p.add_argument("-a", "--bookkeeper-ack-quorum", type=int, required=True, help="acks before an entry is durable")
    p.add_argument("-r", "--ml-mark-delete-max-rate", type=float, default=0.0, help="mark-delete rate limit (0: none)")
    get_and_remove("persistence", "persistence policy", "/persistence")

    # permissions
    permissions.add_namespace_verbs(ns_verb)
