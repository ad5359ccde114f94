"""A "kubelet" running the emulated API server's pods as real podman containers (see :mod:`tests.harness`).

Per pod: one container (the pods the operator makes have one), started on the harness's podman
network with the pod's and its Services' DNS names as network aliases; probes by HTTP from this
process to the container's address; restarts per ``restartPolicy`` with a 1-10 s back-off; deleted
pods get SIGTERM and their ``terminationGracePeriodSeconds`` (capped) before SIGKILL, and a pod name
is only started again once the old container is gone (as a StatefulSet waits for a terminated pod).
"""

from __future__ import annotations

import logging
import re
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.harness.controllers import Api, Obj
from tests.harness.podman import Podman

log = logging.getLogger("harness.kubelet")

_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion (unknown references stay as they are)."""
    return _VAR.sub(lambda m: env.get(m.group(1), m.group(0)), text)


def field_ref(pod: Obj, path: str) -> str:
    meta = pod["metadata"]
    if path == "metadata.name":
        return str(meta["name"])
    if path == "metadata.namespace":
        return str(meta["namespace"])
    m = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
    if m:
        return str((meta.get(m.group(1)) or {}).get(m.group(2), ""))
    raise ValueError(f"fieldRef {path} is not supported by the harness")


@dataclass
class Probe:
    spec: Obj
    passed: int = 0
    failed: int = 0
    next_at: float = 0.0

    def due(self, now: float) -> bool:
        return now >= self.next_at


@dataclass
class PodRun:
    uid: str
    namespace: str
    name: str
    container: str
    restart_policy: str
    ip: str = ""
    restarts: int = 0
    started: bool = False  # startup probe passed
    ready: bool = False
    phase: str = "Pending"
    restart_at: float = 0.0
    probes: dict[str, Probe] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    grace: int = 30
    reported: Any = None


class Kubelet:
    """Starts, probes, restarts and stops the containers of the API's pods."""

    def __init__(self, api: Api, podman: Podman, network: str, workdir: Path, image_map: dict[str, Any]) -> None:
        self.api = api
        self.podman = podman
        self.network = network
        self.workdir = workdir
        #: image prefix -> (image, extra podman args) (the etcd liberty)
        self.image_map = image_map
        self.runs: dict[str, PodRun] = {}

    # ------------------------------------------------------------------------------------------ sync
    def sync(self) -> None:
        pods = {p["metadata"]["uid"]: p for p in self.api.list("Pod")}
        for uid in [u for u in self.runs if u not in pods]:
            self._stop(self.runs.pop(uid))
        states = {c["Names"][0]: c for c in self.podman.containers()}
        now = time.monotonic()
        for uid, pod in pods.items():
            run = self.runs.get(uid)
            if run is None:
                if any(r.name == pod["metadata"]["name"] and r.namespace == pod["metadata"]["namespace"]
                       for r in self.runs.values()):  # fmt: skip
                    continue
                try:
                    run = self._start(pod)
                except Exception as exc:
                    log.warning("cannot start pod %s: %s", pod["metadata"]["name"], exc)
                    self._report(pod, None, message=str(exc))
                    continue
                self.runs[uid] = run
            self._supervise(run, states.get(run.container), now)
            self._report(pod, run)

    def stop_all(self) -> None:
        for run in list(self.runs.values()):
            self.podman.run("rm", "-f", "-t", "0", run.container, check=False)
        self.runs.clear()

    # ------------------------------------------------------------------------------------------ start/stop
    def services_for(self, pod: Obj) -> list[str]:
        labels = pod["metadata"].get("labels") or {}
        out = []
        for svc in self.api.list("Service", pod["metadata"]["namespace"]):
            selector = (svc.get("spec") or {}).get("selector") or {}
            if selector and all(labels.get(k) == v for k, v in selector.items()):
                out.append(svc["metadata"]["name"])
        return out

    def _aliases(self, pod: Obj) -> list[str]:
        meta, spec = pod["metadata"], pod["spec"]
        ns, name = meta["namespace"], meta["name"]
        out = [name]
        sub = spec.get("subdomain")
        if sub:
            out += [
                f"{name}.{sub}",
                f"{name}.{sub}.{ns}",
                f"{name}.{sub}.{ns}.svc",
                f"{name}.{sub}.{ns}.svc.cluster.local",
            ]
        for svc in self.services_for(pod):
            out += [svc, f"{svc}.{ns}", f"{svc}.{ns}.svc", f"{svc}.{ns}.svc.cluster.local"]
        return out

    def _env(self, pod: Obj, container: Obj) -> dict[str, str]:
        env: dict[str, str] = {}
        ns = pod["metadata"]["namespace"]
        for item in container.get("env") or []:
            if "value" in item:
                env[item["name"]] = expand(str(item["value"]), env)
                continue
            source = item.get("valueFrom") or {}
            if "fieldRef" in source:
                env[item["name"]] = field_ref(pod, source["fieldRef"]["fieldPath"])
            elif "configMapKeyRef" in source:
                ref = source["configMapKeyRef"]
                cm = self.api.get("ConfigMap", ns, ref["name"]) or {}
                env[item["name"]] = str((cm.get("data") or {}).get(ref["key"], ""))
            else:
                raise ValueError(f"env source {sorted(source)} is not supported by the harness")
        return env

    def _start(self, pod: Obj) -> PodRun:
        meta, spec = pod["metadata"], pod["spec"]
        ns, name = meta["namespace"], meta["name"]
        (container,) = spec["containers"]
        cname = f"{self.podman.owner}-{ns}-{name}-{meta['uid'][:6]}"
        args = ["run", "-d", "--name", cname, "--label", f"harness={self.podman.owner}", "--network", self.network,
                "--hostname", name]  # fmt: skip
        for alias in self._aliases(pod):
            args += ["--network-alias", alias]
        sc = {**(spec.get("securityContext") or {}), **(container.get("securityContext") or {})}
        if "runAsUser" in sc:
            args += ["--user", f"{sc['runAsUser']}:{sc.get('runAsGroup', sc['runAsUser'])}"]
        env = self._env(pod, container)
        for key, value in env.items():
            args += ["--env", f"{key}={value}"]
        volumes = {v["name"]: v for v in spec.get("volumes") or []}
        for mount in container.get("volumeMounts") or []:
            vol = volumes[mount["name"]]
            ro = ",ro" if mount.get("readOnly") else ""
            if "persistentVolumeClaim" in vol:
                vname = f"{self.podman.owner}-{ns}-{vol['persistentVolumeClaim']['claimName']}"
                if self.podman.run("volume", "exists", vname, check=False).returncode != 0:
                    self.podman.run("volume", "create", "--label", f"harness={self.podman.owner}", vname)
                args += ["--volume", f"{vname}:{mount['mountPath']}:U{ro}"]
            elif "configMap" in vol:
                cm = self.api.get("ConfigMap", ns, vol["configMap"]["name"])
                if cm is None:
                    raise ValueError(f"configMap {vol['configMap']['name']} not found")
                d = self.workdir / "configmaps" / cname / mount["name"]
                d.mkdir(parents=True, exist_ok=True)
                for key, value in (cm.get("data") or {}).items():
                    (d / key).write_text(value)
                args += ["--volume", f"{d}:{mount['mountPath']}:ro"]
            elif "emptyDir" in vol:
                args += ["--tmpfs", mount["mountPath"]]
            else:
                raise ValueError(f"volume {mount['name']} kind is not supported by the harness")
        image = container["image"]
        for prefix, (mapped, extra) in self.image_map.items():
            if image.startswith(prefix):
                image = mapped
                args += list(extra)
        command = [expand(c, env) for c in container.get("command") or []]
        if command:
            args += ["--entrypoint", command[0]]
        args.append(image)
        args += command[1:]
        args += [expand(a, env) for a in container.get("args") or []]
        self.podman.run(*args)
        run = PodRun(meta["uid"], ns, name, cname, spec.get("restartPolicy", "Always"))
        run.grace = min(int(spec.get("terminationGracePeriodSeconds", 30)), 20)
        run.ports = {p["name"]: p["containerPort"] for p in container.get("ports") or [] if "name" in p}
        for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
            if kind in container:
                delay = float(container[kind].get("initialDelaySeconds", 0))
                run.probes[kind] = Probe(container[kind], next_at=time.monotonic() + delay)
        run.ip = self.podman.ip(cname, self.network)
        run.phase = "Running"
        log.info("started pod %s/%s as %s at %s", ns, name, cname, run.ip)
        return run

    def _stop(self, run: PodRun) -> None:
        self.podman.run("stop", "-t", str(run.grace), run.container, check=False, timeout=run.grace + 30)
        self.podman.run("rm", "-f", run.container, check=False)
        log.info("stopped pod %s/%s", run.namespace, run.name)

    # ------------------------------------------------------------------------------------------ supervise
    def _supervise(self, run: PodRun, state: Obj | None, now: float) -> None:
        if run.phase in ("Succeeded", "Failed"):
            return
        running = state is not None and state.get("State") == "running"
        if not running:
            run.ready = False
            exit_code = int((state or {}).get("ExitCode") or 0)
            if run.restart_policy == "Never" or (run.restart_policy == "OnFailure" and exit_code == 0):
                run.phase = "Succeeded" if exit_code == 0 else "Failed"
                return
            if run.restart_at == 0.0:
                run.restart_at = now + min(10.0, 2.0**run.restarts)
            elif now >= run.restart_at:
                self.podman.run("start", run.container, check=False)
                run.restarts += 1
                run.restart_at = 0.0
                run.started = False
                for probe in run.probes.values():
                    probe.passed = probe.failed = 0
                    probe.next_at = now + float(probe.spec.get("initialDelaySeconds", 0))
                run.ip = self.podman.ip(run.container, self.network) or run.ip
                log.info("restarted pod %s/%s (restart %d)", run.namespace, run.name, run.restarts)
            return
        startup = run.probes.get("startupProbe")
        if not run.started:
            if startup is None or (startup.due(now) and self._probe(run, startup, now)):
                run.started = True
            elif startup.failed >= int(startup.spec.get("failureThreshold", 3)):
                self._kill(run, "startup probe failed")
                return
            if not run.started:
                return
        live = run.probes.get("livenessProbe")
        if live is not None and live.due(now):
            self._probe(run, live, now)
            if live.failed >= int(live.spec.get("failureThreshold", 3)):
                self._kill(run, "liveness probe failed")
                return
        ready = run.probes.get("readinessProbe")
        if ready is None:
            run.ready = True
        elif ready.due(now):
            self._probe(run, ready, now)
            if ready.passed >= int(ready.spec.get("successThreshold", 1)):
                run.ready = True
            if ready.failed >= int(ready.spec.get("failureThreshold", 3)):
                run.ready = False

    def _kill(self, run: PodRun, why: str) -> None:
        log.info("killing pod %s/%s: %s", run.namespace, run.name, why)
        self.podman.run("kill", run.container, check=False)
        run.ready = False

    def _probe(self, run: PodRun, probe: Probe, now: float) -> bool:
        probe.next_at = now + float(probe.spec.get("periodSeconds", 10))
        get = probe.spec.get("httpGet") or {}
        port = get.get("port")
        port = run.ports.get(port, port) if isinstance(port, str) else port
        ok = False
        try:
            url = f"http://{run.ip}:{port}{get.get('path', '/')}"
            with urllib.request.urlopen(url, timeout=min(2.0, float(probe.spec.get("timeoutSeconds", 1)))) as r:
                ok = 200 <= r.status < 400
        except (urllib.error.URLError, OSError, ValueError):
            ok = False
        if ok:
            probe.passed += 1
            probe.failed = 0
        else:
            probe.failed += 1
            probe.passed = 0
        return ok

    # ------------------------------------------------------------------------------------------ status
    def _report(self, pod: Obj, run: PodRun | None, message: str = "") -> None:
        if run is None:
            status: Obj = {"phase": "Pending", "message": message,
                           "conditions": [{"type": "Ready", "status": "False"}]}  # fmt: skip
        else:
            ready = "True" if run.ready and run.phase == "Running" else "False"
            status = {
                "phase": run.phase,
                "podIP": run.ip,
                "conditions": [{"type": "Ready", "status": ready}],
                "containerStatuses": [{"name": pod["spec"]["containers"][0]["name"], "ready": run.ready,
                                       "restartCount": run.restarts, "started": run.started}],
            }  # fmt: skip
            if run.reported == status:
                return
            run.reported = status
        if (pod.get("status") or {}) != status:
            self.api.patch_status("Pod", pod["metadata"]["namespace"], pod["metadata"]["name"], status)
