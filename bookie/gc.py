"""Bookie-side garbage collection against the metadata store.

A ledger deleted while this bookie was down (or unreachable) leaves its entries here: the client
only deletes on the bookies it can reach. Every ``gc_wait_time_s`` the collector compares the
ledgers stored locally with the ledger metadata under ``/ledgers`` and deletes the local data of
ledgers that no longer exist, like BookKeeper's ScanAndCompareGarbageCollector:

1. snapshot the local ledger ids *before* listing the metadata: a ledger that appears locally
   after the listing started is never a candidate (its metadata may be newer than the listing);
2. list the ledger ids in the metadata store;
3. for each local id of the snapshot missing from the listing, read its metadata once more
   (BookKeeper's ``verifyMetadataOnGc``) and delete it locally only if that read says "absent".

A failed listing, or one of a root where no ledger id was ever allocated, deletes nothing. The
deletion is the bookie's ordinary journaled delete; disk space comes back at the next
checkpoint's entry-log GC.
"""

from __future__ import annotations

import asyncio
import logging

from magnetar.common.tasks import TaskSet
from magnetar.ledger.ledger_manager import LedgerManager
from magnetar.metadata.api import MetadataError, MetadataStore

from .api import BookieError
from .bookie import Bookie

log = logging.getLogger(__name__)


class LedgerGarbageCollector:
    """Runs :meth:`collect_once` every ``bookie.config.gc_wait_time_s`` (a task kept and cancelled on close)."""

    def __init__(self, bookie: Bookie, store: MetadataStore, *, root: str | None = None) -> None:
        self.bookie = bookie
        self.store = store
        self.manager = LedgerManager(store, root or bookie.config.metadata_ledgers_root)
        self.interval_s = bookie.config.gc_wait_time_s
        self.timeout_s = bookie.config.gc_timeout_s
        self._tasks = TaskSet("bookie ledger GC")
        self._started = False
        #: Ledgers deleted by this collector so far, and runs (metrics).
        self.ledgers_collected = 0
        self.runs = 0

    def start(self) -> None:
        if not self._started:
            self._started = True
            self._tasks.spawn(self._run(), name="bookie-ledger-gc")

    async def close(self) -> None:
        await self._tasks.close()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                # asyncio.timeout, not wait_for: 3.11's wait_for loses a cancellation that meets the pass's end.
                async with asyncio.timeout(self.timeout_s):
                    await self.collect_once()
            except (MetadataError, BookieError, TimeoutError) as e:
                log.warning("bookie ledger GC skipped: %r", e)
            except Exception:  # keep collecting: the next run may succeed
                log.exception("bookie ledger GC failed")

    async def collect_once(self) -> list[int]:
        """One scan-and-compare pass; returns the ledger ids deleted locally."""
        self.runs += 1
        local = set(self.bookie.ledger_ids())  # before the listing: see the module docstring
        if not local:
            return []
        listed = set(await self.manager.ledger_ids())
        if not listed and not await self.store.exists(f"{self.manager.root}/idgen"):
            # No ledger was ever created under this root: a wrong root, or another store.
            log.warning("bookie ledger GC: no ledgers under %s; nothing deleted", self.manager.root)
            return []
        deleted: list[int] = []
        for lid in sorted(local - listed):
            if await self.store.get(self.manager.path(lid)) is not None:
                continue  # created or listed late: it exists
            await self.bookie.delete_ledger(lid)
            deleted.append(lid)
        if deleted:
            self.ledgers_collected += len(deleted)
            log.info("bookie ledger GC: deleted %d ledgers gone from the metadata store: %s", len(deleted), deleted)
        return deleted
