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
from functools import partial
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


def _admin(broker: StandaloneProcess, method: str, path: str) -> None:
    req = urllib.request.Request(f"{broker.http_url}/admin/v2/persistent/{path}", method=method)
    urllib.request.urlopen(req, timeout=10).close()


def _reader_state(broker: StandaloneProcess, topic: str) -> str:
    """The broker's view of a topic's readers: each consumer's permits, each cursor's positions and reads."""
    base = f"{broker.http_url}/admin/v2/persistent/{topic[13:]}"
    with urllib.request.urlopen(f"{base}/stats", timeout=10) as r:
        stats = json.load(r)
    with urllib.request.urlopen(f"{base}/internalStats", timeout=10) as r:
        internal = json.load(r)
    subs = {
        name: [{k: c.get(k) for k in ("availablePermits", "msgOutCounter", "unackedMessages")} for c in s["consumers"]]
        for name, s in stats["subscriptions"].items()
    }
    keys = ("readPosition", "markDeletePosition", "waitingReadOp", "pendingReadOps", "active")
    cursors = {name: {k: c.get(k) for k in keys} for name, c in internal["cursors"].items()}
    return f"lastConfirmedEntry {internal['lastConfirmedEntry']}, consumers {subs}, cursors {cursors}"


def _first_ledger(broker: StandaloneProcess, topic: str) -> int | None:
    with urllib.request.urlopen(f"{broker.http_url}/admin/v2/persistent/{topic[13:]}/internalStats", timeout=10) as r:
        ledgers = [li["ledgerId"] for li in json.load(r)["ledgers"] if li.get("entries", 0) > 0]
    return ledgers[0] if ledgers else None


def _wait_trimmed(broker: StandaloneProcess, topic: str, ledger: int) -> None:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        first = _first_ledger(broker, topic)
        if first is None or first > ledger:
            return
        time.sleep(0.2)
    raise AssertionError(f"ledger {ledger} of {topic} was not trimmed")


@pytest.fixture
def short_stall(monkeypatch: pytest.MonkeyPatch) -> None:
    """A range read waits at most 4 s for messages the broker says exist (2 minutes in production): a read
    that stalls fails the test quickly instead of hanging it."""
    from magnetar.spark import client_io

    monkeypatch.setattr(client_io, "STALL_LIMIT_MS", 4000)


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_range_trimmed_under_a_planned_read_ends_at_once(
    standalone: StandaloneProcess, topic_name: str, short_stall: None, fail_on_data_loss: bool
) -> None:
    """The reported stall: a range planned, then its ledger trimmed before the executor reads it (no
    subscription, no retention: the topic was reloaded, or rolled over under load). Readers do not hold
    data back (as in Pulsar), so the broker moves the reader past the trimmed ledger while its
    lastMessageId still names the trimmed entries: ``has_message_available()`` stays true and every
    ``read_next`` times out. The read must report the loss (or, with failOnDataLoss=false, end), not wait."""
    from magnetar.spark import client_io
    from magnetar.spark.datasource import PulsarBatchReader
    from magnetar.spark.options import SourceOptions

    broker = standalone
    _produce(broker.service_url, topic_name, 20)
    opts = {"service.url": broker.service_url, "admin.url": broker.http_url, "topic": topic_name}
    opts["failOnDataLoss"] = str(fail_on_data_loss).lower()
    reader = PulsarBatchReader(SourceOptions.parse({**opts, "pollTimeoutMs": "500"}, streaming=False))
    (part,) = reader.partitions()
    ledger = int(part.start.split(":")[0]) if not part.start.startswith("-1") else _first_ledger(broker, topic_name)
    assert ledger is not None
    _admin(broker, "PUT", f"{topic_name[13:]}/unload")  # reloaded: the ledger is closed and trimmed
    _wait_trimmed(broker, topic_name, ledger)
    began = time.monotonic()
    if fail_on_data_loss:
        with pytest.raises(client_io.DataLossError, match="no longer available"):
            list(reader.read(part))
    else:
        assert sum(b.num_rows for b in reader.read(part)) == 0
    assert time.monotonic() - began < 3.5, "the read waited for messages that are gone"


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_ledger_trimmed_inside_a_planned_range_is_reported(
    standalone: StandaloneProcess, topic_name: str, fail_on_data_loss: bool
) -> None:
    """A range spanning two ledgers whose first one is trimmed after planning: the broker moves the reader
    to the second ledger, so the read used to return only its rows, silently. The gap is data loss."""
    from magnetar.spark import client_io
    from magnetar.spark.datasource import PulsarBatchReader
    from magnetar.spark.options import SourceOptions

    broker = standalone
    keep = f"{topic_name[13:]}/subscription/keep"
    _produce(broker.service_url, topic_name, 5)  # creates the topic
    _admin(broker, "PUT", keep)  # holds the first ledger while planning (created at the end: hold it all)
    _admin(broker, "POST", f"{keep}/resetcursor/0")
    first = _first_ledger(broker, topic_name)
    _admin(broker, "PUT", f"{topic_name[13:]}/unload")  # the first ledger is closed; writes go to a new one
    _produce(broker.service_url, topic_name, 7)
    opts = {"service.url": broker.service_url, "admin.url": broker.http_url, "topic": topic_name}
    opts["failOnDataLoss"] = str(fail_on_data_loss).lower()
    reader = PulsarBatchReader(SourceOptions.parse(opts, streaming=False))
    (part,) = reader.partitions()
    _admin(broker, "DELETE", keep)  # nothing holds the first ledger any more: trimmed
    assert first is not None
    _wait_trimmed(broker, topic_name, first)
    if fail_on_data_loss:
        with pytest.raises(client_io.DataLossError, match="no longer available"):
            list(reader.read(part))
    else:
        assert sum(b.num_rows for b in reader.read(part)) == 7


