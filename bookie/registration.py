"""Bookie registration: leased keys telling ledger clients which bookies exist and accept writes.

A running bookie holds exactly one ephemeral key bound to its metadata-store session:
``/ledgers/available/<address>`` while writable, ``/ledgers/available/readonly/<address>``
while read-only (disk nearly full or set by an operator), as BookKeeper does. The key vanishes
when the process dies (the lease runs out) or shuts down (the lease is revoked). A monitor
moves the key when the bookie's mode changes and re-creates session and key if the session
expired (e.g. the store was unreachable for longer than the TTL).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from typing import Any

from magnetar.common.tasks import TaskSet
from magnetar.metadata.api import MetadataError, MetadataStore, NotFoundError, Session

from .api import BookieError
from .bookie import Bookie

log = logging.getLogger(__name__)

AVAILABLE = "/ledgers/available"
READONLY = f"{AVAILABLE}/readonly"
#: Child of AVAILABLE that is not a bookie.
READONLY_NODE = "readonly"


def writable_path(address: str) -> str:
    return f"{AVAILABLE}/{address}"


def readonly_path(address: str) -> str:
    return f"{READONLY}/{address}"


class RegistrationConflictError(BookieError):
    """Another live bookie instance is registered under this address."""


class BookieRegistration:
    """Keeps ``bookie``'s registration key in ``store`` up to date.

    ``reg = BookieRegistration(store, bookie, "10.0.0.5:3181"); await reg.start()`` ...
    ``await reg.close()``. ``info`` is stored as the key's JSON value (instance id, HTTP address).
    """

    def __init__(
        self,
        store: MetadataStore,
        bookie: Bookie,
        address: str,
        *,
        ttl_s: float = 10.0,
        check_interval_s: float = 0.5,
        info: dict[str, Any] | None = None,
    ) -> None:
        self.store = store
        self.bookie = bookie
        self.address = address
        self.ttl_s = ttl_s
        self.check_interval_s = check_interval_s
        self.info = dict(info or {})
        self._session: Session | None = None
        #: The path currently registered, or None.
        self.path: str | None = None
        self.registered = False
        self._tasks = TaskSet(f"bookie registration {address}")
        self._closed = False

    @property
    def read_only(self) -> bool | None:
        """Mode of the current registration (None when not registered)."""
        if self.path is None:
            return None
        return self.path.startswith(READONLY + "/")

    async def start(self) -> None:
        """Register once (errors propagate: a bookie nobody can find should not look healthy).

        :class:`RegistrationConflictError` if a live registration of ``address`` belongs to
        another instance (same address, other disks); our own leftover from a crash is replaced.
        """
        ours = self.info.get("instanceId")
        for path in (writable_path(self.address), readonly_path(self.address)):
            existing = await self.store.get(path)
            if existing is None or ours is None:
                continue
            try:
                theirs = json.loads(existing.data).get("instanceId")
            except (ValueError, AttributeError):
                theirs = None
            if theirs is not None and theirs != ours:
                raise RegistrationConflictError(
                    f"{path} is held by bookie instance {theirs}, not this one ({ours}): "
                    "is another bookie running with this address?"
                )
        await self._sync()
        self._tasks.spawn(self._monitor(), name="bookie-registration")

    async def _sync(self) -> None:
        """Make the store match the bookie's mode (and renew a lost session)."""
        session = self._session
        if session is None or getattr(session, "expired", False):
            if session is not None:
                log.warning("registration session of bookie %s expired; registering again", self.address)
                with contextlib.suppress(MetadataError):
                    await session.close()
            self._session = session = await self.store.create_session(self.ttl_s)
            self.path = None
            self.registered = False
        want = readonly_path(self.address) if self.bookie.read_only else writable_path(self.address)
        if want == self.path:
            return
        value = dict(self.info, address=self.address, readOnly=want.startswith(READONLY + "/"), ts=int(time.time()))
        # New key first, then drop the old: the bookie is never invisible (briefly in both lists).
        await self.store.put(want, json.dumps(value).encode(), session=session)
        old, self.path = self.path, want
        self.registered = True
        if old is not None:
            with contextlib.suppress(NotFoundError):
                await self.store.delete(old)
        log.info("bookie %s registered as %s at %s", self.address, "read-only" if self.read_only else "writable", want)

    async def _monitor(self) -> None:
        while not self._closed:
            await asyncio.sleep(self.check_interval_s)
            try:
                await self._sync()
            except MetadataError as e:  # the store may be back next time; the lease bridges the gap
                log.warning("bookie %s registration update failed: %s", self.address, e)

    async def close(self) -> None:
        """Remove the registration (revoking the session deletes the key)."""
        self._closed = True
        await self._tasks.close()
        session, self._session = self._session, None
        self.registered = False
        if self.path is not None:
            with contextlib.suppress(MetadataError):
                await self.store.delete(self.path)
            self.path = None
        if session is not None:
            with contextlib.suppress(MetadataError):
                await session.close()
