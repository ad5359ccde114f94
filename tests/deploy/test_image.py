"""The container image, built here with podman (scripts/build-image.sh, cached by content hash) and
smoke-tested: ``magnetar standalone`` (the image's default command) inside a container, the official
``pulsar-client`` outside it through ports published on loopback; the image runs as its non-root user.

Skipped unless podman, runc and mmdebstrap are installed (``.ci/run`` installs them).
"""

from __future__ import annotations

import json
import secrets
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.podman import Podman, build_image, podman_available
from tests.ports import free_port

pytestmark = [
    pytest.mark.skipif(not podman_available(), reason="podman, runc and mmdebstrap are needed"),
    pytest.mark.timeout(1500),
]


@pytest.fixture(scope="module")
def image() -> str:
    return build_image()


@pytest.fixture(scope="module")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Podman]:
    p = Podman(Path(tmp_path_factory.mktemp("podman")), f"img{secrets.token_hex(3)}")
    yield p
    p.cleanup()


def test_image_runs_as_non_root_with_the_magnetar_entry_point(image: str, podman: Podman) -> None:
    out = podman.run("run", "--rm", "--entrypoint", "id", image).stdout
    assert out.startswith("uid=10001(magnetar) gid=10001(magnetar)")
    help_text = podman.run("run", "--rm", image, "--help").stdout
    for command in ("standalone", "broker", "bookie", "initialize-cluster-metadata", "operator", "autorecovery"):
        assert command in help_text
    config = json.loads(podman.run("image", "inspect", image).stdout)[0]["Config"]
    assert config["Entrypoint"] == ["magnetar"] and config["Cmd"][0] == "standalone"


def test_standalone_inside_official_client_outside(image: str, podman: Podman) -> None:
    port, http = free_port(), free_port()
    name = f"{podman.owner}-standalone"
    # Same port inside and out: the broker advertises 127.0.0.1:<port>, which the client then uses.
    podman.run("run", "-d", "--name", name, "--label", f"harness={podman.owner}",
               "-p", f"127.0.0.1:{port}:{port}", "-p", f"127.0.0.1:{http}:{http}", image,
               "standalone", "--data-dir=/data", f"--port={port}", f"--http-port={http}",
               "--advertised-address=127.0.0.1")  # fmt: skip
    deadline = time.monotonic() + 120
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{http}/admin/v2/brokers/health", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        assert time.monotonic() < deadline, podman.run("logs", name, check=False).stderr[-3000:]
        time.sleep(1)

    import pulsar

    client = pulsar.Client(f"pulsar://127.0.0.1:{port}", operation_timeout_seconds=20,
                           logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))  # fmt: skip
    try:
        topic = "persistent://public/default/image-smoke"
        consumer = client.subscribe(topic, "smoke", initial_position=pulsar.InitialPosition.Earliest)
        producer = client.create_producer(topic)
        for i in range(10):
            producer.send(f"m-{i}".encode())
        got = [consumer.receive(timeout_millis=10_000).data().decode() for _ in range(10)]
        assert got == [f"m-{i}" for i in range(10)]
    finally:
        client.close()
    # Data lives in the /data volume (owned by the image's user).
    listing = podman.run("exec", name, "ls", "/data").stdout.split()
    assert listing, "standalone wrote nothing to /data"
