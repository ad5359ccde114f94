"""The test suite's port picker stays out of the range the kernel gives outgoing connections."""

from __future__ import annotations

import socket

from tests.ports import _ephemeral_low, free_port


def test_ports_are_below_the_ephemeral_range_unique_and_bindable() -> None:
    low = _ephemeral_low()
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == 50
    assert all(p < low for p in ports)
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[-1]))  # still free right after
