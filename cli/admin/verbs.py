"""Building blocks of the verbs: registering one, request bodies, list and on/off arguments."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable
from typing import Any

from magnetar.admin_client.client import AdminClient

Handler = Callable[[AdminClient, argparse.Namespace], Any]


def verb(
    group: argparse._SubParsersAction,
    name: str,
    help_text: str,
    handler: Handler,
    *,
    aliases: Iterable[str] = (),
    parents: list[argparse.ArgumentParser],
) -> argparse.ArgumentParser:
    """Register verb ``name`` of ``group``, run by ``handler(client, args)``; returns its parser for arguments."""
    p = group.add_parser(name, help=help_text, description=help_text, aliases=list(aliases), parents=parents)
    p.set_defaults(handler=handler)
    return p


def body(**fields: Any) -> dict[str, Any]:
    """A JSON body without the fields the user left out."""
    return {k: v for k, v in fields.items() if v is not None}


def csv_list(value: str) -> list[str]:
    """A comma-separated argument as a list (blank items dropped)."""
    return [v.strip() for v in value.split(",") if v.strip()]


def enable_flags(p: argparse.ArgumentParser, what: str, required: bool = True) -> None:
    """``-e/--enable`` and ``-d/--disable``, exclusive, stored as ``args.enable``."""
    group = p.add_mutually_exclusive_group(required=required)
    group.add_argument("-e", "--enable", dest="enable", action="store_true", default=None, help=f"enable {what}")
    group.add_argument("-d", "--disable", dest="enable", action="store_false", help=f"disable {what}")


class UsageError(Exception):
    """A combination of arguments argparse cannot check by itself."""
