"""``magnetar operator``: run the Kubernetes operator (kopf) for Tenant, TopicNamespace, Topic and
RetentionPolicy resources."""

from __future__ import annotations

import argparse
import logging
import os


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("operator", help="run the Kubernetes operator (Tenant, TopicNamespace, Topic, RetentionPolicy)")
    p.add_argument(
        "-n", "--namespace", action="append", default=[],
        help="watch only this Kubernetes namespace (repeatable; glob patterns allowed); default: all namespaces",
    )  # fmt: skip
    p.add_argument(
        "--standalone", action="store_true",
        default=os.environ.get("MAGNETAR_OPERATOR_STANDALONE", "").lower() in ("1", "true", "yes"),
        help="no peering: do not coordinate with other replicas (single replica, tests)",
    )  # fmt: skip
    p.add_argument(
        "--peering", default=os.environ.get("MAGNETAR_OPERATOR_PEERING", "magnetar-operator"),
        help="kopf peering object shared by the replicas; the highest --priority replica works, the others wait",
    )  # fmt: skip
    p.add_argument("--priority", type=int, default=int(os.environ.get("MAGNETAR_OPERATOR_PRIORITY", "0")))
    p.add_argument(
        "--liveness", default=os.environ.get("MAGNETAR_OPERATOR_LIVENESS", "http://0.0.0.0:8080/healthz"),
        help="liveness endpoint URL ('' to disable)",
    )  # fmt: skip
    p.add_argument(
        "--drift-interval", type=float, help="seconds between drift checks (MAGNETAR_OPERATOR_DRIFT_INTERVAL)"
    )
    p.add_argument(
        "--cluster-url-template",
        help="admin URL of a clusterRef, with {name} and {namespace} (MAGNETAR_OPERATOR_CLUSTER_URL_TEMPLATE)",
    )
    p.add_argument(
        "--cluster-tls-url-template",
        help="admin URL of a clusterRef whose cluster has TLS on (MAGNETAR_OPERATOR_CLUSTER_TLS_URL_TEMPLATE)",
    )
    p.add_argument(
        "--release-finalizers", action="store_true",
        help="remove the operator's finalizer from every resource and exit (uninstall: the chart's pre-delete hook)",
    )  # fmt: skip
    p.add_argument(
        "--scale-down", metavar="DEPLOYMENT",
        help="with --release-finalizers: first scale this Deployment (in $POD_NAMESPACE) to 0 and wait",
    )  # fmt: skip
    p.add_argument("--log-level", default=os.environ.get("MAGNETAR_LOG_LEVEL", "INFO"))
    p.set_defaults(run=run)


class _NotTemporary(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "failed temporarily" not in record.getMessage()


def run(args: argparse.Namespace) -> int:
    from magnetar.cli.logs import setup_logging

    # Read by magnetar.operator.config at import time: set before importing the handlers.
    if args.drift_interval is not None:
        os.environ["MAGNETAR_OPERATOR_DRIFT_INTERVAL"] = str(args.drift_interval)
    if args.cluster_url_template:
        os.environ["MAGNETAR_OPERATOR_CLUSTER_URL_TEMPLATE"] = args.cluster_url_template
    if args.cluster_tls_url_template:
        os.environ["MAGNETAR_OPERATOR_CLUSTER_TLS_URL_TEMPLATE"] = args.cluster_tls_url_template
    setup_logging(args.log_level)
    if logging.getLogger().level > logging.DEBUG:
        # kopf reports every handler run at INFO; keep its warnings and errors only. Our own retries
        # (TemporaryError) are already logged and posted as Events once per reason by the operator.
        logging.getLogger("kopf").setLevel(logging.WARNING)
        logging.getLogger("kopf.objects").addFilter(_NotTemporary())

    import kopf

    if args.release_finalizers:
        return _release(args.namespace, args.scale_down)

    import magnetar.operator.main  # noqa: F401  (registers the handlers)

    kopf.run(
        clusterwide=not args.namespace,
        namespaces=args.namespace,
        standalone=True if args.standalone else None,
        peering_name=None if args.standalone else args.peering,
        priority=args.priority,
        liveness_endpoint=args.liveness or None,
    )
    return 0


def _release(namespaces: list[str], deployment: str | None) -> int:
    import asyncio

    import kopf

    from magnetar.operator.kube import KubeClient
    from magnetar.operator.release import release_finalizers, scale_down

    async def go() -> int:
        logger = logging.getLogger("magnetar.operator")
        settings = kopf.OperatorSettings()
        info = kopf.login_with_service_account(logger=logger, settings=settings) or kopf.login_with_kubeconfig(
            logger=logger, settings=settings
        )
        if info is None:
            logger.error("no Kubernetes credentials (service account or kubeconfig)")
            return 1
        kube = KubeClient()
        kube.set_credentials(info)
        try:
            if deployment:
                await scale_down(kube, os.environ.get("POD_NAMESPACE") or "default", deployment)
            released = await release_finalizers(kube, namespaces)
        finally:
            await kube.close()
        logger.info("released the finalizer of %d resources", released)
        return 0

    return asyncio.run(go())
