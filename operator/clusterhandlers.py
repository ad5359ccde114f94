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

from magnetar.operator.clusterobjects import ClusterRenderer
from magnetar.operator.clusterops import READY, ClusterReconciler, status_of
from magnetar.operator.config import GROUP, PAUSE_ANNOTATION, VERSION, OperatorConfig, is_true
from magnetar.operator.kube import KubeClient, KubeError

PLURAL = "magnetarclusters"


class ClusterHandlers:
    """State shared by the handlers: the API client, per-cluster locks."""

    def __init__(self, config: OperatorConfig, kube: KubeClient) -> None:
        self.config = config
        self.reconciler = ClusterReconciler(kube)
        self._locks: dict[str, asyncio.Lock] = {}

    async def run(self, body: dict[str, Any], patch: kopf.Patch) -> bool:
        """One pass; writes status into ``patch``; returns whether the cluster is Ready."""
        meta = body.get("metadata") or {}
        if is_true((meta.get("annotations") or {}).get(PAUSE_ANNOTATION, "")):
            return True

        def sink(type_: str, reason: str, message: str) -> None:
            kopf.event(body, type=type_, reason=reason, message=message)  # type: ignore[arg-type]

        async with self._locks.setdefault(meta.get("uid", ""), asyncio.Lock()):
            try:
                result = await self.reconciler.reconcile(body, sink)
            except KubeError as exc:
                sink("Warning", "ApiError", str(exc))
                raise kopf.TemporaryError(str(exc), delay=self.config.cluster_poll) from exc
        status = status_of(body.get("status") or {}, result, int(meta.get("generation") or 1), ClusterRenderer(body))
        for key, value in status.items():
            patch.status[key] = value
        return result.ready

    async def close(self) -> None:
        await self.reconciler.close()


def register(handlers: ClusterHandlers, plain: Any) -> None:
    """Register the kopf handlers (``plain`` deep-copies kopf's body views)."""

    async def apply(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
        if not await handlers.run(plain(body), patch):
            raise kopf.TemporaryError("cluster not ready yet", delay=handlers.config.cluster_poll)

    async def drift(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
        if not (body.get("metadata") or {}).get("deletionTimestamp"):
            await handlers.run(plain(body), patch)

    for decorator in (kopf.on.resume, kopf.on.create, kopf.on.update):
        decorator(GROUP, VERSION, PLURAL, id="MagnetarCluster-apply")(apply)
    kopf.timer(GROUP, VERSION, PLURAL, id="MagnetarCluster-drift", interval=handlers.config.drift_interval,
               initial_delay=handlers.config.drift_interval)(drift)  # fmt: skip

    @kopf.index(GROUP, VERSION, PLURAL, id="cluster_index")
    def cluster_index(
        namespace: str | None, name: str, status: kopf.Status, **_: Any
    ) -> dict[tuple[str | None, str], bool]:
        ready = any(c.get("type") == READY and c.get("status") == "True" for c in status.get("conditions") or [])
        return {(namespace, name): ready}