def test_topic_reloaded_during_a_read_gives_each_row_once(standalone: StandaloneProcess, topic_name: str) -> None:
    """The topic is unloaded (a broker restart, a bundle moving) in the middle of a range: the client's reader
    reconnects and resubscribes at the last message it delivered, inclusively, so that message of a batch
    arrives twice. The range must still give each row exactly once."""
    import pulsar

    from magnetar.spark import client_io
    from magnetar.spark.datasource import PulsarBatchReader
    from magnetar.spark.offsets import Position
    from magnetar.spark.options import SourceOptions

    client = pulsar.Client(standalone.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        producer = client.create_producer(
            topic_name, batching_enabled=True, batching_max_messages=10, block_if_queue_full=True
        )
        for i in range(900):
            producer.send_async(str(i).encode(), None)
        producer.flush()
    finally:
        client.close()
    keep = f"{topic_name[13:]}/subscription/keep"
    _admin(standalone, "PUT", keep)
    _admin(standalone, "POST", f"{keep}/resetcursor/0")  # the reload trims nothing
    opts = {"service.url": standalone.service_url, "admin.url": standalone.http_url, "topic": topic_name}
    reader = PulsarBatchReader(SourceOptions.parse(opts, streaming=False))
    (part,) = reader.partitions()
    planner = reader.planner
    check = client_io.RangeCheck(part.ledgers, partial(planner.gone, part.topic), fail=True)
    start, end = Position.parse(part.start), Position.parse(part.end)
    values: list[bytes] = []
    unloaded = False
    try:
        # A small receiver queue: most of the range is still on the broker at the unload.
        for chunk in client_io.iter_chunks(
            planner.client, part.topic, start, end, 500, {"receiver_queue_size": 10}, check
        ):
            values += [m.data() for m in chunk.messages]
            if len(values) >= 300 and not unloaded:
                _admin(standalone, "PUT", f"{topic_name[13:]}/unload")
                unloaded = True
    except TimeoutError as exc:  # a stalled reader: say which side stopped (permits, read position, reads)
        raise AssertionError(f"{exc}; {len(values)} rows read; {_reader_state(standalone, topic_name)}") from exc
    finally:
        planner.close()
    assert unloaded
    assert len(values) == len(set(values)) == 900


def _count_admin_calls(monkeypatch: pytest.MonkeyPatch, method: str) -> list[str]:
    """The topics the Spark source's ``Admin.<method>`` is called for, from now on (calls go through)."""
    from magnetar.spark.admin import Admin

    calls: list[str] = []
    real = getattr(Admin, method)

    def counted(self: Admin, topic: str) -> Any:
        calls.append(topic)
        return real(self, topic)

    monkeypatch.setattr(Admin, method, counted)
    return calls


def _put_partitions(broker: StandaloneProcess, topic: str, n: int, method: str = "PUT") -> None:
    req = urllib.request.Request(
        f"{broker.http_url}/admin/v2/persistent/{topic[13:]}/partitions",
        data=str(n).encode(),
        method=method,
        headers={"Content-Type": "application/json"},
    )
    urllib.request.urlopen(req, timeout=10).close()


def test_running_stream_resolves_its_topics_once_a_refresh_interval(
    standalone: StandaloneProcess, topic_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spark asks a running stream for its latest offset every 10 ms while idle: the topics' partitions are
    looked up again once ``TOPIC_REFRESH_S`` has passed, not on every call; a grown topic is read then."""
    from magnetar.spark import datasource
    from magnetar.spark.datasource import PulsarStreamReader
    from magnetar.spark.options import SourceOptions

    _put_partitions(standalone, topic_name, 2)
    _produce(standalone.service_url, topic_name, 4)
    lookups = _count_admin_calls(monkeypatch, "partitions")
    monkeypatch.setattr(datasource, "TOPIC_REFRESH_S", 2.0)
    opts = {"service.url": standalone.service_url, "admin.url": standalone.http_url, "topic": topic_name}
    reader = PulsarStreamReader(SourceOptions.parse({**opts, "startingOffsets": "earliest"}, streaming=True))
    try:
        start = reader.initialOffset()
        lookups.clear()
        began = time.monotonic()
        for _ in range(20):
            latest = reader.latestOffset(start, None)
        assert time.monotonic() - began < 2.0, "the calls took too long for this test to tell"
        assert len(lookups) <= 1
        assert sorted(latest) == [f"{topic_name}-partition-{i}" for i in range(2)]
        _put_partitions(standalone, topic_name, 3, method="POST")
        _produce(standalone.service_url, f"{topic_name}-partition-2", 1)
        time.sleep(2.1)
        latest = reader.latestOffset(start, None)
        assert f"{topic_name}-partition-2" in latest
    finally:
        reader.stop()


def test_held_back_micro_batch_paces_the_polling(
    standalone: StandaloneProcess, topic_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While minRecordsPerTrigger holds a micro-batch back, Spark still asks every 10 ms (each call a round trip
    from its JVM, and a lookup an admin call per partition): ``latestOffset`` answers once per ``HOLD_POLL_S``."""
    from magnetar.spark import datasource
    from magnetar.spark.datasource import PulsarStreamReader
    from magnetar.spark.options import SourceOptions

    _produce(standalone.service_url, topic_name, 3)
    lookups = _count_admin_calls(monkeypatch, "last_position")
    monkeypatch.setattr(datasource, "HOLD_POLL_S", 0.3)
    opts = {"service.url": standalone.service_url, "admin.url": standalone.http_url, "topic": topic_name}
    reader = PulsarStreamReader(
        SourceOptions.parse({**opts, "startingOffsets": "earliest", "minRecordsPerTrigger": "100"}, streaming=True)
    )
    try:
        first = reader.latestOffset(reader.initialOffset(), None)  # the first call admits what is there
        assert first != reader.initialOffset()
        _produce(standalone.service_url, topic_name, 5)
        lookups.clear()
        began = time.monotonic()
        for _ in range(4):
            assert reader.latestOffset(first, None) == first  # 5 < 100 rows: held back
        took = time.monotonic() - began
        assert len(lookups) == 4
        assert 0.85 <= took < 3.0  # three waits of 0.3 s after the first hold (not 4 immediate answers)
        _produce(standalone.service_url, topic_name, 100)
        assert reader.latestOffset(first, None) != first  # enough rows now: admitted after the wait
    finally:
        reader.stop()
