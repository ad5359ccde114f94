"""Subscription endpoints of the admin API, observed through the official client."""

from __future__ import annotations

import time

import pulsar
import pytest

from tests.admin.rest import call
from tests.conftest import StandaloneProcess

E = pulsar.InitialPosition.Earliest


@pytest.fixture
def topic_url(standalone: StandaloneProcess, topic_name: str) -> str:
    return f"{standalone.http_url}/admin/v2/{topic_name.replace('persistent://', 'persistent/')}"


def _fill(client: pulsar.Client, topic: str, n: int) -> list[pulsar.MessageId]:
    producer = client.create_producer(topic, batching_enabled=False)
    ids = [producer.send(f"m{i}".encode(), properties={"i": str(i)}) for i in range(n)]
    producer.close()
    return ids


def _backlog(topic_url: str, sub: str) -> int:
    return call("GET", f"{topic_url}/stats").json["subscriptions"][sub]["msgBacklog"]


def test_create_list_delete_subscription(client: pulsar.Client, topic_name: str, topic_url: str) -> None:
    _fill(client, topic_name, 3)
    assert call("PUT", f"{topic_url}/subscription/from-start", {"ledgerId": -1, "entryId": -1}).status == 204
    assert call("PUT", f"{topic_url}/subscription/from-end").status == 204
    assert call("PUT", f"{topic_url}/subscription/from-end").status == 409
    assert call("GET", f"{topic_url}/subscriptions").json == ["from-end", "from-start"]
    assert _backlog(topic_url, "from-start") == 3 and _backlog(topic_url, "from-end") == 0
    consumer = client.subscribe(topic_name, "from-start")
    assert consumer.receive(timeout_millis=5000).data() == b"m0"
    busy = call("DELETE", f"{topic_url}/subscription/from-start")
    assert busy.status == 412 and busy.reason == "Subscription has active connected consumers"
    assert call("DELETE", f"{topic_url}/subscription/from-start?force=true").status == 204
    assert call("DELETE", f"{topic_url}/subscription/from-end").status == 204
    assert call("GET", f"{topic_url}/subscriptions").json == []
    assert call("DELETE", f"{topic_url}/subscription/nope").status == 404


def test_skip_skip_all_and_expire(client: pulsar.Client, topic_name: str, topic_url: str) -> None:
    call("PUT", f"{topic_url}/subscription/s", {"ledgerId": -1, "entryId": -1})
    _fill(client, topic_name, 10)
    assert call("POST", f"{topic_url}/subscription/s/skip/3").status == 204
    assert _backlog(topic_url, "s") == 7
    consumer = client.subscribe(topic_name, "s")
    assert consumer.receive(timeout_millis=5000).data() == b"m3"
    consumer.close()
    assert call("POST", f"{topic_url}/subscription/s/skip_all").status == 204
    assert _backlog(topic_url, "s") == 0
    call("PUT", f"{topic_url}/subscription/e", {"ledgerId": -1, "entryId": -1})
    time.sleep(1.1)
    _fill(client, topic_name, 2)
    assert call("POST", f"{topic_url}/subscription/e/expireMessages/1").status == 204
    assert _backlog(topic_url, "e") == 2  # only the 10 older messages expired
    assert call("POST", f"{topic_url}/all_subscription/expireMessages/0").status == 204
    assert _backlog(topic_url, "e") == 0


def test_reset_cursor_by_time_and_id(client: pulsar.Client, topic_name: str, topic_url: str) -> None:
    call("PUT", f"{topic_url}/subscription/r", {"ledgerId": -1, "entryId": -1})
    ids = _fill(client, topic_name, 5)
    call("POST", f"{topic_url}/subscription/r/skip_all")
    mid = {"ledgerId": ids[2].ledger_id(), "entryId": ids[2].entry_id()}
    assert call("POST", f"{topic_url}/subscription/r/resetcursor", mid).status == 204
    assert _backlog(topic_url, "r") == 3
    assert call("POST", f"{topic_url}/subscription/r/resetcursor?isExcluded=true", mid).status == 204
    assert _backlog(topic_url, "r") == 2
    assert call("POST", f"{topic_url}/subscription/r/resetcursor/0").status == 204
    assert _backlog(topic_url, "r") == 5
    bad = call("POST", f"{topic_url}/subscription/r/resetcursor", {"ledgerId": "x"})
    assert bad.status == 400 and "ledgerId" in bad.reason
    unknown = call("POST", f"{topic_url}/subscription/r/resetcursor", {"ledgerId": 1, "entryId": 1, "bogus": 1})
    assert unknown.status == 400


