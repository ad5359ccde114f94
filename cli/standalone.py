"""``magnetar standalone``: broker, an in-process bookie and the embedded metadata store in one process."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING

from magnetar.cli.logs import setup_logging

if TYPE_CHECKING:  # the broker is imported when the command runs, so other sub-commands stay light
    from aiohttp import web

    from magnetar.broker.config import BrokerConfig
    from magnetar.broker.service import BrokerService

log = logging.getLogger("magnetar.standalone")


class Standalone:
    """The assembled standalone stack; :meth:`start` brings it up, :meth:`close` takes it down in reverse."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self._closers: list = []  # type: ignore[type-arg]
        self.service: BrokerService | None = None
        self._http: web.AppRunner | None = None

    async def start(self) -> None:
        from aiohttp import web

        from magnetar.bookie.bookie import Bookie
        from magnetar.bookie.config import BookieConfig
        from magnetar.bookie.local import LocalBookieClient
        from magnetar.broker.admin.app import build_app
        from magnetar.broker.resources import Resources, initialize_standalone
        from magnetar.broker.service import BrokerService
        from magnetar.ledger.client import BookieLedgerClient
        from magnetar.ledger.registry import StaticBookieRegistry
        from magnetar.managed_ledger.factory import ManagedLedgerFactoryImpl
        from magnetar.metadata.embedded import EmbeddedMetadataStore

        config = self.config
        data = Path(config.data_dir)  # made absolute by run()
        await asyncio.to_thread(data.mkdir, parents=True, exist_ok=True)

        store = EmbeddedMetadataStore(str(data / "metadata.db"))
        await store.start()
        self._closers.append(store.close)

        bookie = Bookie(
            BookieConfig(
                data_dir=data / "bookie",
                journal_dir=Path(config.journal_directory) if config.journal_directory else None,
                ledger_dir=Path(config.ledger_directories) if config.ledger_directories else None,
            )
        )
        await bookie.start()
        self._closers.append(bookie.close)

        registry = StaticBookieRegistry([LocalBookieClient(bookie)])
        ledger_client = BookieLedgerClient(store, registry)
        self._closers.append(ledger_client.close)

        factory = ManagedLedgerFactoryImpl(store, ledger_client)
        self._closers.append(factory.close)

        service = BrokerService(config, store, factory)
        self.service = service
        await initialize_standalone(
            Resources(store),
            config.cluster_name,
            f"pulsar://{config.advertised_address}:{config.broker_service_port}",
            f"http://{config.advertised_address}:{config.web_service_port}",
        )
        await service.start()
        self._closers.append(service.close)

        self._http = web.AppRunner(build_app(service), access_log=None)
        await self._http.setup()
        site = web.TCPSite(self._http, config.bind_address, config.web_service_port, reuse_address=True)
        await site.start()
        self._closers.append(self._http.cleanup)
        log.info(
            "magnetar standalone ready: binary protocol on %s:%d, HTTP on %s:%d, data in %s",
            config.bind_address,
            service.port,
            config.bind_address,
            config.web_service_port,
            data,
        )

    async def close(self) -> None:
        """Close components in reverse order of start; each step is bounded."""
        while self._closers:
            closer = self._closers.pop()
            try:
                await asyncio.wait_for(closer(), 30)
            except Exception:
                log.exception("error during shutdown")


async def serve(config: BrokerConfig) -> None:
    """Run until SIGTERM/SIGINT, then shut down cleanly."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    node = Standalone(config)
    try:
        await node.start()
        await stop.wait()
        log.info("shutting down")
    finally:
        await node.close()
    log.info("stopped")


def run(args: argparse.Namespace) -> int:
    from magnetar.broker.config import load_config

    setup_logging(args.log_level)
    config = load_config(
        args.config,
        {
            "data_dir": args.data_dir,
            "broker_service_port": args.port,
            "web_service_port": args.http_port,
            "bind_address": args.bind_address,
            "advertised_address": args.advertised_address,
        },
    )
    config.data_dir = os.path.abspath(config.data_dir)
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        asyncio.run(serve(config))
    else:
        uvloop.run(serve(config))
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("standalone", help="run broker, bookie and metadata store in one process")
    p.add_argument("--data-dir", help="where messages and metadata live (default ./data)")
    p.add_argument("--port", type=int, help="binary protocol port (brokerServicePort, default 6650)")
    p.add_argument("--http-port", type=int, help="HTTP port (webServicePort, default 8080)")
    p.add_argument("--bind-address", help="address to listen on (bindAddress, default 0.0.0.0)")
    p.add_argument("--advertised-address", help="host name clients are told to use (advertisedAddress)")
    p.add_argument("--config", help="a Pulsar-style key=value configuration file (e.g. standalone.conf)")
    p.add_argument("--log-level", default=os.environ.get("MAGNETAR_LOG_LEVEL", "INFO"))
    p.set_defaults(run=run)
