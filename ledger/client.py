"""The ledger client: creates, opens (with recovery) and deletes ledgers over a set of bookies."""

from __future__ import annotations

import asyncio
import logging
import time

from magnetar.bookie.api import BookieError
from magnetar.metadata.api import MetadataStore

from .api import LedgerClient, LedgerConfig, LedgerError, NoSuchLedgerError, ReadHandle, WriteHandle
from .context import LedgerClientConfig, LedgerContext
from .errors import LedgerUnauthorizedError, MetadataVersionConflictError
from .handles import LedgerWriteHandle
from .ledger_manager import LedgerManager
from .metadata import LedgerMetadata, LedgerState
from .placement import EnsemblePlacement
from .reads import EntryReader, LedgerReadHandle, read_last_add_confirmed
from .recovery import recover_ledger
from .registry import BookieRegistry

log = logging.getLogger(__name__)


class BookieLedgerClient(LedgerClient):
    """:class:`LedgerClient` over bookies found in a :class:`BookieRegistry`, metadata in a store.

    ``BookieLedgerClient(store, registry, config=LedgerClientConfig())``. Closing the client
    closes the registry (and so the bookie clients), not the store.
    """

    def __init__(
        self,
        store: MetadataStore,
        registry: BookieRegistry,
        config: LedgerClientConfig | None = None,
        *,
        placement: EnsemblePlacement | None = None,
    ) -> None:
        config = config or LedgerClientConfig()
        self.ctx = LedgerContext(
            manager=LedgerManager(store, config.ledgers_root, config.id_block_size),
            registry=registry,
            config=config,
            placement=placement or EnsemblePlacement(),
        )
        self._writers: set[LedgerWriteHandle] = set()
        self._closed = False

    @property
    def manager(self) -> LedgerManager:
        return self.ctx.manager

    def _check(self) -> None:
        if self._closed:
            raise LedgerError("ledger client is closed")

    async def create_ledger(self, config: LedgerConfig) -> WriteHandle:
        self._check()
        ctx = self.ctx
        candidates = await ctx.registry.writable_bookies()
        ensemble = ctx.placement.choose(candidates, config.ensemble_size, ctx.usage)
        md = LedgerMetadata(
            ensemble_size=config.ensemble_size,
            write_quorum=config.write_quorum,
            ack_quorum=config.ack_quorum,
            ensembles=[(0, ensemble)],
            password=config.password,
            custom_metadata=dict(config.custom_metadata),
            ctime_ms=int(time.time() * 1000),
        )
        ledger_id = await ctx.manager.new_ledger_id(config.min_ledger_id)
        version = await ctx.manager.create(ledger_id, md)
        handle = LedgerWriteHandle(ctx, ledger_id, md, version, on_close=self._writer_closed)
        self._writers.add(handle)
        ctx.usage.update(ensemble)
        log.debug("created ledger %d on %s", ledger_id, ensemble)
        return handle

    def _writer_closed(self, handle: LedgerWriteHandle) -> None:
        if handle in self._writers:
            self._writers.discard(handle)
            self.ctx.usage.subtract(handle.metadata.ensembles[-1][1])

    async def open_ledger(self, ledger_id: int, *, recovery: bool = True, password: bytes = b"") -> ReadHandle:
        self._check()
        md, version = await self.ctx.manager.read(ledger_id)
        if md.password != password:
            raise LedgerUnauthorizedError(f"wrong password for ledger {ledger_id}")
        if md.state is not LedgerState.CLOSED and recovery:
            md, version = await recover_ledger(self.ctx, ledger_id, md, version)
        if md.state is LedgerState.CLOSED:
            return LedgerReadHandle(self.ctx, ledger_id, md, md.last_entry_id, md.length)
        lac = await read_last_add_confirmed(self.ctx, ledger_id, md)
        length = 0
        if lac >= 0:
            length = (await EntryReader(self.ctx, ledger_id, md).fetch(lac, lac))[0][2]
        return LedgerReadHandle(self.ctx, ledger_id, md, lac, length)

    async def delete_ledger(self, ledger_id: int) -> None:
        self._check()
        manager = self.ctx.manager
        for _ in range(self.ctx.config.metadata_retries):
            try:
                md, version = await manager.read(ledger_id)
            except NoSuchLedgerError:
                return
            try:
                await manager.delete(ledger_id, version)
                break
            except MetadataVersionConflictError:
                continue
        else:
            raise LedgerError(f"could not delete ledger {ledger_id}: too many metadata conflicts")
        timeout = self.ctx.config.bookie_op_timeout_s

        async def one(address: str) -> None:
            try:
                await asyncio.wait_for(self.ctx.registry.client(address).delete_ledger(ledger_id), timeout)
            except (BookieError, TimeoutError) as e:
                # TODO(bookie GC against metadata): a bookie that misses this keeps the data.
                log.warning("bookie %s could not delete ledger %d: %r", address, ledger_id, e)

        await asyncio.gather(*(one(a) for a in sorted(md.all_bookies())))

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for handle in list(self._writers):
            handle._release()
        await self.ctx.registry.close()


#: Alternative name (BookKeeper's client class is ``BookKeeper``); ``cli/standalone.py`` uses it.
BookKeeperClient = BookieLedgerClient
