"""Broker registry: each cluster broker's leased key with its URLs and load report, and leader election.

Keys (Pulsar's layout): ``/loadbalance/brokers/<host:webport>`` holds the broker's lookup data and its
latest load report, ``/loadbalance/leader`` the leader's id; both live with the broker's session (an
etcd lease), so they vanish when the broker dies or is paused past the lease TTL. Reports are written
at most every ``loadBalancerReportUpdateMinIntervalMillis`` (never per message).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from magnetar.common.tasks import TaskSet
from magnetar.metadata.api import NOT_EXISTS, BadVersionError, MetadataError, MetadataStore, Session

log = logging.getLogger(__name__)

BROKERS_PATH = "/loadbalance/brokers"
LEADER_PATH = "/loadbalance/leader"


@dataclass(slots=True)
class BrokerInfo:
    """A registered broker: its URLs (per advertised listener too) and its last load report."""

    broker_id: str
    web_service_url: str
    pulsar_service_url: str
    pulsar_service_url_tls: str = ""
    web_service_url_tls: str = ""
    #: listener name -> {"brokerServiceUrl": ..., "brokerServiceUrlTls": ...}
    advertised_listeners: dict[str, dict[str, str]] = field(default_factory=dict)
    load: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "brokerId": self.broker_id,
            "webServiceUrl": self.web_service_url,
            "webServiceUrlTls": self.web_service_url_tls,
            "pulsarServiceUrl": self.pulsar_service_url,
            "pulsarServiceUrlTls": self.pulsar_service_url_tls,
            "advertisedListeners": self.advertised_listeners,
            **self.load,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BrokerInfo:
        known = {
            "brokerId",
            "webServiceUrl",
            "webServiceUrlTls",
            "pulsarServiceUrl",
            "pulsarServiceUrlTls",
            "advertisedListeners",
        }
        return cls(
            broker_id=data["brokerId"],
            web_service_url=data["webServiceUrl"],
            web_service_url_tls=data.get("webServiceUrlTls", ""),
            pulsar_service_url=data["pulsarServiceUrl"],
            pulsar_service_url_tls=data.get("pulsarServiceUrlTls", ""),
            advertised_listeners=data.get("advertisedListeners") or {},
            load={k: v for k, v in data.items() if k not in known},
        )

    def urls(self, listener_name: str) -> tuple[str, str]:
        """``(brokerServiceUrl, brokerServiceUrlTls)`` for a listener name ("" = the broker's own)."""
        if listener_name:
            listener = self.advertised_listeners.get(listener_name)
            if listener is None:
                raise KeyError(listener_name)
            return listener.get("brokerServiceUrl", ""), listener.get("brokerServiceUrlTls", "")
        return self.pulsar_service_url, self.pulsar_service_url_tls


def _process_usage(previous: tuple[float, float] | None) -> tuple[dict[str, Any], tuple[float, float]]:
    """CPU (percent of one core since the last report) and resident memory of this process."""
    now = (time.monotonic(), time.process_time())
    cpu = 0.0
    if previous is not None and now[0] > previous[0]:
        cpu = 100.0 * (now[1] - previous[1]) / (now[0] - previous[0])
    rss_mb = 0.0
    with contextlib.suppress(OSError, ValueError, IndexError), open("/proc/self/statm") as f:
        rss_mb = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    cores = os.cpu_count() or 1
    usage = {
        "cpu": {"usage": round(cpu, 2), "limit": 100.0 * cores},
        "memory": {"usage": round(rss_mb, 1), "limit": 0.0},
    }
    return usage, now


class BrokerRegistry:
    """Registers this broker under its session, publishes load reports, and elects a leader.

    ``load_source`` returns this broker's current counters (topics, bundles, rates); it is read for
    every report. :meth:`publish_soon` asks for an early report (after ownership changes).
    """

    def __init__(
        self,
        store: MetadataStore,
        me: BrokerInfo,
        load_source: Callable[[], dict[str, Any]],
        report_interval_s: float,
    ) -> None:
        self.store = store
        self.me = me
        self._load_source = load_source
        self._report_interval_s = report_interval_s
        self._session: Session | None = None
        self._leader_id: str | None = None
        self._cpu_mark: tuple[float, float] | None = None
        self._report_now = asyncio.Event()
        self.tasks = TaskSet("broker registry", logger=log)
        self._reporting = False
        self._version = NOT_EXISTS

    @property
    def broker_id(self) -> str:
        return self.me.broker_id

    @property
    def is_leader(self) -> bool:
        return self._leader_id == self.me.broker_id

    async def register(self, session: Session) -> None:
        """Register (again) under ``session`` and run for leader; starts the report task once."""
        self._session = session
        self._leader_id = None
        await self._write_report(create=True)
        await self.elect()
        if not self._reporting:
            self._reporting = True
            self.tasks.spawn(self._report_loop(), name="load report")

    def publish_soon(self) -> None:
        self._report_now.set()

    async def _report_loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._report_now.wait(), self._report_interval_s)
            self._report_now.clear()
            await asyncio.sleep(0.05)  # coalesce bursts of ownership changes into one write
            try:
                await self._write_report(create=False)
                await self.elect()
            except MetadataError as e:
                log.debug("load report not written: %s", e)
            except Exception:
                log.exception("load report failed")

    def load_report(self) -> dict[str, Any]:
        usage, self._cpu_mark = _process_usage(self._cpu_mark)
        return {**self._load_source(), **usage, "lastUpdate": int(time.time() * 1000)}

    async def _write_report(self, *, create: bool) -> None:
        session = self._session
        if session is None:
            return
        self.me.load = self.load_report()
        data = json.dumps(self.me.to_json()).encode()
        path = f"{BROKERS_PATH}/{self.me.broker_id}"
        if create:
            # A key left by this broker's previous process (same id) expires with its old lease.
            with contextlib.suppress(MetadataError):
                await self.store.delete(path)
            stat = await self.store.put(path, data, NOT_EXISTS, session=session)
        else:
            stat = await self.store.put(path, data, self._version)
        self._version = stat.version

    async def elect(self) -> str | None:
        """Take the leader key if it is free; returns the current leader's id."""
        session = self._session
        if session is None:
            return None
        value = await self.store.get(LEADER_PATH)
        if value is None:
            try:
                await self.store.put(
                    LEADER_PATH, json.dumps({"brokerId": self.me.broker_id}).encode(), NOT_EXISTS, session=session
                )
                log.info("this broker (%s) is the leader", self.me.broker_id)
                self._leader_id = self.me.broker_id
                return self._leader_id
            except BadVersionError:
                value = await self.store.get(LEADER_PATH)
        self._leader_id = json.loads(value.data)["brokerId"] if value is not None else None
        return self._leader_id

    async def resign(self) -> None:
        """Give up leadership (graceful shutdown) so another broker takes it at once."""
        if self.is_leader:
            with contextlib.suppress(MetadataError):
                await self.store.delete(LEADER_PATH)
            self._leader_id = None

    async def leader(self) -> BrokerInfo | None:
        leader_id = await self.elect()
        return await self.get(leader_id) if leader_id else None

    async def get(self, broker_id: str) -> BrokerInfo | None:
        if broker_id == self.me.broker_id:
            return self.me
        value = await self.store.get(f"{BROKERS_PATH}/{broker_id}")
        return BrokerInfo.from_json(json.loads(value.data)) if value is not None else None

    async def brokers(self) -> list[BrokerInfo]:
        """Every registered (live) broker with its last report."""
        out = []
        for child in await self.store.get_children(BROKERS_PATH):
            info = await self.get(child)
            if info is not None:
                out.append(info)
        return out

    async def unregister(self) -> None:
        await self.resign()
        with contextlib.suppress(MetadataError):
            await self.store.delete(f"{BROKERS_PATH}/{self.me.broker_id}")

    async def close(self) -> None:
        await self.tasks.close()
