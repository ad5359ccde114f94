"""The free-space floor: a bookie's directories with less than ``min_free_bytes`` free make it read-only, and
writable again once there is room; a failed measurement changes nothing."""

from __future__ import annotations

from pathlib import Path

from magnetar.bookie.disk_space import DiskSpaceMonitor


async def test_full_and_free_again(tmp_path: Path) -> None:
    monitor = DiskSpaceMonitor((tmp_path, tmp_path / "."), 1 << 62, 5.0, "b1")
    await monitor.check()
    assert monitor.full
    monitor.min_free_bytes = 0
    await monitor.check()
    assert not monitor.full


async def test_a_failed_measurement_keeps_the_last_state(tmp_path: Path) -> None:
    monitor = DiskSpaceMonitor((tmp_path,), 1 << 62, 5.0, "b1")
    await monitor.check()
    assert monitor.full
    monitor.dirs = frozenset({tmp_path / "gone"})  # disk_usage raises FileNotFoundError
    monitor.min_free_bytes = 0
    await monitor.check()
    assert monitor.full
