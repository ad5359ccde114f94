"""Factory of managed ledgers: one per process, sharing the entry cache and the cursor flusher."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from magnetar.common.tasks import TaskSet
from magnetar.ledger.api import LedgerClient
from magnetar.managed_ledger.api import (
    ManagedLedger,
    ManagedLedgerClosedError,
    ManagedLedgerConfig,
    ManagedLedgerError,
    ManagedLedgerFactory,
    ManagedLedgerFencedError,
)
from magnetar.managed_ledger.cache import AGE_OUT_SLICE, EntryCache
from magnetar.managed_ledger.ledger import ManagedLedgerImpl, State
from magnetar.managed_ledger.metadata import ManagedLedgerInfo, ledger_path
from magnetar.metadata.api import MetadataError, MetadataStore

if TYPE_CHECKING:
    from magnetar.managed_ledger.cursor import ManagedCursorImpl

log = logging.getLogger(__name__)


class ManagedLedgerFactoryImpl(ManagedLedgerFactory):
    """Opens :class:`~magnetar.managed_ledger.ledger.ManagedLedgerImpl` instances by name.

    ``store`` holds ledger lists and cursors; ``client`` stores entries. The factory does not own
    either: closing it closes its managed ledgers, not the store or the client.

    * ``cache_size_bytes``: entry cache shared by all ledgers of this factory.
    * ``op_timeout_seconds``: bound of every metadata and ledger call except appends (the ledger
      client bounds those itself).
    * ``trim_interval_seconds``: periodic trim check (retention by time); ``0`` disables it.
    * ``trim_delay_seconds``: debounce between a mark-delete move or rollover and the trim it triggers.
    * ``cache_eviction_seconds``: cached entries age out after one to two of these (``0``: only the
      size bound evicts).
    """

    def __init__(
        self,
        store: MetadataStore,
        client: LedgerClient,
        *,
        cache_size_bytes: int = 64 * 1024 * 1024,
        op_timeout_seconds: float = 30.0,
        trim_interval_seconds: float = 60.0,
        trim_delay_seconds: float = 0.1,
        cache_eviction_seconds: float = 0.0,
        default_config: ManagedLedgerConfig | None = None,
    ) -> None:
        self.store = store
        self.client = client
        self.cache = EntryCache(cache_size_bytes)
        self.op_timeout_seconds = op_timeout_seconds
        self.trim_interval_seconds = trim_interval_seconds
        self.trim_delay_seconds = trim_delay_seconds
        self.cache_eviction_seconds = cache_eviction_seconds
        self._age_timer: asyncio.Handle | None = None
        self.default_config = default_config or ManagedLedgerConfig()
        self._ledgers: dict[str, ManagedLedgerImpl] = {}
        self._opening: dict[str, asyncio.Future[ManagedLedgerImpl]] = {}
        self._closed = False
        # Group flush of dirty durable cursors across all ledgers.
        self._dirty: set[ManagedCursorImpl] = set()
        self._flush_timer: asyncio.TimerHandle | None = None
        self._flush_deadline = 0.0
        # One periodic trim check for all ledgers (as Pulsar's broker-wide consumed-ledgers monitor),
        # not a timer per ledger: armed with the first open.
        self._trim_timer: asyncio.TimerHandle | None = None
        self._tasks = TaskSet("managed ledger factory")
        #: Number of group flushes run (for tests and metrics).
        self.cursor_flushes = 0

    @property
    def ledgers(self) -> dict[str, ManagedLedger]:
        """Currently open managed ledgers by name."""
        return dict(self._ledgers)

    async def open(self, name: str, config: ManagedLedgerConfig | None = None) -> ManagedLedger:
        if self._closed:
            raise ManagedLedgerClosedError("managed ledger factory is closed")
        ml = self._ledgers.get(name)
        if ml is not None and ml.state is State.OPEN:
            return ml
        if ml is not None:  # fenced or closing: drop it and take the ledger over again
            self._ledgers.pop(name, None)
            await ml.shutdown(seal=False)
        pending = self._opening.get(name)
        if pending is not None:
            return await asyncio.shield(pending)
        fut: asyncio.Future[ManagedLedgerImpl] = asyncio.get_running_loop().create_future()
        self._opening[name] = fut
        try:
            ml = ManagedLedgerImpl(self, name, config or self.default_config)
            try:
                await ml.initialize()
            except BaseException:
                await ml.shutdown(seal=False)
                raise
            self._ledgers[name] = ml
            loop = asyncio.get_running_loop()
            if self._trim_timer is None and self.trim_interval_seconds > 0:
                self._trim_timer = loop.call_later(self.trim_interval_seconds, self._on_trim)
            if self._age_timer is None and self.cache_eviction_seconds > 0:
                self._age_timer = loop.call_later(self.cache_eviction_seconds, self._on_age)
            fut.set_result(ml)
            return ml
        except MetadataError as e:
            err = ManagedLedgerError(f"cannot open managed ledger {name}: {e}")
            fut.set_exception(err)
            fut.exception()
            raise err from e
        except BaseException as e:
            fut.set_exception(e)
            fut.exception()
            raise
        finally:
            del self._opening[name]

    async def exists(self, name: str) -> bool:
        return await self.store.exists(ledger_path(name))

    async def delete(self, name: str) -> None:
        ml = self._ledgers.get(name)
        if ml is not None:
            await ml.delete()
            return
        path = ledger_path(name)
        value = await self.store.get(path)
        if value is not None:
            for li in ManagedLedgerInfo.parse(value.data).ledgers:
                try:
                    await self.client.delete_ledger(li.ledger_id)
                except Exception as e:
                    log.warning("deleting ledger %d of %s failed: %s", li.ledger_id, name, e)
        await self.store.delete_recursive(path)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        mls = list(self._ledgers.values())
        results = await asyncio.gather(*(ml.close() for ml in mls), return_exceptions=True)
        for ml, r in zip(mls, results, strict=True):
            if isinstance(r, Exception):
                log.warning("closing %s failed: %s", ml.name, r)
        for timer in (self._flush_timer, self._trim_timer, self._age_timer):
            if timer is not None:
                timer.cancel()
        self._flush_timer = self._trim_timer = self._age_timer = None
        await self._tasks.close()

    def _on_age(self) -> None:
        self._age_timer = None
        if self._closed:
            return
        self._age_out(self.cache.age_out(AGE_OUT_SLICE))

    def _drop_aged(self) -> None:
        self._age_timer = None
        if self._closed:
            return
        self._age_out(self.cache.drop_aged(AGE_OUT_SLICE))

    def _age_out(self, done: bool) -> None:
        # A slice per loop callback: dropping a threshold's worth of entries at once stalls the loop.
        loop = asyncio.get_running_loop()
        if done:
            self._age_timer = loop.call_later(self.cache_eviction_seconds, self._on_age)
        else:
            self._age_timer = loop.call_soon(self._drop_aged)

    def _on_trim(self) -> None:
        self._trim_timer = None
        if self._closed:
            return
        for ml in list(self._ledgers.values()):
            ml.check_trim()
        self._trim_timer = asyncio.get_running_loop().call_later(self.trim_interval_seconds, self._on_trim)

    def forget(self, ml: ManagedLedgerImpl) -> None:
        """``ml`` closed or was deleted: stop listing it."""
        if self._ledgers.get(ml.name) is ml:
            del self._ledgers[ml.name]

    # ------------------------------------------------------------------ cursor group flush

    def schedule_cursor_flush(self, cursor: ManagedCursorImpl, within_seconds: float) -> None:
        """Queue a durable cursor for a group flush at most ``within_seconds`` from now."""
        if self._closed:  # closing each ledger flushed its cursors; the task set is gone
            return
        self._dirty.add(cursor)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within_seconds
        if self._flush_timer is None or deadline < self._flush_deadline:
            if self._flush_timer is not None:
                self._flush_timer.cancel()
            self._flush_deadline = deadline
            self._flush_timer = loop.call_at(deadline, self._on_flush_timer)

    def _on_flush_timer(self) -> None:
        self._flush_timer = None
        dirty, self._dirty = self._dirty, set()
        if not dirty:
            return
        self.cursor_flushes += 1
        self._tasks.spawn(self._flush(dirty), name="cursor flush")

    async def _flush(self, cursors: set[ManagedCursorImpl]) -> None:
        # All writes are issued at once so the metadata store commits them together.
        results = await asyncio.gather(*(c.flush() for c in cursors), return_exceptions=True)
        for cursor, r in zip(cursors, results, strict=True):
            if isinstance(r, ManagedLedgerFencedError):
                log.debug("not flushing cursor %s of fenced %s", cursor.name, cursor.ledger_name)
            elif isinstance(r, BaseException) and not isinstance(r, asyncio.CancelledError):
                log.warning("flushing cursor %s of %s failed: %s", cursor.name, cursor.ledger_name, r)
