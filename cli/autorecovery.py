"""``magnetar autorecovery``: re-replicate ledgers of lost bookies, outside the brokers.

Any number may run against one metadata store: ledgers are locked one at a time (ephemeral
keys of each worker's session), so they share the work.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os

from magnetar.cli.logs import setup_logging
from magnetar.cli.process import stop_on_signals

log = logging.getLogger("magnetar.autorecovery")


async def serve(args: argparse.Namespace) -> int:
    """Connect, then run passes until SIGTERM/SIGINT (or one pass with ``--once``)."""
    from magnetar.broker.tls import bookie_client_context
    from magnetar.ledger.autorecovery import AutoRecovery, AutoRecoveryConfig
    from magnetar.metadata import open_metadata_store
    from magnetar.metadata.api import Notification, NotificationType

    try:  # the bookie registry over the metadata store (cluster work, imported lazily)
        from magnetar.bookie.registration import AVAILABLE
        from magnetar.ledger.etcd_registry import MetadataBookieRegistry
    except ImportError as e:  # pragma: no cover - depends on the networked-bookie code
        log.error("no bookie registry over the metadata store is available: %s", e)
        return 2
    store = open_metadata_store(args.metadata_url)
    start = getattr(store, "start", None)
    if start is not None:
        await start()
    registry = MetadataBookieRegistry(store, ssl_context=bookie_client_context(args))
    config = AutoRecoveryConfig(
        check_interval_s=args.interval,
        lost_bookie_grace_s=args.lost_bookie_grace,
        open_ledger_grace_s=args.open_ledger_grace,
    )
    worker = AutoRecovery(store, registry, config)
    try:
        await registry.start()
        if args.once:
            await worker.run_once()
            print(json.dumps(await worker.status(), indent=2, sort_keys=True))
            return 0

        def on_change(n: Notification) -> None:
            if n.type is NotificationType.DELETED:
                worker.trigger()  # a bookie left: audit now (the grace period still applies)

        unwatch = store.watch(AVAILABLE + "/", on_change)
        stop = stop_on_signals()
        await worker.start()
        log.info("auto-recovery worker %s running against %s", worker.worker_id, args.metadata_url)
        await stop.wait()
        unwatch()
        return 0
    finally:
        await asyncio.wait_for(worker.close(), 30)
        await asyncio.wait_for(registry.close(), 30)
        await asyncio.wait_for(store.close(), 30)


def run(args: argparse.Namespace) -> int:
    setup_logging(args.log_level)
    return asyncio.run(serve(args))


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("autorecovery", help="re-replicate the ledgers of lost bookies")
    p.add_argument("--metadata-url", required=True, help="metadata store, e.g. etcd://host:2379")
    p.add_argument("--interval", type=float, default=30.0, help="seconds between passes (default 30)")
    p.add_argument(
        "--lost-bookie-grace", type=float, default=30.0, help="seconds a bookie must be gone before recovery (30)"
    )
    p.add_argument(
        "--open-ledger-grace",
        type=float,
        default=60.0,
        help="seconds before an open ledger whose writer lost a bookie is fenced and closed (60)",
    )
    # TLS to the bookies, with the broker's setting names (see broker/tls.py).
    p.add_argument(
        "--bookkeeperTLSClientAuthentication", dest="bookkeeper_tls_client_authentication", action="store_true",
        help="talk TLS to the bookies",
    )  # fmt: skip
    p.add_argument("--bookkeeperTLSTrustCertsFilePath", dest="bookkeeper_tls_trust_certs_file_path", default="")
    p.add_argument("--bookkeeperTLSCertificateFilePath", dest="bookkeeper_tls_certificate_file_path", default="")
    p.add_argument("--bookkeeperTLSKeyFilePath", dest="bookkeeper_tls_key_file_path", default="")
    p.add_argument("--once", action="store_true", help="run one pass, print the status as JSON, exit")
    p.add_argument("--log-level", default=os.environ.get("MAGNETAR_LOG_LEVEL", "INFO"))
    p.set_defaults(run=run)
