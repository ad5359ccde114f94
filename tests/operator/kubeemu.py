"""An emulated Kubernetes API server for operator-in-the-loop tests: PyPI ``kmock`` (HTTP server, request
parsing, Kubernetes-style error documents) plus the object semantics kopf and kubectl rely on, which kmock
0.8 lacks.

What this layer adds over kmock's ``KubernetesScaffold``:
- objects with ``uid``, ``resourceVersion`` (one global counter), ``generation`` (bumped when anything but
  metadata/status changes), ``creationTimestamp``, ``namespace`` from the URL; 201 on create, 409 when the
  object exists, 404 for unknown objects, optimistic concurrency on PUT with a ``resourceVersion``;
- discovery that kubectl and kopf accept: ``/api`` + ``/api/v1`` (core resources under group version ``v1``,
  not ``/v1``), ``/apis``, ``/apis/{group}`` and ``/apis/{group}/{version}`` with ``{plural}/status``;
- cluster-scoped ``/api/v1/namespaces`` and namespaced collections ``/namespaces/{ns}/{plural}``;
- list with ``labelSelector`` (equality, inequality, existence, ``in``/``notin``) and ``fieldSelector`` on
  ``metadata.name`` / ``metadata.namespace``, a list ``resourceVersion``;
- watch (``?watch=true``/``1``) from a ``resourceVersion`` (history replay; without one: synthetic ADDED
  events), ``timeoutSeconds`` (the stream ends), selectors applied to events;
- PATCH as JSON merge patch (also used for strategic merge patch, which it approximates), JSON patch
  (RFC 6902 with ``test``, so kopf's finalizer patches can fail on a stale list), PUT;
- the ``/status`` subresource: writes to the main resource keep the old status, writes to ``/status`` change
  only status; a create's status is dropped;
- deletion with finalizers: ``deletionTimestamp`` set, the object goes when its last finalizer is removed;
- CustomResourceDefinitions created through the API register their resource (``kubectl apply -f crds/``);
- admission of custom resources as kube-apiserver does it (schema, defaults, pruning, CEL rules with
  ``oldSelf``, ``fieldValidation``) and OpenAPI v3 documents for kubectl: :mod:`tests.operator.admission`;
- server-side apply with field managers and conflicts: :mod:`tests.operator.ssa`;
- ``forbidden``: (plural, namespace, name) whose reads answer 403, for tests of RBAC failures.

What it does not do (tests must not rely on it): no authentication or RBAC beyond ``forbidden``, no
admission webhooks, no validation ratcheting, no ownerReference garbage collection, no namespace deletion
cascade, no real strategic-merge semantics (lists are replaced), no table output for ``kubectl get``
(plain JSON), no watch bookmarks, no history compaction (410).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import copy
import datetime
import json
import re
import secrets
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp.web
import kmock
import yaml

from tests.operator import ssa
from tests.operator.admission import Admission, AdmissionError

_NAME_RE = r"[^/]+"


#: kube-apiserver's generateName: 5 characters of this alphabet after a prefix of at most 58 (names <= 63),
#: drawn up to 8 times while the name is taken.
_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
_MAX_GENERATED_PREFIX = 58
_GENERATE_NAME_TRIES = 8


@dataclass
class ResourceType:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    status_subresource: bool = False
    short_names: list[str] = field(default_factory=list)
    categories: list[str] = field(default_factory=list)

    @property
    def group_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def discovery(self) -> list[dict[str, Any]]:
        verbs = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
        out = [
            {
                "name": self.plural,
                "singularName": self.kind.lower(),
                "namespaced": self.namespaced,
                "kind": self.kind,
                "verbs": verbs,
                "shortNames": self.short_names,
                "categories": self.categories,
            }
        ]
        if self.status_subresource:
            out.append(
                {"name": f"{self.plural}/status", "singularName": "", "namespaced": self.namespaced,
                 "kind": self.kind, "verbs": ["get", "patch", "update"]}
            )  # fmt: skip
        return out


CORE = [
    ResourceType("", "v1", "namespaces", "Namespace", namespaced=False, status_subresource=True, short_names=["ns"]),
    ResourceType("", "v1", "secrets", "Secret"),
    ResourceType("", "v1", "configmaps", "ConfigMap", short_names=["cm"]),
    ResourceType("", "v1", "events", "Event", short_names=["ev"]),
    ResourceType("events.k8s.io", "v1", "events", "Event", short_names=["ev"]),
    ResourceType("coordination.k8s.io", "v1", "leases", "Lease"),
    ResourceType("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition",
                 namespaced=False, status_subresource=True, short_names=["crd", "crds"]),
]  # fmt: skip


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message

    def response(self) -> aiohttp.web.Response:
        return aiohttp.web.json_response(
            {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": self.message,
             "reason": self.reason, "code": self.code},
            status=self.code,
        )  # fmt: skip


def _stale(rtype: ResourceType, name: str) -> ApiError:
    """A write with an old ``resourceVersion`` (optimistic concurrency), in kube-apiserver's words."""
    resource = f"{rtype.plural}.{rtype.group}" if rtype.group else rtype.plural
    return ApiError(409, "Conflict", f'Operation cannot be fulfilled on {resource} "{name}": the object has been '
                    "modified; please apply your changes to the latest version and try again")  # fmt: skip


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _pointer(path: str) -> list[str]:
    return [p.replace("~1", "/").replace("~0", "~") for p in path.split("/")[1:]]


