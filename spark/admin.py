"""A small synchronous client of the admin REST API v2 (stdlib only: it runs on Spark executors too)."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from magnetar.spark.offsets import Position, after_last

_PARTITION_SUFFIX = re.compile(r"^(?P<base>.+)-partition-(?P<index>\d+)$")


class AdminError(RuntimeError):
    """An admin call failed; ``status`` is the HTTP status (0 when the request did not get one)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"admin API {status}: {message}")
        self.status = status


def _path(topic: str) -> str:
    """``persistent://t/ns/x`` -> ``persistent/t/ns/x`` (URL-quoted)."""
    domain, rest = topic.split("://", 1)
    return f"{domain}/" + "/".join(urllib.parse.quote(p, safe="") for p in rest.split("/"))


class Admin:
    """Just the calls the Spark source and sink need."""

    def __init__(self, url: str, timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"{self.url}/admin/v2/{path}", data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                text = resp.read()
        except urllib.error.HTTPError as exc:
            raise AdminError(exc.code, exc.read().decode(errors="replace")) from exc
        except OSError as exc:
            raise AdminError(0, str(exc)) from exc
        return json.loads(text) if text.strip() else None

    def partitions(self, topic: str) -> int:
        """Partition count of a partitioned topic; 0 for a non-partitioned (or missing) one."""
        return int(self._call("GET", f"{_path(topic)}/partitions").get("partitions", 0))

    def expand(self, topic: str) -> list[str]:
        """A topic -> its partitions' names (itself when not partitioned)."""
        n = self.partitions(topic)
        return [f"{topic}-partition-{i}" for i in range(n)] if n > 0 else [topic]

    def namespace_topics(self, domain: str, namespace: str) -> list[str]:
        """Every concrete topic (partitions included) of a namespace."""
        return list(self._call("GET", f"{domain}/{namespace}"))

    def matching(self, pattern: str) -> list[str]:
        """Concrete topics whose name (or partitioned base name) fully matches ``pattern``.

        The pattern carries the namespace like the Scala connector's ``topicsPattern``:
        ``persistent://public/default/orders-.*`` (short ``tenant/ns/regex`` too).
        """
        full = pattern if "://" in pattern else f"persistent://{pattern}"
        domain, rest = full.split("://", 1)
        tenant, ns, _ = rest.split("/", 2)
        regex = re.compile(full)
        found = []
        for name in self.namespace_topics(domain, f"{tenant}/{ns}"):
            m = _PARTITION_SUFFIX.match(name)
            if regex.fullmatch(name) or (m and regex.fullmatch(m.group("base"))):
                found.append(name)
        return sorted(found)

    def end_position(self, topic: str) -> Position:
        """Exclusive end of a concrete topic now (after its last entry; EARLIEST when empty)."""
        try:
            data = self._call("GET", f"{_path(topic)}/lastMessageId")
        except AdminError as exc:
            if exc.status != 404:
                raise
            return after_last(-1, -1)  # not created yet: empty, so a stream can start before its topic
        return after_last(int(data.get("ledgerId", -1)), int(data.get("entryId", -1)))

    def internal_stats(self, topic: str) -> dict[str, Any]:
        return self._call("GET", f"{_path(topic)}/internalStats")

    def ledgers(self, topic: str) -> list[tuple[int, int]]:
        """``(ledger_id, entries)`` in order; the last (open) ledger's count is ``currentLedgerEntries``."""
        stats = self.internal_stats(topic)
        out = [(int(li["ledgerId"]), int(li.get("entries", 0))) for li in stats.get("ledgers", [])]
        if out and stats.get("currentLedgerEntries") is not None:
            out[-1] = (out[-1][0], max(out[-1][1], int(stats["currentLedgerEntries"])))
        return out

    def reset_subscription(self, topic: str, subscription: str, position: Position) -> None:
        """Move (creating if needed) a durable subscription so its next message is ``position``."""
        sub = urllib.parse.quote(subscription, safe="")
        body = {"ledgerId": position.ledger, "entryId": max(position.entry, 0)}
        try:
            self._call("POST", f"{_path(topic)}/subscription/{sub}/resetcursor", body)
        except AdminError as exc:
            if exc.status != 404:
                raise
            self._call("PUT", f"{_path(topic)}/subscription/{sub}", body)
