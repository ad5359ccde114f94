"""Regenerate ``pulsar_api_pb2.py`` and its type stub ``pulsar_api_pb2.pyi`` from ``pulsar_api.proto``
(needs the ``dev`` extra: grpcio-tools). The stub lets the type checker see the message classes."""

from __future__ import annotations

import sys
from pathlib import Path


def main() -> int:
    """Run protoc on the schema next to this file; returns protoc's exit status."""
    from grpc_tools import protoc  # only needed by developers changing the schema

    here = Path(__file__).resolve().parent
    out = [f"--python_out={here}", f"--pyi_out={here}"]
    status = protoc.main(["protoc", f"-I{here}", *out, str(here / "pulsar_api.proto")])
    if status == 0:
        _drop_keyword_members(here / "pulsar_api_pb2.pyi")
    return status


def _drop_keyword_members(stub: Path) -> None:
    """Remove enum members named like a Python keyword (``Schema.Type.None``) from the stub: protoc writes
    them as ``None: ...``, which is not valid Python; at run time they are reachable only through getattr."""
    lines = stub.read_text().splitlines(keepends=True)
    stub.write_text("".join(line for line in lines if not line.lstrip().startswith("None: ")))


if __name__ == "__main__":
    sys.exit(main())