def test_reset_cursor_by_time_includes_that_millisecond(client: pulsar.Client, topic_name: str, topic_url: str) -> None:
    """resetcursor/{timestamp} resumes at the first entry published at or after it (Pulsar's finder looks
    for the newest entry strictly earlier): a batch published in that very millisecond comes back whole."""
    call("PUT", f"{topic_url}/subscription/r", {"ledgerId": -1, "entryId": -1})
    _fill(client, topic_name, 2)
    batched = client.create_producer(
        topic_name, batching_enabled=True, batching_max_messages=3, batching_max_publish_delay_ms=100
    )
    for i in range(3):
        batched.send_async(f"b{i}".encode(), None)
    batched.flush()
    reader = client.create_reader(topic_name, pulsar.MessageId.earliest)
    published = [(m.data(), m.publish_timestamp()) for m in (reader.read_next(5000) for _ in range(5))]
    reader.close()
    batch_time = published[2][1]
    call("POST", f"{topic_url}/subscription/r/skip_all")
    assert call("POST", f"{topic_url}/subscription/r/resetcursor/{batch_time}").status == 204
    consumer = client.subscribe(topic_name, "r")
    got = []
    while True:
        try:
            got.append(consumer.receive(timeout_millis=1000).data())
        except pulsar.Timeout:
            break
    assert got == [d for d, t in published if t >= batch_time]
    assert got[-3:] == [b"b0", b"b1", b"b2"]


def test_peek_and_examine(client: pulsar.Client, topic_name: str, topic_url: str) -> None:
    call("PUT", f"{topic_url}/subscription/p", {"ledgerId": -1, "entryId": -1})
    ids = _fill(client, topic_name, 3)
    first = call("GET", f"{topic_url}/subscription/p/position/1")
    assert first.status == 200 and first.body == b"m0"
    assert first.headers["X-Pulsar-Message-ID"] == f"{ids[0].ledger_id()}:{ids[0].entry_id()}"
    assert first.headers["X-Pulsar-PROPERTY-i"] == "0"
    assert "X-Pulsar-publish-time" in first.headers
    assert call("GET", f"{topic_url}/subscription/p/position/3").body == b"m2"
    assert call("GET", f"{topic_url}/subscription/p/position/4").status == 404
    assert _backlog(topic_url, "p") == 3  # peeking consumes nothing
    latest = call("GET", f"{topic_url}/examinemessage?initialPosition=latest&messagePosition=1")
    assert latest.body == b"m2"
    earliest = call("GET", f"{topic_url}/examinemessage?initialPosition=earliest&messagePosition=2")
    assert earliest.body == b"m1"


def test_peek_batched_compressed_entry(client: pulsar.Client, topic_name: str, topic_url: str) -> None:
    call("PUT", f"{topic_url}/subscription/b", {"ledgerId": -1, "entryId": -1})
    producer = client.create_producer(
        topic_name,
        batching_enabled=True,
        batching_max_publish_delay_ms=100,
        compression_type=pulsar.CompressionType.LZ4,
    )
    for i in range(5):
        producer.send_async(f"batched-{i}".encode() * 20, None)
    producer.flush()
    reply = call("GET", f"{topic_url}/subscription/b/position/1")
    assert reply.status == 200 and int(reply.headers["X-Pulsar-num-batch-message"]) >= 2
    assert b"batched-0" in reply.body  # decompressed for the reader


def test_get_message_by_id(client: pulsar.Client, topic_name: str, topic_url: str) -> None:
    ids = _fill(client, topic_name, 3)
    reply = call("GET", f"{topic_url}/ledger/{ids[1].ledger_id()}/entry/{ids[1].entry_id()}")
    assert reply.status == 200 and reply.body == b"m1" and reply.headers["X-Pulsar-PROPERTY-i"] == "1"
    assert call("GET", f"{topic_url}/ledger/{ids[1].ledger_id()}/entry/999999").status == 404
    assert call("GET", f"{topic_url}/ledger/x/entry/1").status == 400
