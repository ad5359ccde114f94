"""Driver-side planning of the ``pulsar`` source against a real broker, without a JVM (fast, plain pytest).

The readers' planning methods (``partitions``, ``initialOffset``) are plain Python that Spark calls in a Python
worker; calling them directly tests topic resolution, waiting and the commit subscription in seconds.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import StandaloneProcess
from tests.spark.conftest import spark_unavailable

pytestmark = pytest.mark.skipif(spark_unavailable() is not None, reason=str(spark_unavailable()))


def _stats(broker: StandaloneProcess, topic: str) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(f"{broker.http_url}/admin/v2/persistent/{topic[13:]}/stats", timeout=10) as r:
            return json.load(r)
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise


def _produce(service_url: str, topic: str, n: int) -> None:
    import pulsar

    client = pulsar.Client(service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        producer = client.create_producer(topic, batching_enabled=False, block_if_queue_full=True)
        for i in range(n):
            producer.send_async(f"m{i}".encode(), None)
        producer.flush()
    finally:
        client.close()


@pytest.fixture
def eager_deleter(tmp_path: Path) -> Iterator[StandaloneProcess]:
    """A broker deleting topics without subscriptions after 1 s of inactivity (Pulsar's mode, shorter)."""
    node = StandaloneProcess(
        tmp_path / "data",
        {
            "brokerDeleteInactiveTopicsFrequencySeconds": "0.5",
            "brokerDeleteInactiveTopicsMaxInactiveDurationSeconds": "1",
        },
    )
    node.start()
    yield node
    node.stop()


def test_stream_subscription_keeps_unread_topic_alive(eager_deleter: StandaloneProcess, topic_name: str) -> None:
    """A stream's default commit subscription exists from its first planning: the broker keeps the topic."""
    from magnetar.spark.datasource import PulsarStreamReader
    from magnetar.spark.options import SourceOptions

    kept, dropped = f"{topic_name}-kept", f"{topic_name}-dropped"
    _produce(eager_deleter.service_url, kept, 3)
    _produce(eager_deleter.service_url, dropped, 3)
    opts = {"service.url": eager_deleter.service_url, "admin.url": eager_deleter.http_url, "topic": kept}
    reader = PulsarStreamReader(SourceOptions.parse({**opts, "startingOffsets": "earliest"}, streaming=True))
    try:
        start = reader.initialOffset()
    finally:
        reader.stop()
    sub = SourceOptions.parse(opts, streaming=True).commit_subscription
    assert sub and sub.startswith("spark-")
    deadline = time.monotonic() + 15
    while _stats(eager_deleter, dropped) is not None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _stats(eager_deleter, dropped) is None, "the broker deletes an inactive topic nobody subscribed to"
    stats = _stats(eager_deleter, kept)
    assert stats is not None and stats["subscriptions"][sub]["msgBacklog"] == 3
    assert json.loads(json.dumps(start)) == start


def test_waiting_for_non_existed_topic(standalone: StandaloneProcess, topic_name: str) -> None:
    """``waitingForNonExistedTopic=true`` plans once the topic exists; by default a missing topic is empty."""
    from magnetar.spark.datasource import PulsarBatchReader
    from magnetar.spark.options import SourceOptions

    opts = {"service.url": standalone.service_url, "admin.url": standalone.http_url, "topic": topic_name}
    assert PulsarBatchReader(SourceOptions.parse(opts, streaming=False)).partitions() == []

    def create() -> None:
        req = urllib.request.Request(f"{standalone.http_url}/admin/v2/persistent/{topic_name[13:]}", method="PUT")
        urllib.request.urlopen(req, timeout=10).close()

    creator = threading.Timer(1.5, create)
    creator.start()
    try:
        began = time.monotonic()
        waiting = PulsarBatchReader(SourceOptions.parse({**opts, "waitingForNonExistedTopic": "true"}, False))
        assert waiting.partitions() == []  # created empty
        assert time.monotonic() - began >= 1.0
    finally:
        creator.join(30)
    assert _stats(standalone, topic_name) is not None


def test_slow_reads_never_truncate_a_range(standalone: StandaloneProcess, topic_name: str) -> None:
    """A receive that times out (a loaded machine, a slow broker) while the range still has messages waits
    for them: a batch read must not silently return fewer rows than the range holds."""
    from magnetar.spark.datasource import PulsarBatchReader
    from magnetar.spark.options import SourceOptions

    _produce(standalone.service_url, topic_name, 5000)
    opts = {"service.url": standalone.service_url, "admin.url": standalone.http_url, "topic": topic_name}
    reader = PulsarBatchReader(SourceOptions.parse({**opts, "pollTimeoutMs": "1"}, streaming=False))
    (part,) = reader.partitions()
    assert sum(batch.num_rows for batch in reader.read(part)) == 5000
