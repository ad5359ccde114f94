"""The few Kubernetes API calls the operator makes itself (kopf does watching, patching and Events):
reading credentials Secrets and creating the peering object. Uses the credentials kopf logged in with.
"""

from __future__ import annotations

import base64
import json
import ssl
from typing import Any

import aiohttp
import kopf


class KubeError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


class KubeClient:
    """A minimal aiohttp client over kopf's :class:`kopf.ConnectionInfo`."""

    def __init__(self) -> None:
        self._info: kopf.ConnectionInfo | None = None
        self._session: aiohttp.ClientSession | None = None

    def set_credentials(self, info: kopf.ConnectionInfo) -> None:
        self._info = info

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _ssl(self, info: kopf.ConnectionInfo) -> ssl.SSLContext | bool:
        if info.insecure:
            return False
        if not info.server.startswith("https"):
            return True
        cadata = info.ca_data
        if isinstance(cadata, str) and "BEGIN" not in cadata:
            cadata = base64.b64decode(cadata).decode()  # kubeconfig's certificate-authority-data is base64
        elif isinstance(cadata, bytes):
            cadata = cadata.decode()
        context = ssl.create_default_context(cafile=str(info.ca_path) if info.ca_path else None, cadata=cadata or None)
        if info.certificate_path and info.private_key_path:
            context.load_cert_chain(str(info.certificate_path), str(info.private_key_path))
        return context

    async def request(self, method: str, path: str, body: Any = None, content_type: str | None = None) -> Any:
        info = self._info
        if info is None:
            raise KubeError(0, "not logged in to Kubernetes yet")
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=15))
        headers = {"Accept": "application/json"}
        if content_type:
            headers["Content-Type"] = content_type
        if info.token:
            headers["Authorization"] = f"{info.scheme or 'Bearer'} {info.token}"
        auth = aiohttp.BasicAuth(info.username, info.password or "") if info.username else None
        async with self._session.request(
            method,
            info.server.rstrip("/") + path,
            data=None if body is None else json.dumps(body),
            headers={**headers, "Content-Type": headers.get("Content-Type", "application/json")},
            auth=auth,
            ssl=self._ssl(info),
        ) as resp:
            data = await resp.json(content_type=None) if resp.content_length != 0 else None
            if resp.status >= 400:
                message = data.get("message", "") if isinstance(data, dict) else str(data)
                raise KubeError(resp.status, message)
            return data

    async def secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        """A Secret, ``None`` when it does not exist."""
        try:
            found = await self.request("GET", f"/api/v1/namespaces/{namespace}/secrets/{name}")
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise
        return found if isinstance(found, dict) else None

    async def secret_value(self, namespace: str, name: str, key: str) -> str | None:
        """A Secret's value (decoded), ``None`` when the Secret or the key does not exist."""
        secret = await self.secret(namespace, name)
        return None if secret is None else secret_key(secret, key)

    async def patch_status(self, group_version: str, plural: str, namespace: str, name: str,
                           status: dict[str, Any]) -> None:  # fmt: skip
        """Merge-patch a custom resource's ``status`` subresource."""
        path = f"/apis/{group_version}/namespaces/{namespace}/{plural}/{name}/status"
        await self.request("PATCH", path, {"status": status}, content_type="application/merge-patch+json")

    async def ensure_cluster_peering(self, name: str) -> None:
        """Create the ClusterKopfPeering object replicas coordinate through (kopf does not create it)."""
        body = {"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": {"name": name}}
        try:
            await self.request("POST", "/apis/kopf.dev/v1/clusterkopfpeerings", body)
        except KubeError as exc:
            if exc.status != 409:
                raise


def secret_key(secret: dict[str, Any], key: str) -> str | None:
    """One key of a Secret object, decoded (``None`` when absent)."""
    raw = (secret.get("data") or {}).get(key)
    if raw is None:
        plain = (secret.get("stringData") or {}).get(key)
        return str(plain) if plain is not None else None
    return base64.b64decode(raw).decode()
