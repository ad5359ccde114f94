"""``magnetar admin``: value parsing in-process, every verb as a subprocess against the session broker.

Tests of a verb whose REST operation the broker does not serve yet are skipped on a probe of
``GET /admin/v2/openapi.json``; they start running by themselves when the endpoint lands.
"""

from __future__ import annotations

import io
import json
import re
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pulsar
import pytest

from magnetar.admin_client.client import Response
from magnetar.admin_client.paths import parse_topic, topic_path
from magnetar.cli.admin.messages import messages_from_response
from magnetar.cli.admin.output import Output, hexdump, render
from magnetar.cli.admin.values import (
    LATEST,
    parse_message_id,
    parse_namespace,
    parse_relative_time,
    parse_size,
    retention_megabytes,
    retention_minutes,
)
from tests.conftest import StandaloneProcess

# --------------------------------------------------------------------------- probe of the OpenAPI document


#: Values a template parameter can take when the route restricts it but the document does not say so
#: (the ``{domain}`` routes are ``persistent|non-persistent`` regexes, rendered as plain strings).
_RESTRICTED = {"domain": {"persistent", "non-persistent"}}


def _segments(path: str) -> list[tuple[str, bool]]:
    """Path segments as ``(text, is_parameter)``; a parameter's text is its name."""
    out = []
    for seg in path.strip("/").split("/"):
        m = re.fullmatch(r"\{(\w*)[^}]*\}", seg)
        out.append((m.group(1), True) if m else (seg, False))
    return out


def _served(spec: dict[str, Any], op: str) -> bool:
    """Whether ``"METHOD /path/{}/..."`` is routed to an operation of ``spec``.

    A ``{}`` of ours needs a parameter there; a literal of ours matches the same literal or a
    parameter that can take it.
    """
    method, path = op.split(" ", 1)
    want = _segments(path)
    for spec_path, item in spec.get("paths", {}).items():
        if method.lower() not in item:
            continue
        have = _segments(spec_path)
        if len(have) == len(want) and all(
            (h_param and (w_param or w in _RESTRICTED.get(h, {w}))) or (not h_param and not w_param and h == w)
            for (h, h_param), (w, w_param) in zip(have, want, strict=True)
        ):
            return True
    return False


def test_probe_matching() -> None:
    spec = {
        "paths": {
            "/admin/v2/{domain}/{tenant}/{namespace}": {"get": {}},
            "/admin/v2/clusters/{cluster}": {"put": {}},
        }
    }
    assert _served(spec, "GET /admin/v2/persistent/{}/{}")
    assert not _served(spec, "GET /admin/v2/namespaces/{}/{}")  # not a domain
    assert not _served(spec, "PUT /admin/v2/persistent/{}/{}")  # method
    assert _served(spec, "PUT /admin/v2/clusters/{}")
    assert _served(spec, "PUT /admin/v2/clusters/c1")  # our literal, their parameter: routed there...
    assert not _served(spec, "PUT /admin/v2/{}/{}")  # ...but not our parameter, their literal


def needs(*ops: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Skip the test unless the broker's OpenAPI document lists every one of ``ops`` (``"GET /admin/v2/x/{}"``)."""

    def deco(func: Callable[..., Any]) -> Callable[..., Any]:
        func.admin_ops = ops  # type: ignore[attr-defined]
        return func

    return deco


@pytest.fixture(scope="session")
def openapi(standalone: StandaloneProcess) -> dict[str, Any]:
    with urllib.request.urlopen(f"{standalone.http_url}/admin/v2/openapi.json", timeout=10) as r:
        return json.loads(r.read())


@pytest.fixture(autouse=True)
def _skip_unserved(request: pytest.FixtureRequest) -> None:
    ops = getattr(request.function, "admin_ops", ())
    if not ops:
        return
    spec = request.getfixturevalue("openapi")
    missing = [op for op in ops if not _served(spec, op)]
    if missing:
        pytest.skip(f"endpoint not served yet: {', '.join(missing)}")


# --------------------------------------------------------------------------- running the CLI


def run_cli(url: str, *args: str, output: str | None = None, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "magnetar.cli.main", "admin", "--admin-url", url]
    if output:
        cmd += ["--output", output]
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=timeout)


class Admin:
    """The CLI bound to one broker: ``ok`` expects success, ``fails`` expects exit 1."""

    def __init__(self, url: str) -> None:
        self.url = url

    def ok(self, *args: str) -> str:
        r = run_cli(self.url, *args)
        assert r.returncode == 0, f"magnetar admin {' '.join(args)} -> {r.returncode}\n{r.stdout}\n{r.stderr}"
        return r.stdout

    def json(self, *args: str) -> Any:
        r = run_cli(self.url, *args, output="json")
        assert r.returncode == 0, f"magnetar admin {' '.join(args)} -> {r.returncode}\n{r.stdout}\n{r.stderr}"
        return json.loads(r.stdout) if r.stdout.strip() else None

    def fails(self, *args: str) -> str:
        r = run_cli(self.url, *args)
        assert r.returncode == 1, f"expected exit 1: magnetar admin {' '.join(args)} -> {r.returncode}\n{r.stdout}"
        assert r.stderr.startswith("error: "), r.stderr
        return r.stderr


