"""``benchmarks.bench --magnetar-no-fsync``: Magnetar started with journalSyncData=false, and said so."""

from __future__ import annotations

from pathlib import Path

from benchmarks.bench.brokers import MagnetarBroker
from benchmarks.bench.main import parse_args


def test_no_fsync_option_sets_journal_sync_data_false(tmp_path: Path) -> None:
    assert parse_args(["--magnetar-no-fsync"]).magnetar_no_fsync is True
    assert parse_args([]).magnetar_no_fsync is False
    off = MagnetarBroker(tmp_path / "off", "magnetar", "", journal_sync=False)
    env = off.env()
    assert env is not None and env["MAGNETAR_journalSyncData"] == "false"
    assert "journalSyncData=false" in off.version()
    on = MagnetarBroker(tmp_path / "on", "magnetar", "")
    assert on.env() is None and "journalSyncData" not in on.version()
