"""Reading key material and credential files from the values Pulsar's settings accept.

``tokenSecretKey``, ``tokenPublicKey`` and ``basicAuthConf`` name their content as Pulsar's
``AuthTokenUtils.readKeyFromUrl`` does: ``file:///path``, ``data:[type][;base64],content``, ``env:VAR``,
a plain path of an existing file, or the content itself in base64.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from pathlib import Path
from urllib.parse import unquote_to_bytes, urlparse

_BASE64 = re.compile(r"[A-Za-z0-9+/_-]+={0,2}")


def read_key_value(value: str) -> bytes:
    """The bytes ``value`` designates (see the module docstring); ``ValueError`` when it names nothing."""
    value = value.strip()
    if value.startswith("data:"):
        return _data_url(value)
    if value.startswith("file:"):
        path = urlparse(value).path or value[len("file:") :]
        return _read_file(Path(path))
    if value.startswith("env:"):
        name = value[len("env:") :]
        content = os.environ.get(name)
        if content is None:
            raise ValueError(f"environment variable {name} is not set")
        return content.encode()
    if value and Path(value).is_file():
        return _read_file(Path(value))
    if _BASE64.fullmatch(value):
        padded = value + "=" * (-len(value) % 4)
        try:
            return base64.urlsafe_b64decode(padded) if "-" in value or "_" in value else base64.b64decode(padded)
        except (binascii.Error, ValueError):
            pass
    raise ValueError(f"Secret/Public Key file {value} doesn't exist")


def _data_url(value: str) -> bytes:
    meta, sep, content = value[len("data:") :].partition(",")
    if not sep:
        raise ValueError("invalid data: URL (no comma)")
    if meta.endswith(";base64"):
        try:
            return base64.b64decode(content, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ValueError(f"invalid base64 in data: URL: {exc}") from None
    return unquote_to_bytes(content)


def _read_file(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror}") from None