def json_patch(doc: Any, ops: list[dict[str, Any]]) -> Any:
    """RFC 6902 JSON patch (add, remove, replace, test, move, copy); a failed ``test`` is a 422."""
    doc = copy.deepcopy(doc)

    def walk(parts: list[str]) -> tuple[Any, str]:
        node = doc
        for part in parts[:-1]:
            node = node[int(part)] if isinstance(node, list) else node[part]
        return node, parts[-1]

    def get(path: str) -> Any:
        node = doc
        for part in _pointer(path):
            node = node[int(part)] if isinstance(node, list) else node[part]
        return node

    for op in ops:
        kind, path = op["op"], op.get("path", "")
        try:
            if kind == "test":
                if get(path) != op.get("value"):
                    raise ApiError(422, "Invalid", f"the server rejected our request: test failed at {path}")
                continue
            if kind in ("move", "copy"):
                value = copy.deepcopy(get(op["from"]))
                if kind == "move":
                    parent, key = walk(_pointer(op["from"]))
                    del parent[int(key) if isinstance(parent, list) else key]
                kind, op = "add", {"op": "add", "path": path, "value": value}
            parent, key = walk(_pointer(path))
            if kind == "add":
                if isinstance(parent, list):
                    parent.insert(len(parent) if key == "-" else int(key), op["value"])
                else:
                    parent[key] = op["value"]
            elif kind == "remove":
                del parent[int(key) if isinstance(parent, list) else key]
            elif kind == "replace":
                if isinstance(parent, list):
                    parent[int(key)] = op["value"]
                else:
                    if key not in parent:
                        raise KeyError(key)
                    parent[key] = op["value"]
        except (KeyError, IndexError, ValueError, TypeError) as exc:
            raise ApiError(422, "Invalid", f"the server rejected our request: {kind} {path}: {exc}") from None
    return doc


def _selector_matches(selector: str, labels: dict[str, str]) -> bool:
    for term in filter(None, (t.strip() for t in re.split(r",(?![^()]*\))", selector or ""))):
        if m := re.fullmatch(r"([^\s!=]+)\s+(in|notin)\s+\((.*)\)", term):
            key, op, values = m.group(1), m.group(2), {v.strip() for v in m.group(3).split(",")}
            if (labels.get(key) in values) != (op == "in"):
                return False
        elif "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key.strip()) == value.strip():
                return False
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            if labels.get(key.strip()) != value.strip():
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def _fields_match(selector: str, obj: dict[str, Any]) -> bool:
    meta = obj.get("metadata", {})
    for term in filter(None, (t.strip() for t in (selector or "").split(","))):
        negate = "!=" in term
        key, value = term.replace("==", "=").split("!=" if negate else "=", 1)
        actual = {"metadata.name": meta.get("name"), "metadata.namespace": meta.get("namespace")}.get(key.strip())
        if (actual == value.strip()) == negate:
            return False
    return True


@dataclass
class _Event:
    rv: int
    rtype: ResourceType
    type: str
    obj: dict[str, Any]


