"""The synchronous admin client: stdlib ``http.client``, one request at a time, no event loop.

Connections are kept alive (one per broker: the CLI's scripts and Spark's planner, which polls, pay the TCP
handshake once), and redirects are followed for every method as Pulsar's admin tools do: a broker answers a
call about a topic or bundle another broker owns with ``307`` to that owner.
"""

from __future__ import annotations

import http.client
import json
import select
import ssl
import threading
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode, urljoin, urlsplit

from magnetar.admin_client.auth import ClientSecurity
from magnetar.admin_client.errors import AdminConnectionError, AdminError, reason_of

#: ``body=NO_BODY`` (the default) sends no body; ``body=None`` sends JSON ``null``.
NO_BODY: Any = object()
#: Redirects followed per call (a loop between misconfigured brokers ends as an error).
MAX_REDIRECTS = 5
#: Safe to send again when a kept-alive connection turns out to be closed under the request.
_IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
#: The connection itself failed (refused, reset, closed, timed out), as opposed to an HTTP answer.
_CONNECTION_ERRORS = (OSError, http.client.HTTPException)


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
    """Blocking client of the admin REST API at ``base_url``; paths start with ``/admin/v2`` (see ``paths``).

    ``security`` adds credentials (``Authorization`` header, or a client certificate) and the TLS trust
    settings for ``https`` URLs; they go to redirect targets too (the owning broker checks them), never over
    a redirect from ``https`` to ``http``. Thread-safe (requests take turns); :meth:`close` drops the kept
    connections. The client pickles (Spark ships it to executors): connections and the SSL context are
    rebuilt on the other side.
    """

    def __init__(self, base_url: str, timeout: float = 30.0, security: ClientSecurity | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.security = security or ClientSecurity()
        self._ssl: ssl.SSLContext | None = None
        self._conns: dict[tuple[str, str, int], http.client.HTTPConnection] = {}
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {"base_url": self.base_url, "timeout": self.timeout, "security": self.security}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["base_url"], state["timeout"], state["security"])  # type: ignore[misc]

    def close(self) -> None:
        """Close the kept connections (the next request opens a new one)."""
        with self._lock:
            for conn in self._conns.values():
                conn.close()
            self._conns.clear()

    def _ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = self.security.ssl_context()
        return self._ssl

    def request(self, method: str, path: str, *, query: dict[str, Any] | None = None, body: Any = NO_BODY) -> Response:
        """Send one request; raises :class:`AdminError` for 4xx/5xx and :class:`AdminConnectionError`.

        ``query`` values of ``None`` are left out; booleans are sent as ``true``/``false``.
        """
        url = self.base_url + path
        if query:
            url += "?" + urlencode({k: _query_value(v) for k, v in query.items() if v is not None})
        data = None
        headers = {"Accept": "application/json", **self.security.http_headers()}
        if body is not NO_BODY:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        with self._lock:
            for _hop in range(MAX_REDIRECTS + 1):
                resp = self._exchange(method, url, data, headers)
                location = resp.header("Location")
                if resp.status not in _REDIRECTS or not location:
                    break
                target = urljoin(url, location)
                if url.startswith("https:") and not target.startswith("https:"):
                    break  # never send credentials to a plain-text URL: answered as the error it is
                if resp.status in (301, 302, 303) and method not in ("GET", "HEAD"):
                    method, data = "GET", None  # as browsers and urllib do; 307/308 keep method and body
                    headers.pop("Content-Type", None)
                url = target
        if resp.status >= 300:
            reason = reason_of(resp.body.decode("utf-8", "replace"), http.client.responses.get(resp.status, "error"))
            raise AdminError(resp.status, reason, method, path)
        return resp

    def _exchange(self, method: str, url: str, data: bytes | None, headers: dict[str, str]) -> Response:
        """One request and its whole answer on the kept connection to ``url``'s broker (caller holds the lock).
        A kept connection the server closed meanwhile is replaced, and an idempotent request sent again."""
        parts = urlsplit(url)
        origin = (parts.scheme, parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80))
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        for attempt in (0, 1):
            conn = self._conns.get(origin)
            reused = conn is not None and not _dropped(conn)
            if not reused:
                if conn is not None:
                    conn.close()
                conn = self._conns[origin] = self._connect(origin)
            assert conn is not None
            try:
                conn.request(method, target or "/", body=data, headers=headers)
                answer = conn.getresponse()
                out = Response(answer.status, answer.getheaders(), answer.read())
            except _CONNECTION_ERRORS as exc:
                conn.close()
                del self._conns[origin]
                if reused and attempt == 0 and method in _IDEMPOTENT and not isinstance(exc, TimeoutError):
                    continue  # closed under us between requests: the server never saw this one
                raise AdminConnectionError(f"cannot reach the admin API at {self.base_url}: {exc}") from None
            if answer.will_close:
                conn.close()
                del self._conns[origin]
            return out
        raise AssertionError("unreachable")

    def _connect(self, origin: tuple[str, str, int]) -> http.client.HTTPConnection:
        scheme, host, port = origin
        if scheme == "https":
            return http.client.HTTPSConnection(host, port, timeout=self.timeout, context=self._ssl_context())
        if scheme != "http":
            raise AdminConnectionError(f"cannot reach the admin API at {self.base_url}: unsupported scheme {scheme!r}")
        return http.client.HTTPConnection(host, port, timeout=self.timeout)

    def call(self, method: str, path: str, *, query: dict[str, Any] | None = None, body: Any = NO_BODY) -> Any:
        """:meth:`request` and decode the JSON answer (``None`` for no content)."""
        return self.request(method, path, query=query, body=body).json()

    def get(self, path: str, **query: Any) -> Any:
        return self.call("GET", path, query=query)


def _dropped(conn: http.client.HTTPConnection) -> bool:
    """Whether a kept connection was closed by the server (readable while idle means EOF or junk)."""
    sock = conn.sock
    if sock is None:
        return True
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


def _query_value(value: Any) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)
