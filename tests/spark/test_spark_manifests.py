"""Offline checks of the Spark job templates in manifests/spark (no cluster, no Spark)."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy import tools

REPO = Path(__file__).resolve().parents[2]
SPARK_DIR = REPO / "manifests" / "spark"


def _docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((SPARK_DIR / name).read_text()) if d]


def _example() -> Any:
    spec = importlib.util.spec_from_file_location("topic_to_parquet", REPO / "examples" / "topic_to_parquet.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _app_args(main_file: str, args: list[str]) -> None:
    """The main file is the example as installed in the image, and it accepts the arguments."""
    assert main_file == "local:///opt/magnetar/examples/topic_to_parquet.py"
    parsed = _example().parse_args(args)
    assert parsed.topics and parsed.output.startswith("/data/") and parsed.checkpoint.startswith("/data/")
    assert parsed.trigger == "available-now" or parsed.trigger.startswith("once-per:")


def test_spark_application() -> None:
    docs = _docs("sparkapplication.yaml")
    assert tools.validate_builtin([d for d in docs if d["kind"] != "SparkApplication"]) == []
    (app,) = [d for d in docs if d["kind"] == "SparkApplication"]
    assert app["apiVersion"] == "sparkoperator.k8s.io/v1beta2"
    spec = app["spec"]
    assert spec["type"] == "Python" and spec["mode"] == "cluster" and spec["image"]
    assert spec["sparkVersion"].startswith("4.")
    assert spec["restartPolicy"]["type"] == "Always"  # a streaming query: restart from the checkpoint
    assert all(isinstance(v, str) for v in spec["sparkConf"].values())
    _app_args(spec["mainApplicationFile"], spec["arguments"])
    volumes = {v["name"]: v for v in spec["volumes"]}
    claims = {d["metadata"]["name"] for d in docs if d["kind"] == "PersistentVolumeClaim"}
    for role in ("driver", "executor"):
        assert spec[role]["cores"] >= 1 and spec[role]["memory"]
        for mount in spec[role]["volumeMounts"]:
            assert volumes[mount["name"]]["persistentVolumeClaim"]["claimName"] in claims
    assert spec["executor"]["instances"] >= 1 and spec["driver"]["serviceAccount"]


def test_spark_submit_job_and_pod_templates() -> None:
    docs = _docs("spark-submit-job.yaml")
    assert tools.validate_builtin(docs) == []
    (job,) = [d for d in docs if d["kind"] == "Job"]
    (templates,) = [d for d in docs if d["kind"] == "ConfigMap"]
    pods = {k: yaml.safe_load(v) for k, v in templates["data"].items()}
    # Pod templates are built-in Pods too: validate them strictly.
    assert tools.validate_builtin(list(pods.values())) == []
    assert pods["driver.yaml"]["spec"]["containers"][0]["name"] == "spark-kubernetes-driver"
    assert pods["executor.yaml"]["spec"]["containers"][0]["name"] == "spark-kubernetes-executor"
    container = job["spec"]["template"]["spec"]["containers"][0]
    args = container["args"]
    assert args[0] == "spark-submit" and any(a.startswith("--master=k8s://") for a in args)
    confs = dict(a.removeprefix("--conf=").split("=", 1) for a in args if a.startswith("--conf="))
    assert confs["spark.kubernetes.driver.podTemplateFile"] == "/templates/driver.yaml"
    assert confs["spark.kubernetes.executor.podTemplateFile"] == "/templates/executor.yaml"
    assert "--deploy-mode=cluster" in args
    main_index = next(i for i, a in enumerate(args) if a.startswith("local://"))
    _app_args(args[main_index], args[main_index + 1 :])
    sa = job["spec"]["template"]["spec"]["serviceAccountName"]
    assert {d["metadata"]["name"] for d in docs if d["kind"] == "ServiceAccount"} == {sa}
    claim = pods["driver.yaml"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"]
    assert claim in {d["metadata"]["name"] for d in docs if d["kind"] == "PersistentVolumeClaim"}


def _args_of(args: list[str], flag: str) -> str:
    (value,) = [a.split("=", 1)[1] for a in args if a.startswith(f"--{flag}=")]
    return value


@pytest.mark.parametrize("name", ["sparkapplication.yaml", "spark-submit-job.yaml"])
def test_templates_point_at_the_operators_broker_service_and_keep_the_topic(name: str) -> None:
    """One naming convention with the operator (``<cluster>-broker.<namespace>.svc``); a durable subscription;
    a volume both driver and executors (on other nodes) can write, as Spark's uid."""
    from magnetar.operator.config import DEFAULT_CLUSTER_URL_TEMPLATE

    docs = _docs(name)
    if name == "sparkapplication.yaml":
        (app,) = [d for d in docs if d["kind"] == "SparkApplication"]
        args = app["spec"]["arguments"]
        security = [app["spec"][role]["podSecurityContext"] for role in ("driver", "executor")]
    else:
        (job,) = [d for d in docs if d["kind"] == "Job"]
        args = job["spec"]["template"]["spec"]["containers"][0]["args"]
        (templates,) = [d for d in docs if d["kind"] == "ConfigMap"]
        security = [yaml.safe_load(v)["spec"]["securityContext"] for v in templates["data"].values()]
    admin = DEFAULT_CLUSTER_URL_TEMPLATE.format(name="magnetar", namespace="magnetar")
    assert _args_of(args, "admin-url") == admin
    assert _args_of(args, "service-url") == admin.replace("http://", "pulsar://").replace(":8080", ":6650")
    assert _args_of(args, "commit-subscription")
    assert all(s["fsGroup"] == 185 and s["runAsUser"] == 185 for s in security)
    for claim in (d for d in docs if d["kind"] == "PersistentVolumeClaim"):
        assert claim["spec"]["accessModes"] == ["ReadWriteMany"]