_VALIDATION: contextvars.ContextVar[str] = contextvars.ContextVar("field_validation", default="")
_WARNINGS: contextvars.ContextVar[list[str]] = contextvars.ContextVar("warnings")


class KubeEmulator(kmock.KubernetesScaffold):
    """kmock's scaffold with the object store, discovery and semantics described in the module docstring."""

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.types: dict[tuple[str, str, str], ResourceType] = {}
        self.store: dict[tuple[str, str, str, str, str], dict[str, Any]] = {}
        self.history: list[_Event] = []
        self.rv = 100
        self.changed = asyncio.Condition()
        #: CRD admission (schema, defaults, pruning, CEL) and OpenAPI documents: tests/operator/admission.py
        self.admission = Admission()
        #: (plural, namespace, name) that reads answer 403 for, as RBAC would (set by tests)
        self.forbidden: set[tuple[str, str, str]] = set()
        for rtype in CORE:
            self.add_type(rtype)

    # ------------------------------------------------------------------------------------------ registry
    def add_type(self, rtype: ResourceType) -> None:
        self.types[(rtype.group, rtype.version, rtype.plural)] = rtype
        self.admission.add_type(rtype.group, rtype.version, rtype.kind, rtype.plural, rtype.namespaced)

    def register_crd(self, crd: dict[str, Any]) -> None:
        self.admission.register(crd)
        spec = crd["spec"]
        names = spec["names"]
        for version in spec["versions"]:
            self.add_type(
                ResourceType(
                    spec["group"], version["name"], names["plural"], names["kind"],
                    namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                    status_subresource="status" in (version.get("subresources") or {}),
                    short_names=list(names.get("shortNames") or []), categories=list(names.get("categories") or []),
                )
            )  # fmt: skip

    # ------------------------------------------------------------------------------------------ direct access
    def objects(self, plural: str, namespace: str | None = None) -> list[dict[str, Any]]:
        """Stored objects of a plural (any group), for assertions."""
        return [
            copy.deepcopy(o)
            for (g, v, p, ns, n), o in sorted(self.store.items())
            if p == plural and (namespace is None or ns == namespace)
        ]

    def get(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        for (_, _, p, ns, n), o in self.store.items():
            if p == plural and ns == namespace and n == name:
                return copy.deepcopy(o)
        return None

    # ------------------------------------------------------------------------------------------ routing
    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        if raw_request.path.rstrip("/") == "/api/v1/namespaces":
            # kmock's path parser cannot split this path (it takes "namespaces" for a namespace prefix).
            body = await raw_request.read()
            try:
                request = kmock.Request(
                    method=raw_request.method, url=raw_request.url, body=body,
                    data=json.loads(body) if body else None, raw_request=raw_request,
                )  # fmt: skip
            except ValueError as exc:
                return ApiError(400, "BadRequest", str(exc)).response()
            return await self._handle(request)
        return await super().__call__(raw_request)

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        raw = request._raw_request
        assert raw is not None
        try:
            response = await self._route(request, raw)
        except ApiError as exc:
            return exc.response()
        if response is None:
            return await super()._handle(request)
        return response

    async def _route(self, request: kmock.Request, raw: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse | None:
        path = raw.path.rstrip("/")
        method = raw.method.upper()
        if path == "/api":
            return aiohttp.web.json_response({"kind": "APIVersions", "versions": ["v1"]})
        if path == "/apis":
            return aiohttp.web.json_response(self._group_list())
        if path == "/version":
            return aiohttp.web.json_response({"major": "1", "minor": "32", "gitVersion": "v1.32.0-magnetar-emulator",
                                              "platform": "linux/amd64"})  # fmt: skip
        if path == "/openapi/v3":
            return aiohttp.web.json_response(self.admission.openapi_root())
        m = re.fullmatch(r"/openapi/v3/(?:apis/([^/]+)|api)/([^/]+)", path)
        doc = self.admission.openapi_group(m.group(1) or "", m.group(2)) if m else None
        if doc is not None:
            return aiohttp.web.json_response(doc)
        if path.startswith("/openapi"):
            raise ApiError(404, "NotFound", f"no OpenAPI document at {path} (v3 only)")
        m = re.fullmatch(r"/api/(v1)|/apis/([^/]+)/([^/]+)", path)
        if m and method == "GET":
            group, version = ("", "v1") if m.group(1) else (m.group(2), m.group(3))
            return aiohttp.web.json_response(self._resource_list(group, version))
        m = re.fullmatch(r"/apis/([^/]+)", path)
        if m and method == "GET":
            groups = [g for g in self._group_list()["groups"] if g["name"] == m.group(1)]
            if not groups:
                raise ApiError(404, "NotFound", f"group {m.group(1)} not found")
            return aiohttp.web.json_response({"kind": "APIGroup", "apiVersion": "v1", **groups[0]})
        parsed = self._parse(path)
        if parsed is None:
            return None
        rtype, namespace, name, sub = parsed
        query = raw.query
        if method == "GET" and name is not None and (rtype.plural, namespace, name) in self.forbidden:
            raise ApiError(403, "Forbidden", f'{rtype.plural} "{name}" is forbidden: User cannot get resource '
                           f'"{rtype.plural}" in API group "{rtype.group}" in the namespace "{namespace}"')  # fmt: skip
        _VALIDATION.set(query.get("fieldValidation", ""))
        _WARNINGS.set([])
        try:
            response = await self._dispatch(raw, rtype, namespace, name, sub, method, path, query, body=None,
                                            request=request)  # fmt: skip
        except AdmissionError as exc:
            return aiohttp.web.json_response(exc.status(), status=exc.status()["code"])
        for warning in _WARNINGS.get():
            response.headers.add("Warning", f'299 - "{warning}"')
        return response

    async def _dispatch(self, raw: aiohttp.web.BaseRequest, rtype: ResourceType, namespace: str, name: str | None,
                        sub: str | None, method: str, path: str, query: Any, body: Any,
                        request: kmock.Request) -> aiohttp.web.StreamResponse:  # fmt: skip
        body = request.data if request.body else None
        if method == "GET" and name is None:
            if query.get("watch") in ("true", "1"):
                return await self._watch(raw, rtype, namespace, query)
            return aiohttp.web.json_response(await self._list(rtype, namespace, query))
        if method == "GET":
            return aiohttp.web.json_response(self._fetch(rtype, namespace, name))
        if method == "POST" and name is None:
            return aiohttp.web.json_response(await self._create(rtype, namespace, body), status=201)
        if method == "PUT" and name is not None:
            return aiohttp.web.json_response(await self._replace(rtype, namespace, name, sub, body))
        if method == "PATCH" and name is not None:
            ctype = raw.headers.get("Content-Type", "")
            if "apply-patch" in ctype:
                applied = yaml.safe_load(request.body) if request.body else None
                return aiohttp.web.json_response(await self._apply(rtype, namespace, name, sub, applied, query))
            return aiohttp.web.json_response(await self._patch(rtype, namespace, name, sub, ctype, body))
        if method == "DELETE" and name is not None:
            return aiohttp.web.json_response(await self._delete(rtype, namespace, name))
        raise ApiError(405, "MethodNotAllowed", f"{method} {path} is not supported by the emulator")

    def _parse(self, path: str) -> tuple[ResourceType, str, str | None, str | None] | None:
        m = re.fullmatch(r"/api/v1(?P<rest>/.*)|/apis/(?P<g>[^/]+)/(?P<v>[^/]+)(?P<rest2>/.*)", path)
        if not m:
            return None
        group, version, rest = ("", "v1", m.group("rest")) if m.group("rest") else (m.group("g"), m.group("v"),
                                                                                      m.group("rest2"))  # fmt: skip
        parts = rest.strip("/").split("/")
        namespace = ""
        # /namespaces/{ns}/{plural}/... but /namespaces and /namespaces/{name}[/status] are the namespace kind
        if len(parts) >= 3 and parts[0] == "namespaces":
            namespace, parts = parts[1], parts[2:]
        rtype = self.types.get((group, version, parts[0]))
        if rtype is None:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({group}/{version} "
                                            f"{parts[0]})")  # fmt: skip
        name = parts[1] if len(parts) > 1 else None
        sub = parts[2] if len(parts) > 2 else None
        return rtype, namespace, name, sub

    def _group_list(self) -> dict[str, Any]:
        groups: dict[str, list[str]] = {}
        for rtype in self.types.values():
            if rtype.group:
                groups.setdefault(rtype.group, [])
                if rtype.version not in groups[rtype.group]:
                    groups[rtype.group].append(rtype.version)
        return {
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": [
                {
                    "name": g,
                    "versions": [{"groupVersion": f"{g}/{v}", "version": v} for v in versions],
                    "preferredVersion": {"groupVersion": f"{g}/{versions[0]}", "version": versions[0]},
                }
                for g, versions in sorted(groups.items())
            ],
        }

    def _resource_list(self, group: str, version: str) -> dict[str, Any]:
        types = [t for t in self.types.values() if t.group == group and t.version == version]
        if not types:
            raise ApiError(404, "NotFound", f"{group}/{version} not found")
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": types[0].group_version,
            "resources": [r for t in types for r in t.discovery()],
        }

    # ------------------------------------------------------------------------------------------ verbs
    def _key(self, rtype: ResourceType, namespace: str, name: str) -> tuple[str, str, str, str, str]:
        return (rtype.group, rtype.version, rtype.plural, namespace if rtype.namespaced else "", name)

    def _fetch(self, rtype: ResourceType, namespace: str, name: str) -> dict[str, Any]:
        obj = self.store.get(self._key(rtype, namespace, name))
        if obj is None:
            raise ApiError(404, "NotFound", f'{rtype.plural}.{rtype.group} "{name}" not found')
        return obj

    def _select(self, rtype: ResourceType, namespace: str, query: Any) -> Iterator[dict[str, Any]]:
        for (g, v, p, ns, _), obj in sorted(self.store.items()):
            if (g, v, p) != (rtype.group, rtype.version, rtype.plural):
                continue
            if namespace and ns != namespace:
                continue
            if self._matches(obj, query):
                yield obj

    @staticmethod
    def _matches(obj: dict[str, Any], query: Any) -> bool:
        labels = obj.get("metadata", {}).get("labels") or {}
        return _selector_matches(query.get("labelSelector", ""), labels) and _fields_match(
            query.get("fieldSelector", ""), obj
        )

    async def _list(self, rtype: ResourceType, namespace: str, query: Any) -> dict[str, Any]:
        return {
            "kind": f"{rtype.kind}List",
            "apiVersion": rtype.group_version,
            "metadata": {"resourceVersion": str(self.rv)},
            "items": [copy.deepcopy(o) for o in self._select(rtype, namespace, query)],
        }

    async def _emit(self, rtype: ResourceType, type_: str, obj: dict[str, Any]) -> None:
        self.history.append(_Event(self.rv, rtype, type_, copy.deepcopy(obj)))
        async with self.changed:
            self.changed.notify_all()

    def _bump(self, obj: dict[str, Any]) -> None:
        self.rv += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(self.rv)

    def _generate_name(self, rtype: ResourceType, namespace: str, prefix: str) -> str:
        """``generateName`` as kube-apiserver does it: the prefix (cut to 58 characters) and 5 random characters
        of its alphabet, drawn again while the name is taken (RetryGenerateName, GA in 1.32: 8 tries). kopf
        names all its events ``kopf-event-*``; a name clash would answer 409 and kopf drops that event."""
        prefix = prefix[:_MAX_GENERATED_PREFIX]
        for _ in range(_GENERATE_NAME_TRIES):
            name = prefix + "".join(secrets.choice(_NAME_ALPHABET) for _ in range(5))
            if self._key(rtype, namespace, name) not in self.store:
                return name
        return name  # the last clash is reported as 409, as the API server does

    async def _create(self, rtype: ResourceType, namespace: str, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "a JSON object is required")
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        if rtype.namespaced:
            namespace = namespace or meta.get("namespace") or "default"
            meta["namespace"] = namespace
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = self._generate_name(rtype, namespace, meta["generateName"])
        name = meta.get("name")
        if not name:
            raise ApiError(422, "Invalid", "metadata.name is required")
        key = self._key(rtype, namespace, name)
        if key in self.store:
            raise ApiError(409, "AlreadyExists", f'{rtype.plural}.{rtype.group} "{name}" already exists')
        obj.setdefault("apiVersion", rtype.group_version)
        obj.setdefault("kind", rtype.kind)
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=_now(), generation=1)
        meta.pop("deletionTimestamp", None)
        if rtype.status_subresource:
            obj.pop("status", None)
        if rtype.kind == "Secret" and "stringData" in obj:
            import base64

            data = obj.setdefault("data", {})
            for k, v in obj.pop("stringData").items():
                data[k] = base64.b64encode(str(v).encode()).decode()
        obj = self._admit(rtype, obj, None)
        self._bump(obj)
        self.store[key] = obj
        if rtype.plural == "customresourcedefinitions":
            self.register_crd(obj)
        await self._emit(rtype, "ADDED", obj)
        return obj

    async def _store_update(self, rtype: ResourceType, key: tuple[str, ...], old: dict[str, Any],
                            new: dict[str, Any], sub: str | None) -> dict[str, Any]:  # fmt: skip
        """Apply subresource rules, generation, resourceVersion; delete when the last finalizer went."""
        if rtype.status_subresource:
            if sub == "status":
                new = {**copy.deepcopy(old), "status": new.get("status")}
                if new["status"] is None:
                    new.pop("status")
                # metadata changes through /status are ignored, as in Kubernetes
            else:
                new = {k: v for k, v in new.items() if k != "status"}
                if "status" in old:
                    new["status"] = copy.deepcopy(old["status"])
        meta, old_meta = new.setdefault("metadata", {}), old.get("metadata", {})
        for fixed in ("uid", "creationTimestamp", "name", "namespace", "deletionTimestamp"):
            if fixed in old_meta:
                meta[fixed] = old_meta[fixed]
        new = self._admit(rtype, new, old)
        meta = new.setdefault("metadata", {})  # admission may return a new object (pruned, defaulted)
        body_of = lambda o: {k: v for k, v in o.items() if k not in ("metadata", "status")}  # noqa: E731
        meta["generation"] = int(old_meta.get("generation", 1)) + (body_of(new) != body_of(old))
        if new == old:
            return old  # a no-op write changes nothing, not even the resourceVersion
        self._bump(new)
        self.store[key] = new  # type: ignore[index]
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            del self.store[key]  # type: ignore[arg-type]
            await self._emit(rtype, "DELETED", new)
        else:
            await self._emit(rtype, "MODIFIED", new)
        return new

    def _admit(self, rtype: ResourceType, new: dict[str, Any], old: dict[str, Any] | None) -> dict[str, Any]:
        """CRD admission of a write (raises AdmissionError: 422), warnings kept for the response."""
        admitted, warnings = self.admission.admit(rtype.group, rtype.version, rtype.plural, new, old,
                                                  _VALIDATION.get())  # fmt: skip
        _WARNINGS.get().extend(warnings)
        return admitted

    async def _replace(self, rtype: ResourceType, namespace: str, name: str, sub: str | None,
                       body: Any) -> dict[str, Any]:  # fmt: skip
        key = self._key(rtype, namespace, name)
        old = self._fetch(rtype, namespace, name)
        expected = (body.get("metadata") or {}).get("resourceVersion")
        if expected and expected != old["metadata"]["resourceVersion"]:
            raise _stale(rtype, name)
        return await self._store_update(rtype, key, old, copy.deepcopy(body), sub)

    async def _patch(self, rtype: ResourceType, namespace: str, name: str, sub: str | None, ctype: str,
                     body: Any) -> dict[str, Any]:  # fmt: skip
        key = self._key(rtype, namespace, name)
        old = self._fetch(rtype, namespace, name)
        # merge-patch and (approximately) strategic-merge-patch; apply patches go to _apply
        new = json_patch(old, body or []) if "json-patch" in ctype else merge_patch(old, body or {})
        expected = (new.get("metadata") or {}).get("resourceVersion")
        if expected and expected != old["metadata"]["resourceVersion"]:
            raise _stale(rtype, name)
        return await self._store_update(rtype, key, old, new, sub)

    async def _apply(self, rtype: ResourceType, namespace: str, name: str, sub: str | None, applied: Any,
                     query: Any) -> dict[str, Any]:  # fmt: skip
        """Server-side apply (tests/operator/ssa.py): create when missing, else update with field ownership."""
        if not isinstance(applied, dict):
            raise ApiError(400, "BadRequest", "an apply patch must be an object")
        manager = query.get("fieldManager")
        if not manager:
            raise ApiError(400, "BadRequest", "fieldManager is required for apply requests")
        key = self._key(rtype, namespace, name)
        old = self.store.get(key)
        try:
            new = ssa.apply(old, applied, manager, query.get("force") in ("true", "1"), _now())
        except ssa.ApplyConflict as exc:
            raise ApiError(409, "Conflict", str(exc)) from exc
        if old is None:
            return await self._create(rtype, namespace, new)
        return await self._store_update(rtype, key, old, new, sub)

    async def _delete(self, rtype: ResourceType, namespace: str, name: str) -> dict[str, Any]:
        key = self._key(rtype, namespace, name)
        old = self._fetch(rtype, namespace, name)
        meta = old.get("metadata", {})
        if meta.get("finalizers"):
            if not meta.get("deletionTimestamp"):
                new = copy.deepcopy(old)
                new["metadata"].update(deletionTimestamp=_now(), deletionGracePeriodSeconds=0)
                self._bump(new)
                self.store[key] = new
                await self._emit(rtype, "MODIFIED", new)
                return new
            return old
        del self.store[key]
        self._bump(old)
        await self._emit(rtype, "DELETED", old)
        return {"kind": "Status", "apiVersion": "v1", "status": "Success", "details": {"name": name}}

    async def _watch(self, raw: aiohttp.web.BaseRequest, rtype: ResourceType, namespace: str,
                     query: Any) -> aiohttp.web.StreamResponse:  # fmt: skip
        timeout = float(query.get("timeoutSeconds") or 1800)
        since = query.get("resourceVersion")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        resp = aiohttp.web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(raw)

        def relevant(ev: _Event) -> bool:
            ns = ev.obj.get("metadata", {}).get("namespace", "")
            return ev.rtype is rtype and (not namespace or ns == namespace) and self._matches(ev.obj, query)

        async def send(type_: str, obj: dict[str, Any]) -> None:
            await resp.write(json.dumps({"type": type_, "object": obj}).encode() + b"\n")

        if since in (None, "", "0"):
            # No resourceVersion: the current state as ADDED events, then changes.
            position = len(self.history)
            for obj in list(self._select(rtype, namespace, query)):
                await send("ADDED", obj)
        else:
            position = next((i for i, ev in enumerate(self.history) if ev.rv > int(since)), len(self.history))
        try:
            while True:
                while position < len(self.history):
                    ev = self.history[position]
                    position += 1
                    if relevant(ev):
                        await send(ev.type, ev.obj)
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                async with self.changed:
                    if position >= len(self.history):
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(self.changed.wait(), min(remaining, 5.0))
        except (ConnectionResetError, asyncio.CancelledError):
            return resp
        await resp.write_eof()
        return resp


