"""The Spark job image, built with podman (manifests/spark/build-image.sh) and smoke-tested: the executor
branch of its entrypoint starts the image's real JVM with Spark's SPARK_JAVA_OPT_* options, and the example
job streams a topic of the (host's) broker into Parquet inside the container."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import StandaloneProcess

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "manifests" / "spark" / "build-image.sh"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (shutil.which("podman") and shutil.which("mmdebstrap") and os.geteuid() == 0),
        reason="needs podman and mmdebstrap as root (see /work/shared/README.md §5 in the team notes)",
    ),
]


def _podman() -> list[str]:
    return ["podman", "--runtime", "runc", "--cgroup-manager=cgroupfs"]


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> str:
    done = subprocess.run([str(BUILD)], capture_output=True, text=True, timeout=1800, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


def _run(image: str, *args: str, env: dict[str, str] | None = None, **kw: Any) -> subprocess.CompletedProcess[str]:
    conf = Path(os.environ.get("XDG_RUNTIME_DIR", "/tmp")) / "magnetar-podman" / "containers.conf"
    cmd = [*_podman(), "run", "--rm", *(f"--env={k}={v}" for k, v in (env or {}).items()), *kw.pop("opts", []), image]
    return subprocess.run(
        [*cmd, *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={**os.environ, "CONTAINERS_CONF": str(conf)},
    )


def test_executor_entrypoint_starts_the_images_java_with_spark_options(image: str) -> None:
    # `-version` as the first option: the real JVM prints its version and exits before the executor class
    # would try to reach a driver, which proves JAVA_HOME resolves and the options come first, in order.
    env = {
        "SPARK_JAVA_OPT_0": "-version",
        "SPARK_JAVA_OPT_1": "-Dspark.driver.port=7078",
        "SPARK_EXECUTOR_MEMORY": "512m",
        "SPARK_DRIVER_URL": "spark://CoarseGrainedScheduler@nowhere:7078",
        "SPARK_EXECUTOR_ID": "1",
        "SPARK_EXECUTOR_CORES": "1",
        "SPARK_APPLICATION_ID": "smoke",
        "SPARK_EXECUTOR_POD_IP": "127.0.0.1",
    }
    done = _run(image, "executor", env=env)
    assert done.returncode == 0, done.stderr
    assert 'version "17' in done.stderr


def test_example_job_runs_in_the_image(
    image: str, standalone: StandaloneProcess, client: Any, topic_name: str, tmp_path: Path
) -> None:
    producer = client.create_producer(topic_name)
    for i in range(20):
        producer.send(f"img{i}".encode())
    producer.close()
    data = tmp_path / "data"
    data.mkdir()
    data.chmod(0o777)  # the image runs as Spark's uid 185
    done = _run(
        image,
        "python3",
        "/opt/magnetar/examples/topic_to_parquet.py",
        "--master=local[1]",
        f"--service-url={standalone.service_url}",
        f"--admin-url={standalone.http_url}",
        f"--topics={topic_name}",
        "--output=/data/out",
        "--checkpoint=/data/ckpt",
        env={"SPARK_LOCAL_IP": "127.0.0.1"},
        opts=["--network=host", f"--volume={data}:/data"],
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert "replaced a statically registered" not in done.stderr  # auto-registered, not registered twice
    import pyarrow.parquet as pq

    values = sorted(v.decode() for v in pq.read_table(data / "out").column("value").to_pylist())
    assert values == sorted(f"img{i}" for i in range(20))


def test_images_spark_python_processes_import_bytecode(image: str) -> None:
    # Spark's Python processes (a planner per streaming query, the workers) import pyspark and py4j from
    # $SPARK_HOME/python/lib/*.zip, first on their path. The image replaces each zip by a compiled directory
    # of that name (`precompile --unpack`): no compiling at every start, and no re-reading of a zip's index
    # when Spark's runner invalidates the import caches. Unchecked hash-based pycs (flags 1) are used as
    # they are, without reading the source.
    code = (
        "import os, py4j.java_gateway as g, pyspark.sql.streaming.python_streaming_source_runner as m; "
        "[print(x.__file__, os.path.isdir(x.__file__.split('.zip/')[0] + '.zip'), "
        "int.from_bytes(open(x.__cached__, 'rb').read(8)[4:8], 'little')) for x in (m, g)]"
    )
    path = "$(ls -d /opt/spark/python/lib/*.zip | paste -sd:)"  # pyspark's and py4j's, as Spark sets it
    done = _run(image, "bash", "-c", f'PYTHONPATH={path} PYTHONDONTWRITEBYTECODE=1 python3 -c "{code}"')
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line.split() for line in done.stdout.splitlines()]
    assert len(rows) == 2, done.stdout
    for file, unpacked, flags in rows:
        assert "/opt/spark/python/lib/" in file and ".zip/" in file and file.endswith(".py"), file
        assert unpacked == "True" and flags == "1", (file, unpacked, flags)
