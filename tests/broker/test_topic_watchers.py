"""Topic-list watchers (PIP-145) over raw frames: the Python client polls instead, the Java client watches."""

from __future__ import annotations

import time
import urllib.request
import uuid
from collections.abc import Iterator

import pulsar
import pytest

from magnetar.broker.protocol import pulsar_api_pb2 as pb
from magnetar.broker.topic_list import compile_topics_pattern, filter_topics, topics_hash
from tests.admin.rest import call
from tests.conftest import StandaloneProcess
from tests.rawclient import RawClient

T = pb.BaseCommand
NS = "public/default"


# ---------------------------------------------------------------------------------------------- pure helpers


def test_topics_hash_is_pulsars_crc32c() -> None:
    # CRC32C("123456789") = 0xE3069283; Guava prints a HashCode's little-endian bytes.
    assert topics_hash(["123456789"]) == "839206e3"
    assert topics_hash(["b", "a"]) == topics_hash(["a", "b"]) != topics_hash(["a"])
    assert topics_hash([]) == "00000000"


def test_pattern_matches_base_name_without_scheme() -> None:
    pattern = compile_topics_pattern("persistent://public/default/orders-.*")
    topics = [
        "persistent://public/default/orders-1",
        "persistent://public/default/orders-p-partition-3",
        "persistent://public/default/other",
        "persistent://public/default/xorders-1",
    ]
    assert filter_topics(topics, pattern) == topics[:2]
    # Whole-name match, as Java's Matcher.matches(): a prefix is not enough.
    assert not compile_topics_pattern("persistent://public/default/orders").matches(topics[0])


# ---------------------------------------------------------------------------------------------- wire


def _short_base() -> str:
    # Patterns longer than subscriptionPatternMaxLength (50) are refused, so keep names short.
    return "w" + uuid.uuid4().hex[:8]


def _watch(raw: RawClient, pattern: str, watcher_id: int = 1, request_id: int = 1, topics_hash: str | None = None) -> T:
    cmd = T(type=T.WATCH_TOPIC_LIST)
    w = cmd.watchTopicList
    w.request_id, w.watcher_id, w.namespace, w.topics_pattern = request_id, watcher_id, NS, pattern
    if topics_hash is not None:
        w.topics_hash = topics_hash
    raw.send(cmd)
    return raw.recv_until_any({T.WATCH_TOPIC_LIST_SUCCESS, T.ERROR})


def _no_update_within(raw: RawClient, seconds: float) -> bool:
    """True if no WATCH_TOPIC_UPDATE arrives within ``seconds``."""
    raw.sock.settimeout(seconds)
    try:
        raw.recv_until(T.WATCH_TOPIC_UPDATE)
    except TimeoutError:
        return True
    finally:
        raw.sock.settimeout(10)
    return False


