"""Where the ledger client finds bookies."""

from __future__ import annotations

import abc
import contextlib
import logging
from collections.abc import Iterable

from magnetar.bookie.api import BookieClient, BookieUnavailableError

log = logging.getLogger(__name__)


class BookieRegistry(abc.ABC):
    """Lists the bookies new ledgers may use and hands out a client per bookie address."""

    @abc.abstractmethod
    async def writable_bookies(self) -> list[str]:
        """Addresses of the bookies accepting new ledgers."""

    async def readonly_bookies(self) -> list[str]:
        """Addresses of registered bookies that serve reads but take no new ledgers."""
        return []

    async def available_bookies(self) -> list[str]:
        """Every registered bookie, writable or read-only (auto-recovery: a bookie that some
        ledger uses but that is not listed here is lost)."""
        return sorted({*await self.writable_bookies(), *await self.readonly_bookies()})

    @abc.abstractmethod
    def client(self, address: str) -> BookieClient:
        """The client of ``address``; :class:`BookieUnavailableError` if it is unknown."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release the clients."""


class StaticBookieRegistry(BookieRegistry):
    """A fixed set of bookies (standalone: the one in-process bookie; tests: several).

    ``StaticBookieRegistry([LocalBookieClient(bookie), ...])``. :meth:`set_writable` takes a
    bookie out of (or back into) placement without affecting reads of existing ledgers;
    :meth:`remove` makes it lost.
    """

    def __init__(self, clients: Iterable[BookieClient]) -> None:
        self._clients: dict[str, BookieClient] = {}
        for c in clients:
            if c.address in self._clients:
                raise ValueError(f"two clients for bookie {c.address}")
            self._clients[c.address] = c
        self._not_writable: set[str] = set()

    def set_writable(self, address: str, writable: bool) -> None:
        if writable:
            self._not_writable.discard(address)
        else:
            self._not_writable.add(address)

    def remove(self, address: str) -> BookieClient | None:
        """Forget a bookie entirely (it is lost: no reads, no placement); returns its client."""
        self._not_writable.discard(address)
        return self._clients.pop(address, None)

    async def writable_bookies(self) -> list[str]:
        return [a for a in self._clients if a not in self._not_writable]

    async def available_bookies(self) -> list[str]:
        return list(self._clients)

    def client(self, address: str) -> BookieClient:
        try:
            return self._clients[address]
        except KeyError:
            raise BookieUnavailableError(f"unknown bookie {address}") from None

    async def close(self) -> None:
        for c in self._clients.values():
            with contextlib.suppress(Exception):
                await c.close()
