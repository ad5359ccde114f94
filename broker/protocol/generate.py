"""Regenerate ``pulsar_api_pb2.py`` from ``pulsar_api.proto`` (needs the ``dev`` extra: grpcio-tools)."""

from __future__ import annotations

import sys
from pathlib import Path


def main() -> int:
    """Run protoc on the schema next to this file; returns protoc's exit status."""
    from grpc_tools import protoc  # only needed by developers changing the schema

    here = Path(__file__).resolve().parent
    return protoc.main(["protoc", f"-I{here}", f"--python_out={here}", str(here / "pulsar_api.proto")])


if __name__ == "__main__":
    sys.exit(main())
