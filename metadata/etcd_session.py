"""Sessions of :class:`~magnetar.metadata.etcd.EtcdMetadataStore`: etcd leases kept alive by a task.

A session is an etcd lease (TTL at least :data:`MIN_LEASE_TTL` s, etcd's minimum) renewed every
TTL/3 over the store's :class:`~magnetar.metadata.etcd_transport.EtcdTransport`; ephemeral keys
are put with the lease, so they vanish when the session is closed (lease revoked) or when the
owner dies (lease expires).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from aetcd import rpc

from magnetar.common.tasks import TaskSet
from magnetar.metadata.api import MetadataError, Session
from magnetar.metadata.etcd_transport import EtcdTransport, SessionExpiredError

log = logging.getLogger(__name__)

#: etcd's smallest lease TTL in seconds.
MIN_LEASE_TTL = 2


class EtcdSession(Session):
    """An etcd lease kept alive by a task; ephemeral keys are attached to it."""

    def __init__(
        self, transport: EtcdTransport, lease_id: int, ttl: int, on_close: Callable[[EtcdSession], None]
    ) -> None:
        self._transport = transport
        self._on_close = on_close
        self._id = lease_id
        self.ttl = ttl
        self.closed = False
        #: Set when etcd reported the lease gone (the owner could not renew it in time).
        self.expired = False
        self.keepalives = 0
        self._tasks = TaskSet(f"etcd lease {lease_id:x}")
        # The grant was answered just now; renewals move this on from the time they were sent.
        self._valid_until = time.monotonic() + ttl

    @property
    def id(self) -> int:
        return self._id

    @property
    def transport(self) -> EtcdTransport:
        """The connection the lease belongs to."""
        return self._transport

    def start(self) -> None:
        """Start renewing the lease."""
        self._tasks.spawn(self._keep_alive(), name=f"etcd-lease-{self._id:x}")

    async def _keep_alive(self) -> None:
        interval = self.ttl / 3
        transport = self._transport
        while not self.closed and not transport.closed:
            await asyncio.sleep(interval)
            sent = time.monotonic()
            try:
                ttl = await transport.renew(self._id, deadline=min(transport.op_timeout_seconds, self.ttl / 3))
            except MetadataError as e:
                log.debug("keep-alive of lease %x failed: %s", self._id, e)
                interval = min(0.25, self.ttl / 3)  # retry soon: the lease runs down meanwhile
                continue
            if ttl <= 0:
                self._valid_until = 0.0
                self.expired = True
                log.warning("etcd session %x expired: its ephemeral keys are gone", self._id)
                return
            self.keepalives += 1
            self._valid_until = sent + ttl
            interval = self.ttl / 3

    @property
    def valid_until(self) -> float:
        return self._valid_until

    async def close(self) -> None:
        """Revoke the lease (deleting its ephemeral keys).

        If etcd cannot be reached the keys still vanish once the TTL runs out, since renewals stop.
        """
        if self.closed:
            return
        self.closed = True
        self._on_close(self)
        await self._tasks.close()
        if self.expired:
            return
        try:
            req = rpc.LeaseRevokeRequest(ID=self._id)
            await self._transport.rpc("revoke session", lambda s: s.lease.LeaseRevoke, req, internal=True)
        except SessionExpiredError:
            pass
        except MetadataError as e:
            log.warning("could not revoke etcd lease %x (its keys expire in %ss): %s", self._id, self.ttl, e)
