"""The synchronous admin client: one short-lived ``urllib`` request at a time, no event loop."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from magnetar.admin_client.auth import ClientSecurity
from magnetar.admin_client.errors import AdminConnectionError, AdminError, reason_of

#: ``body=NO_BODY`` (the default) sends no body; ``body=None`` sends JSON ``null``.
NO_BODY: Any = object()


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
    settings for ``https`` URLs. The client pickles (Spark ships it to executors): the SSL context is rebuilt.
    """

    def __init__(self, base_url: str, timeout: float = 30.0, security: ClientSecurity | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.security = security or ClientSecurity()
        self._ssl: ssl.SSLContext | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"base_url": self.base_url, "timeout": self.timeout, "security": self.security}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["base_url"], state["timeout"], state["security"])  # type: ignore[misc]

    def _ssl_context(self) -> ssl.SSLContext | None:
        if not self.base_url.startswith("https:"):
            return None
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
        req = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout, context=self._ssl_context()) as resp:
                return Response(resp.status, list(resp.headers.items()), resp.read())
        except urllib.error.HTTPError as exc:
            raw = exc.read() if exc.fp is not None else b""
            reason = reason_of(raw.decode("utf-8", "replace"), str(exc.reason or "error"))
            raise AdminError(exc.code, reason, method, path) from None
        except (urllib.error.URLError, OSError) as exc:
            why = exc.reason if isinstance(exc, urllib.error.URLError) else exc
            raise AdminConnectionError(f"cannot reach the admin API at {self.base_url}: {why}") from None

    def call(self, method: str, path: str, *, query: dict[str, Any] | None = None, body: Any = NO_BODY) -> Any:
        """:meth:`request` and decode the JSON answer (``None`` for no content)."""
        return self.request(method, path, query=query, body=body).json()

    def get(self, path: str, **query: Any) -> Any:
        return self.call("GET", path, query=query)


def _query_value(value: Any) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)
