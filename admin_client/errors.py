"""How an admin call fails: an error answer (:class:`AdminError`) or no answer (:class:`AdminConnectionError`)."""

from __future__ import annotations

import json


class AdminError(Exception):
    """The admin API answered with an error status; ``reason`` is Pulsar's ``{"reason": ...}``."""

    def __init__(self, status: int, reason: str, method: str = "", path: str = "") -> None:
        where = f"{method} {path}: " if method else ""
        super().__init__(f"{where}HTTP {status}: {reason}")
        self.status = status
        self.reason = reason

    @property
    def transient(self) -> bool:
        """5xx and 429 may pass by themselves; anything else needs a change (request, broker state) first."""
        return self.status >= 500 or self.status == 429


class AdminConnectionError(Exception):
    """The admin API could not be reached (connection refused, timeout)."""


def reason_of(body: str, fallback: str = "no reason given") -> str:
    """Pulsar's ``{"reason": ...}`` of an error answer; otherwise the body text, or ``fallback`` for none."""
    text = body.strip()
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None
    if isinstance(doc, dict) and (doc.get("reason") or doc.get("message")):
        return str(doc.get("reason") or doc.get("message"))[:500]
    return text[:500] or fallback
