"""The admin calls the Spark source and sink need, over the shared synchronous admin client (stdlib only:
it runs on Spark executors too)."""

from __future__ import annotations

import re
from typing import Any

from magnetar.admin_client.auth import ClientSecurity
from magnetar.admin_client.client import AdminClient
from magnetar.admin_client.errors import AdminError
from magnetar.admin_client.paths import api_path, parse_topic, subscription_path, topic_path
from magnetar.broker.topic_name import TopicName
from magnetar.spark.offsets import EARLIEST, Position, after_last


class Admin:
    """Just the calls the Spark source and sink need; topics are full names (``persistent://t/ns/x``)."""

    def __init__(self, url: str, security: ClientSecurity | None = None, timeout: float = 30.0) -> None:
        self.client = AdminClient(url, timeout, security)

    def close(self) -> None:
        """Drop the kept-alive connection (the next call opens one)."""
        self.client.close()

    def partitions(self, topic: str) -> int:
        """Partition count of a partitioned topic; 0 for a non-partitioned (or missing) one."""
        return int(self.client.get(f"{_topic_path(topic)}/partitions").get("partitions", 0))

    def expand(self, topic: str) -> list[str]:
        """A topic -> its partitions' names (itself when not partitioned)."""
        n = self.partitions(topic)
        return [f"{topic}-partition-{i}" for i in range(n)] if n > 0 else [topic]

    def matching(self, pattern: str) -> list[str]:
        """Concrete topics whose name (or partitioned base name) fully matches ``pattern``.

        The pattern carries the namespace like the Scala connector's ``topicsPattern``:
        ``persistent://public/default/orders-.*`` (short ``tenant/ns/regex`` too).
        """
        parsed = parse_topic(pattern)
        regex = re.compile(str(parsed))
        found = []
        for name in self.client.get(api_path(parsed.domain, parsed.tenant, parsed.namespace_portion)):
            base = str(TopicName.parse(name).partitioned_base)
            if regex.fullmatch(name) or regex.fullmatch(base):
                found.append(name)
        return sorted(found)

    def last_position(self, topic: str) -> Position | None:
        """Exclusive end of a concrete topic now (EARLIEST when empty); None when the topic does not exist."""
        try:
            data = self.client.get(f"{_topic_path(topic)}/lastMessageId")
        except AdminError as exc:
            if exc.status != 404:
                raise
            return None
        return after_last(int(data.get("ledgerId", -1)), int(data.get("entryId", -1)))

    def end_position(self, topic: str) -> Position:
        """Exclusive end of a concrete topic now; EARLIEST when empty or not created yet (a stream can start
        before its topic)."""
        end = self.last_position(topic)
        return EARLIEST if end is None else end

    def exists(self, topic: str) -> bool:
        """Whether a topic (partitioned, or a concrete one) exists."""
        return self.partitions(topic) > 0 or self.last_position(topic) is not None

    def schema(self, topic: str) -> dict[str, Any] | None:
        """The topic's latest schema info (``type``, ``data``...), None when it has none."""
        name = TopicName.parse(topic).partitioned_base
        path = f"/admin/v2/schemas/{name.tenant}/{name.namespace_portion}/{name.local_name}/schema"
        try:
            return self.client.get(path)
        except AdminError as exc:
            if exc.status != 404:
                raise
            return None

    def stats(self, topic: str) -> dict[str, Any]:
        """A concrete topic's ``stats`` (``msgInCounter``, ``bytesInCounter``, subscriptions...)."""
        return self.client.get(f"{_topic_path(topic)}/stats")

    def internal_stats(self, topic: str) -> dict[str, Any]:
        return self.client.get(f"{_topic_path(topic)}/internalStats")

    @staticmethod
    def ledgers_of(stats: dict[str, Any]) -> list[tuple[int, int]]:
        """``(ledger_id, entries)`` in order from a topic's ``internalStats``; the last (open) ledger's count
        is ``currentLedgerEntries``."""
        out = [(int(li["ledgerId"]), int(li.get("entries", 0))) for li in stats.get("ledgers", [])]
        if out and stats.get("currentLedgerEntries") is not None:
            out[-1] = (out[-1][0], max(out[-1][1], int(stats["currentLedgerEntries"])))
        return out

    def check_credentials(self, topic: str) -> None:
        """Fail clearly when the broker refuses this client's credentials (an HTTP lookup of ``topic``).

        The official client reports refused credentials on the binary protocol only as a time-out after
        retrying; the HTTP lookup is authenticated (and authorized) like the binary one and answers 401/403 with
        the broker's reason at once.
        """
        path = "/lookup/v2/topic/" + topic_path(parse_topic(topic)).removeprefix("/admin/v2/")
        try:
            self.client.get(path)
        except AdminError as exc:
            if exc.status in (401, 403):
                what = "refused" if exc.status == 401 else "did not authorize"
                raise PermissionError(
                    f"the broker {what} the client's credentials (pulsar.client.authPluginClassName / "
                    f"pulsar.client.authParams) for {topic}: HTTP {exc.status}: {exc.reason}"
                ) from None

    def create_subscription(self, topic: str, subscription: str, position: Position) -> bool:
        """Create a durable subscription whose next message is ``position``; False when it already exists."""
        path = subscription_path(parse_topic(topic), subscription)
        try:
            self.client.call("PUT", path, body=_message_id(position))
        except AdminError as exc:
            if exc.status != 409:
                raise
            return False
        return True

    def reset_subscription(self, topic: str, subscription: str, position: Position) -> None:
        """Move (creating if needed) a durable subscription so its next message is ``position``."""
        path = subscription_path(parse_topic(topic), subscription)
        try:
            self.client.call("POST", f"{path}/resetcursor", body=_message_id(position))
        except AdminError as exc:
            if exc.status != 404:
                raise
            self.client.call("PUT", path, body=_message_id(position))


def _message_id(position: Position) -> dict[str, int]:
    if position.is_earliest:
        return {"ledgerId": -1, "entryId": -1}
    return {"ledgerId": position.ledger, "entryId": max(position.entry, 0)}


def _topic_path(topic: str) -> str:
    return topic_path(parse_topic(topic))
