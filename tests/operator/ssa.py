"""Server-side apply for the emulated API server (:mod:`tests.operator.kubeemu`), as far as the docs recommend
it (``kubectl apply --server-side``, Argo CD ``ServerSideApply=true``):

- ``PATCH`` with ``application/apply-patch+yaml`` creates the object when missing, otherwise sets the fields
  the applied configuration names;
- field ownership per ``fieldManager`` in ``metadata.managedFields`` (``operation: Apply``, ``FieldsV1``);
  a field this manager applied before and no longer names is removed, unless another manager owns it too;
- a field owned by another Apply manager with a different value is a ``409 Conflict`` naming the manager,
  unless ``force=true`` (then ownership moves);
- ``status`` of a kind with the status subresource is never changed by an apply to the main resource.

Simplifications (tests must not rely on them): lists are atomic (no ``x-kubernetes-list-map-keys`` merge),
writes other than apply (``kubectl patch``, the operator's status writes) record no ownership, so they
never conflict with an apply.
"""

from __future__ import annotations

import copy
from typing import Any

Path = tuple[str, ...]
_IDENTITY = {("apiVersion",), ("kind",), ("metadata", "name"), ("metadata", "namespace")}


class ApplyConflict(Exception):
    """Fields owned by other managers with different values (``409 Conflict``)."""

    def __init__(self, conflicts: dict[Path, str]) -> None:
        lines = [f'conflict with "{manager}": .{".".join(path)}' for path, manager in sorted(conflicts.items())]
        super().__init__(f"Apply failed with {len(conflicts)} conflict{'s' * (len(conflicts) > 1)}: "
                         + "; ".join(lines))  # fmt: skip


def leaves(obj: Any, prefix: Path = ()) -> dict[Path, Any]:
    """Leaf paths of an applied configuration (maps are walked, lists and scalars are leaves)."""
    if isinstance(obj, dict) and obj:
        out: dict[Path, Any] = {}
        for key, value in obj.items():
            out.update(leaves(value, (*prefix, str(key))))
        return out
    return {prefix: obj} if prefix else {}


def _fields_v1(paths: set[Path]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for path in sorted(paths):
        node = tree
        for part in path:
            node = node.setdefault(f"f:{part}", {})
    return tree


def _paths_of(fields: dict[str, Any], prefix: Path = ()) -> set[Path]:
    out: set[Path] = set()
    for key, sub in fields.items():
        path = (*prefix, key[2:])
        out |= _paths_of(sub, path) if sub else {path}
    return out


def _get(obj: Any, path: Path) -> Any:
    for part in path:
        if not isinstance(obj, dict) or part not in obj:
            return _MISSING
        obj = obj[part]
    return obj


def _set(obj: dict[str, Any], path: Path, value: Any) -> None:
    for part in path[:-1]:
        if not isinstance(obj.get(part), dict):
            obj[part] = {}
        obj = obj[part]
    obj[path[-1]] = copy.deepcopy(value)


def _delete(obj: dict[str, Any], path: Path) -> None:
    parents = []
    node: Any = obj
    for part in path[:-1]:
        if not isinstance(node, dict) or part not in node:
            return
        parents.append((node, part))
        node = node[part]
    if isinstance(node, dict):
        node.pop(path[-1], None)
    for parent, part in reversed(parents):  # drop maps left empty
        if parent[part] == {}:
            del parent[part]


_MISSING = object()


def apply(live: dict[str, Any] | None, applied: dict[str, Any], manager: str, force: bool,
          now: str) -> dict[str, Any]:  # fmt: skip
    """The object after ``manager`` applies ``applied`` to ``live`` (``None``: create)."""
    result = copy.deepcopy(live) if live is not None else {}
    entries = [dict(e) for e in ((live or {}).get("metadata") or {}).get("managedFields") or []]
    owned = {e["manager"]: _paths_of(e.get("fieldsV1") or {}) for e in entries if e.get("operation") == "Apply"}
    new = {p: v for p, v in leaves(applied).items() if p not in _IDENTITY and p[0] != "status"}
    conflicts = {}
    for path, value in new.items():
        for other, paths in owned.items():
            if other != manager and path in paths and _get(result, path) != value:
                conflicts[path] = other
    if conflicts and not force:
        raise ApplyConflict(conflicts)
    for path in owned.get(manager, set()) - set(new):
        if not any(path in paths for other, paths in owned.items() if other != manager):
            _delete(result, path)
    for path, value in new.items():
        _set(result, path, value)
    for path in ("apiVersion", "kind"):
        result[path] = applied.get(path, result.get(path))
    meta = result.setdefault("metadata", {})
    for key in ("name", "namespace"):
        if key in (applied.get("metadata") or {}):
            meta.setdefault(key, applied["metadata"][key])
    if force:
        for other in owned:
            if other != manager:
                owned[other] -= set(conflicts)
    owned[manager] = set(new)
    kept = [e for e in entries if e.get("operation") != "Apply"]
    meta["managedFields"] = kept + [
        {"manager": m, "operation": "Apply", "apiVersion": result.get("apiVersion", ""), "time": now,
         "fieldsType": "FieldsV1", "fieldsV1": _fields_v1(paths)}
        for m, paths in sorted(owned.items()) if paths
    ]  # fmt: skip
    return result
