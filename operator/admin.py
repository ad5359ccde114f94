"""A small async client of the admin REST API (Pulsar's ``/admin/v2`` paths and JSON bodies).

Errors are split the way the reconciler needs them: :class:`Unreachable` (connection refused, timeout,
5xx: retry with backoff) and :class:`AdminError` with the HTTP status and Pulsar's ``reason``.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import aiohttp

_TIMEOUT = aiohttp.ClientTimeout(total=15, connect=5)


class AdminError(Exception):
    """The admin API answered with an error status."""

    def __init__(self, status: int, reason: str, method: str = "", path: str = "") -> None:
        super().__init__(f"{method} {path}: HTTP {status}: {reason}".strip())
        self.status = status
        self.reason = reason

    @property
    def transient(self) -> bool:
        # 5xx and 429 may pass; anything else needs a change (spec, broker state) first.
        return self.status >= 500 or self.status == 429


class Unreachable(Exception):
    """The admin endpoint could not be reached (connection error or timeout)."""


def _path(*parts: str) -> str:
    return "/".join(quote(p, safe="") for p in parts)


def topic_path(topic: str) -> str:
    """``persistent://t/ns/x`` -> ``persistent/t/ns/x`` (the admin API's topic path)."""
    domain, rest = topic.split("://", 1)
    tenant, namespace, local = rest.split("/", 2)
    return f"{domain}/{_path(tenant, namespace, local)}"


class AdminClient:
    """Admin REST calls against one endpoint. Create with :meth:`open`, close with :meth:`close`."""

    def __init__(self, base_url: str, token: str | None = None, session: aiohttp.ClientSession | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self._token = token
        self._session = session
        self._own_session = session is None

    async def close(self) -> None:
        if self._own_session and self._session is not None:
            await self._session.close()
            self._session = None

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        return headers

    async def request(
        self, method: str, path: str, body: Any = None, params: dict[str, str] | None = None, *, has_body: bool = False
    ) -> Any:
        """One call; returns the decoded JSON answer (``None`` for 204 / empty)."""
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=_TIMEOUT)
        headers = self._headers()
        data = None
        if body is not None or has_body:
            headers["Content-Type"] = "application/json"
            data = json.dumps(body)
        url = f"{self.base_url}/admin/v2/{path}"
        try:
            async with self._session.request(method, url, data=data, params=params, headers=headers) as resp:
                text = await resp.text()
                if resp.status >= 400:
                    raise AdminError(resp.status, _reason(text), method, path)
                if resp.status == 204 or not text.strip():
                    return None
                return json.loads(text)
        except (TimeoutError, aiohttp.ClientConnectionError) as exc:
            raise Unreachable(f"{self.base_url}: {exc.__class__.__name__}: {exc}") from exc

    # ------------------------------------------------------------------------------------------ clusters
    async def clusters(self) -> list[str]:
        return list(await self.request("GET", "clusters") or [])

    # ------------------------------------------------------------------------------------------ tenants
    async def get_tenant(self, tenant: str) -> dict[str, Any] | None:
        return await self._get_or_none(f"tenants/{_path(tenant)}")

    async def create_tenant(self, tenant: str, info: dict[str, Any]) -> None:
        await self.request("PUT", f"tenants/{_path(tenant)}", info)

    async def update_tenant(self, tenant: str, info: dict[str, Any]) -> None:
        await self.request("POST", f"tenants/{_path(tenant)}", info)

    async def delete_tenant(self, tenant: str, force: bool = False) -> None:
        await self.request("DELETE", f"tenants/{_path(tenant)}", params={"force": str(force).lower()})

    # ------------------------------------------------------------------------------------------ namespaces
    async def get_namespace(self, namespace: str) -> dict[str, Any] | None:
        """The namespace's full ``Policies`` document, ``None`` if it does not exist."""
        return await self._get_or_none(f"namespaces/{_ns(namespace)}")

    async def create_namespace(self, namespace: str, policies: dict[str, Any] | None = None) -> None:
        await self.request("PUT", f"namespaces/{_ns(namespace)}", policies, has_body=policies is not None)

    async def delete_namespace(self, namespace: str, force: bool = False) -> None:
        await self.request("DELETE", f"namespaces/{_ns(namespace)}", params={"force": str(force).lower()})

    async def namespace_policy(self, namespace: str, method: str, segment: str, body: Any = None,
                               params: dict[str, str] | None = None) -> Any:  # fmt: skip
        return await self.request(method, f"namespaces/{_ns(namespace)}/{segment}", body, params)

    # ------------------------------------------------------------------------------------------ topics
    async def topic_partitions(self, topic: str) -> int:
        """Partitions of a partitioned topic; 0 for a non-partitioned or missing one."""
        answer = await self.request("GET", f"{topic_path(topic)}/partitions")
        return int((answer or {}).get("partitions", 0))

    async def list_topics(self, namespace: str, persistent: bool = True) -> list[str]:
        domain = "persistent" if persistent else "non-persistent"
        return list(await self.request("GET", f"{domain}/{_ns(namespace)}") or [])

    async def create_topic(self, topic: str, partitions: int) -> None:
        if partitions > 0:
            await self.request("PUT", f"{topic_path(topic)}/partitions", partitions)
        else:
            await self.request("PUT", topic_path(topic))

    async def grow_partitions(self, topic: str, partitions: int) -> None:
        await self.request("POST", f"{topic_path(topic)}/partitions", partitions)

    async def delete_topic(self, topic: str, partitioned: bool) -> None:
        suffix = "/partitions" if partitioned else ""
        await self.request("DELETE", f"{topic_path(topic)}{suffix}", params={"force": "true"})

    async def topic_policy(self, topic: str, method: str, segment: str, body: Any = None,
                           params: dict[str, str] | None = None) -> Any:  # fmt: skip
        return await self.request(method, f"{topic_path(topic)}/{segment}", body, params)

    async def _get_or_none(self, path: str) -> Any:
        try:
            return await self.request("GET", path)
        except AdminError as exc:
            if exc.status == 404:
                return None
            raise


def _ns(namespace: str) -> str:
    tenant, name = namespace.split("/", 1)
    return _path(tenant, name)


def _reason(text: str) -> str:
    try:
        doc = json.loads(text)
    except ValueError:
        return text.strip()[:500] or "no reason given"
    if isinstance(doc, dict):
        return str(doc.get("reason") or doc.get("message") or doc)[:500]
    return str(doc)[:500]
