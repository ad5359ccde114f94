"""When a bookie's periodic jobs are due: checkpoints, free-space checks and entry-log compactions.

Sans-IO: the times are passed in, the bookie's checkpoint loop runs the jobs. The loop sleeps until
:meth:`PeriodicJobs.next_due` instead of polling, so an idle bookie wakes only when a job is due.
"""

from __future__ import annotations

from .config import BookieConfig


class PeriodicJobs:
    """The bookie's periodic jobs: when each last ran and when the next one is due."""

    def __init__(self, config: BookieConfig, free_space_every_s: float, now: float) -> None:
        self.config = config
        #: How often free disk space is compared with ``min_free_bytes`` (the networked bookie shortens it).
        self.free_space_every_s = free_space_every_s
        self.last_space_check = float("-inf")  # the first round checks at once
        self.restart(now)

    def restart(self, now: float) -> None:
        """The bookie (re)started: checkpoints and compactions count their intervals from ``now``."""
        self.last_checkpoint = now
        self.last_compaction = {False: now, True: now}  # minor, major

    def space_check_due(self, now: float) -> bool:
        """Whether the free-space check is due; if so it counts as done at ``now``."""
        if now - self.last_space_check < self.free_space_every_s:
            return False
        self.last_space_check = now
        return True

    def checkpoint_due(self, now: float) -> bool:
        return now - self.last_checkpoint >= self.config.checkpoint_interval_s

    def compaction_due(self, now: float) -> bool | None:
        """``True`` (major) or ``False`` (minor) when a compaction is due, which then counts as done at ``now``
        (a major one covers the minor one); ``None`` when none is."""
        cfg = self.config
        for major, interval in ((True, cfg.major_compaction_interval_s), (False, cfg.minor_compaction_interval_s)):
            if now - self.last_compaction[major] >= interval:
                self.last_compaction[major] = now
                self.last_compaction[False] = now
                return major
        return None

    def next_due(self, *, checkpoint: bool, compaction: bool) -> float:
        """When the next job is due: the free-space check, and the checkpoint and compaction when they may run
        (a running flush or held-back adds keep them out; their end wakes the loop)."""
        cfg = self.config
        at = self.last_space_check + self.free_space_every_s
        if checkpoint:
            at = min(at, self.last_checkpoint + cfg.checkpoint_interval_s)
        if compaction:
            at = min(
                at,
                self.last_compaction[True] + cfg.major_compaction_interval_s,
                self.last_compaction[False] + cfg.minor_compaction_interval_s,
            )
        return at
