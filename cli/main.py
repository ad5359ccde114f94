"""Entry point of the ``magnetar`` console script."""

from __future__ import annotations

import argparse
import sys

from magnetar.cli import admin, autorecovery, bookie, initialize, standalone, tokens
from magnetar.cli import broker as broker_cli
from magnetar.operator import cli as operator_cli


def main(argv: list[str] | None = None) -> int:
    """Parse the sub-command and run it."""
    parser = argparse.ArgumentParser(
        prog="magnetar", description="Magnetar: a messaging platform speaking Pulsar's protocol"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    standalone.add_parser(sub)
    broker_cli.add_parser(sub)
    initialize.add_parser(sub)
    admin.add_parser(sub)
    bookie.add_parser(sub)
    autorecovery.add_parser(sub)
    operator_cli.add_parser(sub)
    tokens.add_parser(sub)
    args = parser.parse_args(argv)
    return int(args.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
