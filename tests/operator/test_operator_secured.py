"""Operator in the loop with a secured MagnetarCluster: the real ``magnetar operator`` process, the emulated
Kubernetes API, and an HTTPS admin API that wants the operator's token (tests/operator/test_secured_admin.py).
A Tenant with a ``clusterRef`` waits with ``CredentialsMissing`` while the operator token Secret is missing,
then is created over HTTPS (the cluster's ca.crt trusted) with ``Authorization: Bearer <token>``.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tests.operator.kubeemu import EmulatorThread
from tests.operator.test_operator_loop import KUBECTL, NS, ROOT, Cluster, start_operator, stop_operator
from tests.operator.test_secured_admin import TOKEN, SecuredAdmin, _pem

pytestmark = pytest.mark.skipif(not Path(KUBECTL).exists(), reason="kubectl not installed")

SECURED_CLUSTER = {
    "apiVersion": "magnetar.io/v1alpha1",
    "kind": "MagnetarCluster",
    "metadata": {"name": "secure", "namespace": NS, "annotations": {"magnetar.io/paused": "true"}},
    "spec": {
        "image": "localhost/magnetar:dev",
        "metadataStore": {"external": {"endpoints": ["etcd:2379"]}},
        "bookies": {"replicas": 3},
        "brokers": {"replicas": 1},
        "security": {
            "tls": {"secretName": "secure-tls", "tlsOnly": True},
            "authentication": {
                "token": {"secretKey": {"name": "secure-token-key", "key": "secret.key"}},
                "superUserRoles": ["magnetar-operator"],
                "operatorTokenSecretRef": {"name": "secure-operator-token", "key": "token"},
            },
        },
    },
}


def _secret(name: str, data: dict[str, str], type_: str = "Opaque") -> str:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name, "namespace": NS},
            "type": type_,
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
        }
    )


class AdminThread:
    """The HTTPS admin API served from a background thread (the tests are synchronous)."""

    def __init__(self, server: SecuredAdmin) -> None:
        self.server = server
        self.loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self.loop.run_forever, name="secured-admin", daemon=True)

    def start(self) -> AdminThread:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)
        return self

    async def _start(self) -> None:
        self._runner = web.AppRunner(self.server.app())
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=self.server.context).start()
        self.server.url = f"https://127.0.0.1:{self._runner.addresses[0][1]}"

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, SecuredAdmin]]:
    tmp = tmp_path_factory.mktemp("secured")
    admin = AdminThread(SecuredAdmin(tmp)).start()
    emu = EmulatorThread().start()
    env = {
        **os.environ,
        "KUBECONFIG": emu.kubeconfig(str(tmp / "kubeconfig")),
        "KUBECACHEDIR": str(tmp / "kubecache"),
        # Plaintext would be refused: a TLS-only cluster is reached through the TLS template only.
        "MAGNETAR_OPERATOR_CLUSTER_URL_TEMPLATE": "http://127.0.0.1:9",
        "MAGNETAR_OPERATOR_DRIFT_INTERVAL": "120",
        "MAGNETAR_OPERATOR_BACKOFF_BASE": "0.5",
        "MAGNETAR_OPERATOR_BACKOFF_CAP": "2",
    }
    log = tmp / "operator.log"
    cluster = Cluster(emu, None, env, log)  # type: ignore[arg-type]  (no broker: the HTTPS admin API stands in)
    proc: subprocess.Popen[bytes] | None = None
    try:
        cluster.kubectl("apply", "-f", str(ROOT / "crds"))
        cluster.kubectl("apply", "-f", "-", input=json.dumps(SECURED_CLUSTER))
        ready = json.dumps({"status": {"conditions": [{"type": "Ready", "status": "True"}]}})
        cluster.kubectl("patch", "magnetarcluster", "secure", "--subresource=status", "--type=merge", "-p", ready)
        tls = {"tls.crt": "unused", "tls.key": "unused", "ca.crt": _pem(admin.server.ca)}
        cluster.kubectl("apply", "-f", "-", input=_secret("secure-tls", tls, "kubernetes.io/tls"))
        proc = start_operator(env, log, f"--cluster-tls-url-template={admin.server.url}")
        yield cluster, admin.server
    finally:
        if proc is not None:
            stop_operator(proc)
        emu.stop()
        admin.stop()


def _tenant(name: str) -> str:
    body: dict[str, Any] = {"apiVersion": "magnetar.io/v1alpha1", "kind": "Tenant",
                            "metadata": {"name": name, "namespace": NS},
                            "spec": {"clusterRef": {"name": "secure"}, "adminRoles": ["acme-admin"]}}  # fmt: skip
    return json.dumps(body)


def test_tenant_waits_for_the_operator_token_then_is_created_over_https(
    secured: tuple[Cluster, SecuredAdmin],
) -> None:
    cluster, admin = secured
    cluster.kubectl("apply", "-f", "-", input=_tenant("acme"))
    cluster.wait_ready("tenants", "acme", "False", "CredentialsMissing")
    assert "secure-operator-token" in cluster.condition("tenants", "acme")["message"]
    assert admin.authorizations == []  # nothing is called without the token

    cluster.kubectl("apply", "-f", "-", input=_secret("secure-operator-token", {"token": TOKEN}))
    cluster.wait_ready("tenants", "acme")
    assert admin.tenants["acme"]["adminRoles"] == ["acme-admin"]
    assert set(admin.authorizations) == {f"Bearer {TOKEN}"}
    status = (cluster.obj("tenants", "acme") or {})["status"]
    assert status["adminUrl"] == admin.url
