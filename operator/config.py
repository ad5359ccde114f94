"""Operator settings, from environment variables (``MAGNETAR_OPERATOR_*``) and ``magnetar operator`` flags."""

from __future__ import annotations

import os
from dataclasses import dataclass

GROUP = "magnetar.io"
VERSION = "v1alpha1"
PAUSE_ANNOTATION = f"{GROUP}/paused"
FORCE_DELETE_ANNOTATION = f"{GROUP}/force-delete"
FINALIZER = f"{GROUP}/finalizer"

#: Default admin URL of a MagnetarCluster: its broker Service on the admin port.
DEFAULT_CLUSTER_URL_TEMPLATE = "http://{name}-broker.{namespace}.svc:8080"
#: ... and when the cluster has TLS on (``spec.security.tls``): its HTTPS port.
DEFAULT_CLUSTER_TLS_URL_TEMPLATE = "https://{name}-broker.{namespace}.svc:8443"
#: Secret (in the cluster's namespace) holding the operator's admin token for secured clusters whose spec
#: names none (``security.authentication.operatorTokenSecretRef``).
DEFAULT_OPERATOR_TOKEN_SECRET = "magnetar-operator-token"


def _float(name: str, default: float) -> float:
    value = os.environ.get(name)
    return float(value) if value else default


@dataclass(frozen=True)
class OperatorConfig:
    """Tunables. Short intervals are for tests; the defaults suit a real cluster."""

    #: seconds between drift checks of each resource
    drift_interval: float = 60.0
    #: first retry delay and longest delay of the exponential backoff on transient errors
    backoff_base: float = 1.0
    backoff_cap: float = 60.0
    #: how a clusterRef becomes an admin URL (``{name}``, ``{namespace}``): the MagnetarCluster's broker
    #: Service by default
    cluster_url_template: str = DEFAULT_CLUSTER_URL_TEMPLATE
    #: the same for clusters with TLS on (the operator then trusts the ca.crt of the cluster's TLS Secret)
    cluster_tls_url_template: str = DEFAULT_CLUSTER_TLS_URL_TEMPLATE
    #: the operator's admin token for secured clusters without ``operatorTokenSecretRef``: Secret name, key
    operator_token_secret: str = DEFAULT_OPERATOR_TOKEN_SECRET
    operator_token_key: str = "token"
    #: seconds a deletion waits on an unreachable cluster, unreadable credentials or a failing admin API
    #: before the resource is released and its Pulsar object orphaned (Event ``Orphaned``); 0 = forever
    delete_timeout: float = 300.0
    #: whether resources may name an admin URL inline (``connection.adminUrl``); off = only ``clusterRef``
    allow_inline_admin_url: bool = True
    #: URL prefixes an inline ``connection.adminUrl`` must start with (empty: any URL, when allowed)
    admin_url_allowlist: tuple[str, ...] = ()
    #: reconciliations running at once and started per second (start-up with thousands of resources
    #: must not stampede the broker); 0 = unlimited
    max_concurrent_reconciles: int = 8
    reconciles_per_second: float = 50.0
    #: seconds a namespace's topic list is reused by the topics in it (one list per namespace per pass,
    #: not one per topic); the operator's own creations and deletions update it
    topic_list_cache_seconds: float = 5.0
    #: watch the credentials Secrets resources reference (needs list/watch on Secrets): a rotated token is
    #: used at once; off: from the next retry or drift pass
    watch_secrets: bool = False
    #: seconds between passes over a MagnetarCluster that is not Ready yet (start-up, rollouts)
    cluster_poll: float = 5.0
    #: seconds one Kubernetes API request of kopf's (finalizers, progress, status patches) may take before
    #: kopf retries it; kopf's own default (300) could hold one resource's handlers that long
    api_request_timeout: float = 30.0
    #: seconds between kopf's checks of a deleted resource's drift timer that was mid-call when the deletion
    #: came (the finalizer's removal waits for it to stop); kopf's own default is 60
    timer_stop_poll: float = 1.0

    @classmethod
    def from_env(cls) -> OperatorConfig:
        return cls(
            drift_interval=_float("MAGNETAR_OPERATOR_DRIFT_INTERVAL", cls.drift_interval),
            backoff_base=_float("MAGNETAR_OPERATOR_BACKOFF_BASE", cls.backoff_base),
            backoff_cap=_float("MAGNETAR_OPERATOR_BACKOFF_CAP", cls.backoff_cap),
            cluster_url_template=os.environ.get("MAGNETAR_OPERATOR_CLUSTER_URL_TEMPLATE")
            or DEFAULT_CLUSTER_URL_TEMPLATE,
            cluster_tls_url_template=os.environ.get("MAGNETAR_OPERATOR_CLUSTER_TLS_URL_TEMPLATE")
            or DEFAULT_CLUSTER_TLS_URL_TEMPLATE,
            operator_token_secret=os.environ.get("MAGNETAR_OPERATOR_TOKEN_SECRET") or DEFAULT_OPERATOR_TOKEN_SECRET,
            operator_token_key=os.environ.get("MAGNETAR_OPERATOR_TOKEN_KEY") or "token",
            delete_timeout=_float("MAGNETAR_OPERATOR_DELETE_TIMEOUT", cls.delete_timeout),
            allow_inline_admin_url=is_true(os.environ.get("MAGNETAR_OPERATOR_ALLOW_INLINE_ADMIN_URL", "true")),
            admin_url_allowlist=tuple(
                u.strip() for u in os.environ.get("MAGNETAR_OPERATOR_ADMIN_URL_ALLOWLIST", "").split(",") if u.strip()
            ),
            max_concurrent_reconciles=int(_float("MAGNETAR_OPERATOR_MAX_CONCURRENT_RECONCILES", 8)),
            reconciles_per_second=_float("MAGNETAR_OPERATOR_RECONCILES_PER_SECOND", cls.reconciles_per_second),
            watch_secrets=is_true(os.environ.get("MAGNETAR_OPERATOR_WATCH_SECRETS", "false")),
            topic_list_cache_seconds=_float("MAGNETAR_OPERATOR_TOPIC_LIST_CACHE_SECONDS", cls.topic_list_cache_seconds),
            cluster_poll=_float("MAGNETAR_OPERATOR_CLUSTER_POLL", cls.cluster_poll),
            api_request_timeout=_float("MAGNETAR_OPERATOR_API_REQUEST_TIMEOUT", cls.api_request_timeout),
            timer_stop_poll=_float("MAGNETAR_OPERATOR_TIMER_STOP_POLL", cls.timer_stop_poll),
        )

    def inline_url_refusal(self, url: str) -> str | None:
        """Why an inline ``connection.adminUrl`` may not be used (multi-tenant clusters), else ``None``."""
        if not self.allow_inline_admin_url:
            return "inline connection.adminUrl is disabled by the operator's configuration: use clusterRef"
        if self.admin_url_allowlist and not any(url.startswith(p) for p in self.admin_url_allowlist):
            return f"connection.adminUrl {url} is not in the operator's allow-list"
        return None

    def cluster_url(self, namespace: str, name: str, tls: bool = False) -> str:
        template = self.cluster_tls_url_template if tls else self.cluster_url_template
        return template.format(name=name, namespace=namespace).rstrip("/")


def is_true(value: object) -> bool:
    return str(value).strip().lower() in ("true", "1", "yes", "on")
