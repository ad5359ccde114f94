"""Hostile clients (issue 13): one frame, message or disconnect must not freeze the broker, block a
subscription, or corrupt a topic; every other client keeps working."""

from __future__ import annotations

import json
import socket
import struct
import time
import urllib.error
import urllib.parse
import urllib.request
import zlib

import lz4.block
import pulsar
import pytest
import snappy
import zstandard
from crc32c import crc32c

from magnetar.broker.protocol import pulsar_api_pb2 as pb
from magnetar.broker.protocol.frames import encode_command, entry_meta
from tests.conftest import StandaloneProcess, _quiet_logger
from tests.rawclient import RawClient

T = pb.BaseCommand


def _topics_of_namespace(raw: RawClient, pattern: str, request_id: int = 3) -> T:
    cmd = T(type=T.GET_TOPICS_OF_NAMESPACE)
    r = cmd.getTopicsOfNamespace
    r.request_id, r.namespace, r.topics_pattern = request_id, "public/default", pattern
    raw.send(cmd)
    return raw.recv_until_any({T.GET_TOPICS_OF_NAMESPACE_RESPONSE, T.ERROR})


# ---------------------------------------------------------------- 4: regex denial of service
def test_catastrophic_pattern_does_not_freeze_broker(fresh_standalone: StandaloneProcess) -> None:
    fresh_standalone.start()
    client = pulsar.Client(fresh_standalone.service_url, operation_timeout_seconds=10, logger=_quiet_logger())
    try:
        long_name = "persistent://public/default/" + "a" * 40
        client.create_producer(long_name).close()
    finally:
        client.close()
    evil = RawClient(fresh_standalone.port)
    evil.connect()
    cmd = T(type=T.GET_TOPICS_OF_NAMESPACE)
    r = cmd.getTopicsOfNamespace
    r.request_id, r.namespace, r.topics_pattern = 3, "public/default", "^(.+)+#$"
    evil.send(cmd)
    started = time.monotonic()
    probe = RawClient(fresh_standalone.port, timeout=3)
    try:
        assert probe.connect().type == T.CONNECTED
        assert time.monotonic() - started < 3
        reply = evil.recv_until_any({T.GET_TOPICS_OF_NAMESPACE_RESPONSE, T.ERROR})
        assert reply.type == T.GET_TOPICS_OF_NAMESPACE_RESPONSE
        assert list(reply.getTopicsOfNamespaceResponse.topics) == []
    finally:
        probe.close()
        evil.close()


def test_pattern_with_unsupported_syntax_gets_clear_error(standalone: StandaloneProcess) -> None:
    raw = RawClient(standalone.port)
    try:
        raw.connect()
        reply = _topics_of_namespace(raw, r"public/default/(a)\1")
        assert reply.type == T.ERROR and reply.error.request_id == 3
        assert "RE2" in reply.error.message
        ok = _topics_of_namespace(raw, "public/default/.*", request_id=4)
        assert ok.type == T.GET_TOPICS_OF_NAMESPACE_RESPONSE
    finally:
        raw.close()


# ---------------------------------------------------------------- 1: poison messages
def _entry_with_raw_metadata(meta: bytes, payload: bytes) -> bytes:
    body = struct.pack(">I", len(meta)) + meta + payload
    return struct.pack(">HI", 0x0E01, crc32c(body)) + body


def _meta(**fields: object) -> bytes:
    return pb.MessageMetadata(producer_name="raw", sequence_id=0, publish_time=1, **fields).SerializeToString()


_INVALID_UTF8_KEY = _meta(partition_key="k").replace(b"\x01k", b"\x01\xff")

POISON = {
    "garbage-metadata": _entry_with_raw_metadata(b"\xff\xff\xff\xff", b"payload"),
    "invalid-utf8-partition-key": _entry_with_raw_metadata(_INVALID_UTF8_KEY, b"payload"),
    "batch-claims-2^31-messages": _entry_with_raw_metadata(_meta(num_messages_in_batch=2**31 - 1), b"tiny"),
    "batch-claims-zero-messages": _entry_with_raw_metadata(_meta(num_messages_in_batch=0), b"tiny"),
}


