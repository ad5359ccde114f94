"""Ledger metadata: what the metadata store records about one ledger."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

FORMAT_VERSION = 1


class LedgerState(StrEnum):
    """Life cycle of a ledger: written while OPEN, sealed when CLOSED."""

    OPEN = "OPEN"
    IN_RECOVERY = "IN_RECOVERY"
    CLOSED = "CLOSED"


@dataclass(frozen=True, slots=True)
class LedgerMetadata:
    """Replication settings, state and ensembles of one ledger (immutable; use :meth:`evolve`).

    ``ensembles`` lists fragments as ``(first_entry_id, [bookie addresses])``; entry ``e`` belongs
    to the last fragment whose first entry id is <= ``e`` and is written to the bookies at
    ``(e + i) % ensemble_size`` for ``i < write_quorum`` of that fragment's list.
    """

    ensemble_size: int
    write_quorum: int
    ack_quorum: int
    ensembles: list[tuple[int, list[str]]]
    state: LedgerState = LedgerState.OPEN
    last_entry_id: int = -1
    length: int = 0
    password: bytes = b""
    custom_metadata: dict[str, bytes] = field(default_factory=dict)
    ctime_ms: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.ack_quorum <= self.write_quorum <= self.ensemble_size:
            raise ValueError(
                f"need 1 <= ack quorum ({self.ack_quorum}) <= write quorum ({self.write_quorum}) "
                f"<= ensemble size ({self.ensemble_size})"
            )
        for _, bookies in self.ensembles:
            if len(bookies) != self.ensemble_size:
                raise ValueError(f"ensemble {bookies} does not have {self.ensemble_size} bookies")

    def evolve(self, **changes: Any) -> LedgerMetadata:
        """A copy with ``changes`` applied."""
        return replace(self, **changes)

    def fragment_index(self, entry_id: int) -> int:
        """Index in :attr:`ensembles` of the fragment holding ``entry_id``."""
        idx = 0
        for i, (first, _) in enumerate(self.ensembles):
            if first <= entry_id:
                idx = i
            else:
                break
        return idx

    def ensemble_at(self, entry_id: int) -> list[str]:
        return self.ensembles[self.fragment_index(entry_id)][1]

    def write_set(self, entry_id: int) -> list[str]:
        """Addresses of the bookies that store ``entry_id``, in preference order."""
        bookies = self.ensemble_at(entry_id)
        e = self.ensemble_size
        return [bookies[(entry_id + i) % e] for i in range(self.write_quorum)]

    def all_bookies(self) -> set[str]:
        return {b for _, bookies in self.ensembles for b in bookies}

    # ---------------------------------------------------------------- serialisation

    def to_bytes(self) -> bytes:
        doc = {
            "formatVersion": FORMAT_VERSION,
            "ensembleSize": self.ensemble_size,
            "writeQuorumSize": self.write_quorum,
            "ackQuorumSize": self.ack_quorum,
            "state": self.state.value,
            "lastEntryId": self.last_entry_id,
            "length": self.length,
            "ensembles": [[first, list(bookies)] for first, bookies in self.ensembles],
            "password": base64.b64encode(self.password).decode(),
            "customMetadata": {k: base64.b64encode(v).decode() for k, v in self.custom_metadata.items()},
            "ctime": self.ctime_ms,
        }
        return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> LedgerMetadata:
        doc = json.loads(data)
        if doc.get("formatVersion", 1) > FORMAT_VERSION:
            raise ValueError(f"ledger metadata format {doc['formatVersion']} is newer than this code")
        return cls(
            ensemble_size=doc["ensembleSize"],
            write_quorum=doc["writeQuorumSize"],
            ack_quorum=doc["ackQuorumSize"],
            ensembles=[(int(first), list(bookies)) for first, bookies in doc["ensembles"]],
            state=LedgerState(doc["state"]),
            last_entry_id=doc["lastEntryId"],
            length=doc["length"],
            password=base64.b64decode(doc.get("password", "")),
            custom_metadata={k: base64.b64decode(v) for k, v in doc.get("customMetadata", {}).items()},
            ctime_ms=doc.get("ctime", 0),
        )
