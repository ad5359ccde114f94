"""Loopback ports for the servers tests start, chosen below the kernel's ephemeral port range.

A port found by binding port 0 comes from the ephemeral range, which the kernel also hands out as the local
port of outgoing connections. Between picking such a port and a server binding it, a client socket (an etcd
client, a bookie connection, another test's client) can take it, and the server fails with EADDRINUSE: the
cause of a CI failure of ``tests/cluster/test_cluster_tls.py``. Ports below the range are never assigned that
way; each is given out once per session.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

_given: set[int] = set()


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A loopback TCP port free now, outside the ephemeral range and not given out before in this session."""
    high = _ephemeral_low()
    low = max(1024, high - 12000)
    if high - low >= 1000:
        for _ in range(500):
            port = random.randrange(low, high)
            if port not in _given and _bindable(port):
                _given.add(port)
                return port
    # An ephemeral range starting too low to leave room below it: a kernel-chosen port.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    _given.add(port)
    return port