@pytest.mark.parametrize("poison", list(POISON), ids=list(POISON))
def test_poison_message_is_refused_and_subscription_keeps_flowing(
    standalone: StandaloneProcess, client: pulsar.Client, topic_name: str, poison: str
) -> None:
    consumer = client.subscribe(
        topic_name, "s", consumer_type=pulsar.ConsumerType.Shared, initial_position=pulsar.InitialPosition.Earliest
    )
    raw = RawClient(standalone.port)
    try:
        raw.connect()
        assert raw.create_producer(topic_name).type == T.PRODUCER_SUCCESS
        raw.send_message(1, 0, b"", entry=POISON[poison])
        reply = raw.recv_until_any({T.SEND_ERROR, T.SEND_RECEIPT})
        assert reply.type == T.SEND_ERROR and reply.send_error.error == pb.NotAllowedError
        assert "metadata" in reply.send_error.message.lower() or "batch" in reply.send_error.message.lower()
        raw.send_message(1, 1, b"good")
        assert raw.recv_until(T.SEND_RECEIPT).send_receipt.sequence_id == 1
    finally:
        raw.close()
    assert consumer.receive(timeout_millis=5000).data() == b"good"
    consumer.seek(pulsar.MessageId.earliest)
    assert consumer.receive(timeout_millis=5000).data() == b"good"
    consumer.unsubscribe()


@pytest.mark.parametrize("poison", list(POISON), ids=list(POISON))
def test_entry_meta_never_raises_on_a_stored_entry(poison: str) -> None:
    meta = entry_meta(POISON[poison])
    assert 1 <= meta.num_messages <= len(POISON[poison])
    assert isinstance(meta.sticky_key, bytes)


def test_batch_lying_about_its_contents_is_delivered_as_is(
    standalone: StandaloneProcess, client: pulsar.Client, topic_name: str
) -> None:
    # Claims 3 messages, holds one: the broker cannot tell without per-message work; it stores and
    # delivers the entry unchanged and the subscription goes on to the next message.
    single = pb.SingleMessageMetadata(payload_size=20).SerializeToString()
    payload = struct.pack(">I", len(single)) + single + b"hi" * 10
    lying = _entry_with_raw_metadata(_meta(num_messages_in_batch=3), payload)
    raw = RawClient(standalone.port)
    try:
        raw.connect()
        assert raw.create_producer(topic_name).type == T.PRODUCER_SUCCESS
        raw.send_message(1, 0, b"", entry=lying)
        raw.send_message(1, 1, b"good")
        assert raw.recv_until(T.SEND_RECEIPT).send_receipt.sequence_id == 0
        assert raw.recv_until(T.SEND_RECEIPT).send_receipt.sequence_id == 1
        assert raw.subscribe(topic_name, "s", consumer_id=7, request_id=9).type == T.SUCCESS
        raw.flow(7, 100)
        first, second = raw.recv_until(T.MESSAGE), raw.recv_until(T.MESSAGE)
        assert (first.message.message_id.entryId, second.message.message_id.entryId) == (0, 1)
    finally:
        raw.close()


# ---------------------------------------------------------------- 2: invalid UTF-8 from the wire
def _with_invalid_utf8(cmd: T, text: str) -> bytes:
    """``cmd``'s frame with the string ``text`` (once in it) turned into invalid UTF-8 of the same length."""
    body = cmd.SerializeToString()
    encoded = text.encode()
    assert body.count(encoded) == 1
    body = body.replace(encoded, b"\xff" * len(encoded))
    return struct.pack(">II", len(body) + 4, len(body)) + body


def test_invalid_utf8_topic_is_invalid_topic_name(standalone: StandaloneProcess, client: pulsar.Client) -> None:
    raw = RawClient(standalone.port)
    try:
        raw.connect()
        for kind, field in ((T.PRODUCER, "producer"), (T.SUBSCRIBE, "subscribe"), (T.LOOKUP, "lookupTopic")):
            cmd = T(type=kind)
            inner = getattr(cmd, field)
            inner.topic, inner.request_id = "persistent://public/default/BADNAME", 5
            if kind == T.SUBSCRIBE:
                inner.subscription, inner.subType, inner.consumer_id = "s", pb.CommandSubscribe.Exclusive, 1
            elif kind == T.PRODUCER:
                inner.producer_id = 1
            raw.send_raw(_with_invalid_utf8(cmd, "BADNAME"))
            reply = raw.recv_until_any({T.ERROR, T.LOOKUP_RESPONSE, T.PRODUCER_SUCCESS, T.SUCCESS})
            if reply.type == T.LOOKUP_RESPONSE:
                assert reply.lookupTopicResponse.response == pb.CommandLookupTopicResponse.Failed
                assert reply.lookupTopicResponse.error == pb.InvalidTopicName
            else:
                assert reply.type == T.ERROR and reply.error.error == pb.InvalidTopicName, reply
        # The connection still works, and no producer was left behind with id 1.
        assert raw.create_producer("persistent://public/default/after-bad-utf8", request_id=6).type == (
            T.PRODUCER_SUCCESS
        )
    finally:
        raw.close()


