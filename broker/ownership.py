"""Bundle ownership: ``/namespace/<tenant>/<ns>/<0x..._0x...>`` leased keys taken with compare-and-swap.

A bundle is served by the broker whose session holds its key (Pulsar's ``NamespaceEphemeralData``:
the owner's URLs). The key vanishes with the owner's lease (death, pause past the TTL) or when the
owner releases it (unload, split, graceful shutdown).
"""

from __future__ import annotations

import contextlib
import json
import logging
from dataclasses import dataclass
from typing import Any

from magnetar.broker.broker_registry import BrokerInfo
from magnetar.broker.bundles import Bundle
from magnetar.metadata.api import NOT_EXISTS, BadVersionError, MetadataError, MetadataStore, NotFoundError, Session

log = logging.getLogger(__name__)

OWNERSHIP_ROOT = "/namespace"


def ownership_path(bundle: Bundle) -> str:
    return f"{OWNERSHIP_ROOT}/{bundle.namespace}/{bundle.range}"


@dataclass(frozen=True, slots=True)
class Owner:
    """Who serves a bundle (the stored ownership data)."""

    broker_id: str
    native_url: str
    native_url_tls: str
    http_url: str
    advertised_listeners: dict[str, dict[str, str]]
    session: int
    disabled: bool = False
    http_url_tls: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "brokerId": self.broker_id,
            "nativeUrl": self.native_url,
            "nativeUrlTls": self.native_url_tls,
            "httpUrl": self.http_url,
            "httpUrlTls": self.http_url_tls,
            "disabled": self.disabled,
            "advertisedListeners": self.advertised_listeners,
            "session": self.session,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Owner:
        return cls(
            broker_id=data.get("brokerId", ""),
            native_url=data.get("nativeUrl", ""),
            native_url_tls=data.get("nativeUrlTls", ""),
            http_url=data.get("httpUrl", ""),
            advertised_listeners=data.get("advertisedListeners") or {},
            session=int(data.get("session", 0)),
            disabled=bool(data.get("disabled", False)),
            http_url_tls=data.get("httpUrlTls", ""),
        )

    @classmethod
    def of(cls, info: BrokerInfo, session: Session) -> Owner:
        return cls(
            info.broker_id,
            info.pulsar_service_url,
            info.pulsar_service_url_tls,
            info.web_service_url,
            info.advertised_listeners,
            session.id,
            http_url_tls=info.web_service_url_tls,
        )

    def urls(self, listener_name: str) -> tuple[str, str]:
        """``(brokerServiceUrl, brokerServiceUrlTls)`` for a listener name; ``KeyError`` if unknown."""
        if listener_name:
            listener = self.advertised_listeners[listener_name]
            return listener.get("brokerServiceUrl", ""), listener.get("brokerServiceUrlTls", "")
        return self.native_url, self.native_url_tls


class OwnershipCache:
    """This broker's owned bundles, and reads/CAS-writes of everyone's ownership keys."""

    def __init__(self, store: MetadataStore, me: BrokerInfo) -> None:
        self.store = store
        self.me = me
        self._session: Session | None = None
        #: bundle -> version of our key
        self._owned: dict[Bundle, int] = {}

    def set_session(self, session: Session) -> None:
        self._session = session

    @property
    def owned(self) -> list[Bundle]:
        return list(self._owned)

    def owns(self, bundle: Bundle) -> bool:
        return bundle in self._owned

    def forget_all(self) -> list[Bundle]:
        """Drop every local claim (the lease is gone: the keys went with it)."""
        lost = list(self._owned)
        self._owned.clear()
        return lost

    async def owner(self, bundle: Bundle) -> Owner | None:
        value = await self.store.get(ownership_path(bundle))
        return Owner.from_json(json.loads(value.data)) if value is not None else None

    async def try_acquire(self, bundle: Bundle) -> Owner:
        """Take ``bundle`` if nobody holds it; returns the owner (this broker or the one that won)."""
        session = self._session
        assert session is not None, "no session"
        mine = Owner.of(self.me, session)
        for _ in range(3):
            if bundle in self._owned:
                return mine
            try:
                stat = await self.store.put(ownership_path(bundle), json.dumps(mine.to_json()).encode(),
                                            NOT_EXISTS, session=session)  # fmt: skip
            except BadVersionError:
                value = await self.store.get(ownership_path(bundle))
                if value is None:
                    continue  # released meanwhile: try again
                current = Owner.from_json(json.loads(value.data))
                if current.broker_id == self.me.broker_id and current.session != session.id:
                    # Left by this broker's previous life (same id, dead session): take it over.
                    with contextlib.suppress(NotFoundError, BadVersionError):
                        await self.store.delete(ownership_path(bundle), value.stat.version)
                    continue
                if current.session == session.id:
                    self._owned[bundle] = value.stat.version
                    return mine
                return current
            self._owned[bundle] = stat.version
            log.info("acquired bundle %s", bundle.key)
            return mine
        raise MetadataError(f"could not acquire bundle {bundle.key}")

    async def release(self, bundle: Bundle) -> None:
        """Give ``bundle`` up (after its topics are closed)."""
        version = self._owned.pop(bundle, None)
        if version is None:
            return
        with contextlib.suppress(NotFoundError, BadVersionError):
            await self.store.delete(ownership_path(bundle), version)
        log.info("released bundle %s", bundle.key)

    async def owners_of_namespace(self, namespace: str) -> dict[str, Owner]:
        """Bundle range -> owner for every owned bundle of ``namespace``."""
        base = f"{OWNERSHIP_ROOT}/{namespace}"
        out = {}
        for child in await self.store.get_children(base):
            value = await self.store.get(f"{base}/{child}")
            if value is not None:
                out[child] = Owner.from_json(json.loads(value.data))
        return out
