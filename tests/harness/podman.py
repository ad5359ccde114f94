"""podman with the options this sandbox needs (runc, cgroupfs, a containers.conf without ulimits)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def podman_available() -> bool:
    return subprocess.run(["sh", "-c", "command -v podman && command -v runc && command -v mmdebstrap"],
                          capture_output=True).returncode == 0  # fmt: skip


def _env(workdir: Path) -> dict[str, str]:
    conf = workdir / "containers.conf"
    if not conf.exists():
        conf.write_text("[containers]\ndefault_ulimits = []\n")
    return {**os.environ, "CONTAINERS_CONF": str(conf)}


class Podman:
    """Thin wrapper over the podman CLI; every object it makes carries the ``owner`` label (for cleanup)."""

    def __init__(self, workdir: Path, owner: str) -> None:
        self.workdir = workdir
        self.owner = owner
        self.env = _env(workdir)

    def run(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        cmd = ["podman", "--runtime", "runc", "--cgroup-manager=cgroupfs", *args]
        result = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({result.returncode}): {result.stderr[-2000:]}")
        return result

    def containers(self) -> list[dict[str, Any]]:
        out = self.run("ps", "-a", "--format=json", f"--filter=label=harness={self.owner}").stdout
        return json.loads(out or "[]")

    def ip(self, container: str, network: str) -> str:
        out = self.run("inspect", "--format", "{{json .NetworkSettings.Networks}}", container).stdout
        return str(json.loads(out)[network]["IPAddress"])

    def cleanup(self, network: str | None = None, volumes: bool = True) -> None:
        for c in self.containers():
            self.run("rm", "-f", "-t", "0", c["Id"], check=False)
        if volumes:
            out = self.run("volume", "ls", "--format=json", f"--filter=label=harness={self.owner}", check=False)
            for v in json.loads(out.stdout or "[]"):
                self.run("volume", "rm", "-f", v["Name"], check=False)
        if network:
            self.run("network", "rm", "-f", network, check=False)


def build_image() -> str:
    """The project image (scripts/build-image.sh: cached by the content hash of its inputs)."""
    result = subprocess.run([str(ROOT / "scripts" / "build-image.sh")], capture_output=True, text=True, timeout=1500)
    if result.returncode != 0:
        raise RuntimeError(f"image build failed: {result.stderr[-3000:]}")
    return result.stdout.strip().splitlines()[-1]


def base_image(podman: Podman) -> str:
    """The Debian base image the project image was built on (newest magnetar-base)."""
    out = podman.run("images", "--format=json", "localhost/magnetar-base").stdout
    images = sorted(json.loads(out or "[]"), key=lambda i: i.get("Created", 0), reverse=True)
    if not images:
        raise RuntimeError("no localhost/magnetar-base image: run scripts/build-image.sh")
    return str(images[0]["Names"][0])