def test_invalid_utf8_names_are_refused_and_stats_keep_working(standalone: StandaloneProcess, topic_name: str) -> None:
    raw = RawClient(standalone.port)
    try:
        raw.connect()
        cmd = T(type=T.PRODUCER)
        p = cmd.producer
        p.topic, p.producer_id, p.request_id, p.producer_name = topic_name, 1, 1, "PNAME"
        raw.send_raw(_with_invalid_utf8(cmd, "PNAME"))
        reply = raw.recv_until_any({T.ERROR, T.PRODUCER_SUCCESS})
        assert reply.type == T.ERROR and reply.error.request_id == 1
        cmd = T(type=T.SUBSCRIBE)
        s = cmd.subscribe
        s.topic, s.subscription, s.consumer_id, s.request_id, s.consumer_name = topic_name, "sub", 1, 2, "CNAME"
        s.subType = pb.CommandSubscribe.Exclusive
        raw.send_raw(_with_invalid_utf8(cmd, "CNAME"))
        reply = raw.recv_until_any({T.ERROR, T.SUCCESS})
        assert reply.type == T.ERROR and reply.error.request_id == 2
        # A valid producer whose SEND carries an invalid UTF-8 property: refused too.
        assert raw.create_producer(topic_name, producer_id=3, request_id=3).type == T.PRODUCER_SUCCESS
        bad = _meta(properties=[pb.KeyValue(key="PK", value="v")]).replace(b"\x02PK", b"\x02\xff\xff")
        raw.send_message(3, 0, b"", entry=_entry_with_raw_metadata(bad, b"x"))
        assert raw.recv_until_any({T.SEND_ERROR, T.SEND_RECEIPT}).type == T.SEND_ERROR
        path = topic_name.replace("persistent://", "persistent/")
        for url in (f"{standalone.http_url}/admin/v2/{path}/stats", f"{standalone.http_url}/metrics"):
            with urllib.request.urlopen(url, timeout=10) as r:
                assert r.status == 200
    finally:
        raw.close()


# ---------------------------------------------------------------- 3: a disconnect never fences a topic
def _reset(raw: RawClient) -> None:
    """Close with a TCP reset (SO_LINGER 0), as a client that dies mid-request."""
    raw.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    raw.close()


def _producer_cmd(topic: str, producer_id: int, request_id: int, mode: int) -> T:
    cmd = T(type=T.PRODUCER)
    p = cmd.producer
    p.topic, p.producer_id, p.request_id, p.producer_access_mode = topic, producer_id, request_id, mode
    return cmd


def test_reset_after_exclusive_producer_request_never_fences_the_topic(
    standalone: StandaloneProcess, client: pulsar.Client, topic_name: str
) -> None:
    for i in range(40):
        topic = f"{topic_name}-{i % 4}"  # new topics (load cancelled) and loaded ones (epoch write cancelled)
        dying, bystander = RawClient(standalone.port), RawClient(standalone.port)
        try:
            dying.connect()
            bystander.connect()
            dying.send(_producer_cmd(topic, 1, 1, pb.Exclusive))
            for client_, first in ((dying, 2), (bystander, 1)):  # both load one topic, open one subscription
                client_.send(_producer_cmd(topic + "-shared", first, first, pb.Shared))
                sub = T(type=T.SUBSCRIBE)
                s = sub.subscribe
                s.topic, s.subscription, s.subType = f"{topic}-shared", f"sub-{i}", pb.CommandSubscribe.Shared
                s.consumer_id, s.request_id = 1, 10 + first
                client_.send(sub)
            time.sleep((i % 8) * 0.0005)
            _reset(dying)
            for _ in range(2):
                reply = bystander.recv_until_any({T.PRODUCER_SUCCESS, T.SUCCESS, T.ERROR})
                assert reply.type != T.ERROR, f"try {i}: another client's disconnect failed this: {reply}"
        finally:
            bystander.close()
        deadline = time.monotonic() + 10
        while True:  # the dead client's producer goes away with its connection
            try:
                producer = client.create_producer(topic, access_mode=pulsar.ProducerAccessMode.Exclusive)
                break
            except pulsar.ProducerFenced:
                assert time.monotonic() < deadline, f"try {i}: topic stays fenced"
                time.sleep(0.05)
        producer.send(b"x")
        producer.close()


