"""The Kubernetes API emulator's semantics that kopf and kubectl depend on (see kubeemu's docstring)."""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.operator.kubeemu import EmulatorThread

CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.example.io"},
    "spec": {
        "group": "example.io",
        "scope": "Namespaced",
        "names": {"kind": "Widget", "plural": "widgets", "singular": "widget", "shortNames": ["wd"]},
        "versions": [{"name": "v1", "served": True, "storage": True, "subresources": {"status": {}}}],
    },
}
BASE = "/apis/example.io/v1/namespaces/ns1/widgets"


@pytest.fixture(scope="module")
def emu() -> Iterator[EmulatorThread]:
    thread = EmulatorThread().start()
    yield thread
    thread.stop()


def call(emu: EmulatorThread, method: str, path: str, body: Any = None, ctype: str = "application/json") -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(emu.url + path, data=data, method=method, headers={"Content-Type": ctype})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def test_discovery_and_crd_registration_through_the_api(emu: EmulatorThread) -> None:
    status, core = call(emu, "GET", "/api/v1")
    assert status == 200 and core["groupVersion"] == "v1"
    assert {"namespaces", "secrets", "events"} <= {r["name"] for r in core["resources"]}
    assert call(emu, "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", CRD)[0] == 201
    status, groups = call(emu, "GET", "/apis")
    assert "example.io" in {g["name"] for g in groups["groups"]}
    status, resources = call(emu, "GET", "/apis/example.io/v1")
    assert {r["name"] for r in resources["resources"]} == {"widgets", "widgets/status"}
    status, _ = call(emu, "POST", "/api/v1/namespaces", {"metadata": {"name": "ns1"}})
    assert status == 201
    assert [n["metadata"]["name"] for n in call(emu, "GET", "/api/v1/namespaces")[1]["items"]] == ["ns1"]


def test_create_update_status_and_generation(emu: EmulatorThread) -> None:
    status, obj = call(emu, "POST", BASE, {"metadata": {"name": "w1", "labels": {"app": "a"}},
                                           "spec": {"size": 1}, "status": {"ignored": True}})  # fmt: skip
    assert status == 201
    meta = obj["metadata"]
    assert meta["uid"] and meta["resourceVersion"] and meta["creationTimestamp"] and meta["generation"] == 1
    assert meta["namespace"] == "ns1" and "status" not in obj  # status dropped on create
    assert call(emu, "POST", BASE, {"metadata": {"name": "w1"}})[0] == 409
    # Main resource: spec changes bump the generation, status changes are ignored.
    _, obj = call(emu, "PATCH", f"{BASE}/w1", {"spec": {"size": 2}, "status": {"x": 1}}, "application/merge-patch+json")
    assert obj["metadata"]["generation"] == 2 and "status" not in obj
    # /status: only status changes, generation stays.
    _, obj = call(emu, "PATCH", f"{BASE}/w1/status", {"status": {"ok": True}, "spec": {"size": 9}},
                  "application/merge-patch+json")  # fmt: skip
    assert obj["status"] == {"ok": True} and obj["spec"] == {"size": 2} and obj["metadata"]["generation"] == 2
    # Metadata changes do not bump the generation.
    _, obj = call(emu, "PATCH", f"{BASE}/w1", {"metadata": {"annotations": {"a": "b"}}}, "application/merge-patch+json")
    assert obj["metadata"]["generation"] == 2
    # PUT with a stale resourceVersion is a conflict.
    stale = {**obj, "metadata": {**obj["metadata"], "resourceVersion": "1"}}
    assert call(emu, "PUT", f"{BASE}/w1", stale)[0] == 409
    assert call(emu, "PUT", f"{BASE}/w1", {**obj, "spec": {"size": 3}})[1]["metadata"]["generation"] == 3


def test_label_selectors_and_json_patch_test(emu: EmulatorThread) -> None:
    call(emu, "POST", BASE, {"metadata": {"name": "w2", "labels": {"app": "b", "tier": "x"}}})
    names = lambda q: [o["metadata"]["name"] for o in call(emu, "GET", f"{BASE}?{q}")[1]["items"]]  # noqa: E731
    assert names("labelSelector=app%3Db") == ["w2"]
    assert names("labelSelector=app%21%3Db") == ["w1"]
    assert names("labelSelector=tier") == ["w2"]
    assert names("labelSelector=app%20in%20(a,b)") == ["w1", "w2"]
    assert names("fieldSelector=metadata.name%3Dw1") == ["w1"]
    patch = [{"op": "test", "path": "/metadata/labels/app", "value": "zzz"},
             {"op": "replace", "path": "/metadata/labels/app", "value": "c"}]  # fmt: skip
    assert call(emu, "PATCH", f"{BASE}/w2", patch, "application/json-patch+json")[0] == 422
    patch[0]["value"] = "b"
    status, obj = call(emu, "PATCH", f"{BASE}/w2", patch, "application/json-patch+json")
    assert status == 200 and obj["metadata"]["labels"]["app"] == "c"


