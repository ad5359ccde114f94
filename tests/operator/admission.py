"""Admission of custom resources for the emulated API server (:mod:`tests.operator.kubeemu`), as
kube-apiserver does it for CRDs on create, update and patch:

- defaults from the schema (``default``) filled in, unknown fields pruned (``metadata``, ``apiVersion`` and
  ``kind`` at the root excepted; ``x-kubernetes-preserve-unknown-fields`` keeps a subtree), or refused with
  ``fieldValidation=Strict`` (what ``kubectl apply`` sends by default: ``400 BadRequest``, strict decoding
  error) and reported as a ``Warning`` header with ``Warn`` (the server's default);
- the structural schema (types, enums, patterns, bounds, required) and every ``x-kubernetes-validations``
  CEL rule, transition rules (``oldSelf``) on updates only, through :mod:`tests.operator.crdcheck`;
- a refusal is ``422 Invalid`` with Kubernetes' message shape: ``Topic.magnetar.io "x" is invalid:
  spec.partitions: Invalid value: ...: partitions may only grow`` and one ``details.causes`` entry per error;
- OpenAPI v3 documents (``/openapi/v3`` and one per group version) built from the registered CRDs, with the
  ``fieldValidation`` query parameter on every write, so ``kubectl`` validates against the server
  instead of needing ``--validate=false``.

Not done (as documented in kubeemu): validation ratcheting, CEL cost limits, ``int32``/``int64`` ranges
beyond the schema's bounds, OpenAPI v2 (kubectl uses v3 when the server offers it).
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from tests.operator import crdcheck

_ROOT_KEPT = ("apiVersion", "kind", "metadata")


class AdmissionError(Exception):
    """A refused write: ``422 Invalid`` with the errors as causes."""

    def __init__(self, kind: str, group: str, name: str, errors: list[str]) -> None:
        self.errors, self.kind, self.group, self.name = errors, kind, group, name
        self.message = f'{kind}.{group} "{name}" is invalid: ' + ", ".join(errors)
        super().__init__(self.message)

    def status(self) -> dict[str, Any]:
        causes = [{"reason": "FieldValueInvalid", "message": e, "field": e.split(":", 1)[0]} for e in self.errors]
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": self.message,
                "reason": "Invalid", "code": 422,
                "details": {"name": self.name, "group": self.group, "kind": self.kind, "causes": causes}}  # fmt: skip


class StrictDecodingError(AdmissionError):
    """Unknown fields with ``fieldValidation=Strict``: ``400 BadRequest``, as kube-apiserver answers."""

    def __init__(self, kind: str, version: str, unknown: list[str]) -> None:
        fields = ", ".join(f'unknown field "{p}"' for p in unknown)
        self.errors, self.kind = [fields], kind
        self.message = f'{kind} in version "{version}" cannot be handled as a {kind}: strict decoding error: {fields}'
        Exception.__init__(self, self.message)

    def status(self) -> dict[str, Any]:
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": self.message,
                "reason": "BadRequest", "code": 400}  # fmt: skip


@dataclass
class _Served:
    group: str
    version: str
    kind: str
    plural: str
    namespaced: bool
    schema: dict[str, Any]


class Admission:
    """The registered CRDs' schemas, and admission of writes against them."""

    def __init__(self) -> None:
        self.served: dict[tuple[str, str, str], _Served] = {}

    def register(self, crd: dict[str, Any]) -> None:
        spec = crd["spec"]
        for version in spec["versions"]:
            schema = ((version.get("schema") or {}).get("openAPIV3Schema")) or {}
            served = _Served(spec["group"], version["name"], spec["names"]["kind"], spec["names"]["plural"],
                             spec.get("scope", "Namespaced") == "Namespaced", schema)  # fmt: skip
            self.served[(served.group, served.version, served.plural)] = served

    def add_type(self, group: str, version: str, kind: str, plural: str, namespaced: bool) -> None:
        """A built-in resource: listed in the OpenAPI documents with an open schema, admitted as is."""
        self.served.setdefault((group, version, plural), _Served(group, version, kind, plural, namespaced, {}))

    # ------------------------------------------------------------------------------------------ admission
    def admit(self, group: str, version: str, plural: str, new: dict[str, Any], old: dict[str, Any] | None,
              field_validation: str = "") -> tuple[dict[str, Any], list[str]]:  # fmt: skip
        """The object to store (defaulted, pruned) and warnings; raises :class:`AdmissionError`."""
        served = self.served.get((group, version, plural))
        if served is None or not served.schema:
            return new, []
        obj = copy.deepcopy(new)
        _default(served.schema, obj)
        unknown: list[str] = []
        _prune(served.schema, obj, "", unknown, root=True)
        name = (obj.get("metadata") or {}).get("name", "")
        mode = (field_validation or "Warn").capitalize()
        if unknown and mode == "Strict":
            raise StrictDecodingError(served.kind, version, unknown)
        errors = [_kube_message(e) for e in crdcheck.check(served.schema, obj, old)]
        if errors:
            raise AdmissionError(served.kind, group, name, errors)
        warnings = [f'unknown field "{p}"' for p in unknown] if mode == "Warn" else []
        return obj, warnings

    # ------------------------------------------------------------------------------------------ openapi
    def openapi_root(self) -> dict[str, Any]:
        paths = {}
        for group, version in sorted({(s.group, s.version) for s in self.served.values()}):
            doc = json.dumps(self.openapi_group(group, version), sort_keys=True).encode()
            digest = hashlib.sha512(doc).hexdigest()[:32].upper()
            prefix = f"apis/{group}/{version}" if group else f"api/{version}"
            paths[prefix] = {"serverRelativeURL": f"/openapi/v3/{prefix}?hash={digest}"}
        return {"paths": paths}

    def openapi_group(self, group: str, version: str) -> dict[str, Any] | None:
        served = [s for s in self.served.values() if (s.group, s.version) == (group, version)]
        if not served:
            return None
        params = [{"name": n, "in": "query", "schema": {"type": "string", "uniqueItems": True}}
                  for n in ("dryRun", "fieldManager", "fieldValidation")]  # fmt: skip
        paths: dict[str, Any] = {}
        schemas: dict[str, Any] = {}
        for s in served:
            gvk = {"group": s.group, "version": s.version, "kind": s.kind}
            ref = f"{'.'.join(reversed(s.group.split('.'))) or 'io.k8s.api.core'}.{s.version}.{s.kind}"
            open_schema = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
            schemas[ref] = {**(s.schema or open_schema), "x-kubernetes-group-version-kind": [gvk]}
            base = f"/apis/{s.group}/{s.version}" if s.group else f"/api/{s.version}"
            scope = base + ("/namespaces/{namespace}" if s.namespaced else "")
            body = {"content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{ref}"}}}}
            paths[f"{scope}/{s.plural}"] = {
                "post": {"x-kubernetes-group-version-kind": gvk, "x-kubernetes-action": "post",
                         "parameters": params, "requestBody": body, "responses": {}},
            }  # fmt: skip
            item = {"x-kubernetes-group-version-kind": gvk, "parameters": params, "requestBody": body, "responses": {}}
            paths[f"{scope}/{s.plural}/{{name}}"] = {
                "put": {**item, "x-kubernetes-action": "put"},
                "patch": {**item, "x-kubernetes-action": "patch"},
            }
        return {"openapi": "3.0.0", "info": {"title": "Kubernetes (emulated)", "version": "v1.32.0"},
                "paths": paths, "components": {"schemas": schemas}}  # fmt: skip


def _kube_message(error: str) -> str:
    """crdcheck's ``path: message`` in the API server's shape ``path: Invalid value: message``."""
    path, _, message = error.partition(": ")
    return f"{path.lstrip('.') or '<root>'}: Invalid value: {message}"


def _default(schema: dict[str, Any], value: Any) -> None:
    if isinstance(value, dict) and schema.get("type") == "object":
        for key, sub in (schema.get("properties") or {}).items():
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
            if key in value:
                _default(sub, value[key])
    elif isinstance(value, list) and "items" in schema:
        for item in value:
            _default(schema["items"], item)


def _prune(schema: dict[str, Any], value: Any, path: str, unknown: list[str], root: bool = False) -> None:
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return
    if isinstance(value, dict) and schema.get("type") == "object":
        props = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        for key in list(value):
            where = f"{path}.{key}" if path else key
            if key in props:
                if not (root and key == "metadata"):
                    _prune(props[key], value[key], where, unknown)
            elif root and key in _ROOT_KEPT:
                continue
            elif isinstance(extra, dict):
                _prune(extra, value[key], where, unknown)
            elif extra is True:
                continue
            else:
                unknown.append(where)
                del value[key]
    elif isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            _prune(schema["items"], item, f"{path}[{i}]", unknown)
