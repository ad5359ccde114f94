"""Entry point of the ``magnetar`` console script."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    """Parse the sub-command and run it."""
    parser = argparse.ArgumentParser(prog="magnetar", description="Magnetar messaging platform")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("standalone", help="broker + bookie + metadata store in one process")
    args = parser.parse_args(argv)
    print(f"{args.command}: not wired yet", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