def test_watch_replays_from_a_resource_version_and_times_out(emu: EmulatorThread) -> None:
    rv = call(emu, "GET", BASE)[1]["metadata"]["resourceVersion"]
    call(emu, "PATCH", f"{BASE}/w2", {"spec": {"n": 1}}, "application/merge-patch+json")
    started = time.monotonic()
    with urllib.request.urlopen(f"{emu.url}{BASE}?watch=true&resourceVersion={rv}&timeoutSeconds=1", timeout=10) as r:
        events = [json.loads(line) for line in r.read().splitlines() if line.strip()]
    assert time.monotonic() - started < 5
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("MODIFIED", "w2")]
    got: list[dict[str, Any]] = []

    def watch() -> None:
        url = f"{emu.url}{BASE}?watch=1&timeoutSeconds=2&labelSelector=app%3Dc"
        with urllib.request.urlopen(url, timeout=10) as r:
            got.extend(json.loads(line) for line in r.read().splitlines() if line.strip())

    thread = threading.Thread(target=watch)
    thread.start()
    time.sleep(0.5)
    call(emu, "PATCH", f"{BASE}/w1", {"spec": {"n": 2}}, "application/merge-patch+json")  # not selected
    call(emu, "PATCH", f"{BASE}/w2", {"spec": {"n": 3}}, "application/merge-patch+json")
    thread.join(10)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in got] == [("ADDED", "w2"), ("MODIFIED", "w2")]


def test_finalizers_hold_deletion(emu: EmulatorThread) -> None:
    call(emu, "POST", BASE, {"metadata": {"name": "w3", "finalizers": ["x/y"]}})
    status, obj = call(emu, "DELETE", f"{BASE}/w3")
    assert status == 200 and obj["metadata"]["deletionTimestamp"]
    assert call(emu, "GET", f"{BASE}/w3")[0] == 200
    call(emu, "PATCH", f"{BASE}/w3", {"metadata": {"finalizers": None}}, "application/merge-patch+json")
    assert call(emu, "GET", f"{BASE}/w3")[0] == 404
    call(emu, "POST", BASE, {"metadata": {"name": "w4"}})
    assert call(emu, "DELETE", f"{BASE}/w4")[0] == 200
    assert call(emu, "GET", f"{BASE}/w4")[0] == 404


def test_generation_bumps_for_admitted_custom_resources(emu: EmulatorThread) -> None:
    """A CRD with a schema goes through admission (which returns a new, pruned object); the generation must
    still move with spec changes (it once stayed 1, so kopf and the operator never saw a new generation)."""
    import yaml

    crd = yaml.safe_load((Path(__file__).resolve().parents[2] / "crds" / "magnetar.io_tenant.yaml").read_text())
    assert call(emu, "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)[0] == 201
    base = "/apis/magnetar.io/v1alpha1/namespaces/ns1/tenants"
    tenant = {"apiVersion": "magnetar.io/v1alpha1", "kind": "Tenant", "metadata": {"name": "t1"},
              "spec": {"clusterRef": {"name": "c"}}}  # fmt: skip
    status, obj = call(emu, "POST", base, tenant)
    assert status == 201 and obj["metadata"]["generation"] == 1
    _, obj = call(emu, "PATCH", f"{base}/t1", {"spec": {"adminRoles": ["ops"]}}, "application/merge-patch+json")
    assert obj["spec"]["adminRoles"] == ["ops"] and obj["metadata"]["generation"] == 2
    assert call(emu, "GET", f"{base}/t1")[1]["metadata"]["generation"] == 2


def test_generate_name_never_clashes_with_a_taken_name(emu: EmulatorThread) -> None:
    """kopf posts every event as ``generateName: kopf-event-``; a clash answered 409 and kopf dropped the event
    (a CI run missed a "Decommissioned" event that way). kube-apiserver draws 5 characters of a 27-letter
    alphabet and, since 1.32, draws again while the name is taken: 4,000 events all get created, with distinct
    names of the apiserver's shape. (5 hex digits, the emulator's old suffix, clash within 4,000 names with
    probability 0.9995.)"""
    from concurrent.futures import ThreadPoolExecutor

    assert call(emu, "POST", "/api/v1/namespaces", {"metadata": {"name": "gen"}})[0] in (201, 409)
    event = {"metadata": {"generateName": "kopf-event-"}, "reason": "R", "message": "m"}

    def post(_: int) -> int:
        return call(emu, "POST", "/api/v1/namespaces/gen/events", event)[0]

    with ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(post, range(4000)))
    assert statuses.count(201) == 4000, {s: statuses.count(s) for s in set(statuses)}
    names = [e["metadata"]["name"] for e in call(emu, "GET", "/api/v1/namespaces/gen/events")[1]["items"]]
    assert len(set(names)) == 4000
    assert all(re.fullmatch(r"kopf-event-[bcdfghjklmnpqrstvwxz2456789]{5}", n) for n in names)
    long_prefix = "x" * 70
    status, made = call(emu, "POST", "/api/v1/namespaces/gen/events", {"metadata": {"generateName": long_prefix}})
    assert status == 201 and len(made["metadata"]["name"]) == 63
