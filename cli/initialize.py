"""``magnetar initialize-cluster-metadata``: create a cluster's records in the metadata store (idempotent)."""

from __future__ import annotations

import argparse
import asyncio
import logging

from magnetar.cli.logs import setup_logging

log = logging.getLogger("magnetar.initialize")


async def initialize(
    metadata_url: str,
    cluster: str,
    web_service_url: str,
    broker_service_url: str,
    web_service_url_tls: str = "",
    broker_service_url_tls: str = "",
) -> bool:
    """Cluster record, tenant ``public``, namespace ``public/default`` and the ledgers root (a cluster
    served over TLS only may give just the TLS URLs).

    Returns whether anything was created; running it again changes nothing.
    """
    from magnetar.broker.resources import Resources, default_policies
    from magnetar.metadata import open_metadata_store
    from magnetar.metadata.api import NOT_EXISTS, BadVersionError

    store = open_metadata_store(metadata_url)
    try:
        resources = Resources(store)
        urls = {
            "serviceUrl": web_service_url,
            "serviceUrlTls": web_service_url_tls,
            "brokerServiceUrl": broker_service_url,
            "brokerServiceUrlTls": broker_service_url_tls,
        }
        created = await resources.create_cluster(cluster, {k: v for k, v in urls.items() if v})
        created |= await resources.create_tenant("public", {"adminRoles": [], "allowedClusters": [cluster]})
        created |= await resources.create_namespace("public/default", default_policies(cluster))
        try:
            await store.put("/ledgers", b"", NOT_EXISTS)  # the ledger client's root (ids, ledger records)
            created = True
        except BadVersionError:
            pass
        return created
    finally:
        await store.close()


def run(args: argparse.Namespace) -> int:
    setup_logging(args.log_level)
    if not (args.web_service_url or args.web_service_url_tls) or not (
        args.broker_service_url or args.broker_service_url_tls
    ):
        log.error("give --web-service-url and/or --web-service-url-tls, --broker-service-url and/or ...-tls")
        return 2
    created = asyncio.run(
        initialize(
            args.metadata_url,
            args.cluster,
            args.web_service_url or "",
            args.broker_service_url or "",
            args.web_service_url_tls or "",
            args.broker_service_url_tls or "",
        )
    )
    log.info(
        "cluster %s %s in %s", args.cluster, "initialized" if created else "was already initialized", args.metadata_url
    )
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("initialize-cluster-metadata", help="create a cluster's metadata (idempotent)")
    p.add_argument("--cluster", required=True, help="cluster name")
    p.add_argument("--metadata-url", required=True, help="etcd://host:port[,host:port]")
    p.add_argument("--web-service-url", help="e.g. http://broker.example:8080")
    p.add_argument("--web-service-url-tls", help="e.g. https://broker.example:8443")
    p.add_argument("--broker-service-url", help="e.g. pulsar://broker.example:6650")
    p.add_argument("--broker-service-url-tls", help="e.g. pulsar+ssl://broker.example:6651")
    p.add_argument("--log-level", default="INFO")
    p.set_defaults(run=run)