# ---------------------------------------------------------------- 5: smaller ones
def _admin_get(url: str) -> tuple[int, bytes, dict[str, str]]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read(), dict(e.headers)


_DATA = b"hello world " * 20
CORRUPT_PAYLOADS = {
    "lz4-garbage": (pb.LZ4, b"\xff" * 40, len(_DATA)),
    "lz4-wrong-size": (pb.LZ4, lz4.block.compress(_DATA, store_size=False), len(_DATA) + 7),
    "zlib-garbage": (pb.ZLIB, b"\x78\x9c" + b"\xff" * 30, len(_DATA)),
    "zlib-wrong-size": (pb.ZLIB, zlib.compress(_DATA), len(_DATA) - 10),
    "zstd-garbage": (pb.ZSTD, b"\x28\xb5\x2f\xfd" + b"\xff" * 30, len(_DATA)),
    "zstd-wrong-size": (pb.ZSTD, zstandard.ZstdCompressor().compress(_DATA), len(_DATA) - 1),
    "snappy-garbage": (pb.SNAPPY, b"\xff" * 40, len(_DATA)),
    "snappy-wrong-size": (pb.SNAPPY, snappy.compress(_DATA), len(_DATA) + 1),
    "huge-declared-size": (pb.LZ4, lz4.block.compress(_DATA, store_size=False), 2**32 - 1),
}


def test_admin_get_message_with_corrupt_payload_is_409(standalone: StandaloneProcess, topic_name: str) -> None:
    raw = RawClient(standalone.port)
    try:
        raw.connect()
        assert raw.create_producer(topic_name).type == T.PRODUCER_SUCCESS
        ids = {}
        for seq, (name, (codec, payload, size)) in enumerate(CORRUPT_PAYLOADS.items()):
            meta = _meta(compression=codec, uncompressed_size=size)
            raw.send_message(1, seq, b"", entry=_entry_with_raw_metadata(meta, payload))
            receipt = raw.recv_until(T.SEND_RECEIPT).send_receipt
            ids[name] = (receipt.message_id.ledgerId, receipt.message_id.entryId)
        good = _meta(compression=pb.ZLIB, uncompressed_size=len(_DATA))
        raw.send_message(1, 100, b"", entry=_entry_with_raw_metadata(good, zlib.compress(_DATA)))
        receipt = raw.recv_until(T.SEND_RECEIPT).send_receipt
        ids["good"] = (receipt.message_id.ledgerId, receipt.message_id.entryId)
    finally:
        raw.close()
    path = topic_name.replace("persistent://", "persistent/")
    for name, (ledger, entry) in ids.items():
        status, body, _ = _admin_get(f"{standalone.http_url}/admin/v2/{path}/ledger/{ledger}/entry/{entry}")
        if name == "good":
            assert status == 200 and body == _DATA
        else:
            assert status == 409, (name, status, body)
            assert b"reason" in body


def test_admin_get_message_with_control_characters_in_metadata(standalone: StandaloneProcess, topic_name: str) -> None:
    raw = RawClient(standalone.port)
    try:
        raw.connect()
        assert raw.create_producer(topic_name).type == T.PRODUCER_SUCCESS
        meta = pb.MessageMetadata(
            producer_name="evil\r\nSet-Cookie: x=1",
            sequence_id=0,
            publish_time=1,
            partition_key="k\n\x00",
            properties=[pb.KeyValue(key="a b\r\n", value="v\r\nX-Injected: 1"), pb.KeyValue(key="ok", value="\x07")],
        ).SerializeToString()
        raw.send_message(1, 0, b"", entry=_entry_with_raw_metadata(meta, b"body"))
        receipt = raw.recv_until(T.SEND_RECEIPT).send_receipt
    finally:
        raw.close()
    path = topic_name.replace("persistent://", "persistent/")
    url = f"{standalone.http_url}/admin/v2/{path}/ledger/{receipt.message_id.ledgerId}/entry/0"
    status, body, headers = _admin_get(url)
    assert status == 200 and body == b"body"
    assert "X-Injected" not in headers and "Set-Cookie" not in headers
    assert headers["X-Pulsar-PROPERTY-ok"] == "%07"


