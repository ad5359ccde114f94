"""Admission of the emulated API server (:mod:`tests.operator.admission`) on its own: defaults, pruning and
``fieldValidation`` modes, CEL transition rules only on updates, and the OpenAPI v3 documents kubectl reads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.operator.admission import Admission, AdmissionError, StrictDecodingError

ROOT = Path(__file__).resolve().parents[2]

CRD: dict[str, Any] = {
    "spec": {
        "group": "example.io", "scope": "Namespaced", "names": {"kind": "Widget", "plural": "widgets"},
        "versions": [{"name": "v1", "schema": {"openAPIV3Schema": {
            "type": "object",
            "properties": {
                "apiVersion": {"type": "string"}, "kind": {"type": "string"}, "metadata": {"type": "object"},
                "spec": {
                    "type": "object",
                    "properties": {
                        "size": {"type": "integer", "default": 1, "x-kubernetes-validations": [
                            {"rule": "self >= oldSelf", "message": "size may only grow"}]},
                        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                        "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                    },
                },
            },
        }}}],
    }
}  # fmt: skip


def widget(spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "example.io/v1", "kind": "Widget", "metadata": {"name": "w"}, "spec": spec}


@pytest.fixture
def admission() -> Admission:
    adm = Admission()
    adm.register(CRD)
    return adm


def test_defaults_and_pruning_with_each_field_validation_mode(admission: Admission) -> None:
    obj = widget({"labels": {"a": "b"}, "free": {"any": {"thing": 1}}, "bogus": 1})
    stored, warnings = admission.admit("example.io", "v1", "widgets", obj, None)  # server default: Warn
    assert stored["spec"] == {"size": 1, "labels": {"a": "b"}, "free": {"any": {"thing": 1}}}
    assert warnings == ['unknown field "spec.bogus"']
    assert admission.admit("example.io", "v1", "widgets", obj, None, "Ignore")[1] == []
    with pytest.raises(StrictDecodingError) as refused:
        admission.admit("example.io", "v1", "widgets", obj, None, "Strict")
    assert refused.value.status()["code"] == 400
    assert 'strict decoding error: unknown field "spec.bogus"' in refused.value.message


def test_transition_rules_apply_to_updates_only(admission: Admission) -> None:
    admission.admit("example.io", "v1", "widgets", widget({"size": 1}), None)
    with pytest.raises(AdmissionError) as refused:
        admission.admit("example.io", "v1", "widgets", widget({"size": 1}), widget({"size": 3}))
    status = refused.value.status()
    assert status["code"] == 422 and status["reason"] == "Invalid"
    assert status["message"] == 'Widget.example.io "w" is invalid: spec.size: Invalid value: size may only grow'
    assert status["details"]["causes"][0]["field"] == "spec.size"
    with pytest.raises(AdmissionError, match=r"spec\.size"):
        admission.admit("example.io", "v1", "widgets", widget({"size": "big"}), None)


def test_unknown_kinds_are_admitted_as_they_are(admission: Admission) -> None:
    admission.add_type("", "v1", "ConfigMap", "configmaps", True)
    obj = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"x": "y"}, "odd": 1}
    assert admission.admit("", "v1", "configmaps", obj, None, "Strict") == (obj, [])


def test_openapi_v3_documents_offer_field_validation(admission: Admission) -> None:
    for path in sorted((ROOT / "crds").glob("magnetar.io_*.yaml")):
        admission.register(yaml.safe_load(path.read_text()))
    root = admission.openapi_root()["paths"]
    url = root["apis/magnetar.io/v1alpha1"]["serverRelativeURL"]
    assert url.startswith("/openapi/v3/apis/magnetar.io/v1alpha1?hash=")
    doc = admission.openapi_group("magnetar.io", "v1alpha1")
    assert doc is not None
    patch = doc["paths"]["/apis/magnetar.io/v1alpha1/namespaces/{namespace}/topics/{name}"]["patch"]
    assert patch["x-kubernetes-group-version-kind"] == {"group": "magnetar.io", "version": "v1alpha1", "kind": "Topic"}
    assert "fieldValidation" in [p["name"] for p in patch["parameters"]]
    assert "io.magnetar.v1alpha1.Topic" in doc["components"]["schemas"]