def test_image_has_no_architecture_specific_paths() -> None:
    text = (SPARK_DIR / "Dockerfile").read_text()
    assert "/usr/lib/jvm/java-17-openjdk-" not in text  # named after the build machine's architecture
    assert "JAVA_HOME=/opt/java" in text


def test_entrypoint_passes_spark_java_options_to_the_executor(tmp_path: Path) -> None:
    """Spark's executor JVM options (SPARK_JAVA_OPT_<n>, in numeric order) reach the executor's java command."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    argv_file = tmp_path / "argv"
    fake = bin_dir / "java"
    fake.write_text(f'#!/usr/bin/env bash\nprintf "%s\\n" "$@" > {argv_file}\n')
    fake.chmod(0o755)
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "SPARK_HOME": "/opt/spark",
        "SPARK_EXECUTOR_MEMORY": "1g",
        "SPARK_DRIVER_URL": "spark://CoarseGrainedScheduler@driver-svc:7078",
        "SPARK_EXECUTOR_ID": "3",
        "SPARK_EXECUTOR_CORES": "1",
        "SPARK_APPLICATION_ID": "spark-app-1",
        "SPARK_EXECUTOR_POD_IP": "10.0.0.5",
        "SPARK_JAVA_OPT_0": "-Djava.net.preferIPv6Addresses=false",
        "SPARK_JAVA_OPT_1": "--add-opens=java.base/java.nio=ALL-UNNAMED",
        "SPARK_JAVA_OPT_10": "-Dspark.driver.port=7078",
        "SPARK_JAVA_OPT_2": "-Dio.netty.tryReflectionSetAccessible=true",
    }
    done = subprocess.run(
        ["bash", str(SPARK_DIR / "entrypoint.sh"), "executor"], env=env, capture_output=True, timeout=30, check=False
    )
    assert done.returncode == 0, done.stderr.decode()
    argv = argv_file.read_text().splitlines()
    assert argv[:4] == [
        "-Djava.net.preferIPv6Addresses=false",
        "--add-opens=java.base/java.nio=ALL-UNNAMED",
        "-Dio.netty.tryReflectionSetAccessible=true",
        "-Dspark.driver.port=7078",
    ]
    main = argv.index("org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend")
    assert argv[main - 2 : main] == ["-cp", ":/opt/spark/jars/*"]
    assert argv[argv.index("--executor-id") + 1] == "3" and argv[argv.index("--hostname") + 1] == "10.0.0.5"
    # With JAVA_HOME set (the image sets it), that java is used.
    env["JAVA_HOME"] = str(tmp_path)
    argv_file.unlink()
    done = subprocess.run(
        ["bash", str(SPARK_DIR / "entrypoint.sh"), "executor"], env=env, capture_output=True, timeout=30
    )
    assert argv_file.exists(), done.stderr.decode()


def test_image_context_includes_every_package() -> None:
    """The Spark image's build context lets in at least what the project image's does (all packages)."""

    def allowed(path: Path) -> set[str]:
        return {line[1:] for line in path.read_text().splitlines() if line.startswith("!")}

    spark = allowed(SPARK_DIR / "Dockerfile.dockerignore")
    assert allowed(REPO / ".dockerignore") <= spark
    assert {"examples/", "manifests/spark/entrypoint.sh"} <= spark
