"""Retention: which consumed ledgers a managed ledger may delete (Pulsar's trimming rule)."""

from __future__ import annotations

from collections.abc import Iterable

from magnetar.managed_ledger.api import ManagedLedgerConfig, Position
from magnetar.managed_ledger.metadata import LedgerInfo


def trimmable(
    ledgers: Iterable[LedgerInfo],
    current: LedgerInfo | None,
    slowest: Position,
    total_size: int,
    config: ManagedLedgerConfig,
    now_ms: int,
) -> list[int]:
    """Ids of the oldest ledgers (in list order) that are consumed up to ``slowest`` and outside retention.

    Stops at the current ledger, an open one, or the first one still retained.
    """
    size_left = total_size
    out: list[int] = []
    for li in ledgers:
        if li is current or not li.closed:
            break
        if li.entries > 0:
            if Position(li.ledger_id, li.entries - 1) > slowest:
                break
            # As Pulsar: a consumed ledger goes once it is past the retention time OR the
            # retained size exceeds the quota; -1 disables a limit, 0 retains nothing.
            t = config.retention_time_seconds
            expired = t == 0 or (t > 0 and now_ms - li.timestamp_ms > t * 1000)
            s = config.retention_size_bytes
            over_quota = s >= 0 and size_left > s
            if not (expired or over_quota):
                break
        out.append(li.ledger_id)
        size_left -= li.size
    return out
