"""``magnetar operator --release-finalizers``: remove the operator's finalizer from every Magnetar resource
(the uninstall step the chart runs as a pre-delete hook). Afterwards deleting a resource removes only the
Kubernetes object and leaves its Pulsar object in place, instead of hanging in Terminating with no
operator left to finish it. Each released resource gets a ``FinalizerReleased`` Event."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any

from magnetar.operator.config import FINALIZER, GROUP, VERSION
from magnetar.operator.kube import KubeClient

log = logging.getLogger("magnetar.operator")

PLURALS = ("topics", "topicnamespaces", "tenants", "retentionpolicies")


async def scale_down(kube: KubeClient, namespace: str, deployment: str, wait_seconds: float = 120.0) -> None:
    """Scale the operator's Deployment to 0 and wait for its pods to stop (a running operator would put the
    finalizers back)."""
    path = f"/apis/apps/v1/namespaces/{namespace}/deployments/{deployment}"
    await kube.request("PATCH", path, {"spec": {"replicas": 0}}, content_type="application/merge-patch+json")
    deadline = time.monotonic() + wait_seconds
    while True:
        status = (await kube.request("GET", path) or {}).get("status") or {}
        if not status.get("replicas"):  # omitted when 0
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"deployment {namespace}/{deployment} still has {status.get('replicas')} pods")
        await asyncio.sleep(2)


async def release_finalizers(kube: KubeClient, namespaces: list[str]) -> int:
    """Remove :data:`FINALIZER` from the resources in ``namespaces`` (all when empty); returns how many."""
    released = 0
    scopes = [f"/namespaces/{ns}" for ns in namespaces] or [""]
    for plural in PLURALS:
        for scope in scopes:
            listed = await kube.request("GET", f"/apis/{GROUP}/{VERSION}{scope}/{plural}")
            for item in (listed or {}).get("items") or []:
                if await _release(kube, plural, item):
                    released += 1
    return released


async def _release(kube: KubeClient, plural: str, item: dict[str, Any]) -> bool:
    meta = item.get("metadata") or {}
    finalizers = list(meta.get("finalizers") or [])
    if FINALIZER not in finalizers:
        return False
    index = finalizers.index(FINALIZER)
    path = f"/apis/{GROUP}/{VERSION}/namespaces/{meta['namespace']}/{plural}/{meta['name']}"
    # `test` first: a concurrent change of the list makes the patch fail instead of removing another entry.
    ops = [{"op": "test", "path": f"/metadata/finalizers/{index}", "value": FINALIZER},
           {"op": "remove", "path": f"/metadata/finalizers/{index}"}]  # fmt: skip
    await kube.request("PATCH", path, ops, content_type="application/json-patch+json")
    message = "the operator is being uninstalled: deleting this resource now leaves its Pulsar object in place"
    event = {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"namespace": meta["namespace"], "name": f"{meta['name']}.{uuid.uuid4().hex[:12]}"},
        "involvedObject": {"apiVersion": f"{GROUP}/{VERSION}", "kind": item.get("kind", ""),
                           "namespace": meta["namespace"], "name": meta["name"], "uid": meta.get("uid", "")},
        "reason": "FinalizerReleased", "message": message, "type": "Warning",
        "source": {"component": "magnetar-operator"},
    }  # fmt: skip
    await kube.request("POST", f"/api/v1/namespaces/{meta['namespace']}/events", event)
    log.info("%s %s/%s: finalizer released", item.get("kind", plural), meta["namespace"], meta["name"])
    return True
