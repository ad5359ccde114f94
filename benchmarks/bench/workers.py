"""Client worker processes.

Each reports ("ready", None), waits for the shared go event, runs, and reports ("done", dict) or
("error", traceback) on the queue. They ignore SIGINT: the parent ends them."""

from __future__ import annotations

import array
import signal
import struct
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import pulsar

from benchmarks.bench.brokers import pulsar_client

# Payload header of latency messages: monotonic time (ns) the pacing schedule gave the send, the
# time it was actually sent, and the sequence number.
LATENCY_HEADER = struct.Struct("<QQQ")


def worker_main(body: Callable[..., dict[str, Any]], wid: int, out: Any, go: Any, kw: dict[str, Any]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:

        def ready() -> None:
            out.put((wid, "ready", None))
            go.wait()

        out.put((wid, "done", body(ready=ready, **kw)))
    except BaseException:
        out.put((wid, "error", traceback.format_exc()))


class _SendTally:
    """What the send callbacks reported: acks, failures and the distinct failure results."""

    def __init__(self) -> None:
        self.ok = 0
        self.failed = 0
        self.failures: set[str] = set()

    def on_sent(self, res: pulsar.Result, _msg_id: Any) -> None:
        if res == pulsar.Result.Ok:
            self.ok += 1
        else:
            self.failed += 1
            self.failures.add(str(res))

    def settle(self, sent: int, timeout: float = 60.0) -> dict[str, Any]:
        """Wait until every send callback has run (flush() can return before the last ones do); the counts."""
        deadline = time.monotonic() + timeout
        while self.ok + self.failed < sent and time.monotonic() < deadline:
            time.sleep(0.001)
        called = self.ok + self.failed
        return {
            "sent": sent,
            "acked": self.ok,
            "errors": self.failed + sent - called,
            "error_kinds": sorted(self.failures) + (["no callback"] if called < sent else []),
        }


class _TimedSendTally(_SendTally):
    """Also the time of each receipt: one producer on one partition gets its receipts in send order,
    so the i-th receipt answers the i-th send."""

    def __init__(self) -> None:
        super().__init__()
        self.receipt_ns = array.array("q")

    def on_sent(self, res: pulsar.Result, msg_id: Any) -> None:
        self.receipt_ns.append(time.monotonic_ns())
        super().on_sent(res, msg_id)


def producer_worker(
    ready: Callable[[], None],
    url: str,
    topic: str,
    size: int,
    batched: bool,
    max_pending: int,
    batch: tuple[int, int, int],
    duration: float | None = None,
    count: int | None = None,
) -> dict[str, Any]:
    """Publish as fast as the bounded outstanding window allows, for ``duration`` s or ``count`` msgs."""
    client = pulsar_client(url)
    producer = client.create_producer(
        topic,
        batching_enabled=batched,
        batching_max_messages=batch[0],
        batching_max_allowed_size_in_bytes=batch[1],
        batching_max_publish_delay_ms=batch[2],
        # The client blocks send_async when this many are unacknowledged: the bounded window.
        max_pending_messages=max_pending,
        block_if_queue_full=True,
        send_timeout_millis=60_000,
    )
    payload = b"x" * size
    tally = _SendTally()

    ready()
    cpu0, t0 = time.process_time(), time.monotonic()
    sent = 0
    end = t0 + duration if duration is not None else float("inf")
    limit = count if count is not None else sys.maxsize
    chunk = 100  # check the clock once per chunk, not per message
    while sent < limit and time.monotonic() < end:
        for _ in range(min(chunk, limit - sent)):
            producer.send_async(payload, tally.on_sent)
        sent += min(chunk, limit - sent)
    producer.flush()
    counts = tally.settle(sent)
    t1, cpu1 = time.monotonic(), time.process_time()
    result = {
        **counts,
        "t0": t0,
        "t1": t1,
        "cpu": cpu1 - cpu0,
    }
    client.close()
    return result


def consumer_worker(
    ready: Callable[[], None],
    url: str,
    topic: str,
    subscription: str,
    count: int,
    receiver_queue: int,
    timeout: float,
) -> dict[str, Any]:
    """Subscribe after the go signal and receive+ack ``count`` messages from the backlog."""
    client = pulsar_client(url)
    ready()
    cpu0, t0 = time.process_time(), time.monotonic()
    consumer = client.subscribe(
        topic,
        subscription,
        receiver_queue_size=receiver_queue,
        initial_position=pulsar.InitialPosition.Earliest,
    )
    got, nbytes = 0, 0
    deadline = t0 + timeout
    while got < count and time.monotonic() < deadline:
        try:
            msg = consumer.receive(1000)
        except pulsar.Timeout:
            continue
        nbytes += len(msg.data())
        consumer.acknowledge(msg)
        got += 1
    t1, cpu1 = time.monotonic(), time.process_time()
    result = {"received": got, "bytes": nbytes, "t0": t0, "t1": t1, "cpu": cpu1 - cpu0}
    client.close()
    return result


def paced_producer_worker(
    ready: Callable[[], None], url: str, topic: str, size: int, rate: int, duration: float
) -> dict[str, Any]:
    """Publish non-batched at ``rate`` msg/s, stamping each payload with its scheduled and its actual
    monotonic send time (a late pacer shows as the difference: the producer process being the limit)."""
    client = pulsar_client(url)
    producer = client.create_producer(
        topic, batching_enabled=False, max_pending_messages=10_000, block_if_queue_full=True
    )
    pad = b"x" * max(0, size - LATENCY_HEADER.size)
    tally = _TimedSendTally()
    send_ns = array.array("q")

    ready()
    cpu0 = time.process_time()
    start = time.monotonic_ns()
    end = start + int(duration * 1e9)
    sent = 0
    while True:
        now = time.monotonic_ns()
        if now >= end:
            break
        # Send whatever is due by now: pacing by schedule keeps the long-run rate exact even though
        # sleep() granularity is coarser than the inter-message gap at 20k msg/s.
        due = (now - start) * rate // 1_000_000_000
        while sent < due:
            scheduled = start + sent * 1_000_000_000 // rate
            t = time.monotonic_ns()
            send_ns.append(t)
            producer.send_async(LATENCY_HEADER.pack(scheduled, t, sent) + pad, tally.on_sent)
            sent += 1
        time.sleep(0.0002)
    producer.flush()
    counts = tally.settle(sent)
    t1 = time.monotonic_ns()
    receipts = tally.receipt_ns
    if tally.failed == 0 and len(receipts) == sent:
        # Publish latency (send -> receipt), what Pulsar's perf tool reports for producers.
        publish = array.array("q", map(int.__sub__, receipts, send_ns))
    else:  # a failed send's callback may come out of order: no pairing
        publish = array.array("q")
    result = {
        **counts,
        "publish_latencies": publish.tobytes(),
        "t0": start / 1e9,
        "t1": t1 / 1e9,
        "cpu": time.process_time() - cpu0,
    }
    client.close()
    return result


def latency_consumer_worker(
    ready: Callable[[], None],
    url: str,
    topic: str,
    receiver_queue: int,
    skip: int,
    expected: Any,
    timeout: float,
) -> dict[str, Any]:
    """Receive until the producer's count (set in ``expected`` by the parent) arrived or time is up.

    Returns latencies in ns (as bytes of int64 arrays) of messages with sequence >= ``skip``: from
    the actual send time (``latencies``) and from the scheduled one (``latencies_from_schedule``).
    """
    client = pulsar_client(url)
    consumer = client.subscribe(
        topic,
        "latency",
        receiver_queue_size=receiver_queue,
        initial_position=pulsar.InitialPosition.Earliest,
    )
    lat = array.array("q")
    lat_sched = array.array("q")
    got = 0
    ready()
    cpu0, t0 = time.process_time(), time.monotonic()
    idle_since: float | None = None
    while time.monotonic() < t0 + timeout:
        want = expected.value
        if 0 <= want <= got:
            break
        try:
            msg = consumer.receive(200)
        except pulsar.Timeout:
            # Producer finished and nothing more arrives: give up on lost messages after 5 s.
            now = time.monotonic()
            idle_since = idle_since or now
            if want >= 0 and now - idle_since > 5.0:
                break
            continue
        now_ns = time.monotonic_ns()
        idle_since = None
        scheduled_ns, sent_ns, seq = LATENCY_HEADER.unpack_from(msg.data())
        if seq >= skip:
            lat.append(now_ns - sent_ns)
            lat_sched.append(now_ns - scheduled_ns)
        consumer.acknowledge(msg)
        got += 1
    result = {
        "received": got,
        "latencies": lat.tobytes(),
        "latencies_from_schedule": lat_sched.tobytes(),
        "t0": t0,
        "t1": time.monotonic(),
        "cpu": time.process_time() - cpu0,
    }
    client.close()
    return result
