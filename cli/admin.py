"""``magnetar admin``: pulsar-admin's verbs over the admin REST API v2.

Usage: ``magnetar admin [--admin-url URL] [--output text|json] GROUP VERB [ARGS]``, groups ``clusters``,
``tenants``, ``namespaces``, ``topics`` and ``brokers``. Paths and JSON bodies are Apache Pulsar's
admin API v2, so the command also works against an Apache Pulsar broker.

Text output follows pulsar-admin: lists one item per line, objects as pretty JSON, nothing for
operations that return no content. ``--output json`` prints compact JSON for scripts. A failed
request prints the server's ``reason`` on stderr and exits 1; bad arguments exit 2 (argparse).

The HTTP client is ``urllib``: one short-lived request at a time needs no event loop.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import re
import struct
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TextIO
from urllib.parse import quote, urlencode

DEFAULT_ADMIN_URL = "http://localhost:8080"
#: Environment variable that overrides the default ``--admin-url``.
ADMIN_URL_ENV = "MAGNETAR_ADMIN_URL"

#: Pulsar's ``MessageId.latest`` / ``MessageId.earliest`` as (ledgerId, entryId).
LATEST = (2**63 - 1, 2**63 - 1)
EARLIEST = (-1, -1)

_NO_BODY = object()


# --------------------------------------------------------------------------- value formats


_TIME_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "y": 365 * 86400}
_SIZE_UNITS = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_INT = re.compile(r"[+-]?\d+")


def parse_relative_time(value: str) -> int:
    """Seconds in a pulsar-admin relative time: ``120`` (seconds), ``10s``, ``10m``, ``1h``, ``2d``, ``5w``, ``1y``.

    ``-1`` stays ``-1`` (Pulsar's "infinite"). Units are case-insensitive, as in pulsar-admin.
    """
    text = value.strip()
    if not text:
        raise ValueError("expected a non-empty time")
    unit = text[-1].lower()
    if unit.isalpha():
        if unit not in _TIME_UNITS:
            raise ValueError(f"invalid time unit {text[-1]!r} in {value!r} (use s, m, h, d, w or y)")
        number = text[:-1]
        factor = _TIME_UNITS[unit]
    else:
        number, factor = text, 1
    if not _INT.fullmatch(number):
        raise ValueError(f"invalid time {value!r}")
    return int(number) * factor


def parse_size(value: str) -> int:
    """Bytes in a pulsar-admin size: ``4096`` (bytes), ``10k``, ``100M``, ``1G``, ``3T`` (powers of 1024).

    ``-1`` stays ``-1`` (Pulsar's "infinite").
    """
    text = value.strip()
    if not text:
        raise ValueError("expected a non-empty size")
    unit = text[-1].lower()
    if unit.isalpha():
        if unit not in _SIZE_UNITS:
            raise ValueError(f"invalid size unit {text[-1]!r} in {value!r} (use k, M, G or T)")
        number = text[:-1]
        factor = _SIZE_UNITS[unit]
    else:
        number, factor = text, 1
    if not _INT.fullmatch(number):
        raise ValueError(f"invalid size {value!r}")
    return int(number) * factor


def retention_minutes(value: str) -> int:
    """A retention time as Pulsar stores it: minutes, ``-1`` for infinite."""
    seconds = parse_relative_time(value)
    return -1 if seconds == -1 else seconds // 60


def retention_megabytes(value: str) -> int:
    """A retention size as Pulsar stores it: MiB (below 1 MiB is 0, no retention), ``-1`` for infinite."""
    size = parse_size(value)
    return -1 if size == -1 else size // (1 << 20)


def parse_message_id(value: str) -> tuple[int, int]:
    """``ledgerId:entryId`` (an optional ``:partition`` suffix is accepted), ``earliest`` or ``latest``."""
    text = value.strip().lower()
    if text == "latest":
        return LATEST
    if text == "earliest":
        return EARLIEST
    parts = text.split(":")
    if len(parts) not in (2, 3) or not all(_INT.fullmatch(p) for p in parts):
        raise ValueError(f"invalid message id {value!r} (expected ledgerId:entryId, 'earliest' or 'latest')")
    return int(parts[0]), int(parts[1])


def _arg_type(parse: Callable[[str], Any], what: str) -> Callable[[str], Any]:
    """Wrap a parser so argparse reports a usage error (exit 2) naming ``what``."""

    def convert(value: str) -> Any:
        try:
            return parse(value)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{what}: {exc}") from None

    convert.__name__ = what  # argparse names the type in its messages
    return convert


TIME = _arg_type(parse_relative_time, "time")
SIZE = _arg_type(parse_size, "size")
MESSAGE_ID = _arg_type(parse_message_id, "message id")


# --------------------------------------------------------------------------- names


@dataclass(frozen=True, slots=True)
class Topic:
    """A topic name split as the REST paths need it."""

    domain: str
    tenant: str
    namespace: str
    local: str

    @classmethod
    def parse(cls, name: str) -> Topic:
        """``persistent://t/ns/topic``, ``t/ns/topic`` or ``topic`` (in ``public/default``), as pulsar-admin."""
        domain = "persistent"
        rest = name
        if "://" in name:
            domain, rest = name.split("://", 1)
            if domain not in ("persistent", "non-persistent"):
                raise ValueError(f"invalid topic domain {domain!r} in {name!r}")
        elif "/" not in name:
            rest = f"public/default/{name}"
        parts = rest.split("/", 2)
        if len(parts) != 3 or not all(parts):
            raise ValueError(f"invalid topic name {name!r} (expected persistent://tenant/namespace/topic)")
        return cls(domain, parts[0], parts[1], parts[2])

    @property
    def path(self) -> str:
        """``/admin/v2/{domain}/{tenant}/{namespace}/{topic}`` with the local name URL-encoded."""
        return f"/admin/v2/{self.domain}/{_seg(self.tenant)}/{_seg(self.namespace)}/{_seg(self.local)}"

    def __str__(self) -> str:
        return f"{self.domain}://{self.tenant}/{self.namespace}/{self.local}"


def parse_namespace(value: str) -> tuple[str, str]:
    """``tenant/namespace``."""
    parts = value.split("/")
    if len(parts) != 2 or not all(parts):
        raise ValueError(f"invalid namespace {value!r} (expected tenant/namespace)")
    return parts[0], parts[1]


TOPIC = _arg_type(Topic.parse, "topic")
NAMESPACE = _arg_type(parse_namespace, "namespace")


def _seg(value: str) -> str:
    """One URL path segment."""
    return quote(value, safe="")


def _ns_path(ns: tuple[str, str], suffix: str = "") -> str:
    return f"/admin/v2/namespaces/{_seg(ns[0])}/{_seg(ns[1])}{suffix}"


def _sub_path(topic: Topic, subscription: str, suffix: str = "") -> str:
    return f"{topic.path}/subscription/{_seg(subscription)}{suffix}"


# --------------------------------------------------------------------------- HTTP


class AdminError(Exception):
    """The server answered with an error status; ``reason`` is its ``{"reason": ...}``."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"{reason} (HTTP {status})")
        self.status = status
        self.reason = reason


class AdminConnectionError(Exception):
    """The admin API could not be reached at all."""


@dataclass(slots=True)
class Response:
    """An HTTP response read in full."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> str | None:
        lower = name.lower()
        return next((v for k, v in self.headers if k.lower() == lower), None)

    def json(self) -> Any:
        """The body as JSON; ``None`` when there is no body."""
        if not self.body.strip():
            return None
        try:
            return json.loads(self.body)
        except ValueError:
            # Some endpoints (health) answer plain text: show it as is.
            return self.body.decode("utf-8", "replace")


class AdminClient:
    """Minimal blocking client of the admin REST API."""

    def __init__(self, base_url: str, timeout: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout

    def request(self, method: str, path: str, *, query: dict[str, Any] | None = None, body: Any = _NO_BODY) -> Response:
        """Send one request; raises :class:`AdminError` for 4xx/5xx and :class:`AdminConnectionError`."""
        url = self.base_url + path
        if query:
            url += "?" + urlencode({k: _query_value(v) for k, v in query.items() if v is not None})
        data = None
        headers = {"Accept": "application/json"}
        if body is not _NO_BODY:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        req = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return Response(resp.status, list(resp.headers.items()), resp.read())
        except urllib.error.HTTPError as exc:
            raw = exc.read() if exc.fp is not None else b""
            raise AdminError(exc.code, _reason(raw, exc.reason)) from None
        except (urllib.error.URLError, OSError) as exc:
            why = exc.reason if isinstance(exc, urllib.error.URLError) else exc
            raise AdminConnectionError(f"cannot reach the admin API at {self.base_url}: {why}") from None

    def call(self, method: str, path: str, *, query: dict[str, Any] | None = None, body: Any = _NO_BODY) -> Any:
        """:meth:`request` and decode the JSON answer (``None`` for no content)."""
        return self.request(method, path, query=query, body=body).json()

    def get(self, path: str, **query: Any) -> Any:
        return self.call("GET", path, query=query)


def _query_value(value: Any) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def _reason(raw: bytes, fallback: Any) -> str:
    """Pulsar's ``{"reason": ...}``; otherwise the body text or the HTTP reason phrase."""
    text = raw.decode("utf-8", "replace").strip()
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict) and data.get("reason"):
        return str(data["reason"])
    return text[:500] or str(fallback or "error")


# --------------------------------------------------------------------------- output


@dataclass(slots=True)
class Output:
    """What a command produced: ``data`` for ``--output json``; ``text`` overrides the default rendering."""

    data: Any = None
    text: str | None = None
    lines: list[str] = field(default_factory=list)


def render(result: Any, mode: str, out: TextIO) -> None:
    """Print ``result`` (plain data or :class:`Output`) the pulsar-admin way or as JSON."""
    if isinstance(result, Output):
        if mode == "json":
            if result.data is not None:
                out.write(json.dumps(result.data) + "\n")
            return
        if result.text is not None:
            out.write(result.text if result.text.endswith("\n") else result.text + "\n")
            return
        result = result.data
    if result is None:
        return
    if mode == "json":
        out.write(json.dumps(result) + "\n")
    elif isinstance(result, list) and all(isinstance(x, str | int | float) for x in result):
        for item in result:
            out.write(f"{item}\n")
    elif isinstance(result, dict | list):
        out.write(json.dumps(result, indent=2) + "\n")
    else:
        out.write(f"{result}\n")


def hexdump(data: bytes) -> str:
    """A boxed hex dump (the layout pulsar-admin prints for peeked payloads)."""
    rule = "+--------+-------------------------------------------------+----------------+"
    lines = [
        "         +-------------------------------------------------+",
        "         |  0  1  2  3  4  5  6  7  8  9  a  b  c  d  e  f |",
        rule,
    ]
    for offset in range(0, len(data), 16):
        chunk = data[offset : offset + 16]
        hexes = " ".join(f"{b:02x}" for b in chunk)
        text = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        lines.append(f"|{offset:08x}| {hexes:<47} |{text:<16}|")
    lines.append(rule)
    return "\n".join(lines)


# --------------------------------------------------------------------------- peeked messages


@dataclass(slots=True)
class PeekedMessage:
    """One message from peek/examine/get-message-by-id (headers ``X-Pulsar-*`` + payload)."""

    message_id: str
    payload: bytes
    properties: dict[str, str]
    publish_time: str | None = None
    event_time: str | None = None
    extra: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "messageId": self.message_id,
            "publishTime": self.publish_time,
            "eventTime": self.event_time,
            "properties": self.properties,
            "payload": base64.b64encode(self.payload).decode(),
        }
        with contextlib.suppress(UnicodeDecodeError):
            data["payloadText"] = self.payload.decode("utf-8")
        data.update(self.extra)
        return data

    def to_text(self) -> str:
        label = "Batch Message ID" if self.message_id.count(":") >= 2 else "Message ID"
        lines = [f"{label}: {self.message_id}"]
        if self.publish_time is not None:
            lines.append(f"Publish time: {self.publish_time}")
        if self.event_time is not None:
            lines.append(f"Event time: {self.event_time}")
        for key, value in self.extra.items():
            lines.append(f"{key}: {value}")
        if self.properties:
            lines.append("Properties:")
            lines.append(json.dumps(self.properties, indent=2))
        lines.append(hexdump(self.payload))
        return "\n".join(lines)


def messages_from_response(resp: Response) -> list[PeekedMessage]:
    """Decode a raw-message response; a batch entry is split into its messages like pulsar-admin does."""
    message_id = resp.header("X-Pulsar-Message-ID") or "?"
    properties: dict[str, str] = {}
    extra: dict[str, str] = {}
    for name, value in resp.headers:
        lower = name.lower()
        if lower == "x-pulsar-property":
            # Newer brokers send all properties as one JSON header.
            try:
                properties.update({str(k): str(v) for k, v in json.loads(value).items()})
            except (ValueError, AttributeError):
                extra["Properties"] = value
        elif lower.startswith("x-pulsar-property-"):
            properties[name[len("x-pulsar-property-") :]] = value
        elif lower in ("x-pulsar-producer-name", "x-pulsar-sequence-id", "x-pulsar-partition-key"):
            extra[name[len("x-pulsar-") :].replace("-", " ").capitalize()] = value
    publish_time = resp.header("X-Pulsar-publish-time")
    event_time = resp.header("X-Pulsar-event-time")
    batch = resp.header("X-Pulsar-num-batch-message")
    if batch and batch.isdigit() and int(batch) > 0:
        singles = _split_batch(resp.body, int(batch))
        if singles is not None:
            base_id = ":".join(message_id.split(":")[:2])
            return [
                PeekedMessage(
                    f"{base_id}:{i}",
                    payload,
                    {**properties, **props},
                    publish_time,
                    str(evt) if evt else event_time,
                    dict(extra),
                )
                for i, (payload, props, evt) in enumerate(singles)
            ]
    return [PeekedMessage(message_id, resp.body, properties, publish_time, event_time, extra)]


def _split_batch(body: bytes, count: int) -> list[tuple[bytes, dict[str, str], int]] | None:
    """Split an uncompressed batch: ``count`` x (u32 metadata size, SingleMessageMetadata, payload)."""
    try:
        from magnetar.broker.protocol import pulsar_api_pb2 as pb
    except ImportError:  # pragma: no cover - the CLI ships with the broker
        return None
    singles = []
    pos = 0
    try:
        for _ in range(count):
            (size,) = struct.unpack_from(">I", body, pos)
            pos += 4
            meta = pb.SingleMessageMetadata()
            meta.ParseFromString(body[pos : pos + size])
            pos += size
            payload = body[pos : pos + meta.payload_size]
            if len(payload) != meta.payload_size:
                return None
            pos += meta.payload_size
            singles.append((payload, {kv.key: kv.value for kv in meta.properties}, meta.event_time))
    except Exception:
        # Not a readable batch (compressed, or a broker that already split it): show the raw entry.
        return None
    return singles if pos == len(body) else None


# --------------------------------------------------------------------------- commands

Handler = Callable[[AdminClient, argparse.Namespace], Any]


def _verb(
    group: argparse._SubParsersAction,  # type: ignore[type-arg]
    name: str,
    help_text: str,
    handler: Handler,
    *,
    aliases: Iterable[str] = (),
    parents: list[argparse.ArgumentParser],
) -> argparse.ArgumentParser:
    p = group.add_parser(name, help=help_text, description=help_text, aliases=list(aliases), parents=parents)
    p.set_defaults(handler=handler)
    return p


def _body(**fields: Any) -> dict[str, Any]:
    """A JSON body without the fields the user left out."""
    return {k: v for k, v in fields.items() if v is not None}


def _csv(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


# clusters -------------------------------------------------------------------


def _cluster_body(a: argparse.Namespace) -> dict[str, Any]:
    return _body(
        serviceUrl=a.url,
        serviceUrlTls=a.url_secure,
        brokerServiceUrl=a.broker_url,
        brokerServiceUrlTls=a.broker_url_secure,
    )


def _add_clusters(sub: argparse._SubParsersAction, common: list[argparse.ArgumentParser]) -> None:  # type: ignore[type-arg]
    g = sub.add_parser("clusters", help="Operations on clusters").add_subparsers(
        dest="verb", required=True, metavar="VERB"
    )
    _verb(g, "list", "List the clusters", lambda c, a: c.get("/admin/v2/clusters"), parents=common)
    p = _verb(
        g,
        "get",
        "Get a cluster's configuration",
        lambda c, a: c.get(f"/admin/v2/clusters/{_seg(a.cluster)}"),
        parents=common,
    )
    p.add_argument("cluster")
    for verb, method, text in (("create", "PUT", "Provision a new cluster"), ("update", "POST", "Update a cluster")):
        p = _verb(
            g,
            verb,
            text,
            lambda c, a, m=method: c.call(m, f"/admin/v2/clusters/{_seg(a.cluster)}", body=_cluster_body(a)),
            parents=common,
        )
        p.add_argument("cluster")
        p.add_argument("--url", help="service URL (http://host:8080)")
        p.add_argument("--url-secure", help="TLS service URL")
        p.add_argument("--broker-url", help="broker service URL (pulsar://host:6650)")
        p.add_argument("--broker-url-secure", help="TLS broker service URL")
    p = _verb(
        g,
        "delete",
        "Delete a cluster",
        lambda c, a: c.call("DELETE", f"/admin/v2/clusters/{_seg(a.cluster)}"),
        parents=common,
    )
    p.add_argument("cluster")


# tenants --------------------------------------------------------------------


def _tenant_write(c: AdminClient, a: argparse.Namespace, method: str) -> Any:
    clusters = a.allowed_clusters
    if clusters is None and method == "PUT":
        # pulsar-admin's default: a new tenant may use every cluster.
        clusters = c.get("/admin/v2/clusters") or []
    if method == "POST" and (a.admin_roles is None or clusters is None):
        # An update replaces the whole TenantInfo: keep what the user did not mention.
        current = c.get(f"/admin/v2/tenants/{_seg(a.tenant)}") or {}
        if a.admin_roles is None:
            a.admin_roles = current.get("adminRoles", [])
        if clusters is None:
            clusters = current.get("allowedClusters", [])
    body = {"adminRoles": a.admin_roles or [], "allowedClusters": clusters}
    return c.call(method, f"/admin/v2/tenants/{_seg(a.tenant)}", body=body)


def _add_tenants(sub: argparse._SubParsersAction, common: list[argparse.ArgumentParser]) -> None:  # type: ignore[type-arg]
    g = sub.add_parser("tenants", help="Operations on tenants").add_subparsers(
        dest="verb", required=True, metavar="VERB"
    )
    _verb(g, "list", "List the tenants", lambda c, a: c.get("/admin/v2/tenants"), parents=common)
    p = _verb(
        g,
        "get",
        "Get a tenant's admin roles and allowed clusters",
        lambda c, a: c.get(f"/admin/v2/tenants/{_seg(a.tenant)}"),
        parents=common,
    )
    p.add_argument("tenant")
    for verb, method, text in (("create", "PUT", "Create a tenant"), ("update", "POST", "Update a tenant")):
        p = _verb(g, verb, text, lambda c, a, m=method: _tenant_write(c, a, m), parents=common)
        p.add_argument("tenant")
        p.add_argument("-r", "--admin-roles", type=_csv, help="comma-separated admin roles")
        p.add_argument(
            "-c",
            "--allowed-clusters",
            type=_csv,
            help="comma-separated allowed clusters (create: all clusters by default)",
        )
    p = _verb(
        g,
        "delete",
        "Delete a tenant",
        lambda c, a: c.call("DELETE", f"/admin/v2/tenants/{_seg(a.tenant)}", query={"force": a.force or None}),
        parents=common,
    )
    p.add_argument("tenant")
    p.add_argument("-f", "--force", action="store_true", help="delete its namespaces and topics too")


# namespaces -----------------------------------------------------------------


def _enable_flags(p: argparse.ArgumentParser, what: str, required: bool = True) -> None:
    group = p.add_mutually_exclusive_group(required=required)
    group.add_argument("-e", "--enable", dest="enable", action="store_true", default=None, help=f"enable {what}")
    group.add_argument("-d", "--disable", dest="enable", action="store_false", help=f"disable {what}")


def _set_auto_topic_creation(c: AdminClient, a: argparse.Namespace) -> Any:
    body: dict[str, Any] = {"allowAutoTopicCreation": a.enable}
    if a.enable:
        body["topicType"] = a.type
        if a.type == "partitioned":
            if a.num_partitions is None:
                raise UsageError("--num-partitions is required with --type partitioned")
            body["defaultNumPartitions"] = a.num_partitions
    return c.call("POST", _ns_path(a.namespace, "/autoTopicCreation"), body=body)


def _add_namespaces(sub: argparse._SubParsersAction, common: list[argparse.ArgumentParser]) -> None:  # type: ignore[type-arg]
    g = sub.add_parser("namespaces", help="Operations on namespaces").add_subparsers(
        dest="verb", required=True, metavar="VERB"
    )

    def ns_verb(name: str, text: str, handler: Handler, aliases: Iterable[str] = ()) -> argparse.ArgumentParser:
        p = _verb(g, name, text, handler, aliases=aliases, parents=common)
        p.add_argument("namespace", type=NAMESPACE, help="tenant/namespace")
        return p

    p = _verb(
        g,
        "list",
        "List the namespaces of a tenant",
        lambda c, a: c.get(f"/admin/v2/namespaces/{_seg(a.tenant)}"),
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
        type=_arg_type(retention_minutes, "time"),
        required=True,
        help="retention time: 120 (seconds), 10m, 3h, 2d, 5w; 0 none, -1 infinite",
    )
    p.add_argument(
        "-s",
        "--size",
        type=_arg_type(retention_megabytes, "size"),
        required=True,
        help="retention size: 4096 (bytes), 10M, 16G, 3T; 0 none, -1 infinite",
    )
    ns_verb("get-retention", "Get the retention policy", lambda c, a: c.get(_ns_path(a.namespace, "/retention")))
    ns_verb(
        "remove-retention",
        "Remove the retention policy",
        lambda c, a: c.call("DELETE", _ns_path(a.namespace, "/retention")),
    )

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
    ns_verb("get-message-ttl", "Get the message TTL", lambda c, a: c.get(_ns_path(a.namespace, "/messageTTL")))
    ns_verb(
        "remove-message-ttl",
        "Remove the message TTL",
        lambda c, a: c.call("DELETE", _ns_path(a.namespace, "/messageTTL")),
    )

    # backlog quota
    p = ns_verb(
        "set-backlog-quota",
        "Set a backlog quota",
        lambda c, a: c.call(
            "POST",
            _ns_path(a.namespace, "/backlogQuota"),
            query={"backlogQuotaType": a.type},
            body=_body(limitSize=a.limit_size, limitTime=a.limit_time, policy=a.policy),
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
    _enable_flags(p, "deduplication")
    ns_verb(
        "get-deduplication",
        "Get the deduplication setting",
        lambda c, a: c.get(_ns_path(a.namespace, "/deduplication")),
    )
    ns_verb(
        "remove-deduplication",
        "Remove the deduplication setting",
        lambda c, a: c.call("DELETE", _ns_path(a.namespace, "/deduplication")),
    )

    # auto topic creation
    p = ns_verb("set-auto-topic-creation", "Override the broker's topic auto-creation", _set_auto_topic_creation)
    _enable_flags(p, "topic auto-creation")
    p.add_argument("-t", "--type", default="non-partitioned", choices=["partitioned", "non-partitioned"])
    p.add_argument("-n", "--num-partitions", type=int, help="partitions of auto-created partitioned topics")
    ns_verb(
        "get-auto-topic-creation",
        "Get the topic auto-creation override",
        lambda c, a: c.get(_ns_path(a.namespace, "/autoTopicCreation")),
    )
    ns_verb(
        "remove-auto-topic-creation",
        "Remove the topic auto-creation override",
        lambda c, a: c.call("DELETE", _ns_path(a.namespace, "/autoTopicCreation")),
    )

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
    ns_verb("get-persistence", "Get the persistence policy", lambda c, a: c.get(_ns_path(a.namespace, "/persistence")))
    ns_verb(
        "remove-persistence",
        "Remove the persistence policy",
        lambda c, a: c.call("DELETE", _ns_path(a.namespace, "/persistence")),
    )


# topics ---------------------------------------------------------------------


def _terminate(c: AdminClient, a: argparse.Namespace) -> Output:
    data = c.call("POST", f"{a.topic.path}/terminate")
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
        f"{a.topic.path}/examinemessage",
        query={"initialPosition": a.initial_position, "messagePosition": a.message_position},
    )
    return _messages_output(messages_from_response(resp)[:1])


def _message_by_id(c: AdminClient, a: argparse.Namespace) -> Output:
    resp = c.request("GET", f"{a.topic.path}/ledger/{a.ledger_id}/entry/{a.entry_id}")
    return _messages_output(messages_from_response(resp))


def _add_topics(sub: argparse._SubParsersAction, common: list[argparse.ArgumentParser]) -> None:  # type: ignore[type-arg]
    g = sub.add_parser("topics", help="Operations on persistent topics").add_subparsers(
        dest="verb", required=True, metavar="VERB"
    )

    def ns_path(a: argparse.Namespace, suffix: str = "") -> str:
        tenant, ns = a.namespace
        return f"/admin/v2/persistent/{_seg(tenant)}/{_seg(ns)}{suffix}"

    def t_verb(name: str, text: str, handler: Handler, aliases: Iterable[str] = ()) -> argparse.ArgumentParser:
        p = _verb(g, name, text, handler, aliases=aliases, parents=common)
        p.add_argument("topic", type=TOPIC, help="persistent://tenant/namespace/topic")
        return p

    def sub_arg(p: argparse.ArgumentParser) -> None:
        p.add_argument("-s", "--subscription", required=True, help="subscription name")

    p = _verb(g, "list", "List the topics of a namespace", lambda c, a: c.get(ns_path(a)), parents=common)
    p.add_argument("namespace", type=NAMESPACE, help="tenant/namespace")
    p = _verb(
        g,
        "list-partitioned-topics",
        "List the partitioned topics of a namespace",
        lambda c, a: c.get(ns_path(a, "/partitioned")),
        parents=common,
    )
    p.add_argument("namespace", type=NAMESPACE, help="tenant/namespace")

    t_verb("create", "Create a non-partitioned topic", lambda c, a: c.call("PUT", a.topic.path))
    p = t_verb(
        "create-partitioned-topic",
        "Create a partitioned topic",
        lambda c, a: c.call("PUT", f"{a.topic.path}/partitions", body=a.partitions),
    )
    p.add_argument("-p", "--partitions", type=int, required=True)
    p = t_verb(
        "update-partitioned-topic",
        "Grow a partitioned topic",
        lambda c, a: c.call("POST", f"{a.topic.path}/partitions", body=a.partitions, query={"force": a.force or None}),
    )
    p.add_argument("-p", "--partitions", type=int, required=True)
    p.add_argument("-f", "--force", action="store_true")
    t_verb(
        "get-partitioned-topic-metadata",
        "Get a partitioned topic's partition count",
        lambda c, a: c.get(f"{a.topic.path}/partitions"),
    )
    p = t_verb(
        "delete",
        "Delete a topic",
        lambda c, a: c.call("DELETE", a.topic.path, query={"force": a.force or None}),
    )
    p.add_argument("-f", "--force", action="store_true", help="close producers and consumers first")
    p = t_verb(
        "delete-partitioned-topic",
        "Delete a partitioned topic and its partitions",
        lambda c, a: c.call("DELETE", f"{a.topic.path}/partitions", query={"force": a.force or None}),
    )
    p.add_argument("-f", "--force", action="store_true", help="close producers and consumers first")

    p = t_verb(
        "stats",
        "Get a topic's stats",
        lambda c, a: c.get(f"{a.topic.path}/stats", getPreciseBacklog=a.get_precise_backlog or None),
    )
    p.add_argument("-gpb", "--get-precise-backlog", action="store_true")
    p = t_verb(
        "partitioned-stats",
        "Get a partitioned topic's stats",
        lambda c, a: c.get(f"{a.topic.path}/partitioned-stats", perPartition=a.per_partition),
    )
    p.add_argument("--per-partition", action="store_true", help="include each partition's stats")
    t_verb("stats-internal", "Get a topic's internal stats", lambda c, a: c.get(f"{a.topic.path}/internalStats"))
    t_verb("last-message-id", "Get the last message id", lambda c, a: c.get(f"{a.topic.path}/lastMessageId"))
    t_verb("terminate", "Terminate a topic (no more publishing)", _terminate)
    t_verb("unload", "Unload a topic", lambda c, a: c.call("PUT", f"{a.topic.path}/unload"))
    t_verb("subscriptions", "List a topic's subscriptions", lambda c, a: c.get(f"{a.topic.path}/subscriptions"))

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
        lambda c, a: c.call("POST", f"{a.topic.path}/all_subscription/expireMessages/{a.expire_time}"),
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


# brokers --------------------------------------------------------------------


def _add_brokers(sub: argparse._SubParsersAction, common: list[argparse.ArgumentParser]) -> None:  # type: ignore[type-arg]
    g = sub.add_parser("brokers", help="Operations on brokers").add_subparsers(
        dest="verb", required=True, metavar="VERB"
    )
    p = _verb(
        g,
        "list",
        "List the active brokers of a cluster",
        lambda c, a: c.get(f"/admin/v2/brokers/{_seg(a.cluster)}"),
        parents=common,
    )
    p.add_argument("cluster")
    _verb(g, "healthcheck", "Check the broker's health", lambda c, a: c.get("/admin/v2/brokers/health"), parents=common)


# --------------------------------------------------------------------------- entry


class UsageError(Exception):
    """A combination of arguments argparse cannot check by itself."""


def _common_options(defaults: bool) -> argparse.ArgumentParser:
    """``--admin-url`` and ``--output``, accepted before the group and after the verb."""
    p = argparse.ArgumentParser(add_help=False)
    suppress = argparse.SUPPRESS
    p.add_argument(
        "--admin-url",
        default=os.environ.get(ADMIN_URL_ENV, DEFAULT_ADMIN_URL) if defaults else suppress,
        help=f"admin API base URL (default ${ADMIN_URL_ENV} or {DEFAULT_ADMIN_URL})",
    )
    p.add_argument(
        "-o",
        "--output",
        choices=["text", "json"],
        default="text" if defaults else suppress,
        help="text (pulsar-admin style, default) or json",
    )
    p.add_argument("--timeout", type=float, default=30.0 if defaults else suppress, help="request timeout in seconds")
    return p


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register ``magnetar admin``."""
    p = sub.add_parser(
        "admin",
        help="administer a broker over the admin REST API (pulsar-admin's verbs)",
        description="Administer clusters, tenants, namespaces, topics and brokers over the admin REST API v2.",
        parents=[_common_options(defaults=True)],
    )
    groups = p.add_subparsers(dest="group", required=True, metavar="GROUP")
    # Leaf parsers repeat the options without defaults so a value before the group is not overwritten.
    common = [_common_options(defaults=False)]
    _add_clusters(groups, common)
    _add_tenants(groups, common)
    _add_namespaces(groups, common)
    _add_topics(groups, common)
    _add_brokers(groups, common)
    p.set_defaults(run=run)


def run(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Execute the parsed command; returns the exit status."""
    out = out or sys.stdout
    err = err or sys.stderr
    client = AdminClient(args.admin_url, timeout=args.timeout)
    try:
        result = args.handler(client, args)
    except UsageError as exc:
        err.write(f"error: {exc}\n")
        return 2
    except AdminError as exc:
        err.write(f"error: {exc.reason} (HTTP {exc.status})\n")
        return 1
    except AdminConnectionError as exc:
        err.write(f"error: {exc}\n")
        return 1
    render(result, args.output, out)
    return 0