def test_redeliver_with_unknown_ids_redelivers_the_known_ones(standalone: StandaloneProcess, topic_name: str) -> None:
    raw = RawClient(standalone.port)
    try:
        raw.connect()
        assert raw.create_producer(topic_name).type == T.PRODUCER_SUCCESS
        raw.send_message(1, 0, b"m0")
        raw.recv_until(T.SEND_RECEIPT)
        assert raw.subscribe(topic_name, "s", 7, 9, sub_type=pb.CommandSubscribe.Shared).type == T.SUCCESS
        raw.flow(7, 10)
        first = raw.recv_until(T.MESSAGE).message.message_id
        cmd = T(type=T.REDELIVER_UNACKNOWLEDGED_MESSAGES)
        r = cmd.redeliverUnacknowledgedMessages
        r.consumer_id = 7
        for ledger, entry in ((2**64 - 1, 2**64 - 1), (999999, 0), (first.ledgerId, 2**63 + 5)):
            r.message_ids.add(ledgerId=ledger, entryId=entry)
        r.message_ids.add(ledgerId=first.ledgerId, entryId=first.entryId)
        raw.send(cmd)
        again = raw.recv_until(T.MESSAGE)
        assert (again.message.message_id.entryId, again.message.redelivery_count) == (first.entryId, 1)
    finally:
        raw.close()


@pytest.mark.parametrize(
    "topic",
    [
        "persistent://public/default/t-partition-99999999999999999999999",
        "persistent://public/default/t-partition-2147483648",
        "persistent://public/default/t-partition-\u00b2",
        "persistent://public/default/t\x00\x01",
        "persistent://public/default/t\r\nx",
    ],
)
def test_odd_topic_names_get_invalid_topic_name_or_work(standalone: StandaloneProcess, topic: str) -> None:
    raw = RawClient(standalone.port)
    try:
        raw.connect()
        reply = raw.create_producer(topic)
        assert reply.type == T.PRODUCER_SUCCESS or reply.error.error == pb.InvalidTopicName, reply
        if reply.type == T.PRODUCER_SUCCESS:  # an ordinary topic, not a partition: it works end to end
            raw.send_message(1, 0, b"odd")
            raw.recv_until(T.SEND_RECEIPT)
            assert raw.subscribe(topic, "s", consumer_id=3, request_id=4).type == T.SUCCESS
            raw.flow(3, 10)
            assert raw.recv_until(T.MESSAGE).message.message_id.partition in (0, -1)
        lookup = T(type=T.PARTITIONED_METADATA)
        lookup.partitionMetadata.topic, lookup.partitionMetadata.request_id = topic, 2
        raw.send(lookup)
        meta = raw.recv_until(T.PARTITIONED_METADATA_RESPONSE).partitionMetadataResponse
        assert meta.response == pb.CommandPartitionedTopicMetadataResponse.Success or (
            meta.error == pb.InvalidTopicName
        ), meta
    finally:
        raw.close()
    quoted = urllib.parse.quote(topic.replace("persistent://", "persistent/"), safe="/")
    status, _, _ = _admin_get(f"{standalone.http_url}/admin/v2/{quoted}/stats")
    assert status in (200, 404, 412), status
    status, _, _ = _admin_get(f"{standalone.http_url}/admin/v2/{quoted}/partitions")
    assert status in (200, 404, 412), status


def test_concurrent_requests_for_one_id_leave_no_orphan(standalone: StandaloneProcess, topic_name: str) -> None:
    raw = RawClient(standalone.port)
    try:
        raw.connect()
        for request_id in (1, 2):  # both in flight before either is registered
            raw.send(_producer_cmd(topic_name, 5, request_id, pb.Shared))
        for request_id in (3, 4):
            cmd = T(type=T.SUBSCRIBE)
            s = cmd.subscribe
            s.topic, s.subscription, s.subType = topic_name, f"sub-{request_id}", pb.CommandSubscribe.Shared
            s.consumer_id, s.request_id = 6, request_id
            raw.send(cmd)
        replies = [raw.recv_until_any({T.PRODUCER_SUCCESS, T.SUCCESS, T.ERROR}) for _ in range(4)]
        assert [r.type for r in replies].count(T.SUCCESS) == 1  # one consumer per id: the other is ServiceNotReady
    finally:
        _reset(raw)
    path = topic_name.replace("persistent://", "persistent/")
    deadline = time.monotonic() + 10
    while True:
        _, body, _ = _admin_get(f"{standalone.http_url}/admin/v2/{path}/stats")
        stats = json.loads(body)
        leaked = stats["publishers"] or [s for s in stats["subscriptions"].values() if s["consumers"]]
        if not leaked:
            break
        assert time.monotonic() < deadline, f"left behind: {leaked}"
        time.sleep(0.1)