@pytest.fixture
def admin(standalone: StandaloneProcess) -> Admin:
    return Admin(standalone.http_url)


def _http(url: str, method: str, body: Any = None) -> int:
    """Set-up requests that are not what the test is about."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code


def _unique(prefix: str) -> str:
    return f"{prefix}-{time.monotonic_ns() % 10**10}"


@pytest.fixture
def namespace(standalone: StandaloneProcess) -> Iterator[str]:
    """A fresh namespace in tenant ``public`` (needs namespace create/delete)."""
    ns = f"public/{_unique('cli')}"
    assert _http(f"{standalone.http_url}/admin/v2/namespaces/{ns}", "PUT") in (200, 204)
    yield ns
    _http(f"{standalone.http_url}/admin/v2/namespaces/{ns}?force=true", "DELETE")


def _publish(client: Any, topic: str, payloads: list[bytes], **producer_args: Any) -> None:
    producer = client.create_producer(topic, **producer_args)
    sent: list[Any] = []
    for i, p in enumerate(payloads):
        # Asynchronous sends so that a batching producer puts them in one batch.
        producer.send_async(p, lambda res, msg_id: sent.append(res), properties={"index": str(i)})
    producer.flush()
    assert sent == [pulsar.Result.Ok] * len(payloads), sent
    producer.close()


NS_CREATE = ("PUT /admin/v2/namespaces/{}/{}", "DELETE /admin/v2/namespaces/{}/{}")
TOPIC = "/admin/v2/persistent/{}/{}/{}"
SUB = TOPIC + "/subscription/{}"


# --------------------------------------------------------------------------- value formats (in-process)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("120", 120),
        ("0", 0),
        ("-1", -1),
        ("10s", 10),
        ("10m", 600),
        ("1h", 3600),
        ("3H", 10800),
        ("2d", 172800),
        ("5w", 5 * 7 * 86400),
        ("1y", 365 * 86400),
        (" 7m ", 420),
    ],
)
def test_parse_relative_time(text: str, seconds: int) -> None:
    assert parse_relative_time(text) == seconds


@pytest.mark.parametrize("text", ["", "m", "10x", "1.5h", "ten", "10mm", "--1"])
def test_parse_relative_time_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_relative_time(text)


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("4096", 4096),
        ("-1", -1),
        ("0", 0),
        ("10k", 10 << 10),
        ("10K", 10 << 10),
        ("100M", 100 << 20),
        ("100m", 100 << 20),
        ("1G", 1 << 30),
        ("3T", 3 << 40),
    ],
)
def test_parse_size(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "G", "10X", "1.5G", "10GB", "big"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_size(text)


def test_retention_units_are_pulsars() -> None:
    # Pulsar stores minutes and MiB; -1 (infinite) passes through unchanged.
    assert retention_minutes("2d") == 2880
    assert retention_minutes("120") == 2
    assert retention_minutes("-1") == -1
    assert retention_megabytes("1G") == 1024
    assert retention_megabytes("100") == 0
    assert retention_megabytes("-1") == -1


def test_parse_message_id_and_names() -> None:
    assert parse_message_id("12:3") == (12, 3)
    assert parse_message_id("12:3:-1") == (12, 3)
    assert parse_message_id("earliest") == (-1, -1)
    assert parse_message_id("latest") == LATEST
    with pytest.raises(ValueError):
        parse_message_id("12")
    assert str(parse_topic("t1")) == "persistent://public/default/t1"
    assert str(parse_topic("a/b/c")) == "persistent://a/b/c"
    assert topic_path(parse_topic("persistent://a/b/c d")) == "/admin/v2/persistent/a/b/c%20d"
    for bad in ("a/b", "ftp://a/b/c", "persistent://a//c"):
        with pytest.raises(ValueError):
            parse_topic(bad)
    assert parse_namespace("t/ns") == ("t", "ns")
    with pytest.raises(ValueError):
        parse_namespace("t/ns/x")


def test_render_text_and_json() -> None:
    out = io.StringIO()
    render(["a", "b"], "text", out)
    render({"k": 1}, "text", out)
    render(None, "text", out)
    render(Output(data={"x": 1}, text="done"), "text", out)
    assert out.getvalue() == 'a\nb\n{\n  "k": 1\n}\ndone\n'
    out = io.StringIO()
    render(["a"], "json", out)
    render(Output(data={"x": 1}, text="done"), "json", out)
    assert out.getvalue() == '["a"]\n{"x": 1}\n'


def test_hexdump_layout() -> None:
    dump = hexdump(b"hello, world! \x00\x01\xff+")
    lines = dump.splitlines()
    assert lines[3] == "|00000000| 68 65 6c 6c 6f 2c 20 77 6f 72 6c 64 21 20 00 01 |hello, world! ..|"
    assert lines[4].startswith("|00000010| ff 2b ")
    assert len({len(line) for line in lines[2:]}) == 1


def test_peeked_batch_is_split() -> None:
    from magnetar.broker.protocol import pulsar_api_pb2 as pb

    body = b""
    for i, payload in enumerate([b"one", b"two"]):
        meta = pb.SingleMessageMetadata(payload_size=len(payload))
        meta.properties.add(key="i", value=str(i))
        raw = meta.SerializeToString()
        body += struct.pack(">I", len(raw)) + raw + payload
    resp = Response(
        200,
        [("X-Pulsar-Message-ID", "7:4"), ("X-Pulsar-num-batch-message", "2"), ("X-Pulsar-publish-time", "t")],
        body,
    )
    msgs = messages_from_response(resp)
    assert [(m.message_id, m.payload, m.properties) for m in msgs] == [
        ("7:4:0", b"one", {"i": "0"}),
        ("7:4:1", b"two", {"i": "1"}),
    ]
    assert msgs[0].to_text().startswith("Batch Message ID: 7:4:0\nPublish time: t\n")
    # A plain message with properties as separate headers.
    plain = messages_from_response(Response(200, [("X-Pulsar-Message-ID", "7:5"), ("X-Pulsar-PROPERTY-k", "v")], b"x"))
    assert plain[0].to_json()["properties"] == {"k": "v"} and plain[0].to_json()["payloadText"] == "x"


# --------------------------------------------------------------------------- errors and usage


class _ErrorServer(BaseHTTPRequestHandler):
    """Answers every request like Pulsar does on a conflict."""

    def _answer(self) -> None:
        body = json.dumps({"reason": "Tenant already exists"}).encode()
        self.send_response(409)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_PUT = do_POST = do_DELETE = _answer

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def error_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ErrorServer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_server_reason_is_printed_and_exit_is_1(error_server: str) -> None:
    r = run_cli(error_server, "tenants", "create", "t1", "--allowed-clusters", "standalone")
    assert r.returncode == 1
    assert r.stderr == "error: Tenant already exists (HTTP 409)\n"
    assert r.stdout == ""


def test_connection_failure_is_clear() -> None:
    from tests.conftest import free_port

    url = f"http://127.0.0.1:{free_port()}"
    r = run_cli(url, "clusters", "list")
    assert r.returncode == 1
    assert f"cannot reach the admin API at {url}" in r.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["namespaces", "set-retention", "public/default", "--time", "10x", "--size", "1G"],
        ["namespaces", "set-retention", "public/default", "--time", "10m", "--size", "1Q"],
        ["namespaces", "set-message-ttl", "public/default", "--ttl", "soon"],
        ["namespaces", "set-deduplication", "public/default"],
        ["namespaces", "set-deduplication", "public/default", "--enable", "--disable"],
        ["topics", "stats", "a/b"],
        ["topics", "create-subscription", "t", "-s", "s", "--messageId", "12"],
        ["topics", "reset-cursor", "t", "-s", "s"],
        ["nonsense"],
    ],
)
def test_bad_arguments_exit_2(args: list[str]) -> None:
    # Never reaches a server: argparse (or the CLI's own checks) refuse first.
    r = run_cli("http://127.0.0.1:9", *args)
    assert r.returncode == 2, r.stderr
    assert "error" in r.stderr


def test_options_after_the_verb(standalone: StandaloneProcess) -> None:
    verb = [sys.executable, "-m", "magnetar.cli.main", "admin", "brokers", "healthcheck"]
    r = subprocess.run(
        [*verb, "-o", "json", "--admin-url", standalone.http_url],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == "ok"


# --------------------------------------------------------------------------- brokers


def test_brokers_healthcheck(admin: Admin) -> None:
    assert admin.ok("brokers", "healthcheck") == "ok\n"


@needs("GET /admin/v2/brokers/{}")
def test_brokers_list(admin: Admin) -> None:
    brokers = admin.json("brokers", "list", "standalone")
    assert isinstance(brokers, list) and brokers
    assert admin.ok("brokers", "list", "standalone").splitlines() == brokers


# --------------------------------------------------------------------------- clusters


@needs("GET /admin/v2/clusters", "GET /admin/v2/clusters/{}")
def test_clusters_list_and_get(admin: Admin) -> None:
    assert "standalone" in admin.ok("clusters", "list").splitlines()
    assert "standalone" in admin.json("clusters", "list")
    data = admin.json("clusters", "get", "standalone")
    assert data["serviceUrl"].startswith("http://") and data["brokerServiceUrl"].startswith("pulsar://")
    # Text output is pulsar-admin's pretty JSON.
    assert json.loads(admin.ok("clusters", "get", "standalone")) == data
    assert "not" in admin.fails("clusters", "get", _unique("nosuch")).lower()


@needs(
    "PUT /admin/v2/clusters/{}",
    "POST /admin/v2/clusters/{}",
    "GET /admin/v2/clusters/{}",
    "DELETE /admin/v2/clusters/{}",
)
def test_clusters_create_update_delete(admin: Admin) -> None:
    name = _unique("c")
    admin.ok("clusters", "create", name, "--url", "http://h1:8080", "--broker-url", "pulsar://h1:6650")
    assert admin.json("clusters", "get", name)["serviceUrl"] == "http://h1:8080"
    admin.fails("clusters", "create", name, "--url", "http://h1:8080")  # 409: exists
    admin.ok("clusters", "update", name, "--url", "http://h2:8080", "--broker-url", "pulsar://h2:6650")
    data = admin.json("clusters", "get", name)
    assert (data["serviceUrl"], data["brokerServiceUrl"]) == ("http://h2:8080", "pulsar://h2:6650")
    assert name in admin.json("clusters", "list")
    admin.ok("clusters", "delete", name)
    assert name not in admin.json("clusters", "list")
    admin.fails("clusters", "delete", name)


# --------------------------------------------------------------------------- tenants


TENANT_OPS = (
    "PUT /admin/v2/tenants/{}",
    "POST /admin/v2/tenants/{}",
    "GET /admin/v2/tenants/{}",
    "GET /admin/v2/tenants",
    "DELETE /admin/v2/tenants/{}",
)


@needs(*TENANT_OPS)
def test_tenants_lifecycle(admin: Admin) -> None:
    tenant = _unique("tn")
    admin.ok("tenants", "create", tenant, "--admin-roles", "alice,bob", "--allowed-clusters", "standalone")
    assert admin.json("tenants", "get", tenant) == {"adminRoles": ["alice", "bob"], "allowedClusters": ["standalone"]}
    assert tenant in admin.ok("tenants", "list").splitlines()
    admin.fails("tenants", "create", tenant)  # exists
    # update keeps the fields it is not given
    admin.ok("tenants", "update", tenant, "--admin-roles", "carol")
    assert admin.json("tenants", "get", tenant) == {"adminRoles": ["carol"], "allowedClusters": ["standalone"]}
    admin.ok("tenants", "delete", tenant)
    assert tenant not in admin.json("tenants", "list")
    assert admin.fails("tenants", "get", tenant)


@needs(*TENANT_OPS)
def test_tenant_create_defaults_to_all_clusters(admin: Admin) -> None:
    tenant = _unique("tn")
    admin.ok("tenants", "create", tenant)
    try:
        info = admin.json("tenants", "get", tenant)
        assert "standalone" in info["allowedClusters"] and info["adminRoles"] == []
    finally:
        admin.ok("tenants", "delete", tenant)


@needs(*TENANT_OPS, *NS_CREATE, "GET /admin/v2/namespaces/{}")
def test_tenant_delete_force(admin: Admin) -> None:
    tenant = _unique("tn")
    admin.ok("tenants", "create", tenant, "-c", "standalone")
    admin.ok("namespaces", "create", f"{tenant}/ns1")
    assert admin.json("namespaces", "list", tenant) == [f"{tenant}/ns1"]
    admin.fails("tenants", "delete", tenant)  # still has a namespace
    admin.ok("tenants", "delete", tenant, "--force")
    assert tenant not in admin.json("tenants", "list")


# --------------------------------------------------------------------------- namespaces


@needs(*NS_CREATE, "GET /admin/v2/namespaces/{}", "GET /admin/v2/namespaces/{}/{}")
def test_namespaces_create_list_policies_delete(admin: Admin) -> None:
    ns = f"public/{_unique('ns')}"
    admin.ok("namespaces", "create", ns)
    assert ns in admin.ok("namespaces", "list", "public").splitlines()
    admin.fails("namespaces", "create", ns)  # exists
    policies = admin.json("namespaces", "policies", ns)
    assert isinstance(policies, dict) and policies
    assert json.loads(admin.ok("namespaces", "policies", ns)) == policies
    admin.ok("namespaces", "delete", ns)
    assert ns not in admin.json("namespaces", "list", "public")
    admin.fails("namespaces", "policies", ns)
    admin.fails("namespaces", "create", "nosuchtenant-xyz/ns")


@needs(*NS_CREATE, "GET /admin/v2/namespaces/{}/{}/topics", "PUT " + TOPIC, "GET /admin/v2/namespaces/{}")
def test_namespaces_topics_and_delete_force(admin: Admin, namespace: str) -> None:
    topic = f"persistent://{namespace}/t1"
    admin.ok("topics", "create", topic)
    assert admin.json("namespaces", "topics", namespace) == [topic]
    assert admin.ok("namespaces", "topics", namespace) == f"{topic}\n"
    admin.fails("namespaces", "delete", namespace)  # not empty
    admin.ok("namespaces", "delete", namespace, "--force")
    assert namespace not in admin.json("namespaces", "list", "public")


@needs(*NS_CREATE, *(f"{m} /admin/v2/namespaces/{{}}/{{}}/retention" for m in ("POST", "GET", "DELETE")))
def test_namespaces_retention(admin: Admin, namespace: str) -> None:
    admin.ok("namespaces", "set-retention", namespace, "--time", "2d", "--size", "1G")
    assert admin.json("namespaces", "get-retention", namespace) == {
        "retentionTimeInMinutes": 2880,
        "retentionSizeInMB": 1024,
    }
    admin.ok("namespaces", "set-retention", namespace, "-t", "-1", "-s", "-1")
    assert admin.json("namespaces", "get-retention", namespace) == {
        "retentionTimeInMinutes": -1,
        "retentionSizeInMB": -1,
    }
    admin.ok("namespaces", "remove-retention", namespace)
    assert admin.json("namespaces", "get-retention", namespace) in (
        None,
        {},
        {"retentionTimeInMinutes": 0, "retentionSizeInMB": 0},
    )


@needs(*NS_CREATE, *(f"{m} /admin/v2/namespaces/{{}}/{{}}/messageTTL" for m in ("POST", "GET", "DELETE")))
def test_namespaces_message_ttl(admin: Admin, namespace: str) -> None:
    admin.ok("namespaces", "set-message-ttl", namespace, "--ttl", "1h")
    assert admin.json("namespaces", "get-message-ttl", namespace) == 3600
    assert admin.ok("namespaces", "get-message-ttl", namespace) == "3600\n"
    admin.ok("namespaces", "set-message-ttl", namespace, "-ttl", "90")
    assert admin.json("namespaces", "get-message-ttl", namespace) == 90
    admin.ok("namespaces", "remove-message-ttl", namespace)
    assert admin.json("namespaces", "get-message-ttl", namespace) in (None, 0)


@needs(
    *NS_CREATE,
    "POST /admin/v2/namespaces/{}/{}/backlogQuota",
    "DELETE /admin/v2/namespaces/{}/{}/backlogQuota",
    "GET /admin/v2/namespaces/{}/{}/backlogQuotaMap",
)
def test_namespaces_backlog_quota(admin: Admin, namespace: str) -> None:
    admin.ok("namespaces", "set-backlog-quota", namespace, "--limit-size", "100M", "--policy", "producer_exception")
    quotas = admin.json("namespaces", "get-backlog-quotas", namespace)
    assert quotas["destination_storage"]["limitSize"] == 100 << 20
    assert quotas["destination_storage"]["policy"] == "producer_exception"
    admin.ok(
        "namespaces", "set-backlog-quota", namespace,
        "--limit-time", "2h", "--policy", "consumer_backlog_eviction", "--type", "message_age",
    )  # fmt: skip
    quotas = admin.json("namespaces", "get-backlog-quotas", namespace)
    assert quotas["message_age"]["limitTime"] == 7200
    assert quotas["message_age"]["policy"] == "consumer_backlog_eviction"
    admin.ok("namespaces", "remove-backlog-quota", namespace)
    quotas = admin.json("namespaces", "get-backlog-quotas", namespace)
    assert "destination_storage" not in quotas and "message_age" in quotas
    admin.ok("namespaces", "remove-backlog-quota", namespace, "--type", "message_age")
    assert not admin.json("namespaces", "get-backlog-quotas", namespace)
    admin.fails("namespaces", "set-backlog-quota", "public/nosuch-ns-xyz", "-l", "1G", "-p", "producer_exception")


@needs(*NS_CREATE, *(f"{m} /admin/v2/namespaces/{{}}/{{}}/deduplication" for m in ("POST", "GET", "DELETE")))
def test_namespaces_deduplication(admin: Admin, namespace: str) -> None:
    admin.ok("namespaces", "set-deduplication", namespace, "--enable")
    assert admin.json("namespaces", "get-deduplication", namespace) is True
    admin.ok("namespaces", "set-deduplication", namespace, "--disable")
    assert admin.json("namespaces", "get-deduplication", namespace) is False
    admin.ok("namespaces", "remove-deduplication", namespace)
    assert admin.json("namespaces", "get-deduplication", namespace) in (None, False)


@needs(*NS_CREATE, *(f"{m} /admin/v2/namespaces/{{}}/{{}}/autoTopicCreation" for m in ("POST", "GET", "DELETE")))
def test_namespaces_auto_topic_creation(admin: Admin, namespace: str) -> None:
    admin.ok("namespaces", "set-auto-topic-creation", namespace, "--enable", "--type", "partitioned", "-n", "3")
    assert admin.json("namespaces", "get-auto-topic-creation", namespace) == {
        "allowAutoTopicCreation": True,
        "topicType": "partitioned",
        "defaultNumPartitions": 3,
    }
    admin.ok("namespaces", "set-auto-topic-creation", namespace, "--disable")
    assert admin.json("namespaces", "get-auto-topic-creation", namespace)["allowAutoTopicCreation"] is False
    admin.ok("namespaces", "remove-auto-topic-creation", namespace)
    assert admin.json("namespaces", "get-auto-topic-creation", namespace) in (None, {})
    r = run_cli(admin.url, "namespaces", "set-auto-topic-creation", namespace, "--enable", "--type", "partitioned")
    assert r.returncode == 2 and "--num-partitions" in r.stderr


@needs(*NS_CREATE, *(f"{m} /admin/v2/namespaces/{{}}/{{}}/persistence" for m in ("POST", "GET", "DELETE")))
def test_namespaces_persistence(admin: Admin, namespace: str) -> None:
    admin.ok("namespaces", "set-persistence", namespace, "-e", "1", "-w", "1", "-a", "1")
    data = admin.json("namespaces", "get-persistence", namespace)
    assert (data["bookkeeperEnsemble"], data["bookkeeperWriteQuorum"], data["bookkeeperAckQuorum"]) == (1, 1, 1)
    admin.fails("namespaces", "set-persistence", namespace, "-e", "1", "-w", "2", "-a", "3")  # ack > write > ensemble
    admin.ok("namespaces", "remove-persistence", namespace)
    assert admin.json("namespaces", "get-persistence", namespace) in (None, {})


# --------------------------------------------------------------------------- topics


@needs(
    "PUT " + TOPIC,
    "DELETE " + TOPIC,
    "GET /admin/v2/persistent/{}/{}",
    "GET " + TOPIC + "/stats",
    "GET " + TOPIC + "/internalStats",
    "GET " + TOPIC + "/lastMessageId",
    "PUT " + TOPIC + "/unload",
)
def test_topics_create_stats_delete(admin: Admin, topic_name: str) -> None:
    admin.ok("topics", "create", topic_name)
    assert topic_name in admin.ok("topics", "list", "public/default").splitlines()
    admin.fails("topics", "create", topic_name)  # exists
    stats = admin.json("topics", "stats", topic_name)
    assert stats["msgInCounter"] == 0 and stats["subscriptions"] == {} and stats["publishers"] == []
    assert json.loads(admin.ok("topics", "stats", topic_name)) == stats
    internal = admin.json("topics", "stats-internal", topic_name)
    assert internal["entriesAddedCounter"] == 0 and "ledgers" in internal
    assert isinstance(admin.json("topics", "last-message-id", topic_name), dict)
    admin.ok("topics", "unload", topic_name)
    admin.ok("topics", "delete", topic_name)
    assert topic_name not in admin.json("topics", "list", "public/default")
    admin.fails("topics", "stats", topic_name)
    admin.fails("topics", "delete", topic_name)


@needs("DELETE " + TOPIC, "GET /admin/v2/persistent/{}/{}")
def test_topics_delete_force_with_producer(admin: Admin, client: Any, topic_name: str) -> None:
    producer = client.create_producer(topic_name)
    producer.send(b"x")
    admin.fails("topics", "delete", topic_name)  # a producer is connected
    # (Not checked afterwards: the disconnected producer reconnects and auto-creates the topic again.)
    admin.ok("topics", "delete", topic_name, "--force")
    producer.close()


@needs(
    *(f"{m} {TOPIC}/partitions" for m in ("PUT", "POST", "GET", "DELETE")),
    "GET /admin/v2/persistent/{}/{}/partitioned",
    "GET " + TOPIC + "/partitioned-stats",
)
def test_topics_partitioned(admin: Admin, topic_name: str) -> None:
    admin.ok("topics", "create-partitioned-topic", topic_name, "--partitions", "2")
    assert admin.json("topics", "get-partitioned-topic-metadata", topic_name)["partitions"] == 2
    assert topic_name in admin.ok("topics", "list-partitioned-topics", "public/default").splitlines()
    admin.fails("topics", "create-partitioned-topic", topic_name, "-p", "2")  # exists
    admin.ok("topics", "update-partitioned-topic", topic_name, "-p", "3")
    assert admin.json("topics", "get-partitioned-topic-metadata", topic_name)["partitions"] == 3
    admin.fails("topics", "update-partitioned-topic", topic_name, "-p", "1")  # shrinking is refused
    stats = admin.json("topics", "partitioned-stats", topic_name, "--per-partition")
    assert stats["metadata"]["partitions"] == 3 and "msgRateIn" in stats
    admin.ok("topics", "delete-partitioned-topic", topic_name)
    assert topic_name not in admin.json("topics", "list-partitioned-topics", "public/default")


SUBSCRIPTION_OPS = (
    "PUT " + SUB,
    "DELETE " + SUB,
    "GET " + TOPIC + "/subscriptions",
    "GET " + TOPIC + "/stats",
)


def _backlog(admin: Admin, topic: str, sub: str) -> int:
    return int(admin.json("topics", "stats", topic)["subscriptions"][sub]["msgBacklog"])


@needs(*SUBSCRIPTION_OPS, "POST " + SUB + "/skip/{}", "POST " + SUB + "/skip_all")
def test_topics_subscriptions_skip_clear(admin: Admin, client: Any, topic_name: str) -> None:
    _publish(client, topic_name, [b"a", b"b", b"c"])
    admin.ok("topics", "create-subscription", topic_name, "-s", "from-start", "--messageId", "earliest")
    admin.ok("topics", "create-subscription", topic_name, "-s", "from-end")
    assert sorted(admin.json("topics", "subscriptions", topic_name)) == ["from-end", "from-start"]
    assert _backlog(admin, topic_name, "from-start") == 3
    assert _backlog(admin, topic_name, "from-end") == 0
    admin.fails("topics", "create-subscription", topic_name, "-s", "from-end")  # exists
    admin.ok("topics", "skip", topic_name, "-s", "from-start", "--count", "2")
    assert _backlog(admin, topic_name, "from-start") == 1
    admin.ok("topics", "clear-backlog", topic_name, "-s", "from-start")
    assert _backlog(admin, topic_name, "from-start") == 0
    admin.ok("topics", "unsubscribe", topic_name, "-s", "from-end")
    assert admin.json("topics", "subscriptions", topic_name) == ["from-start"]
    admin.fails("topics", "unsubscribe", topic_name, "-s", "from-end")
    admin.fails("topics", "skip", topic_name, "-s", "nosuch", "-n", "1")


@needs(*SUBSCRIPTION_OPS, "GET " + SUB + "/position/{}", "GET " + TOPIC + "/examinemessage")
def test_topics_peek_and_examine(admin: Admin, client: Any, topic_name: str) -> None:
    _publish(client, topic_name, [b"m0", b"m1", b"m2"])
    admin.ok("topics", "create-subscription", topic_name, "-s", "peek", "-m", "earliest")
    peeked = admin.json("topics", "peek-messages", topic_name, "-s", "peek", "-n", "2")
    assert [m["payloadText"] for m in peeked] == ["m0", "m1"]
    assert peeked[0]["properties"] == {"index": "0"}
    assert re.fullmatch(r"\d+:\d+(:\d+)?", peeked[0]["messageId"])
    text = admin.ok("topics", "peek-messages", topic_name, "-s", "peek", "-n", "5")  # only 3 there
    assert text.count("Message ID: ") == 3 and "|m0" in text and "|m2" in text and '"index": "1"' in text
    assert _backlog(admin, topic_name, "peek") == 3  # peeking consumes nothing
    first = admin.json("topics", "examine-message", topic_name, "-i", "earliest", "-m", "1")
    last = admin.json("topics", "examine-messages", topic_name, "--initialPosition", "latest")
    assert (first[0]["payloadText"], last[0]["payloadText"]) == ("m0", "m2")
    admin.fails("topics", "peek-messages", topic_name, "-s", "nosuch")


@needs(*SUBSCRIPTION_OPS, "GET " + SUB + "/position/{}")
def test_topics_peek_batched_messages(admin: Admin, client: Any, topic_name: str) -> None:
    _publish(client, topic_name, [b"b0", b"b1"], batching_enabled=True, batching_max_publish_delay_ms=50)
    admin.ok("topics", "create-subscription", topic_name, "-s", "peek", "-m", "earliest")
    peeked = admin.json("topics", "peek-messages", topic_name, "-s", "peek", "-n", "2")
    assert [m["payloadText"] for m in peeked] == ["b0", "b1"]


@needs(
    *SUBSCRIPTION_OPS,
    "POST " + SUB + "/resetcursor/{}",
    "POST " + SUB + "/resetcursor",
    "POST " + SUB + "/skip_all",
    "POST " + SUB + "/expireMessages/{}",
    "GET " + SUB + "/position/{}",
)
def test_topics_reset_cursor_and_expire(admin: Admin, client: Any, topic_name: str) -> None:
    _publish(client, topic_name, [b"r0", b"r1", b"r2"])
    admin.ok("topics", "create-subscription", topic_name, "-s", "s", "-m", "earliest")
    second = admin.json("topics", "peek-messages", topic_name, "-s", "s", "-n", "2")[1]["messageId"]
    admin.ok("topics", "clear-backlog", topic_name, "-s", "s")
    assert _backlog(admin, topic_name, "s") == 0
    admin.ok("topics", "reset-cursor", topic_name, "-s", "s", "--time", "1h")
    assert _backlog(admin, topic_name, "s") == 3
    admin.ok("topics", "reset-cursor", topic_name, "-s", "s", "--messageId", second)
    assert _backlog(admin, topic_name, "s") == 2
    assert admin.json("topics", "peek-messages", topic_name, "-s", "s")[0]["payloadText"] == "r1"
    time.sleep(1.2)
    admin.ok("topics", "expire-messages", topic_name, "-s", "s", "--expireTime", "1s")
    assert _backlog(admin, topic_name, "s") == 0


@needs("POST " + TOPIC + "/terminate", "GET " + TOPIC + "/lastMessageId")
def test_topics_terminate(admin: Admin, client: Any, topic_name: str) -> None:
    _publish(client, topic_name, [b"x"])
    last = admin.json("topics", "last-message-id", topic_name)
    out = admin.ok("topics", "terminate", topic_name)
    assert out == f"Topic successfully terminated at {last['ledgerId']}:{last['entryId']}:-1\n"
    with pytest.raises(Exception) as info:
        client.create_producer(topic_name).send(b"y")
    assert "terminated" in f"{type(info.value).__name__} {info.value}".lower()


@needs("GET " + TOPIC + "/ledger/{}/entry/{}", "GET " + TOPIC + "/lastMessageId")
def test_topics_get_message_by_id(admin: Admin, client: Any, topic_name: str) -> None:
    _publish(client, topic_name, [b"only"])
    last = admin.json("topics", "last-message-id", topic_name)
    msg = admin.json("topics", "get-message-by-id", topic_name, "-l", str(last["ledgerId"]), "-e", str(last["entryId"]))
    assert msg[0]["payloadText"] == "only"


# --------------------------------------------------------------------------- docs/grafana-dashboard.json

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana-dashboard.json"


def test_grafana_dashboard_is_well_formed() -> None:
    dash = json.loads(DASHBOARD.read_text())
    assert dash["schemaVersion"] >= 36 and dash["uid"] and dash["title"]
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert {"cluster", "namespace", "topic"} <= variables.keys()
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for panel in dash["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24, panel["title"]
        covered = {(x, y) for x in range(pos["x"], pos["x"] + pos["w"]) for y in range(pos["y"], pos["y"] + pos["h"])}
        assert not covered & cells, f"{panel['title']} overlaps another panel"
        cells |= covered
        for target in panel.get("targets", []):
            assert target["datasource"]["uid"] == "${datasource}" and target["expr"]


def test_grafana_dashboard_metrics_are_exported(standalone: StandaloneProcess, client: Any, topic_name: str) -> None:
    # A topic with a subscription, so every per-topic and per-subscription series exists.
    client.subscribe(topic_name, "dash").close()
    _publish(client, topic_name, [b"x"])
    with urllib.request.urlopen(f"{standalone.http_url}/metrics", timeout=10) as r:
        exported = {
            line.split("{")[0].split(" ")[0] for line in r.read().decode().splitlines() if line and line[0] != "#"
        }
    text = DASHBOARD.read_text()
    used = set(re.findall(r"\b((?:pulsar|process)_[a-z_]+)", text))
    assert used, "no metric names found in the dashboard"
    assert used <= exported, f"dashboard uses metrics /metrics does not export: {sorted(used - exported)}"
    required = {
        "pulsar_rate_in", "pulsar_rate_out", "pulsar_throughput_in", "pulsar_throughput_out", "pulsar_msg_backlog",
        "pulsar_storage_size", "pulsar_subscription_back_log", "pulsar_producers_count", "pulsar_consumers_count",
        "pulsar_subscriptions_count", "pulsar_topics_count", "process_cpu_seconds_total",
        "process_resident_memory_bytes",
    }  # fmt: skip
    assert required <= used, f"dashboard lacks {sorted(required - used)}"
