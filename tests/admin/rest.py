"""A tiny blocking HTTP client for admin-API tests (urllib; no extra dependency)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any


@dataclass
class Reply:
    status: int
    body: bytes
    headers: dict[str, str]

    @property
    def json(self) -> Any:
        return json.loads(self.body) if self.body else None

    @property
    def reason(self) -> str:
        return self.json["reason"]


def call(
    method: str,
    url: str,
    body: Any = None,
    *,
    raw: bytes | None = None,
    timeout: float = 30,
    headers: dict[str, str] | None = None,
) -> Reply:
    """Send ``body`` as JSON (or ``raw`` bytes) and return the reply, whatever its status."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return Reply(resp.status, resp.read(), dict(resp.headers))
    except urllib.error.HTTPError as err:
        return Reply(err.code, err.read(), dict(err.headers))
