"""Ledger metadata in the metadata store: paths, compare-and-swap updates, id allocation.

Layout (BookKeeper's flat style): ``<root>/L0000000042`` holds ledger 42's JSON metadata and
``<root>/idgen`` the next id not yet handed out. Ids are reserved in blocks with one CAS per
block, so creating a ledger costs one metadata write, not two.
"""

from __future__ import annotations

import asyncio
import logging

from magnetar.metadata.api import NOT_EXISTS, BadVersionError, MetadataStore, NotFoundError

from .api import NoSuchLedgerError
from .errors import MetadataVersionConflictError
from .metadata import LedgerMetadata

log = logging.getLogger(__name__)

_FIRST_LEDGER_ID = 1


class LedgerManager:
    """Reads and writes ledger metadata; every update is a compare-and-swap on the version."""

    def __init__(self, store: MetadataStore, root: str = "/ledgers", id_block_size: int = 1000) -> None:
        self.store = store
        self.root = root.rstrip("/")
        self.id_block_size = id_block_size
        self._idgen_path = f"{self.root}/idgen"
        self._next_id = 0
        self._block_end = 0  # exclusive
        self._id_lock = asyncio.Lock()

    def path(self, ledger_id: int) -> str:
        return f"{self.root}/L{ledger_id:010d}"

    async def new_ledger_id(self, at_least: int = 0) -> int:
        """A ledger id no other client will ever get, not below ``at_least``.

        A managed ledger's ledgers need growing ids; when another broker wrote its last ledger, the
        rest of this client's block may lie below that id, so it is dropped for a fresh block (blocks
        are reserved in increasing order, so a fresh one lies above every id handed out before)."""
        async with self._id_lock:
            if self._next_id >= self._block_end or self._next_id < at_least:
                await self._reserve_block(at_least)
            lid = self._next_id
            self._next_id += 1
            return lid

    async def _reserve_block(self, at_least: int = 0) -> None:
        while True:
            current = await self.store.get(self._idgen_path)
            if current is None:
                start, expected = _FIRST_LEDGER_ID, NOT_EXISTS
            else:
                start, expected = int(current.data), current.stat.version
            start = max(start, at_least)
            end = start + self.id_block_size
            try:
                await self.store.put(self._idgen_path, str(end).encode(), expected)
            except BadVersionError:
                continue  # another client reserved a block first; take the next one
            self._next_id, self._block_end = start, end
            log.debug("reserved ledger ids [%d, %d)", start, end)
            return

    async def create(self, ledger_id: int, metadata: LedgerMetadata) -> int:
        """Store a new ledger's metadata; returns its version."""
        try:
            stat = await self.store.put(self.path(ledger_id), metadata.to_bytes(), NOT_EXISTS)
        except BadVersionError as e:
            raise MetadataVersionConflictError(f"ledger {ledger_id} already exists") from e
        return stat.version

    async def read(self, ledger_id: int) -> tuple[LedgerMetadata, int]:
        """``(metadata, version)``; :class:`NoSuchLedgerError` if absent."""
        value = await self.store.get(self.path(ledger_id))
        if value is None:
            raise NoSuchLedgerError(f"ledger {ledger_id} does not exist")
        return LedgerMetadata.from_bytes(value.data), value.stat.version

    async def write(self, ledger_id: int, metadata: LedgerMetadata, version: int) -> int:
        """Replace the metadata if it is still at ``version``; returns the new version."""
        try:
            stat = await self.store.put(self.path(ledger_id), metadata.to_bytes(), version)
        except BadVersionError as e:
            raise MetadataVersionConflictError(f"ledger {ledger_id} metadata changed concurrently") from e
        except NotFoundError as e:  # pragma: no cover - stores report a missing key as a version mismatch
            raise NoSuchLedgerError(f"ledger {ledger_id} does not exist") from e
        return stat.version

    async def delete(self, ledger_id: int, version: int) -> None:
        try:
            await self.store.delete(self.path(ledger_id), version)
        except BadVersionError as e:
            raise MetadataVersionConflictError(f"ledger {ledger_id} metadata changed concurrently") from e
        except NotFoundError:
            pass

    async def ledger_ids(self) -> list[int]:
        """Ids of every existing ledger (for tools and bookie-side garbage collection)."""
        ids = []
        for name in await self.store.get_children(self.root):
            if name.startswith("L") and name[1:].isdigit():
                ids.append(int(name[1:]))
        return sorted(ids)
