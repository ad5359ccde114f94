"""Helpers shared by the bookie tests and the kill -9 child process."""

from __future__ import annotations

from pathlib import Path

from magnetar.bookie.config import BookieConfig
from magnetar.bookie.storage import CachedEntries

KEY = b"master-key"


def small_config(data_dir: Path, **overrides: object) -> BookieConfig:
    """Sizes small enough that rotation, checkpoints and GC happen with a few KiB of data."""
    settings: dict[str, object] = {
        "journal_file_size": 64 * 1024,
        "journal_group_max_bytes": 16 * 1024,
        "entry_log_size": 32 * 1024,
        "checkpoint_interval_s": 3600.0,  # tests checkpoint explicitly
        "checkpoint_on_journal_rotation": False,
        "min_free_bytes": 0,
        "add_timeout_s": 10.0,
    }
    settings.update(overrides)
    return BookieConfig(data_dir=data_dir, **settings)  # type: ignore[arg-type]


def payload(ledger_id: int, entry_id: int, size: int | None = None) -> bytes:
    """Deterministic, distinct bytes for an entry (sizes vary unless given)."""
    n = size if size is not None else 20 + (entry_id * 37 + ledger_id * 11) % 300
    seed = f"{ledger_id}:{entry_id}:".encode()
    return (seed * (n // len(seed) + 1))[:n]


def cached(entries: dict[int, tuple[bytes, bytes]]) -> CachedEntries:
    """A ledger's write-cache entries from ``{entry_id: (head, data)}``."""
    out = CachedEntries()
    for eid, (head, data) in entries.items():
        out.put(eid, head, data)
    return out