class EmulatorThread:
    """The emulator served on a loopback port from a background thread (the tests are synchronous)."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.loop = asyncio.new_event_loop()
        self.emulator: KubeEmulator | None = None
        self.url = ""
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="kube-emulator", daemon=True)

    def start(self) -> EmulatorThread:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("kube emulator did not start")
        return self

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._serve())

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        async with KubeEmulator() as emulator, kmock.Server(emulator, host=self.host) as server:
            self.emulator = emulator
            self.url = f"http://{server.host}:{server.port}"
            self._ready.set()
            await self._stop.wait()

    def call(self, fn: Any, *args: Any) -> Any:
        """Run ``fn(*args)`` (sync or async) on the emulator's loop and return its result."""

        async def wrapper() -> Any:
            result = fn(*args)
            if asyncio.iscoroutine(result):
                result = await result
            return result

        return asyncio.run_coroutine_threadsafe(wrapper(), self.loop).result(30)

    def stop(self) -> None:
        if self._stop is not None:
            self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def kubeconfig(self, path: str) -> str:
        """Write a kubeconfig pointing at the emulator (no credentials: it does not authenticate)."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "emulator", "cluster": {"server": self.url}}],
            "users": [{"name": "tester", "user": {"token": "emulator-does-not-check"}}],
            "contexts": [
                {"name": "emulator", "context": {"cluster": "emulator", "user": "tester", "namespace": "default"}}
            ],
            "current-context": "emulator",
        }
        with open(path, "w") as f:
            json.dump(config, f)
        return path
