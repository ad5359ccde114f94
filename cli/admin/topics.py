"""``magnetar admin topics ...``: topics, their subscriptions and messages."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterable
from typing import Any

from magnetar.admin_client.client import AdminClient
from magnetar.admin_client.errors import AdminError
from magnetar.admin_client.paths import api_path, subscription_path, topic_path
from magnetar.broker.topic_name import TopicName
from magnetar.cli.admin import permissions
from magnetar.cli.admin.messages import PeekedMessage, messages_from_response
from magnetar.cli.admin.output import Output
from magnetar.cli.admin.values import LATEST, MESSAGE_ID, NAMESPACE, TIME, TOPIC
from magnetar.cli.admin.verbs import Handler, UsageError, verb


def _sub_path(topic: TopicName, subscription: str, suffix: str = "") -> str:
    return subscription_path(topic, subscription) + suffix


def _terminate(c: AdminClient, a: argparse.Namespace) -> Output:
    data = c.call("POST", f"{topic_path(a.topic)}/terminate")
    if isinstance(data, dict) and "ledgerId" in data:
        where = f"{data['ledgerId']}:{data.get('entryId')}:{data.get('partitionIndex', -1)}"
    else:
        where = json.dumps(data)
    return Output(data=data, text=f"Topic successfully terminated at {where}")


def _reset_cursor(c: AdminClient, a: argparse.Namespace) -> Any:
    if (a.time is None) == (a.message_id is None):
        raise UsageError("give exactly one of --time or --messageId")
    if a.time is not None:
        # pulsar-admin: the cursor goes back by that much from now.
        timestamp = int(time.time() * 1000) - a.time * 1000
        return c.call("POST", _sub_path(a.topic, a.subscription, f"/resetcursor/{timestamp}"))
    ledger, entry = a.message_id
    body: dict[str, Any] = {"ledgerId": ledger, "entryId": entry}
    if a.exclude_reset_position:
        body["isExcluded"] = True
    return c.call("POST", _sub_path(a.topic, a.subscription, "/resetcursor"), body=body)


def _create_subscription(c: AdminClient, a: argparse.Namespace) -> Any:
    ledger, entry = a.message_id
    return c.call("PUT", _sub_path(a.topic, a.subscription), body={"ledgerId": ledger, "entryId": entry})


def _messages_output(messages: list[PeekedMessage]) -> Output:
    separator = "\n" + "-" * 73 + "\n\n"
    return Output(data=[m.to_json() for m in messages], text=separator.join(m.to_text() for m in messages))


def _peek(c: AdminClient, a: argparse.Namespace) -> Output:
    if a.count < 1:
        raise UsageError("--count must be at least 1")
    messages: list[PeekedMessage] = []
    for position in range(1, a.count + 1):
        try:
            resp = c.request("GET", _sub_path(a.topic, a.subscription, f"/position/{position}"))
        except AdminError as exc:
            # Fewer messages in the backlog than asked for: show what there is.
            if exc.status < 500 and messages:
                break
            raise
        messages.extend(messages_from_response(resp))
        if len(messages) >= a.count:
            break
    return _messages_output(messages[: a.count])


def _examine(c: AdminClient, a: argparse.Namespace) -> Output:
    resp = c.request(
        "GET",
        f"{topic_path(a.topic)}/examinemessage",
        query={"initialPosition": a.initial_position, "messagePosition": a.message_position},
    )
    return _messages_output(messages_from_response(resp)[:1])


def _message_by_id(c: AdminClient, a: argparse.Namespace) -> Output:
    resp = c.request("GET", f"{topic_path(a.topic)}/ledger/{a.ledger_id}/entry/{a.entry_id}")
    return _messages_output(messages_from_response(resp))


def add_verbs(sub: argparse._SubParsersAction, common: list[argparse.ArgumentParser]) -> None:
    g = sub.add_parser("topics", help="Operations on persistent topics").add_subparsers(
        dest="verb", required=True, metavar="VERB"
    )

    def ns_path(a: argparse.Namespace, suffix: str = "") -> str:
        tenant, ns = a.namespace
        return api_path("persistent", tenant, ns) + suffix

    def t_verb(name: str, text: str, handler: Handler, aliases: Iterable[str] = ()) -> argparse.ArgumentParser:
        p = verb(g, name, text, handler, aliases=aliases, parents=common)
        p.add_argument("topic", type=TOPIC, help="persistent://tenant/namespace/topic")
        return p

    def sub_arg(p: argparse.ArgumentParser) -> None:
        p.add_argument("-s", "--subscription", required=True, help="subscription name")

    p = verb(g, "list", "List the topics of a namespace", lambda c, a: c.get(ns_path(a)), parents=common)
    p.add_argument("namespace", type=NAMESPACE, help="tenant/namespace")
    p = verb(
        g,
        "list-partitioned-topics",
        "List the partitioned topics of a namespace",
        lambda c, a: c.get(ns_path(a, "/partitioned")),
        parents=common,
    )
    p.add_argument("namespace", type=NAMESPACE, help="tenant/namespace")

    t_verb("create", "Create a non-partitioned topic", lambda c, a: c.call("PUT", topic_path(a.topic)))
    p = t_verb(
        "create-partitioned-topic",
        "Create a partitioned topic",
        lambda c, a: c.call("PUT", f"{topic_path(a.topic)}/partitions", body=a.partitions),
    )
    p.add_argument("-p", "--partitions", type=int, required=True)
    p = t_verb(
        "update-partitioned-topic",
        "Grow a partitioned topic",
        lambda c, a: c.call(
            "POST", f"{topic_path(a.topic)}/partitions", body=a.partitions, query={"force": a.force or None}
        ),
    )
    p.add_argument("-p", "--partitions", type=int, required=True)
    p.add_argument("-f", "--force", action="store_true")
    t_verb(
        "get-partitioned-topic-metadata",
        "Get a partitioned topic's partition count",
        lambda c, a: c.get(f"{topic_path(a.topic)}/partitions"),
    )
    p = t_verb(
        "delete",
        "Delete a topic",
        lambda c, a: c.call("DELETE", topic_path(a.topic), query={"force": a.force or None}),
    )
    p.add_argument("-f", "--force", action="store_true", help="close producers and consumers first")
    p = t_verb(
        "delete-partitioned-topic",
        "Delete a partitioned topic and its partitions",
        lambda c, a: c.call("DELETE", f"{topic_path(a.topic)}/partitions", query={"force": a.force or None}),
    )
    p.add_argument("-f", "--force", action="store_true", help="close producers and consumers first")

    p = t_verb(
        "stats",
        "Get a topic's stats",
        lambda c, a: c.get(f"{topic_path(a.topic)}/stats", getPreciseBacklog=a.get_precise_backlog or None),
    )
    p.add_argument("-gpb", "--get-precise-backlog", action="store_true")
    p = t_verb(
        "partitioned-stats",
        "Get a partitioned topic's stats",
        lambda c, a: c.get(f"{topic_path(a.topic)}/partitioned-stats", perPartition=a.per_partition),
    )
    p.add_argument("--per-partition", action="store_true", help="include each partition's stats")
    t_verb("stats-internal", "Get a topic's internal stats", lambda c, a: c.get(f"{topic_path(a.topic)}/internalStats"))
    t_verb("last-message-id", "Get the last message id", lambda c, a: c.get(f"{topic_path(a.topic)}/lastMessageId"))
    t_verb("terminate", "Terminate a topic (no more publishing)", _terminate)
    t_verb("unload", "Unload a topic", lambda c, a: c.call("PUT", f"{topic_path(a.topic)}/unload"))
    t_verb("subscriptions", "List a topic's subscriptions", lambda c, a: c.get(f"{topic_path(a.topic)}/subscriptions"))

    p = t_verb("create-subscription", "Create a subscription", _create_subscription)
    sub_arg(p)
    p.add_argument(
        "-m",
        "--messageId",
        dest="message_id",
        type=MESSAGE_ID,
        default=LATEST,
        help="where it starts: latest (default), earliest or ledgerId:entryId",
    )
    p = t_verb(
        "unsubscribe",
        "Delete a subscription",
        lambda c, a: c.call("DELETE", _sub_path(a.topic, a.subscription), query={"force": a.force or None}),
    )
    sub_arg(p)
    p.add_argument("-f", "--force", action="store_true", help="disconnect its consumers first")
    p = t_verb(
        "skip",
        "Skip messages of a subscription",
        lambda c, a: c.call("POST", _sub_path(a.topic, a.subscription, f"/skip/{a.count}")),
    )
    sub_arg(p)
    p.add_argument("-n", "--count", type=int, required=True, help="messages to skip")
    p = t_verb(
        "clear-backlog",
        "Skip all messages of a subscription",
        lambda c, a: c.call("POST", _sub_path(a.topic, a.subscription, "/skip_all")),
    )
    sub_arg(p)
    p = t_verb("reset-cursor", "Move a subscription back to a time or message id", _reset_cursor)
    sub_arg(p)
    p.add_argument("-t", "--time", type=TIME, help="go back this long from now: 100 (seconds), 10m, 3h, 2d")
    p.add_argument("-m", "--messageId", dest="message_id", type=MESSAGE_ID, help="ledgerId:entryId, earliest or latest")
    p.add_argument("-e", "--exclude-reset-position", action="store_true", help="start after the given message")
    p = t_verb(
        "expire-messages",
        "Expire a subscription's messages older than a time",
        lambda c, a: c.call("POST", _sub_path(a.topic, a.subscription, f"/expireMessages/{a.expire_time}")),
    )
    sub_arg(p)
    p.add_argument(
        "-t", "--expireTime", dest="expire_time", type=TIME, required=True, help="age: 100 (seconds), 10m, 3h"
    )
    p = t_verb(
        "expire-messages-all-subscriptions",
        "Expire messages older than a time on every subscription",
        lambda c, a: c.call("POST", f"{topic_path(a.topic)}/all_subscription/expireMessages/{a.expire_time}"),
    )
    p.add_argument(
        "-t", "--expireTime", dest="expire_time", type=TIME, required=True, help="age: 100 (seconds), 10m, 3h"
    )
    p = t_verb("peek-messages", "Peek at a subscription's next messages", _peek)
    sub_arg(p)
    p.add_argument("-n", "--count", type=int, default=1, help="messages to peek (default 1)")
    p = t_verb("examine-message", "Examine a message by position", _examine, aliases=["examine-messages"])
    p.add_argument("-i", "--initialPosition", dest="initial_position", default="latest", choices=["latest", "earliest"])
    p.add_argument("-m", "--messagePosition", dest="message_position", type=int, default=1)
    p = t_verb("get-message-by-id", "Get a message by ledger and entry id", _message_by_id)
    p.add_argument("-l", "--ledgerId", dest="ledger_id", type=int, required=True)
    p.add_argument("-e", "--entryId", dest="entry_id", type=int, required=True)

    # permissions
    permissions.add_topic_verbs(t_verb)
