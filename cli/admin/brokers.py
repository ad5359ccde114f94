"""``magnetar admin brokers ...``."""

from __future__ import annotations

import argparse

from magnetar.admin_client.paths import api_path
from magnetar.cli.admin.verbs import verb


def add_verbs(sub: argparse._SubParsersAction, common: list[argparse.ArgumentParser]) -> None:
    g = sub.add_parser("brokers", help="Operations on brokers").add_subparsers(
        dest="verb", required=True, metavar="VERB"
    )
    p = verb(
        g,
        "list",
        "List the active brokers of a cluster",
        lambda c, a: c.get(api_path("brokers", a.cluster)),
        parents=common,
    )
    p.add_argument("cluster")
    verb(
        g, "healthcheck", "Check the broker's health", lambda c, a: c.get(api_path("brokers", "health")), parents=common
    )
