"""The Argo CD health checks (manifests/argocd/health.lua), run in a real Lua 5.1 interpreter.

Argo CD evaluates health scripts with gopher-lua, a Lua 5.1 implementation, so the scripts run
here under lupa's Lua 5.1 runtime: a Lua 5.2+ feature (goto, integer division, ...) fails.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest
from lupa import lua51 as lupa_lua51

from magnetar.operator import reconcile
from tests.deploy import tools

#: Globals Argo CD's sandbox does not offer (it opens only the safe standard libraries); removed
#: before running a script so that a script relying on them fails here too.
UNSAFE_GLOBALS = ("os", "io", "require", "dofile", "loadfile", "load", "loadstring", "module", "package", "debug")


def to_lua(runtime: Any, value: Any) -> Any:
    if isinstance(value, dict):
        table = runtime.table()
        for key, item in value.items():
            table[key] = to_lua(runtime, item)
        return table
    if isinstance(value, list):
        table = runtime.table()
        for index, item in enumerate(value, start=1):
            table[index] = to_lua(runtime, item)
        return table
    if isinstance(value, int) and not isinstance(value, bool):
        return float(value)  # JSON numbers reach gopher-lua as float64
    return value


def health(kind: str, obj: dict[str, Any]) -> tuple[str, str]:
    runtime = lupa_lua51.LuaRuntime(unpack_returned_tuples=True)
    lua_globals = runtime.globals()
    for name in UNSAFE_GLOBALS:
        lua_globals[name] = None
    lua_globals["obj"] = to_lua(runtime, obj)
    result = runtime.execute(tools.health_script_path(kind).read_text())
    assert result is not None, "the script must return the hs table"
    return result["status"], result["message"]


def cond(kind: str, status: str, reason: str = "", message: str = "") -> dict[str, Any]:
    return {"type": kind, "status": status, "reason": reason, "message": message}


def resource(
    *conditions: dict[str, Any],
    generation: int | None = 3,
    observed: int | None = 3,
    annotations: dict[str, str] | None = None,
    status: bool = True,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "acme", "namespace": "apps"}
    if generation is not None:
        metadata["generation"] = generation
    if annotations is not None:
        metadata["annotations"] = annotations
    obj: dict[str, Any] = {"apiVersion": "magnetar.io/v1alpha1", "kind": "Tenant", "metadata": metadata, "spec": {}}
    if status:
        obj["status"] = {"conditions": list(conditions)}
        if observed is not None:
            obj["status"]["observedGeneration"] = observed
    return obj


READY = cond("Ready", "True", "Synced", "in sync with tenant acme")
NOT_RECONCILING = cond("Reconciling", "False", "Synced")
NOT_STALLED = cond("Stalled", "False", "Synced")

CASES: dict[str, tuple[dict[str, Any], str, str | None]] = {
    "ready": (resource(READY, NOT_RECONCILING, NOT_STALLED), "Healthy", "in sync with tenant acme"),
    "ready-without-other-conditions": (resource(READY), "Healthy", None),
    "no-status-yet": (resource(status=False), "Progressing", "Waiting for the operator to report status"),
    "status-without-conditions": (resource(observed=None), "Progressing", None),
    "spec-change-not-observed": (
        resource(READY, NOT_RECONCILING, NOT_STALLED, generation=4, observed=3),
        "Progressing",
        "Waiting for the operator to observe generation 4",
    ),
    "no-observed-generation": (resource(READY, observed=None), "Progressing", None),
    "reconciling": (
        resource(
            cond("Ready", "False", "ClusterUnreachable", "admin API down"),
            cond("Reconciling", "True", "ClusterUnreachable", "admin API down, retrying"),
            NOT_STALLED,
        ),
        "Progressing",
        "admin API down, retrying",
    ),
    "stalled": (
        resource(
            cond("Ready", "False", "NotSupported", "partitions cannot shrink"),
            NOT_RECONCILING,
            cond("Stalled", "True", "NotSupported", "partitions cannot shrink from 4 to 2"),
        ),
        "Degraded",
        "partitions cannot shrink from 4 to 2",
    ),
    "stalled-without-message": (resource(cond("Stalled", "True", "ResourceConflict")), "Degraded", "ResourceConflict"),
    "ready-false-permanent-reason": (
        resource(cond("Ready", "False", "ResourceConflict", "topic already managed by apps/other")),
        "Degraded",
        "topic already managed by apps/other",
    ),
    "ready-false-invalid-spec": (resource(cond("Ready", "False", "InvalidSpec", "bad spec")), "Degraded", "bad spec"),
    "permanent-reason-but-reconciling": (
        resource(
            cond("Ready", "False", "PropagationIncomplete", "not applied to apps/t1: ClusterUnreachable"),
            cond("Reconciling", "True", "PropagationIncomplete", "retrying"),
            NOT_STALLED,
        ),
        "Progressing",
        "retrying",
    ),
    "ready-false-transient-reason": (
        resource(cond("Ready", "False", "TenantMissing", "waiting for tenant acme")),
        "Progressing",
        "waiting for tenant acme",
    ),
    "ready-unknown": (resource(cond("Ready", "Unknown")), "Progressing", None),
    "no-ready-condition": (resource(NOT_RECONCILING), "Progressing", "Waiting for the Ready condition"),
    "paused": (
        resource(READY, annotations={"magnetar.io/paused": "true"}),
        "Suspended",
        "Reconciliation paused (annotation magnetar.io/paused=true)",
    ),
    "paused-before-any-status": (resource(status=False, annotations={"magnetar.io/paused": "true"}), "Suspended", None),
    "paused-while-stalled": (
        resource(cond("Stalled", "True", "NotSupported"), annotations={"magnetar.io/paused": "true"}),
        "Suspended",
        None,
    ),
    "pause-annotation-false": (resource(READY, annotations={"magnetar.io/paused": "false"}), "Healthy", None),
    "other-annotations": (resource(READY, annotations={"note": "x"}), "Healthy", None),
    "no-generation": (resource(READY, generation=None, observed=None), "Healthy", None),
}


@pytest.mark.parametrize("kind", tools.KINDS)
@pytest.mark.parametrize("case", list(CASES))
def test_health(kind: str, case: str) -> None:
    obj, expected_status, expected_message = CASES[case]
    obj = copy.deepcopy(obj)
    obj["kind"] = kind
    status, message = health(kind, obj)
    assert status == expected_status
    assert message, "Argo CD shows the message next to the status: never leave it empty"
    if expected_message is not None:
        assert message == expected_message


def test_statuses_match_the_operator_conditions() -> None:
    """The operator's own condition writer (magnetar.operator.reconcile) feeds the scripts."""
    outcomes = {
        "Healthy": reconcile.ok("in sync"),
        "Progressing": reconcile.waiting(reconcile.CLUSTER_UNREACHABLE, "admin API down"),
        "Degraded": reconcile.stalled(reconcile.NOT_SUPPORTED, "partitions cannot shrink"),
    }
    for expected, outcome in outcomes.items():
        obj = resource(*reconcile.conditions(None, outcome, generation=3), observed=3)
        for kind in tools.KINDS:
            assert health(kind, obj)[0] == expected, (kind, expected)


