"""Back-pressure: a consumer that does not read its socket, a producer that outruns storage.

Broker memory must stay bounded: dispatch stops for a consumer whose connection is not writable
(and resumes when it drains), and the broker stops reading a connection with too many sends in
flight (``maxPendingPublishRequestsPerConnection``) or while the broker-wide publish buffer
(``maxMessagePublishBufferSizeInMB``) is full.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pulsar
import pytest

from magnetar.broker.protocol import pulsar_api_pb2 as pb
from tests.admin.rest import call
from tests.conftest import StandaloneProcess
from tests.rawclient import RawClient, T


def _stats(standalone: StandaloneProcess, topic: str) -> dict:
    path = topic.replace("persistent://", "persistent/")
    reply = call("GET", f"{standalone.http_url}/admin/v2/{path}/stats")
    assert reply.status == 200, reply.body
    return json.loads(reply.body)


def test_dispatch_stops_for_a_consumer_that_does_not_read(
    standalone: StandaloneProcess, client: pulsar.Client, topic_name: str
) -> None:
    """A slow reader with huge permits: the broker must not push the whole backlog into its
    connection's write buffer, only what the socket takes, and resume once the reader drains."""
    raw = RawClient(standalone.port, timeout=10)
    try:
        raw.connect()
        reply = raw.subscribe(topic_name, "slow", sub_type=pb.CommandSubscribe.Shared)
        assert reply.type == T.SUCCESS, reply
        raw.flow(1, 1_000_000)  # permits for everything; then never read
        producer = client.create_producer(topic_name, batching_enabled=False, block_if_queue_full=True)
        payload = b"x" * 100_000
        count = 600  # 60 MB: far more than socket buffers hold
        for _ in range(count):
            producer.send_async(payload, None)
        producer.flush()
        time.sleep(1.0)
        out = _stats(standalone, topic_name)["subscriptions"]["slow"]["msgOutCounter"]
        assert out < count // 2, f"{out} of {count} messages were pushed to a consumer that reads nothing"
        # The reader drains its socket: delivery resumes and everything arrives.
        got = 0
        deadline = time.monotonic() + 60
        while got < count and time.monotonic() < deadline:
            cmd = raw.recv_until(T.MESSAGE)
            assert cmd.message.consumer_id == 1
            got += 1
        assert got == count
        producer.close()
    finally:
        raw.close()


@pytest.fixture
def limited_standalone(tmp_path: Path):  # type: ignore[no-untyped-def]
    node = StandaloneProcess(
        tmp_path / "data", {"maxPendingPublishRequestsPerConnection": "10", "maxMessagePublishBufferSizeInMB": "1"}
    )
    node.start()
    yield node
    node.stop()
