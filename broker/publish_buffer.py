"""Publish back-pressure: the broker stops reading connections whose sends it cannot absorb.

As in Pulsar, two limits bound the memory held by sends awaiting persistence:

* per connection, ``maxPendingPublishRequestsPerConnection`` sends in flight: the connection is
  no longer read until half of them completed (:class:`ServerConnection` keeps that count);
* broker-wide, ``maxMessagePublishBufferSizeInMB`` of payload in flight (:class:`PublishBuffer`):
  every connection with producers stops being read until the buffer is below half the limit.

Pausing reading (``transport.pause_reading``) leaves the bytes in the client's socket: its own
pending-message limit then blocks or fails its sends, so the broker never buffers them.
"""

from __future__ import annotations

from collections.abc import Callable


class PublishBuffer:
    """Broker-wide bytes of sends awaiting persistence; ``on_change()`` when throttling starts or ends."""

    def __init__(self, limit_bytes: int, on_change: Callable[[], None]) -> None:
        #: 0 or less: no broker-wide limit.
        self.limit_bytes = limit_bytes
        self.size = 0
        self.throttled = False
        self._on_change = on_change

    def add(self, size: int) -> None:
        """A send of ``size`` bytes entered the write pipeline."""
        self.size += size
        if not self.throttled and 0 < self.limit_bytes < self.size:
            self.throttled = True
            self._on_change()

    def release(self, size: int) -> None:
        """A send of ``size`` bytes was answered (receipt or error)."""
        self.size -= size
        if self.throttled and self.size <= self.limit_bytes // 2:
            self.throttled = False
            self._on_change()
