"""The bookie's periodic-job clock (sans-IO): what is due when, and when the checkpoint loop wakes next."""

from __future__ import annotations

from pathlib import Path

from magnetar.bookie.config import BookieConfig
from magnetar.bookie.schedule import PeriodicJobs


def _jobs(tmp_path: Path) -> PeriodicJobs:
    cfg = BookieConfig(
        data_dir=tmp_path,
        checkpoint_interval_s=5.0,
        minor_compaction_interval_s=100.0,
        major_compaction_interval_s=1000.0,
    )
    return PeriodicJobs(cfg, free_space_every_s=10.0, now=0.0)


def test_next_due_is_the_earliest_job_that_may_run(tmp_path: Path) -> None:
    jobs = _jobs(tmp_path)
    assert jobs.space_check_due(0.0) and not jobs.space_check_due(9.9)  # the first round checks at once
    assert jobs.next_due(checkpoint=True, compaction=True) == 5.0
    assert jobs.next_due(checkpoint=False, compaction=True) == 10.0  # a flush runs: its end wakes the loop
    assert not jobs.checkpoint_due(4.9) and jobs.checkpoint_due(5.0)
    jobs.last_checkpoint = 8.0
    assert jobs.next_due(checkpoint=True, compaction=False) == 10.0


def test_a_major_compaction_covers_the_minor_one(tmp_path: Path) -> None:
    jobs = _jobs(tmp_path)
    assert jobs.compaction_due(99.0) is None
    assert jobs.compaction_due(100.0) is False and jobs.compaction_due(150.0) is None
    assert jobs.compaction_due(1000.0) is True
    assert jobs.compaction_due(1050.0) is None  # the minor interval restarted with the major one
    assert jobs.space_check_due(1000.0)
    assert jobs.next_due(checkpoint=False, compaction=True) == 1010.0  # before the minor one at 1100
