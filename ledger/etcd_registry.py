"""Bookie discovery through the metadata store (etcd in a cluster).

Bookies register themselves under leased keys (:mod:`magnetar.bookie.registration`); this
registry keeps a cache of those keys, updated by a watch and re-listed periodically (a watch
can miss events across reconnects), and hands out one :class:`RemoteBookieClient` per address.
Clients are made for any address on demand: ledgers keep being read from bookies that have
become read-only or left placement.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import ssl
from collections.abc import Callable

from magnetar.bookie.api import BookieClient, BookieUnavailableError
from magnetar.bookie.registration import AVAILABLE, READONLY, READONLY_NODE
from magnetar.bookie.remote import RemoteBookieClient, split_address
from magnetar.common.tasks import TaskSet
from magnetar.metadata.api import MetadataError, MetadataStore, Notification, NotificationType

from .registry import BookieRegistry

log = logging.getLogger(__name__)


class MetadataBookieRegistry(BookieRegistry):
    """:class:`BookieRegistry` over bookie registrations in a :class:`MetadataStore`.

    ``registry = MetadataBookieRegistry(store); await registry.start()`` (or let the first
    :meth:`writable_bookies` start it). Closing it closes the bookie clients, not the store.
    """

    def __init__(
        self,
        store: MetadataStore,
        *,
        refresh_interval_s: float = 10.0,
        add_timeout_s: float = 30.0,
        op_timeout_s: float = 30.0,
        connect_timeout_s: float = 5.0,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.store = store
        self.refresh_interval_s = refresh_interval_s
        self._new_client = functools.partial(
            RemoteBookieClient,
            add_timeout_s=add_timeout_s,
            op_timeout_s=op_timeout_s,
            connect_timeout_s=connect_timeout_s,
            ssl_context=ssl_context,  # TLS to every bookie (bookkeeperTLS* settings)
        )
        self._writable: set[str] = set()
        self._readonly: set[str] = set()
        self._clients: dict[str, RemoteBookieClient] = {}
        self._unwatch: Callable[[], None] | None = None
        self._tasks = TaskSet("bookie registry")
        self._started = False
        self._closed = False

    async def start(self) -> None:
        if self._started:
            return
        self._started = True
        # Watch before listing: a change between the two is then not lost.
        self._unwatch = self.store.watch(AVAILABLE + "/", self._on_change)
        await self.refresh()
        self._tasks.spawn(self._refresh_loop(), name="bookie-registry-refresh")

    async def refresh(self) -> None:
        """Re-list the registrations."""
        children = await self.store.get_children(AVAILABLE)
        self._writable = {c for c in children if c != READONLY_NODE}
        self._readonly = set(await self.store.get_children(READONLY))

    async def _refresh_loop(self) -> None:
        while not self._closed:
            await asyncio.sleep(self.refresh_interval_s)
            try:
                await self.refresh()
            except MetadataError as e:
                log.warning("listing bookies failed (using the cached list): %s", e)

    def _on_change(self, n: Notification) -> None:
        rest = n.path[len(AVAILABLE) + 1 :]
        if rest.startswith(READONLY_NODE + "/"):
            target, address = self._readonly, rest[len(READONLY_NODE) + 1 :]
        elif rest and rest != READONLY_NODE:
            target, address = self._writable, rest
        else:
            return
        if "/" in address:
            return
        if n.type is NotificationType.DELETED:
            target.discard(address)
        else:
            target.add(address)

    async def writable_bookies(self) -> list[str]:
        if not self._started:
            await self.start()
        return sorted(self._writable)

    async def readonly_bookies(self) -> list[str]:
        if not self._started:
            await self.start()
        return sorted(self._readonly)

    async def available_bookies(self) -> list[str]:
        """Every registered bookie, writable or read-only (auto-recovery: anything else is lost)."""
        if not self._started:
            await self.start()
        return sorted(self._writable | self._readonly)

    def client(self, address: str) -> BookieClient:
        if self._closed:
            raise BookieUnavailableError("bookie registry is closed")
        c = self._clients.get(address)
        if c is None:
            try:
                split_address(address)
            except ValueError as e:
                raise BookieUnavailableError(str(e)) from None
            c = self._clients[address] = self._new_client(address)
        return c

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._unwatch is not None:
            self._unwatch()
        await self._tasks.close()
        clients, self._clients = self._clients, {}
        for c in clients.values():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(c.close(), 10)


#: The name used in the cluster issue; the registry works on any MetadataStore.
EtcdBookieRegistry = MetadataBookieRegistry
