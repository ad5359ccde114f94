"""``magnetar standalone``: broker, an in-process bookie and the embedded metadata store in one process."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from magnetar.cli.logs import setup_logging
from magnetar.cli.node import (
    BrokerNode,
    add_setting_flags,
    config_is_valid,
    or_off,
    serve_until_signalled,
    setting_flags,
)
from magnetar.cli.process import run_event_loop

if TYPE_CHECKING:
    from magnetar.bookie.config import BookieConfig
    from magnetar.broker.config import BrokerConfig

log = logging.getLogger("magnetar.standalone")


def bookie_config(config: BrokerConfig, data: Path) -> BookieConfig:
    """The in-process bookie's settings, from the broker's (Pulsar's names for the bookie's settings)."""
    from magnetar.bookie.config import BookieConfig

    return BookieConfig(
        data_dir=data / "bookie",
        journal_dir=Path(config.journal_directory) if config.journal_directory else None,
        ledger_dir=Path(config.ledger_directories) if config.ledger_directories else None,
        write_cache_max_bytes=config.db_storage_write_cache_max_size_mb * 1024 * 1024,
        journal_max_wait_s=config.journal_max_group_wait_ms / 1000,
        journal_adaptive_wait=config.journal_adaptive_group_wait,
        journal_reuse_files=config.journal_reuse_files,
    )


async def start_standalone(node: BrokerNode) -> None:
    """Embedded metadata store and an in-process bookie under the broker; first start creates the
    ``standalone`` cluster, tenant ``public`` and namespace ``public/default``."""
    from magnetar.bookie.bookie import Bookie
    from magnetar.bookie.gc import LedgerGarbageCollector
    from magnetar.bookie.local import LocalBookieClient
    from magnetar.broker.listeners import (
        own_broker_service_url,
        own_broker_service_url_tls,
        own_web_service_urls,
        parse_listeners,
    )
    from magnetar.broker.resources import Resources, initialize_standalone
    from magnetar.ledger.registry import StaticBookieRegistry
    from magnetar.metadata.embedded import EmbeddedMetadataStore

    config = node.config
    data = Path(config.data_dir)  # made absolute by run()
    await asyncio.to_thread(data.mkdir, parents=True, exist_ok=True)

    store = EmbeddedMetadataStore(str(data / "metadata.db"))
    await store.start()
    node.on_close(store.close)

    bookie = Bookie(bookie_config(config, data))
    bookie.journal.sync_data = config.journal_sync_data
    await bookie.start()
    node.on_close(bookie.close)
    # Ledgers deleted in metadata whose bookie-side delete was lost: reclaimed by a periodic scan.
    ledger_gc = LedgerGarbageCollector(bookie, store)
    ledger_gc.start()
    node.on_close(ledger_gc.close)

    listeners = parse_listeners(config)
    web_url, web_url_tls = own_web_service_urls(config)
    await initialize_standalone(
        Resources(store),
        config.cluster_name,
        own_broker_service_url(config, listeners, config.broker_service_port),
        web_url,
        own_broker_service_url_tls(config, listeners, config.broker_service_port_tls),
        web_url_tls,
    )
    service = await node.start_broker(store, StaticBookieRegistry([LocalBookieClient(bookie)]))
    log.info(
        "magnetar standalone ready: binary protocol on %s port %s (TLS: %s), HTTP port %s (HTTPS: %s), data in %s",
        config.bind_address,
        or_off(service.port),
        or_off(service.tls_port),
        or_off(config.web_service_port),
        or_off(config.web_service_port_tls),
        data,
    )


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
            **setting_flags(args),
        },
    )
    config.data_dir = os.path.abspath(config.data_dir)
    if not config_is_valid(config):
        return 2
    run_event_loop(serve_until_signalled(start_standalone, BrokerNode(config)))
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("standalone", help="run broker, bookie and metadata store in one process")
    p.add_argument("--data-dir", help="where messages and metadata live (default ./data)")
    p.add_argument("--port", type=int, help="binary protocol port (brokerServicePort, default 6650)")
    p.add_argument("--http-port", type=int, help="HTTP port (webServicePort, default 8080)")
    p.add_argument("--bind-address", help="address to listen on (bindAddress, default 0.0.0.0)")
    p.add_argument("--advertised-address", help="host name clients are told to use (advertisedAddress)")
    p.add_argument("--config", help="a Pulsar-style key=value configuration file (e.g. standalone.conf)")
    p.add_argument("--log-level", default=os.environ.get("MAGNETAR_LOG_LEVEL", "INFO"))
    add_setting_flags(p)
    p.set_defaults(run=run)
