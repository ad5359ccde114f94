"""Fixtures for the deployment tests: a helm binary (fetched once, cached) and rendering helpers."""

from __future__ import annotations

import pytest

from tests.deploy import tools


@pytest.fixture(scope="session")
def helm_bin() -> str:
    """A working helm. Skips (with the reason) only when no helm can be had on this machine."""
    try:
        path = tools.tool("helm")
    except tools.ToolUnavailable as exc:
        pytest.skip(f"no helm binary: {exc}")
    version = tools.helm("version", "--short")
    assert version.stdout.startswith("v3."), version.stdout
    return path


@pytest.fixture(scope="session")
def kubectl_bin(helm_bin: str) -> str:
    """kubectl comes from the same package as helm (only `kubectl kustomize` is used: no cluster)."""
    return tools.tool("kubectl")
