"""Stored form (JSON) of managed-ledger info and cursor state, and their metadata-store paths.

``/managed-ledgers/<name>`` holds the ledger list and properties; each durable cursor lives at
``/managed-ledgers/<name>/<url-encoded cursor name>``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, unquote

from magnetar.managed_ledger.api import Position

ROOT = "/managed-ledgers"


def ledger_path(name: str) -> str:
    """Metadata path of the managed ledger ``name`` (e.g. ``public/default/persistent/t``)."""
    name = name.strip("/")
    if not name or "//" in name:
        raise ValueError(f"invalid managed ledger name {name!r}")
    return f"{ROOT}/{name}"


def cursor_path(name: str, cursor: str) -> str:
    """Metadata path of a cursor; the cursor name is URL-encoded so ``/`` or ``%`` stay one segment."""
    if not cursor:
        raise ValueError("empty cursor name")
    return f"{ledger_path(name)}/{quote(cursor, safe='')}"


def cursor_name_from_node(node: str) -> str:
    """Inverse of the encoding in :func:`cursor_path`."""
    return unquote(node)


@dataclass(slots=True)
class LedgerInfo:
    """One ledger of a managed ledger. ``entries``/``size`` are final once ``closed``."""

    ledger_id: int
    entries: int = 0
    size: int = 0
    #: Creation time while open; time of the last write once closed (retention clock).
    timestamp_ms: int = 0
    closed: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.ledger_id,
            "entries": self.entries,
            "size": self.size,
            "timestamp": self.timestamp_ms,
            "closed": self.closed,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> LedgerInfo:
        return cls(int(d["id"]), int(d["entries"]), int(d["size"]), int(d["timestamp"]), bool(d["closed"]))


@dataclass(slots=True)
class ManagedLedgerInfo:
    """Value stored at ``/managed-ledgers/<name>``."""

    ledgers: list[LedgerInfo] = field(default_factory=list)
    properties: dict[str, str] = field(default_factory=dict)

    def serialize(self) -> bytes:
        doc = {"ledgers": [li.to_json() for li in self.ledgers], "properties": self.properties}
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def parse(cls, data: bytes) -> ManagedLedgerInfo:
        doc = json.loads(data)
        return cls([LedgerInfo.from_json(d) for d in doc.get("ledgers", [])], dict(doc.get("properties", {})))


@dataclass(slots=True)
class CursorInfo:
    """Value stored at a cursor's path: mark-delete, individually acked ranges, properties."""

    mark_delete: Position
    #: ``[[ledger, first_entry, last_entry], ...]`` after ``mark_delete``.
    individually_deleted: list[list[int]] = field(default_factory=list)
    properties: dict[str, str] = field(default_factory=dict)
    last_active_ms: int = 0
    #: Partly acknowledged batches: ``[[ledger, entry, word0, word1, ...], ...]``, bit set = not yet acked.
    batch_indexes: list[list[int]] = field(default_factory=list)

    def serialize(self) -> bytes:
        doc: dict[str, Any] = {
            "markDelete": [self.mark_delete.ledger_id, self.mark_delete.entry_id],
            "individuallyDeleted": self.individually_deleted,
            "properties": self.properties,
            "lastActive": self.last_active_ms,
        }
        if self.batch_indexes:
            doc["batchIndexes"] = self.batch_indexes
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def parse(cls, data: bytes) -> CursorInfo:
        doc = json.loads(data)
        lid, eid = doc["markDelete"]
        return cls(
            Position(int(lid), int(eid)),
            [[int(a), int(b), int(c)] for a, b, c in doc.get("individuallyDeleted", [])],
            dict(doc.get("properties", {})),
            int(doc.get("lastActive", 0)),
            [[int(v) for v in item] for item in doc.get("batchIndexes", [])],
        )
