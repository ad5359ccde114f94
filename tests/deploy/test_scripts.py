"""Static checks of the shell scripts (scripts/): shellcheck, and the kind script applies what the tests
render (the chart with cluster.enabled, the samples). kind itself cannot run in this sandbox (its node
image cannot be pulled), so scripts/kind-smoke.sh is never executed here."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((ROOT / "scripts").glob("*.sh"))


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck not installed")
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_shellcheck_clean(script: Path) -> None:
    # -x from the repository root: the scripts run from there and source scripts/podman-lib.sh.
    result = subprocess.run(
        ["shellcheck", "-x", "--severity=info", str(script)], capture_output=True, text=True, cwd=ROOT
    )
    assert result.returncode == 0, result.stdout


def test_kind_script_uses_the_chart_and_samples_the_tests_render() -> None:
    text = (ROOT / "scripts" / "kind-smoke.sh").read_text()
    assert "helm install magnetar-operator charts/magnetar-operator" in text
    assert "--set cluster.enabled=true" in text
    assert "magnetarcluster/magnetar --for=condition=Ready" in text
    for sample in ("retentionpolicy", "tenant", "topicnamespace", "topic"):
        assert (ROOT / "manifests" / "samples" / f"{sample}.yaml").exists()
    assert "pulsar://magnetar-broker:6650" in text