def _watchers(standalone: StandaloneProcess) -> int:
    with urllib.request.urlopen(f"{standalone.http_url}/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("magnetar_topic_list_watchers{"):
                return int(float(line.rsplit(" ", 1)[1]))
    raise AssertionError("magnetar_topic_list_watchers not exported")


@pytest.fixture
def raw(standalone: StandaloneProcess) -> Iterator[RawClient]:
    r = RawClient(standalone.port, timeout=10)
    yield r
    r.close()


def test_connected_advertises_topic_watchers(raw: RawClient) -> None:
    assert raw.connect().connected.feature_flags.supports_topic_watchers


def test_watch_reports_current_then_created_and_deleted_topics(
    standalone: StandaloneProcess, client: pulsar.Client, raw: RawClient
) -> None:
    base = _short_base()
    first = f"persistent://{NS}/{base}-a"
    client.create_producer(first).close()
    raw.connect()
    pattern = f"persistent://{NS}/{base}-.*"

    success = _watch(raw, pattern, watcher_id=5, request_id=8)
    assert success.type == T.WATCH_TOPIC_LIST_SUCCESS, success
    s = success.watchTopicListSuccess
    assert (s.request_id, s.watcher_id) == (8, 5)
    assert list(s.topic) == [first] and s.topics_hash == topics_hash([first])

    # A topic created by the official client appears at once, with the new list's hash.
    second = f"persistent://{NS}/{base}-b"
    started = time.monotonic()
    client.create_producer(second).close()
    update = raw.recv_until(T.WATCH_TOPIC_UPDATE).watchTopicUpdate
    assert time.monotonic() - started < 5
    assert update.watcher_id == 5 and list(update.new_topics) == [second] and not update.deleted_topics
    assert update.topics_hash == topics_hash([first, second])

    # A topic the pattern does not match sends nothing; the next update is the matching one.
    client.create_producer(f"persistent://{NS}/x{base}").close()
    third = f"persistent://{NS}/{base}-c"
    reply = call("PUT", f"{standalone.http_url}/admin/v2/persistent/{NS}/{base}-c")  # created via admin
    assert reply.status in (200, 204), reply
    update = raw.recv_until(T.WATCH_TOPIC_UPDATE).watchTopicUpdate
    assert list(update.new_topics) == [third]

    # Deleting reports deleted_topics.
    assert call("DELETE", f"{standalone.http_url}/admin/v2/persistent/{NS}/{base}-a").status in (200, 204)
    update = raw.recv_until(T.WATCH_TOPIC_UPDATE).watchTopicUpdate
    assert list(update.deleted_topics) == [first] and not update.new_topics
    assert update.topics_hash == topics_hash([second, third])


def test_known_hash_gets_an_empty_list(client: pulsar.Client, raw: RawClient) -> None:
    base = _short_base()
    topic = f"persistent://{NS}/{base}-a"
    client.create_producer(topic).close()
    raw.connect()
    s = _watch(raw, f"persistent://{NS}/{base}-.*", topics_hash=topics_hash([topic])).watchTopicListSuccess
    assert list(s.topic) == [] and s.topics_hash == topics_hash([topic])


def test_partitions_match_by_their_partitioned_name(standalone: StandaloneProcess, raw: RawClient) -> None:
    base = _short_base()
    raw.connect()
    assert _watch(raw, f"persistent://{NS}/{base}").type == T.WATCH_TOPIC_LIST_SUCCESS
    assert call("PUT", f"{standalone.http_url}/admin/v2/persistent/{NS}/{base}/partitions", 1).status == 204
    producer_client = pulsar.Client(standalone.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        producer_client.create_producer(f"persistent://{NS}/{base}").close()
    finally:
        producer_client.close()
    update = raw.recv_until(T.WATCH_TOPIC_UPDATE).watchTopicUpdate
    assert list(update.new_topics) == [f"persistent://{NS}/{base}-partition-0"]


def test_close_stops_updates(standalone: StandaloneProcess, client: pulsar.Client, raw: RawClient) -> None:
    base = _short_base()
    raw.connect()
    before = _watchers(standalone)
    assert _watch(raw, f"persistent://{NS}/{base}-.*", watcher_id=3).type == T.WATCH_TOPIC_LIST_SUCCESS
    assert _watchers(standalone) == before + 1
    close = T(type=T.WATCH_TOPIC_LIST_CLOSE)
    close.watchTopicListClose.request_id, close.watchTopicListClose.watcher_id = 11, 3
    raw.send(close)
    assert raw.recv_until_response(11).type == T.SUCCESS
    assert _watchers(standalone) == before
    client.create_producer(f"persistent://{NS}/{base}-a").close()
    assert _no_update_within(raw, 1.5)


def test_disconnect_removes_watchers(standalone: StandaloneProcess) -> None:
    before = _watchers(standalone)
    raw = RawClient(standalone.port)
    try:
        raw.connect()
        for i in range(3):
            assert _watch(raw, f"persistent://{NS}/{_short_base()}", watcher_id=i, request_id=i).type == (
                T.WATCH_TOPIC_LIST_SUCCESS
            )
        assert _watchers(standalone) == before + 3
    finally:
        raw.close()
    deadline = time.monotonic() + 5
    while _watchers(standalone) != before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _watchers(standalone) == before


@pytest.mark.parametrize(
    ("pattern", "code"),
    [
        (f"persistent://{NS}/bad[", pb.UnknownError),
        (f"persistent://{NS}/" + "x" * 60, pb.NotAllowedError),  # longer than subscriptionPatternMaxLength
    ],
)
def test_refused_patterns(raw: RawClient, pattern: str, code: int) -> None:
    raw.connect()
    reply = _watch(raw, pattern, request_id=21)
    assert reply.type == T.ERROR and reply.error.request_id == 21 and reply.error.error == code
    assert _watch(raw, f"persistent://{NS}/{_short_base()}", request_id=22).type == T.WATCH_TOPIC_LIST_SUCCESS


# ---------------------------------------------------------------------------------------------- in process


async def test_service_reports_topic_records_only() -> None:
    """Cursor records and metadata updates under a topic are not topic changes; URL-encoded names decode."""
    from magnetar.broker.topic_list import TopicListService, TopicListWatcher
    from magnetar.metadata.embedded import EmbeddedMetadataStore

    store = EmbeddedMetadataStore(":memory:")
    await store.start()
    try:
        updates: list[tuple[list[str], list[str]]] = []
        service = TopicListService(store)
        watcher = TopicListWatcher(1, NS, compile_topics_pattern("persistent://public/default/a.*"),
                                   lambda _id, new, deleted, _hash: updates.append((new, deleted)))  # fmt: skip
        service.add(watcher)
        root = f"/managed-ledgers/{NS}/persistent"
        await store.put(f"{root}/a%20b", b"{}")  # created before the listing is in: reported after it
        watcher.start([])
        assert updates == [([f"persistent://{NS}/a b"], [])]
        await store.put(f"{root}/a%20b/cursor", b"{}")
        await store.put(f"{root}/a%20b", b"{}")  # modified
        await store.put(f"{root}/zz", b"{}")  # no match
        await store.delete(f"{root}/a%20b/cursor")
        await store.delete(f"{root}/a%20b")
        assert updates[1:] == [([], [f"persistent://{NS}/a b"])]
        assert service.watcher_count() == 1
        service.remove(watcher)
        assert service.watcher_count() == 0
        await store.put(f"{root}/again", b"{}")
        assert len(updates) == 2
    finally:
        await store.close()
