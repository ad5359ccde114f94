"""Offline checks of the Spark job templates in manifests/spark (no cluster, no Spark)."""

from __future__ import annotations

import importlib.util
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


@pytest.mark.parametrize("path", ["Dockerfile", "entrypoint.sh"])
def test_image_files_present(path: str) -> None:
    text = (SPARK_DIR / path).read_text()
    assert "spark" in text.lower()