# ---------------------------------------------------------------- 6: memory under churn
def _loaded_topic_count(http_url: str) -> int:
    _, body, _ = _admin_get(f"{http_url}/metrics")
    lines = body.decode().splitlines()
    return sum(int(float(line.rsplit(" ", 1)[1])) for line in lines if line.startswith("pulsar_topics_count"))


def test_idle_topics_are_unloaded_and_load_again(tmp_path) -> None:  # type: ignore[no-untyped-def]
    broker = StandaloneProcess(
        tmp_path / "data",
        {"brokerUnloadInactiveTopicsSeconds": "1", "brokerDeleteInactiveTopicsFrequencySeconds": "0.5"},
    )
    broker.start()
    try:
        topics = [f"persistent://public/default/idle-{i}" for i in range(20)]
        for i, topic in enumerate(topics):  # a durable subscription each: never deleted, only unloaded
            raw = RawClient(broker.port)
            try:
                raw.connect()
                assert raw.create_producer(topic).type == T.PRODUCER_SUCCESS
                raw.send_message(1, 0, f"kept-{i}".encode())
                raw.recv_until(T.SEND_RECEIPT)
                assert raw.subscribe(topic, "s", consumer_id=2, request_id=3).type == T.SUCCESS
            finally:
                _reset(raw) if i % 2 else raw.close()
        deadline = time.monotonic() + 15
        while _loaded_topic_count(broker.http_url) > 0:
            assert time.monotonic() < deadline, "idle topics stay loaded"
            time.sleep(0.2)
        client = pulsar.Client(broker.service_url, operation_timeout_seconds=10, logger=_quiet_logger())
        try:
            consumer = client.subscribe(topics[7], "s")
            assert consumer.receive(timeout_millis=10_000).data() == b"kept-7"
        finally:
            client.close()
    finally:
        broker.stop()


def test_watch_topic_list_closed_while_listing_is_still_answered(standalone: StandaloneProcess) -> None:
    raw = RawClient(standalone.port)
    try:
        raw.connect()
        watch = T(type=T.WATCH_TOPIC_LIST)
        w = watch.watchTopicList
        w.request_id, w.watcher_id, w.namespace, w.topics_pattern = 2, 1, "public/default", "fz-.*"
        close = T(type=T.WATCH_TOPIC_LIST_CLOSE)
        close.watchTopicListClose.request_id, close.watchTopicListClose.watcher_id = 3, 1
        raw.send_raw(encode_command(watch) + encode_command(close))  # one segment: close before the list is in
        answered = set()
        for _ in range(2):
            reply = raw.recv_until_any({T.SUCCESS, T.ERROR, T.WATCH_TOPIC_LIST_SUCCESS})
            inner = {T.SUCCESS: reply.success, T.ERROR: reply.error}.get(reply.type, reply.watchTopicListSuccess)
            answered.add(inner.request_id)
        assert answered == {2, 3}
    finally:
        raw.close()


def test_producer_closed_while_being_created_is_still_answered(standalone: StandaloneProcess, topic_name: str) -> None:
    raw = RawClient(standalone.port)
    try:
        raw.connect()
        assert raw.create_producer(topic_name, producer_id=1, request_id=1).type == T.PRODUCER_SUCCESS
        for i in range(30):  # CLOSE_PRODUCER lands at different points of the exclusive producer's creation
            producer_id, request_id = 10 + i, 100 + 2 * i
            close = T(type=T.CLOSE_PRODUCER)
            close.close_producer.producer_id, close.close_producer.request_id = producer_id, request_id + 1
            raw.send(_producer_cmd(topic_name, producer_id, request_id, pb.ExclusiveWithFencing))
            time.sleep((i % 10) * 0.0003)
            raw.send(close)
            answered: set[int] = set()
            deadline = time.monotonic() + 5
            while answered != {request_id, request_id + 1} and time.monotonic() < deadline:
                raw.sock.settimeout(max(deadline - time.monotonic(), 0.01))
                try:
                    reply = raw.recv_until_any({T.SUCCESS, T.ERROR, T.PRODUCER_SUCCESS})
                except TimeoutError:
                    break
                inner = {T.SUCCESS: reply.success, T.ERROR: reply.error}.get(reply.type, reply.producer_success)
                answered.add(inner.request_id)
            assert answered == {request_id, request_id + 1}, f"try {i}: unanswered"
    finally:
        raw.close()
