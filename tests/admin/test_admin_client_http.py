"""``magnetar.admin_client.client.AdminClient`` over HTTP: redirects to the owning broker for every method
(a cluster answers a call about a topic it does not own with 307), one kept-alive connection per broker,
and recovery from a connection the server closed meanwhile. Real sockets on loopback: two stdlib HTTP
servers stand in for two brokers, so each request's method, body and connection are seen."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from magnetar.admin_client.client import AdminClient
from magnetar.admin_client.errors import AdminError


@dataclass
class Seen:
    method: str
    path: str
    body: bytes
    auth: str | None
    peer: tuple[str, int]


@dataclass
class Broker:
    """A stand-in broker: records every request; ``redirect_to`` makes it answer 307 to that URL."""

    server: ThreadingHTTPServer
    seen: list[Seen] = field(default_factory=list)
    redirect_to: str | None = None
    close_after_answer: bool = False

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"


def _serve() -> Broker:
    broker: Broker

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as aiohttp answers

        def _any(self) -> None:
            n = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(n) if n else b""
            broker.seen.append(
                Seen(self.command, self.path, body, self.headers.get("Authorization"), self.client_address)
            )
            if broker.redirect_to is not None:
                self.send_response(307)
                self.send_header("Location", broker.redirect_to + self.path)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            out = json.dumps({"method": self.command, "body": body.decode()}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            if broker.close_after_answer:
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            self.wfile.write(out)

        do_GET = do_PUT = do_POST = do_DELETE = _any

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    broker = Broker(server)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return broker


@pytest.fixture
def brokers() -> Iterator[tuple[Broker, Broker]]:
    a, b = _serve(), _serve()
    yield a, b
    for s in (a, b):
        s.server.shutdown()
        s.server.server_close()


@pytest.mark.parametrize("method", ["GET", "PUT", "POST", "DELETE"])
def test_every_method_follows_the_owners_redirect_with_its_body(brokers: tuple[Broker, Broker], method: str) -> None:
    a, b = brokers
    a.redirect_to = b.url
    client = AdminClient(a.url, timeout=5)
    body = {"x": 1} if method in ("PUT", "POST") else None
    kwargs = {"body": body} if body is not None else {}
    answer = client.call(method, "/admin/v2/persistent/t/ns/topic/subscription/s", **kwargs)
    assert answer == {"method": method, "body": json.dumps(body) if body is not None else ""}
    assert [(s.method, s.path) for s in a.seen] == [(method, "/admin/v2/persistent/t/ns/topic/subscription/s")]
    assert [(s.method, s.path) for s in b.seen] == [(method, "/admin/v2/persistent/t/ns/topic/subscription/s")]


def test_a_redirect_loop_is_an_error_not_a_hang(brokers: tuple[Broker, Broker]) -> None:
    a, b = brokers
    a.redirect_to, b.redirect_to = b.url, a.url
    with pytest.raises(AdminError, match="307"):
        AdminClient(a.url, timeout=5).get("/admin/v2/clusters")
    assert len(a.seen) + len(b.seen) <= 12  # bounded hops


def test_requests_share_one_connection(brokers: tuple[Broker, Broker]) -> None:
    a, _ = brokers
    client = AdminClient(a.url, timeout=5)
    for _ in range(5):
        assert client.get("/admin/v2/clusters") == {"method": "GET", "body": ""}
    assert len({s.peer for s in a.seen}) == 1  # one client port: the connection was kept


def test_a_connection_the_server_closed_is_replaced(brokers: tuple[Broker, Broker]) -> None:
    a, _ = brokers
    a.close_after_answer = True
    client = AdminClient(a.url, timeout=5)
    for _ in range(3):
        assert client.call("PUT", "/admin/v2/tenants/t", body={"k": "v"}) == {"method": "PUT", "body": '{"k": "v"}'}
    assert len(a.seen) == 3 and len({s.peer for s in a.seen}) == 3


def test_error_answers_keep_their_reason(brokers: tuple[Broker, Broker]) -> None:
    a, _ = brokers
    a.server.RequestHandlerClass.do_GET = _answer_404  # type: ignore[attr-defined]
    with pytest.raises(AdminError) as err:
        AdminClient(a.url, timeout=5).get("/admin/v2/persistent/t/ns/missing/stats")
    assert err.value.status == 404 and err.value.reason == "Topic not found"


def _answer_404(self: BaseHTTPRequestHandler) -> None:
    out = b'{"reason": "Topic not found"}'
    self.send_response(404)
    self.send_header("Content-Length", str(len(out)))
    self.end_headers()
    self.wfile.write(out)
