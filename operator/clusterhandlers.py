"""kopf handlers of ``MagnetarCluster``: thin wrappers around :class:`~magnetar.operator.clusterops.ClusterReconciler`.

``on.resume/create/update`` run a pass and, while the cluster is not Ready, ask kopf to call again after
``MAGNETAR_OPERATOR_CLUSTER_POLL`` seconds (each pass does at most one disruptive step); the timer
re-runs passes every drift interval, which puts back owned objects edited or deleted by hand. Owned
objects carry ownerReferences, so deleting the cluster lets Kubernetes' garbage collector remove them
(PersistentVolumeClaims stay, as for any StatefulSet). The ``cluster_index`` tells Tenant, TopicNamespace
and Topic handlers whether the cluster their ``clusterRef`` names is Ready.
"""

from __future__ import annotations

import asyncio
from typing import Any

import kopf

from magnetar.operator.clusteraccess import SECRET_REASONS, ClusterAccess
from magnetar.operator.clusterobjects import ClusterRenderer
from magnetar.operator.clusterops import READY, ClusterReconciler, status_of
from magnetar.operator.clusterspec import MagnetarClusterSpec
from magnetar.operator.config import GROUP, PAUSE_ANNOTATION, VERSION, OperatorConfig, is_true
from magnetar.operator.kube import KubeClient, KubeError

PLURAL = "magnetarclusters"


class ClusterHandlers:
    """State shared by the handlers: the API client, per-cluster locks."""

    def __init__(self, config: OperatorConfig, kube: KubeClient) -> None:
        self.config = config
        self.reconciler = ClusterReconciler(kube, config=config)
        self._locks: dict[str, asyncio.Lock] = {}

    def retry_delay(self, reason: str, retry: int) -> float:
        """Seconds until the next pass of a cluster that is not Ready: the poll interval while it starts or
        rolls, exponential backoff while a Secret is missing or unreadable."""
        if reason in SECRET_REASONS:
            return min(self.config.backoff_base * 2 ** min(retry, 16), self.config.backoff_cap)
        return self.config.cluster_poll

    async def run(self, body: dict[str, Any], patch: kopf.Patch) -> tuple[bool, str]:
        """One pass; writes status into ``patch``; returns whether the cluster is Ready and the reason."""
        meta = body.get("metadata") or {}
        if is_true((meta.get("annotations") or {}).get(PAUSE_ANNOTATION, "")):
            return True, "Paused"

        def sink(type_: str, reason: str, message: str) -> None:
            kopf.event(body, type=type_, reason=reason, message=message)  # type: ignore[arg-type]

        async with self._locks.setdefault(meta.get("uid", ""), asyncio.Lock()):
            try:
                result = await self.reconciler.reconcile(body, sink)
            except KubeError as exc:
                sink("Warning", "ApiError", str(exc))
                raise kopf.TemporaryError(str(exc), delay=self.config.cluster_poll) from exc
        status = status_of(body.get("status") or {}, result, int(meta.get("generation") or 1),
                           ClusterRenderer(body, config=self.config))  # fmt: skip
        for key, value in status.items():
            patch.status[key] = value
        return result.ready, result.reason

    async def close(self) -> None:
        await self.reconciler.close()


def register(handlers: ClusterHandlers, plain: Any) -> None:
    """Register the kopf handlers (``plain`` deep-copies kopf's body views)."""

    async def apply(body: kopf.Body, patch: kopf.Patch, retry: int = 0, **_: Any) -> None:
        ready, reason = await handlers.run(plain(body), patch)
        if not ready:
            raise kopf.TemporaryError(f"cluster not ready yet ({reason})", delay=handlers.retry_delay(reason, retry))

    async def drift(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
        if not (body.get("metadata") or {}).get("deletionTimestamp"):
            await handlers.run(plain(body), patch)

    for decorator in (kopf.on.resume, kopf.on.create, kopf.on.update):
        decorator(GROUP, VERSION, PLURAL, id="MagnetarCluster-apply")(apply)
    kopf.timer(GROUP, VERSION, PLURAL, id="MagnetarCluster-drift", interval=handlers.config.drift_interval,
               initial_delay=handlers.config.drift_interval)(drift)  # fmt: skip

    @kopf.index(GROUP, VERSION, PLURAL, id="cluster_index")
    def cluster_index(
        namespace: str | None, name: str, spec: kopf.Spec, status: kopf.Status, **_: Any
    ) -> dict[tuple[str | None, str], dict[str, Any]]:
        """Per cluster: Ready, and how to reach its admin API (:class:`ClusterAccess`)."""
        ready = any(c.get("type") == READY and c.get("status") == "True" for c in status.get("conditions") or [])
        try:
            parsed = MagnetarClusterSpec.model_validate(plain(spec))
        except ValueError:
            return {(namespace, name): ClusterAccess(ready).as_index()}
        return {(namespace, name): ClusterAccess.of(parsed, ready, handlers.config).as_index()}