def test_every_permanent_reason_of_the_operator_is_listed() -> None:
    """The scripts' `permanent` table must know every reason the operator reports as permanent
    (`stalled(...)` in magnetar.operator), so Ready=False alone reads as Degraded too."""
    reasons = set()
    for path in (tools.ROOT / "operator").glob("*.py"):
        for ref in re.findall(r"\bstalled\(\s*(rc\.[A-Z_]+|\"[A-Za-z]+\")", path.read_text()):
            reasons.add(getattr(reconcile, ref[3:]) if ref.startswith("rc.") else ref.strip('"'))
    assert reasons, "found no stalled(...) calls: has the operator's API changed?"
    script = tools.health_script_path("Tenant").read_text()
    listed = set(re.findall(r"^  (\w+) = true,", script, flags=re.M))
    assert reasons <= listed, f"add {sorted(reasons - listed)} to the health scripts' permanent table"


def test_one_script_serves_every_kind() -> None:
    script = tools.ARGOCD_DIR / "health.lua"
    first = script.read_text().splitlines()[0]
    for kind in tools.KINDS:
        assert tools.health_script_path(kind) == script
        assert kind in first, f"the script's header must name {kind}"
    stale = sorted(p.name for p in tools.ARGOCD_DIR.glob("health-*.lua"))
    assert not stale, f"per-kind copies would drift from health.lua: {stale}"


@pytest.mark.parametrize("value", ["true", "True", " yes ", "1", "ON", "false", "0", "no", "", "paused"])
def test_pause_annotation_means_what_the_operator_reads(value: str) -> None:
    """The script and the operator agree on which annotation values pause a resource."""
    from magnetar.operator.engine import Resource

    obj = resource(READY, annotations={"magnetar.io/paused": value})
    operator_paused = Resource.from_body("Topic", obj).paused
    obj["kind"] = "Topic"
    assert (health("Topic", obj)[0] == "Suspended") == operator_paused, value
