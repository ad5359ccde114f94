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

    @abc.abstractmethod
    def client(self, address: str) -> BookieClient:
        """The client of ``address``; :class:`BookieUnavailableError` if it is unknown."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release the clients."""


class StaticBookieRegistry(BookieRegistry):
    """A fixed set of bookies (standalone: the one in-process bookie; tests: several).

    ``StaticBookieRegistry([LocalBookieClient(bookie), ...])``. :meth:`set_writable` takes a
    bookie out of (or back into) placement without affecting reads of existing ledgers.
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

    async def writable_bookies(self) -> list[str]:
        return [a for a in self._clients if a not in self._not_writable]

    def client(self, address: str) -> BookieClient:
        try:
            return self._clients[address]
        except KeyError:
            raise BookieUnavailableError(f"unknown bookie {address}") from None

    async def close(self) -> None:
        for c in self._clients.values():
            with contextlib.suppress(Exception):
                await c.close()
