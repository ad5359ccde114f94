"""``magnetar admin clusters ...``."""

from __future__ import annotations

import argparse
from functools import partial
from typing import Any

from magnetar.admin_client.client import AdminClient
from magnetar.admin_client.paths import api_path
from magnetar.cli.admin.verbs import body, verb


def _cluster_body(a: argparse.Namespace) -> dict[str, Any]:
    return body(
        serviceUrl=a.url,
        serviceUrlTls=a.url_secure,
        brokerServiceUrl=a.broker_url,
        brokerServiceUrlTls=a.broker_url_secure,
    )


def _cluster_write(c: AdminClient, a: argparse.Namespace, method: str) -> Any:
    return c.call(method, api_path("clusters", a.cluster), body=_cluster_body(a))


def add_verbs(sub: argparse._SubParsersAction, common: list[argparse.ArgumentParser]) -> None:
    g = sub.add_parser("clusters", help="Operations on clusters").add_subparsers(
        dest="verb", required=True, metavar="VERB"
    )
    verb(g, "list", "List the clusters", lambda c, a: c.get(api_path("clusters")), parents=common)
    p = verb(
        g,
        "get",
        "Get a cluster's configuration",
        lambda c, a: c.get(api_path("clusters", a.cluster)),
        parents=common,
    )
    p.add_argument("cluster")
    for name, method, text in (("create", "PUT", "Provision a new cluster"), ("update", "POST", "Update a cluster")):
        p = verb(
            g,
            name,
            text,
            partial(_cluster_write, method=method),
            parents=common,
        )
        p.add_argument("cluster")
        p.add_argument("--url", help="service URL (http://host:8080)")
        p.add_argument("--url-secure", help="TLS service URL")
        p.add_argument("--broker-url", help="broker service URL (pulsar://host:6650)")
        p.add_argument("--broker-url-secure", help="TLS broker service URL")
    p = verb(
        g,
        "delete",
        "Delete a cluster",
        lambda c, a: c.call("DELETE", api_path("clusters", a.cluster)),
        parents=common,
    )
    p.add_argument("cluster")
