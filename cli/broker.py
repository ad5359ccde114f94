"""``magnetar broker``: a broker of a cluster, with metadata in etcd and ledgers on remote bookies."""

from __future__ import annotations

import argparse
import logging
import os

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

log = logging.getLogger("magnetar.broker")

#: Pulsar's broker.conf defaults for replication (standalone uses 1/1/1).
CLUSTER_DEFAULTS = {
    "managedLedgerDefaultEnsembleSize": 2,
    "managedLedgerDefaultWriteQuorum": 2,
    "managedLedgerDefaultAckQuorum": 2,
    "clusterName": "magnetar",
}


class ClusterNotInitializedError(RuntimeError):
    """The metadata store has no record of this cluster."""


async def start_cluster_broker(node: BrokerNode) -> None:
    """Connect to the metadata store and the registered bookies, then start the broker."""
    from magnetar.broker.resources import Resources
    from magnetar.broker.tls import bookie_client_context
    from magnetar.ledger.etcd_registry import MetadataBookieRegistry
    from magnetar.metadata import open_metadata_store
    from magnetar.metadata.etcd_transport import tls_from_pulsar_config

    config = node.config
    if not config.metadata_store_url:
        raise SystemExit("magnetar broker needs --metadata-url etcd://host:port")
    etcd_tls = tls_from_pulsar_config(config.metadata_store_config_path) if config.metadata_store_config_path else None
    store = open_metadata_store(config.metadata_store_url, **({"tls": etcd_tls} if etcd_tls else {}))
    node.on_close(store.close)
    if await Resources(store).get_cluster(config.cluster_name) is None:
        raise ClusterNotInitializedError(
            f"cluster {config.cluster_name!r} is not initialized in {config.metadata_store_url}: "
            "run `magnetar initialize-cluster-metadata` first"
        )
    registry = MetadataBookieRegistry(store, ssl_context=bookie_client_context(config))
    await registry.start()  # closed by the ledger client
    service = await node.start_broker(store, registry)
    if config.auto_recovery_daemon_enabled:
        from magnetar.ledger.autorecovery import AutoRecovery, AutoRecoveryConfig

        recovery = AutoRecovery(
            store,
            registry,
            AutoRecoveryConfig(
                check_interval_s=config.auditor_periodic_check_interval,
                lost_bookie_grace_s=config.lost_bookie_recovery_delay,
            ),
        )
        await recovery.start()
        node.on_close(recovery.close)
        service.auto_recovery = recovery
    log.info(
        "magnetar broker ready: cluster %s, binary protocol on %s port %s (TLS: %s), HTTP port %s (HTTPS: %s), "
        "metadata %s",
        config.cluster_name,
        config.bind_address,
        or_off(service.port),
        or_off(service.tls_port),
        or_off(config.web_service_port),
        or_off(config.web_service_port_tls),
        config.metadata_store_url,
    )


def run(args: argparse.Namespace) -> int:
    from magnetar.broker.config import load_config

    setup_logging(args.log_level)
    config = load_config(
        args.config,
        {
            "metadata_store_url": args.metadata_url,
            "cluster_name": args.cluster,
            "broker_service_port": args.port,
            "web_service_port": args.http_port,
            "bind_address": args.bind_address,
            "advertised_address": args.advertised_address,
            **setting_flags(args),
        },
        defaults=CLUSTER_DEFAULTS,
    )
    if not config_is_valid(config):
        return 2
    try:
        run_event_loop(serve_until_signalled(start_cluster_broker, BrokerNode(config)))
    except ClusterNotInitializedError as exc:
        log.error("%s", exc)
        return 1
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("broker", help="run a cluster broker (metadata in etcd, ledgers on bookies)")
    p.add_argument("--metadata-url", help="etcd://host:port[,host:port] (metadataStoreUrl)")
    p.add_argument("--cluster", help="cluster name (clusterName, default magnetar)")
    p.add_argument("--port", type=int, help="binary protocol port (brokerServicePort, default 6650)")
    p.add_argument("--http-port", type=int, help="HTTP port (webServicePort, default 8080)")
    p.add_argument("--bind-address", help="address to listen on (bindAddress, default 0.0.0.0)")
    p.add_argument("--advertised-address", help="host name clients are told to use (advertisedAddress)")
    p.add_argument("--config", help="a Pulsar-style key=value configuration file (e.g. broker.conf)")
    p.add_argument("--log-level", default=os.environ.get("MAGNETAR_LOG_LEVEL", "INFO"))
    add_setting_flags(p)
    p.set_defaults(run=run)
