"""``magnetar admin tenants ...``."""

from __future__ import annotations

import argparse
from functools import partial
from typing import Any

from magnetar.admin_client.client import AdminClient
from magnetar.admin_client.paths import api_path
from magnetar.cli.admin.verbs import csv_list, verb


def _tenant_write(c: AdminClient, a: argparse.Namespace, method: str) -> Any:
    clusters = a.allowed_clusters
    if clusters is None and method == "PUT":
        # pulsar-admin's default: a new tenant may use every cluster.
        clusters = c.get(api_path("clusters")) or []
    if method == "POST" and (a.admin_roles is None or clusters is None):
        # An update replaces the whole TenantInfo: keep what the user did not mention.
        current = c.get(api_path("tenants", a.tenant)) or {}
        if a.admin_roles is None:
            a.admin_roles = current.get("adminRoles", [])
        if clusters is None:
            clusters = current.get("allowedClusters", [])
    info = {"adminRoles": a.admin_roles or [], "allowedClusters": clusters}
    return c.call(method, api_path("tenants", a.tenant), body=info)


def add_verbs(sub: argparse._SubParsersAction, common: list[argparse.ArgumentParser]) -> None:
    g = sub.add_parser("tenants", help="Operations on tenants").add_subparsers(
        dest="verb", required=True, metavar="VERB"
    )
    verb(g, "list", "List the tenants", lambda c, a: c.get(api_path("tenants")), parents=common)
    p = verb(
        g,
        "get",
        "Get a tenant's admin roles and allowed clusters",
        lambda c, a: c.get(api_path("tenants", a.tenant)),
        parents=common,
    )
    p.add_argument("tenant")
    for name, method, text in (("create", "PUT", "Create a tenant"), ("update", "POST", "Update a tenant")):
        p = verb(g, name, text, partial(_tenant_write, method=method), parents=common)
        p.add_argument("tenant")
        p.add_argument("-r", "--admin-roles", type=csv_list, help="comma-separated admin roles")
        p.add_argument(
            "-c",
            "--allowed-clusters",
            type=csv_list,
            help="comma-separated allowed clusters (create: all clusters by default)",
        )
    p = verb(
        g,
        "delete",
        "Delete a tenant",
        lambda c, a: c.call("DELETE", api_path("tenants", a.tenant), query={"force": a.force or None}),
        parents=common,
    )
    p.add_argument("tenant")
    p.add_argument("-f", "--force", action="store_true", help="delete its namespaces and topics too")
