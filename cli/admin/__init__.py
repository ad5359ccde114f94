"""``magnetar admin``: pulsar-admin's verbs over the admin REST API v2.

Usage: ``magnetar admin [--admin-url URL] [--output text|json] [auth/TLS flags] GROUP VERB [ARGS]``,
groups ``clusters``, ``tenants``, ``namespaces``, ``topics`` and ``brokers``. Paths and JSON bodies are
Apache Pulsar's admin API v2, so the command also works against an Apache Pulsar broker.

Text output follows pulsar-admin: lists one item per line, objects as pretty JSON, nothing for
operations that return no content. ``--output json`` prints compact JSON for scripts. A failed
request prints the server's ``reason`` on stderr and exits 1; bad arguments exit 2 (argparse).

Credentials and TLS trust come from pulsar-admin's global flags or a ``client.conf`` (``--conf``,
``$PULSAR_CLIENT_CONF``), see ``conf``. The HTTP client is
:class:`magnetar.admin_client.client.AdminClient`. One module a group of verbs (``clusters``, ``tenants``,
``namespaces``, ``topics``, ``brokers``); ``values`` parses arguments, ``output`` prints results,
``messages`` decodes peeked messages.
"""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

from magnetar.admin_client.auth import AuthConfigError
from magnetar.admin_client.client import AdminClient
from magnetar.admin_client.errors import AdminConnectionError, AdminError
from magnetar.cli.admin import brokers, clusters, namespaces, tenants, topics
from magnetar.cli.admin.conf import add_connection_options, resolve
from magnetar.cli.admin.output import render
from magnetar.cli.admin.verbs import UsageError


def _common_options(defaults: bool) -> argparse.ArgumentParser:
    """Connection flags and ``--output``, accepted before the group and after the verb."""
    p = argparse.ArgumentParser(add_help=False)
    suppress = argparse.SUPPRESS
    add_connection_options(p, defaults)
    p.add_argument(
        "-o",
        "--output",
        choices=["text", "json"],
        default="text" if defaults else suppress,
        help="text (pulsar-admin style, default) or json",
    )
    p.add_argument("--timeout", type=float, default=30.0 if defaults else suppress, help="request timeout in seconds")
    return p


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``magnetar admin``."""
    p = sub.add_parser(
        "admin",
        help="administer a broker over the admin REST API (pulsar-admin's verbs)",
        description="Administer clusters, tenants, namespaces, topics and brokers over the admin REST API v2.",
        parents=[_common_options(defaults=True)],
    )
    groups = p.add_subparsers(dest="group", required=True, metavar="GROUP")
    # Leaf parsers repeat the options without defaults so a value before the group is not overwritten.
    common = [_common_options(defaults=False)]
    for group in (clusters, tenants, namespaces, topics, brokers):
        group.add_verbs(groups, common)
    p.set_defaults(run=run)


def run(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Execute the parsed command; returns the exit status."""
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        url, security = resolve(args)
    except AuthConfigError as exc:
        err.write(f"error: {exc}\n")
        return 2
    client = AdminClient(url, timeout=args.timeout, security=security)
    try:
        result = args.handler(client, args)
    except UsageError as exc:
        err.write(f"error: {exc}\n")
        return 2
    except AdminError as exc:
        err.write(f"error: {exc.reason} (HTTP {exc.status})\n")
        return 1
    except AdminConnectionError as exc:
        err.write(f"error: {exc}\n")
        return 1
    render(result, args.output, out)
    return 0
