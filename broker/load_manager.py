"""The load manager: the leader sheds bundles off overloaded brokers; every broker splits its hot bundles.

Load is what the brokers' reports say (broker/broker_registry.py): a broker whose load (message rate
in + out, or its topic count while idle) exceeds the mean by more than
``loadBalancerBrokerOverloadedThresholdPercentage`` percent, and which serves at least two bundles,
gets one bundle unloaded (through the admin API of its owner); the next lookup assigns it to the least
loaded broker. A bundle with more than ``loadBalancerNamespaceBundleMaxTopics`` loaded topics is split
in two by its owner (``loadBalancerAutoBundleSplitEnabled``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from magnetar.broker.auth.broker_client import broker_client_headers
from magnetar.broker.broker_registry import BrokerInfo
from magnetar.broker.tls import broker_web_target

if TYPE_CHECKING:
    from magnetar.broker.namespace_service import NamespaceService

log = logging.getLogger(__name__)


def broker_load(info: BrokerInfo) -> float:
    rate = float(info.load.get("msgRateIn", 0)) + float(info.load.get("msgRateOut", 0))
    return rate if rate > 0 else float(info.load.get("numTopics", 0))


def overloaded(brokers: list[BrokerInfo], threshold_percentage: float) -> list[BrokerInfo]:
    """Brokers whose load exceeds the mean by more than the threshold and that can give a bundle away."""
    if len(brokers) < 2:
        return []
    mean = sum(broker_load(b) for b in brokers) / len(brokers)
    limit = mean * (1 + threshold_percentage / 100)
    return [b for b in brokers if broker_load(b) > limit and len(b.load.get("bundles", [])) >= 2]


class LoadManager:
    """Periodic shedding (leader only) and automatic bundle splits (every broker, its own bundles)."""

    def __init__(self, namespaces: NamespaceService) -> None:
        self.namespaces = namespaces
        self.config = namespaces.service.config
        #: Bundles unloaded by shedding (for tests and logs).
        self.shed: list[str] = []

    async def run(self) -> None:
        interval = max(0.5, self.config.load_balancer_shedding_interval_minutes * 60)
        while True:
            await asyncio.sleep(interval)
            try:
                await self.run_once()
            except Exception:
                log.exception("load manager pass failed")

    async def run_once(self) -> None:
        ns = self.namespaces
        if self.config.load_balancer_auto_bundle_split_enabled:
            limit = self.config.load_balancer_namespace_bundle_max_topics
            for bundle in ns.ownership.owned:
                if limit > 0 and len(ns.topics_of(bundle)) > limit and bundle.upper - bundle.lower > 1:
                    log.info("bundle %s has more than %d topics: splitting it", bundle.key, limit)
                    await ns.split_bundle(bundle, unload=False)
        if not (self.config.load_balancer_shedding_enabled and ns.registry.is_leader):
            return
        brokers = [b for b in await ns.registry.brokers() if not b.load.get("draining")]
        for broker in overloaded(brokers, self.config.load_balancer_broker_overloaded_threshold_percentage):
            bundle = sorted(broker.load.get("bundles", []))[0]
            log.info("broker %s is overloaded (load %.1f): unloading bundle %s", broker.broker_id,
                     broker_load(broker), bundle)  # fmt: skip
            await self._unload_remote(broker, bundle)
            self.shed.append(bundle)

    async def _unload_remote(self, broker: BrokerInfo, bundle_key: str) -> None:
        import aiohttp

        namespace, _, bundle_range = bundle_key.rpartition("/")
        base, tls = await broker_web_target(self.config, broker.web_service_url, broker.web_service_url_tls)
        url = f"{base}/admin/v2/namespaces/{namespace}/{bundle_range}/unload"
        timeout = aiohttp.ClientTimeout(total=30)
        headers = broker_client_headers(self.config)
        async with (
            aiohttp.ClientSession(timeout=timeout) as http,
            http.put(url, ssl=tls or True, headers=headers) as resp,
        ):
            if resp.status >= 300:
                log.warning("unloading %s on %s failed: HTTP %d", bundle_key, broker.broker_id, resp.status)
