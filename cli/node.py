"""Assembly of a broker process shared by ``magnetar standalone`` and ``magnetar broker``.

Data flows metadata store + bookie registry -> ledger client -> managed ledgers -> broker service,
with the web service (admin API, lookup, metrics) on top. Components close in reverse order.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from magnetar.cli.process import Closers, HeapTrimmer, freeze_startup_objects, report_leftover_tasks, stop_on_signals

if TYPE_CHECKING:  # imported lazily, so light sub-commands (admin) never load the broker
    from aiohttp import web

    from magnetar.broker.config import BrokerConfig
    from magnetar.broker.service import BrokerService
    from magnetar.ledger.registry import BookieRegistry
    from magnetar.metadata.api import MetadataStore

log = logging.getLogger("magnetar.node")


def config_is_valid(config: BrokerConfig) -> bool:
    """Check the settings a broker cannot start with (listeners, TLS); logs why and returns False if invalid."""
    from magnetar.broker.listeners import ConfigError, parse_listeners, uses_tls
    from magnetar.broker.tls import TlsConfigError, TlsSettings, server_context

    try:
        parse_listeners(config)
        if config.broker_service_port is None and config.broker_service_port_tls is None:
            raise ConfigError("brokerServicePort and brokerServicePortTls are both empty: no binary listener")
        if config.web_service_port is None and config.web_service_port_tls is None:
            raise ConfigError("webServicePort and webServicePortTls are both empty: no HTTP listener")
        if uses_tls(config):
            server_context(TlsSettings.of_broker(config))  # the files exist and match
    except (ConfigError, TlsConfigError) as exc:
        log.error("invalid configuration: %s", exc)
        return False
    return True


def or_off(port: int | None) -> int | str:
    """A port for the start-up log line ("off": that listener is not open)."""
    return "off" if port is None else port


def add_setting_flags(parser: argparse.ArgumentParser) -> None:
    """One ``--<settingName> VALUE`` flag per broker setting (Pulsar's camelCase names; an empty value
    unsets an optional one, e.g. ``--brokerServicePort ''`` for TLS only). They win over the short flags."""
    from magnetar.broker.config import pulsar_name, settings

    group = parser.add_argument_group(
        "settings", "--<settingName> VALUE for any setting of the README table, e.g. --brokerServicePortTls 6651"
    )
    for f in settings():
        flag = f"--{pulsar_name(f)}"
        group.add_argument(flag, dest=f"setting__{f.name}", metavar="VALUE", help=argparse.SUPPRESS)


def setting_flags(args: argparse.Namespace) -> dict[str, str]:
    """The settings given as ``--<settingName>`` flags (snake_case name -> value)."""
    prefix = "setting__"
    return {k[len(prefix) :]: v for k, v in vars(args).items() if k.startswith(prefix) and v is not None}


class BrokerNode:
    """A broker and everything it owns; :meth:`close` undoes what was started, last first."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.service: BrokerService | None = None
        self._closers = Closers()
        self._http: web.AppRunner | None = None

    def on_close(self, closer: Callable[[], Awaitable[Any]]) -> None:
        """Register something to close (after everything registered later)."""
        self._closers.add(closer)

    async def start_broker(self, store: MetadataStore, registry: BookieRegistry) -> BrokerService:
        """Ledger client, managed ledgers, broker service and web service over ``store`` and ``registry``."""
        from aiohttp import web

        from magnetar.broker.admin.app import build_app
        from magnetar.broker.service import BrokerService
        from magnetar.ledger.client import BookieLedgerClient
        from magnetar.managed_ledger.factory import ManagedLedgerFactoryImpl

        config = self.config
        if config.malloc_trim_interval_seconds > 0:
            trimmer = HeapTrimmer(config.malloc_trim_interval_seconds)
            if trimmer.start():
                self.on_close(trimmer.close)
            else:
                log.warning("mallocTrimIntervalSeconds is set but this C library has no malloc_trim: ignored")
        ledger_client = BookieLedgerClient(store, registry)
        self.on_close(ledger_client.close)
        factory = ManagedLedgerFactoryImpl(
            store,
            ledger_client,
            cache_size_bytes=config.managed_ledger_cache_size_mb * 1024 * 1024,
            cache_eviction_seconds=config.managed_ledger_cache_eviction_time_threshold_millis / 1000,
        )
        self.on_close(factory.close)
        service = BrokerService(config, store, factory)
        self.service = service
        await service.start()
        self.on_close(service.close)
        self._http = web.AppRunner(build_app(service), access_log=None)
        await self._http.setup()
        self.on_close(self._http.cleanup)
        if config.web_service_port is not None:
            site = web.TCPSite(self._http, config.bind_address, config.web_service_port, reuse_address=True)
            await site.start()
        if config.web_service_port_tls is not None and service.tls is not None:
            # The listeners' context follows certificate rotations (broker/tls.py).
            tls_site = web.TCPSite(
                self._http,
                config.bind_address,
                config.web_service_port_tls,
                reuse_address=True,
                ssl_context=service.tls.listener_context,
            )
            await tls_site.start()
        return service

    async def close(self) -> None:
        """Close components in reverse order of start; each step is bounded."""
        await self._closers.close_all()


async def serve_until_signalled(start: Callable[[BrokerNode], Awaitable[None]], node: BrokerNode) -> None:
    """Run ``start(node)``, wait for SIGTERM/SIGINT, then close the node cleanly."""
    stop = stop_on_signals()
    try:
        await start(node)
        freeze_startup_objects()
        await stop.wait()
        log.info("shutting down")
    finally:
        await node.close()
        report_leftover_tasks()
    log.info("stopped")
