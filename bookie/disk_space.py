"""A bookie's free disk space against its floor (BookKeeper's ``LedgerDirsMonitor``): below ``min_free_bytes``
in its journal or ledger directory the bookie turns read-only, and writable again once space is back."""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections.abc import Iterable
from pathlib import Path

log = logging.getLogger(__name__)


class DiskSpaceMonitor:
    """Measures the free space of ``dirs`` when asked (:meth:`check`); :attr:`full` says whether the last
    measurement found less than ``min_free_bytes`` in any of them."""

    def __init__(self, dirs: Iterable[Path], min_free_bytes: int, timeout_s: float, name: str) -> None:
        self.dirs = frozenset(dirs)
        self.min_free_bytes = min_free_bytes
        self.timeout_s = timeout_s
        self.name = name
        #: The last measurement found less free space than ``min_free_bytes``: the bookie refuses adds.
        self.full = False

    async def check(self) -> None:
        """Measure (in a thread, within ``timeout_s``) and update :attr:`full`; a failed measurement leaves it."""
        dirs = self.dirs
        try:
            async with asyncio.timeout(self.timeout_s):
                free = await asyncio.to_thread(lambda: min(shutil.disk_usage(d).free for d in dirs))
        except (OSError, TimeoutError) as e:
            log.warning("free space check failed: %s", e)
            return
        full = free < self.min_free_bytes
        if full != self.full:
            log.warning("bookie %s is now %s (%d bytes free)", self.name, "read-only" if full else "writable", free)
            self.full = full
