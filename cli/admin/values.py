"""Values of pulsar-admin's arguments: relative times, sizes, message ids and names, as argparse types."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from typing import Any

from magnetar.admin_client.paths import parse_topic

#: Pulsar's ``MessageId.latest`` / ``MessageId.earliest`` as (ledgerId, entryId).
LATEST = (2**63 - 1, 2**63 - 1)
EARLIEST = (-1, -1)

_TIME_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "y": 365 * 86400}
_SIZE_UNITS = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_INT = re.compile(r"[+-]?\d+")


def _with_unit(value: str, what: str, units: dict[str, int], unit_names: str) -> int:
    """An integer with an optional one-letter, case-insensitive unit suffix, times that unit."""
    text = value.strip()
    if not text:
        raise ValueError(f"expected a non-empty {what}")
    unit = text[-1].lower()
    if unit.isalpha():
        if unit not in units:
            raise ValueError(f"invalid {what} unit {text[-1]!r} in {value!r} (use {unit_names})")
        number = text[:-1]
        factor = units[unit]
    else:
        number, factor = text, 1
    if not _INT.fullmatch(number):
        raise ValueError(f"invalid {what} {value!r}")
    return int(number) * factor


def parse_relative_time(value: str) -> int:
    """Seconds in a pulsar-admin relative time: ``120`` (seconds), ``10s``, ``10m``, ``1h``, ``2d``, ``5w``, ``1y``.

    ``-1`` stays ``-1`` (Pulsar's "infinite"). Units are case-insensitive, as in pulsar-admin.
    """
    return _with_unit(value, "time", _TIME_UNITS, "s, m, h, d, w or y")


def parse_size(value: str) -> int:
    """Bytes in a pulsar-admin size: ``4096`` (bytes), ``10k``, ``100M``, ``1G``, ``3T`` (powers of 1024).

    ``-1`` stays ``-1`` (Pulsar's "infinite").
    """
    return _with_unit(value, "size", _SIZE_UNITS, "k, M, G or T")


def retention_minutes(value: str) -> int:
    """A retention time as Pulsar stores it: minutes, ``-1`` for infinite."""
    seconds = parse_relative_time(value)
    return -1 if seconds == -1 else seconds // 60


def retention_megabytes(value: str) -> int:
    """A retention size as Pulsar stores it: MiB (below 1 MiB is 0, no retention), ``-1`` for infinite."""
    size = parse_size(value)
    return -1 if size == -1 else size // (1 << 20)


def parse_message_id(value: str) -> tuple[int, int]:
    """``ledgerId:entryId`` (an optional ``:partition`` suffix is accepted), ``earliest`` or ``latest``."""
    text = value.strip().lower()
    if text == "latest":
        return LATEST
    if text == "earliest":
        return EARLIEST
    parts = text.split(":")
    if len(parts) not in (2, 3) or not all(_INT.fullmatch(p) for p in parts):
        raise ValueError(f"invalid message id {value!r} (expected ledgerId:entryId, 'earliest' or 'latest')")
    return int(parts[0]), int(parts[1])


def _arg_type(parse: Callable[[str], Any], what: str) -> Callable[[str], Any]:
    """Wrap a parser so argparse reports a usage error (exit 2) naming ``what``."""

    def convert(value: str) -> Any:
        try:
            return parse(value)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{what}: {exc}") from None

    convert.__name__ = what  # argparse names the type in its messages
    return convert


TIME = _arg_type(parse_relative_time, "time")
SIZE = _arg_type(parse_size, "size")
MESSAGE_ID = _arg_type(parse_message_id, "message id")
RETENTION_TIME = _arg_type(retention_minutes, "time")
RETENTION_SIZE = _arg_type(retention_megabytes, "size")


def parse_namespace(value: str) -> tuple[str, str]:
    """``tenant/namespace``."""
    parts = value.split("/")
    if len(parts) != 2 or not all(parts):
        raise ValueError(f"invalid namespace {value!r} (expected tenant/namespace)")
    return parts[0], parts[1]


TOPIC = _arg_type(parse_topic, "topic")
NAMESPACE = _arg_type(parse_namespace, "namespace")
