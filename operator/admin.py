"""A small async client of the admin REST API (Pulsar's ``/admin/v2`` paths and JSON bodies).

Errors and paths are :mod:`magnetar.admin_client`'s, split the way the reconciler needs them:
:class:`~magnetar.admin_client.errors.AdminConnectionError` (connection refused, timeout: retry with
backoff) and :class:`~magnetar.admin_client.errors.AdminError` with the HTTP status and Pulsar's
``reason`` (``transient`` for 5xx and 429).
"""

from __future__ import annotations

import json
import ssl
from typing import Any

import aiohttp

from magnetar.admin_client.errors import AdminConnectionError, AdminError, reason_of
from magnetar.admin_client.paths import api_path, namespace_path, parse_topic, topic_path

_TIMEOUT = aiohttp.ClientTimeout(total=15, connect=5)


class AdminClient:
    """Admin REST calls against one endpoint. Create with :meth:`open`, close with :meth:`close`."""

    def __init__(self, base_url: str, token: str | None = None, session: aiohttp.ClientSession | None = None,
                 tls: ssl.SSLContext | None = None) -> None:  # fmt: skip
        self.base_url = base_url.rstrip("/")
        self._token = token
        #: trust for an https URL (None: the system's CAs)
        self._tls = tls
        self._session = session
        self._own_session = session is None
        #: admin calls made (benchmarks and tests count them per resource)
        self.calls = 0

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
        """One call to ``path`` (``/admin/v2/...``); returns the decoded JSON answer (``None`` for 204 / empty)."""
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=_TIMEOUT)
        self.calls += 1
        headers = self._headers()
        data = None
        if body is not None or has_body:
            headers["Content-Type"] = "application/json"
            data = json.dumps(body)
        try:
            async with self._session.request(
                method,
                self.base_url + path,
                data=data,
                params=params,
                headers=headers,
                ssl=self._tls if self._tls is not None else True,
            ) as resp:
                text = await resp.text()
                if resp.status >= 400:
                    raise AdminError(resp.status, reason_of(text), method, path)
                if resp.status == 204 or not text.strip():
                    return None
                return json.loads(text)
        except (TimeoutError, aiohttp.ClientConnectionError, ssl.SSLError) as exc:
            raise AdminConnectionError(f"{self.base_url}: {exc.__class__.__name__}: {exc}") from exc

    # ------------------------------------------------------------------------------------------ clusters
    async def clusters(self) -> list[str]:
        return list(await self.request("GET", api_path("clusters")) or [])

    # ------------------------------------------------------------------------------------------ tenants
    async def get_tenant(self, tenant: str) -> dict[str, Any] | None:
        return await self._get_or_none(api_path("tenants", tenant))

    async def create_tenant(self, tenant: str, info: dict[str, Any]) -> None:
        await self.request("PUT", api_path("tenants", tenant), info)

    async def update_tenant(self, tenant: str, info: dict[str, Any]) -> None:
        await self.request("POST", api_path("tenants", tenant), info)

    async def delete_tenant(self, tenant: str, force: bool = False) -> None:
        await self.request("DELETE", api_path("tenants", tenant), params={"force": str(force).lower()})

    # ------------------------------------------------------------------------------------------ namespaces
    async def get_namespace(self, namespace: str) -> dict[str, Any] | None:
        """The namespace's full ``Policies`` document, ``None`` if it does not exist."""
        return await self._get_or_none(_ns(namespace))

    async def create_namespace(self, namespace: str, policies: dict[str, Any] | None = None) -> None:
        await self.request("PUT", _ns(namespace), policies, has_body=policies is not None)

    async def delete_namespace(self, namespace: str, force: bool = False) -> None:
        await self.request("DELETE", _ns(namespace), params={"force": str(force).lower()})

    async def namespace_policy(self, namespace: str, method: str, segment: str, body: Any = None,
                               params: dict[str, str] | None = None) -> Any:  # fmt: skip
        return await self.request(method, f"{_ns(namespace)}/{segment}", body, params)

    # ------------------------------------------------------------------------------------------ topics
    async def topic_partitions(self, topic: str) -> int:
        """Partitions of a partitioned topic; 0 for a non-partitioned or missing one."""
        answer = await self.request("GET", f"{_topic(topic)}/partitions")
        return int((answer or {}).get("partitions", 0))

    async def list_topics(self, namespace: str, persistent: bool = True) -> list[str]:
        domain = "persistent" if persistent else "non-persistent"
        return list(await self.request("GET", api_path(domain, *namespace.split("/", 1))) or [])

    async def create_topic(self, topic: str, partitions: int) -> None:
        if partitions > 0:
            await self.request("PUT", f"{_topic(topic)}/partitions", partitions)
        else:
            await self.request("PUT", _topic(topic))

    async def grow_partitions(self, topic: str, partitions: int) -> None:
        await self.request("POST", f"{_topic(topic)}/partitions", partitions)

    async def delete_topic(self, topic: str, partitioned: bool, force: bool = False) -> None:
        """Delete a topic; without ``force`` Pulsar refuses (412) while clients are connected."""
        suffix = "/partitions" if partitioned else ""
        await self.request("DELETE", f"{_topic(topic)}{suffix}", params={"force": str(force).lower()})

    async def topic_usage(self, topic: str, partitioned: bool) -> str:
        """Why a topic is in use (connected producers, consumers, unconsumed backlog), ``""`` when idle."""
        stats = await self.request("GET", f"{_topic(topic)}/{'partitioned-stats' if partitioned else 'stats'}")
        stats = stats or {}
        producers = len(stats.get("publishers") or [])
        subs = stats.get("subscriptions") or {}
        consumers = sum(len(sub.get("consumers") or []) for sub in subs.values())
        backlog = sum(int(sub.get("msgBacklog") or 0) for sub in subs.values())
        parts = [f"{n} {what}" for n, what in ((producers, "producers"), (consumers, "consumers"),
                                               (backlog, "messages of backlog")) if n]  # fmt: skip
        return ", ".join(parts)

    async def topic_policy(self, topic: str, method: str, segment: str, body: Any = None,
                           params: dict[str, str] | None = None) -> Any:  # fmt: skip
        return await self.request(method, f"{_topic(topic)}/{segment}", body, params)

    async def _get_or_none(self, path: str) -> Any:
        try:
            return await self.request("GET", path)
        except AdminError as exc:
            if exc.status == 404:
                return None
            raise


def _ns(namespace: str) -> str:
    """``tenant/ns`` -> its admin path."""
    return namespace_path(*namespace.split("/", 1))


def _topic(topic: str) -> str:
    """``persistent://t/ns/x`` -> its admin path."""
    return topic_path(parse_topic(topic))
