"""A resource deleted while its drift timer is mid-call goes promptly, not a kopf polling period later.

kopf asks a resource's timers to stop when the resource is marked for deletion and waits a few event-loop
cycles for them. A timer in the middle of an admin call does not stop that fast, and kopf then looks again
only after ``settings.background.cancellation_polling`` (60 s by default): the deletion handler ran, but
the finalizer stayed that long (the 60 s operator-loop flake of earlier CI runs). Here every admin call
goes through a proxy that answers 1.5 s late, so with a 0.3 s drift interval the timer is nearly always in
a call; the deletion is made while one is in flight.

The real ``magnetar operator`` (kopf) process, the emulated Kubernetes API (no API server can run here) and
a real ``magnetar standalone`` behind the proxy.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from tests.conftest import StandaloneProcess
from tests.operator.kubeemu import EmulatorThread
from tests.operator.test_operator_loop import KUBECTL, ROOT, Cluster, start_operator, stop_operator

pytestmark = pytest.mark.skipif(not Path(KUBECTL).exists(), reason="kubectl not installed")

DELAY = 1.5

TENANT = """
apiVersion: magnetar.io/v1alpha1
kind: Tenant
metadata:
  name: slowpoke
spec:
  clusterRef:
    name: magnetar
  adminRoles: [slow-admin]
  deletionPolicy: Delete
"""


class SlowAdmin:
    """An HTTP proxy to the broker's admin API that answers every request ``DELAY`` seconds late and
    counts the requests in flight."""

    def __init__(self, target: str) -> None:
        self.target = target.rstrip("/")
        self.in_flight = 0
        self.requests: list[str] = []
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    def start(self) -> SlowAdmin:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(30)
        return self

    async def _start(self) -> None:
        self._session = aiohttp.ClientSession()
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"

    async def _forward(self, request: web.Request) -> web.Response:
        assert self._session is not None
        self.in_flight += 1
        self.requests.append(f"{request.method} {request.path}")
        try:
            await asyncio.sleep(DELAY)
            async with self._session.request(
                request.method,
                self.target + request.path_qs,
                data=await request.read(),
                headers={k: v for k, v in request.headers.items() if k.lower() in ("content-type", "authorization")},
            ) as resp:
                body = await resp.read()
                return web.Response(status=resp.status, body=body, content_type=resp.content_type)
        finally:
            self.in_flight -= 1

    def stop(self) -> None:
        async def close() -> None:
            if self._runner is not None:
                await self._runner.cleanup()
            if self._session is not None:
                await self._session.close()

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


@pytest.fixture
def slow_cluster(tmp_path: Path) -> Iterator[tuple[Cluster, SlowAdmin]]:
    broker = StandaloneProcess(tmp_path / "broker")
    broker.start()
    proxy = SlowAdmin(broker.http_url).start()
    emu = EmulatorThread().start()
    env = {
        **os.environ,
        "KUBECONFIG": emu.kubeconfig(str(tmp_path / "kubeconfig")),
        "KUBECACHEDIR": str(tmp_path / "kubecache"),
        "MAGNETAR_OPERATOR_CLUSTER_URL_TEMPLATE": proxy.url,
        "MAGNETAR_OPERATOR_DRIFT_INTERVAL": "0.3",
        "MAGNETAR_OPERATOR_BACKOFF_BASE": "0.5",
        "MAGNETAR_OPERATOR_BACKOFF_CAP": "2",
    }
    cluster = Cluster(emu, broker, env, tmp_path / "operator.log")
    cluster.kubectl("apply", "-f", str(ROOT / "crds"))
    cluster.stand_in_magnetar_cluster()
    proc = start_operator(env, cluster.log)
    try:
        yield cluster, proxy
    finally:
        stop_operator(proc)
        emu.stop()
        proxy.stop()
        broker.stop()


def test_deletion_during_a_timer_call_is_not_held_for_kopfs_polling_period(
    slow_cluster: tuple[Cluster, SlowAdmin],
) -> None:
    cluster, proxy = slow_cluster
    cluster.kubectl("apply", "-f", "-", input=TENANT)
    cluster.wait_ready("tenants", "slowpoke")
    assert cluster.admin("GET", "tenants/slowpoke")["adminRoles"] == ["slow-admin"]
    # Ready is written by the apply handler; the drift timer then runs every 0.3 s plus its 1.5 s admin
    # call. Its first passes may still change the status (each change is an event that gets kopf to look
    # again); once they are no-ops, delete while one is in a call.
    ready = len(proxy.requests)
    cluster.wait(lambda: len(proxy.requests) >= ready + 3 and proxy.in_flight > 0, "a steady drift pass in a call",
                 timeout=30)  # fmt: skip
    cluster.kubectl("delete", "--wait=false", "tenant", "slowpoke")
    started = time.monotonic()
    # kopf's default would look at the stopping timer again only after 60 s; the deletion handler
    # itself takes a few slow calls.
    cluster.wait(lambda: cluster.obj("tenants", "slowpoke") is None, "slowpoke to go", timeout=25,
                 about="tenants/slowpoke")  # fmt: skip
    assert time.monotonic() - started < 25
    assert cluster.admin_or_none("tenants/slowpoke") is None
    assert "DELETE /admin/v2/tenants/slowpoke" in proxy.requests
