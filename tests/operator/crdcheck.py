"""Validate custom resources against the CRDs in ``crds/`` offline: the openAPIV3Schema with a JSON-schema
validator, then every ``x-kubernetes-validations`` CEL rule with ``cel-python`` (transition rules, those
using ``oldSelf``, only when an old object is given and the field exists in both, as the API server does).

Differences from a real API server: Kubernetes' CEL extension libraries (quantity, lists, regex helpers)
are not available (the CRDs use none), CEL cost limits are not computed, and the ``int64``/``int32``
formats are not range-checked beyond the schema's minimum/maximum.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import celpy
import jsonschema
import yaml

CRD_DIR = Path(__file__).resolve().parents[2] / "crds"


@cache
def schemas() -> dict[str, dict[str, Any]]:
    """Kind -> openAPIV3Schema of the served version."""
    out = {}
    for path in sorted(CRD_DIR.glob("magnetar.io_*.yaml")):
        crd = yaml.safe_load(path.read_text())
        out[crd["spec"]["names"]["kind"]] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return out


_ENV = celpy.Environment()


@cache
def _program(rule: str) -> Any:
    return _ENV.program(_ENV.compile(rule))


def _cel_errors(schema: dict[str, Any], new: Any, old: Any, path: str, out: list[str]) -> None:
    for rule in schema.get("x-kubernetes-validations", []):
        uses_old = "oldSelf" in rule["rule"]
        if uses_old and old is None:
            continue
        activation = {"self": celpy.json_to_cel(new)}
        if uses_old:
            activation["oldSelf"] = celpy.json_to_cel(old)
        try:
            result = _program(rule["rule"]).evaluate(activation)
        except celpy.CELEvalError as exc:  # an evaluation error rejects the object, as in Kubernetes
            result = exc
        if not (isinstance(result, celpy.celtypes.BoolType) and bool(result)):
            out.append(f"{path or '<root>'}: {rule['message']}")
    if schema.get("type") == "object" and isinstance(new, dict):
        for key, sub in (schema.get("properties") or {}).items():
            if key in new:
                old_sub = old.get(key) if isinstance(old, dict) else None
                _cel_errors(sub, new[key], old_sub, f"{path}.{key}", out)
    elif schema.get("type") == "array" and isinstance(new, list) and "items" in schema:
        for i, item in enumerate(new):
            _cel_errors(schema["items"], item, None, f"{path}[{i}]", out)


def validate(obj: dict[str, Any], old: dict[str, Any] | None = None) -> list[str]:
    """Reasons the API server would reject ``obj`` (an update of ``old`` when given); empty = accepted."""
    return check(schemas()[obj["kind"]], obj, old)


def check(schema: dict[str, Any], obj: dict[str, Any], old: dict[str, Any] | None = None) -> list[str]:
    """Reasons ``obj`` breaks ``schema`` (an openAPIV3Schema) and its CEL rules; empty = accepted."""
    errors = [
        f"{'.'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}"
        for e in jsonschema.Draft7Validator(schema).iter_errors(obj)
    ]
    if not errors:
        _cel_errors(schema, obj, old, "", errors)
    return errors
