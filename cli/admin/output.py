"""Printing a command's result: pulsar-admin's text layout or JSON for scripts."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, TextIO


@dataclass(slots=True)
class Output:
    """What a command produced: ``data`` for ``--output json``; ``text`` overrides the default rendering."""

    data: Any = None
    text: str | None = None


def render(result: Any, mode: str, out: TextIO) -> None:
    """Print ``result`` (plain data or :class:`Output`) the pulsar-admin way or as JSON."""
    if isinstance(result, Output):
        if mode == "json":
            if result.data is not None:
                out.write(json.dumps(result.data) + "\n")
            return
        if result.text is not None:
            out.write(result.text if result.text.endswith("\n") else result.text + "\n")
            return
        result = result.data
    if result is None:
        return
    if mode == "json":
        out.write(json.dumps(result) + "\n")
    elif isinstance(result, list) and all(isinstance(x, str | int | float) for x in result):
        for item in result:
            out.write(f"{item}\n")
    elif isinstance(result, dict | list):
        out.write(json.dumps(result, indent=2) + "\n")
    else:
        out.write(f"{result}\n")


def hexdump(data: bytes) -> str:
    """A boxed hex dump (the layout pulsar-admin prints for peeked payloads)."""
    rule = "+--------+-------------------------------------------------+----------------+"
    lines = [
        "         +-------------------------------------------------+",
        "         |  0  1  2  3  4  5  6  7  8  9  a  b  c  d  e  f |",
        rule,
    ]
    for offset in range(0, len(data), 16):
        chunk = data[offset : offset + 16]
        hexes = " ".join(f"{b:02x}" for b in chunk)
        text = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        lines.append(f"|{offset:08x}| {hexes:<47} |{text:<16}|")
    lines.append(rule)
    return "\n".join(lines)
