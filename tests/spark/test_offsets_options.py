"""Offset arithmetic and option parsing of the Spark source/sink: plain pytest, no Spark, no broker."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest

from magnetar.spark.offsets import (
    EARLIEST,
    Position,
    after,
    after_last,
    clamp,
    data_lost,
    dump_offset,
    fair_shares,
    load_offset,
    split_range,
    to_json_dict,
)
from magnetar.spark.options import (
    SEQUENCE_STRIDE,
    SinkOptions,
    SourceOptions,
    coerce_client_options,
    normalize_topic,
    producer_name,
    sequence_id,
)

BASE = {"service.url": "pulsar://h:6650", "admin.url": "http://h:8080/"}


def test_position_order_and_parse() -> None:
    assert Position.parse("3:4") == Position(3, 4, -1)
    assert Position.parse("3:4:2") == Position(3, 4, 2)
    assert EARLIEST < Position(0, 0, -1) < Position(0, 0, 0) < Position(0, 0, 1) < Position(0, 1, -1) < Position(1, 0)
    assert str(Position(7, 8, -1)) == "7:8:-1"
    for bad in ("", "1", "a:b", "1:2:3:4"):
        with pytest.raises(ValueError):
            Position.parse(bad)


def test_after_and_after_last() -> None:
    assert after(Position(5, 9, -1)) == Position(5, 10, -1)
    assert after(Position(5, 9, 3)) == Position(5, 9, 4)
    # The whole last entry (batched or not) is inside [start, end).
    assert after_last(5, 9) == Position(5, 10, -1) > Position(5, 9, 99)
    assert after_last(-1, -1) == EARLIEST
    assert after_last(5, -1) == EARLIEST


def test_offset_json_round_trip_depends_only_on_positions() -> None:
    a = {"persistent://p/d/t-partition-1": Position(1, 2, -1), "persistent://p/d/t-partition-0": Position(3, 4, 5)}
    b = dict(reversed(list(a.items())))
    assert dump_offset(a) == dump_offset(b)
    assert json.loads(dump_offset(a)) == to_json_dict(a)
    assert load_offset(dump_offset(a)) == a
    assert load_offset(to_json_dict(a)) == a
    with pytest.raises(ValueError):
        load_offset("[1]")


def test_split_range_covers_exactly() -> None:
    ledgers = [(1, 5), (2, 0), (3, 7)]
    parts = split_range(Position(1, 2), Position(3, 6), ledgers, 3)
    assert parts[0][0] == Position(1, 2) and parts[-1][1] == Position(3, 6)
    for (_, e), (s, _) in itertools.pairwise(parts):
        assert e == s  # contiguous
    # entries per part: 1:2..1:4 (3), 3:0..3:2 (3), 3:3..3:5 (3)
    assert [s for s, _ in parts] == [Position(1, 2), Position(3, 0), Position(3, 3)]
    assert split_range(Position(1, 2), Position(1, 2), ledgers, 3) == []
    assert split_range(EARLIEST, Position(1, 5), [(1, 5)], 0) == [(EARLIEST, Position(1, 5))]
    assert split_range(EARLIEST, Position(1, 5), [(1, 5)], 2) == [
        (EARLIEST, Position(1, 2)),
        (Position(1, 2), Position(1, 4)),
        (Position(1, 4), Position(1, 5)),
    ]


def test_split_range_mid_batch_start_keeps_its_entry_whole() -> None:
    parts = split_range(Position(1, 1, 3), Position(1, 4), [(1, 4)], 1)
    assert parts == [(Position(1, 1, 3), Position(1, 3)), (Position(1, 3), Position(1, 4))]


def test_fair_shares_and_clamp() -> None:
    assert fair_shares(10, ["a", "b", "c"]) == {"a": 4, "b": 3, "c": 3}
    assert fair_shares(2, ["a", "b", "c"]) == {"a": 1, "b": 1, "c": 0}
    assert sum(fair_shares(7, ["a", "b"]).values()) == 7
    assert clamp(
        {"a": Position(1, 9), "b": Position(1, 1), "new": Position(2, 0)}, {"a": Position(1, 5), "b": Position(1, 7)}
    ) == {
        "a": Position(1, 5),
        "b": Position(1, 1),
    }


def test_data_lost() -> None:
    assert not data_lost(EARLIEST, 9)
    assert not data_lost(Position(9, 3), 9)
    assert data_lost(Position(8, 3), 9)
    assert not data_lost(Position(8, 3), 9, committed_next=Position(8, 3))
    assert not data_lost(Position(8, 3), None)


def test_source_options() -> None:
    o = SourceOptions.parse({**BASE, "topic": "t", "pulsar.client.operationTimeoutSeconds": "7"}, streaming=False)
    assert o.topics == ("persistent://public/default/t",) and o.starting == "earliest" and o.ending == "latest"
    assert o.admin_url == "http://h:8080" and o.fail_on_data_loss
    assert o.client_options == {"operation_timeout_seconds": 7}
    s = SourceOptions.parse({**BASE, "topics": "a, acme/ns/b", "maxrecordspertrigger": "5"}, streaming=True)
    assert s.topics == ("persistent://public/default/a", "persistent://acme/ns/b")
    assert s.starting == "latest" and s.max_records_per_trigger == 5
    j = SourceOptions.parse(
        {
            **BASE,
            "topicsPattern": "persistent://public/default/x-.*",
            "startingOffsets": '{"t": "1:2", "u": "earliest"}',
            "failOnDataLoss": "false",
            "commitSubscription": "spark",
        },
        streaming=True,
    )
    assert j.starting == {"persistent://public/default/t": Position(1, 2), "persistent://public/default/u": "earliest"}
    assert not j.fail_on_data_loss and j.commit_subscription == "spark" and j.topics_pattern
    t = SourceOptions.parse({**BASE, "topic": "t", "startingTime": "1000", "endingTime": "2000"}, streaming=False)
    assert (t.starting_time, t.ending_time) == (1000, 2000)


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"topic": "a", "topics": "b"},
        {"topic": "a", "startingOffsets": "latest"},
        {"topic": "a", "endingOffsets": "earliest"},
        {"topic": "a", "startingOffsets": "earliest", "startingTime": "1"},
        {"topic": "a", "startingOffsets": "[1]"},
        {"topic": "a", "startingOffsets": "nope"},
        {"topic": "a", "maxRecordsPerTrigger": "0"},
        {"topic": "a", "failOnDataLoss": "maybe"},
        {"topic": "a/b"},
    ],
)
def test_source_options_rejected(extra: dict[str, str]) -> None:
    with pytest.raises(ValueError):
        SourceOptions.parse({**BASE, **extra}, streaming=False)
    with pytest.raises(ValueError):
        SourceOptions.parse({"topic": "a"}, streaming=True)


def test_streaming_rejects_ending() -> None:
    with pytest.raises(ValueError):
        SourceOptions.parse({**BASE, "topic": "a", "endingOffsets": "latest"}, streaming=True)


def test_sink_options_and_sequence_ids() -> None:
    o = SinkOptions.parse({"service.url": "pulsar://h:6650", "topic": "out", "pulsar.producer.compression_type": "LZ4"})
    assert o.producer_options == {"compression_type": "LZ4"}
    assert o.topic == "persistent://public/default/out" and o.exactly_once
    assert SinkOptions.parse({"service.url": "x", "exactlyOnce": "false"}).topic is None
    with pytest.raises(ValueError):
        SinkOptions.parse({"topic": "x"})
    with pytest.raises(ValueError):
        SinkOptions.parse({"service.url": "x", "topics": "a,b"})
    # Ids grow across batches for a producer and are reproduced exactly by a replay.
    assert sequence_id(0, 0) == 0
    assert sequence_id(1, 0) > sequence_id(0, SEQUENCE_STRIDE - 1)
    assert sequence_id(3, 7) == sequence_id(3, 7)
    with pytest.raises(ValueError):
        sequence_id(0, SEQUENCE_STRIDE)
    assert producer_name("spark", "q", 3) == "spark-q-3"
    assert normalize_topic("non-persistent://a/b/c") == "non-persistent://a/b/c"
    assert coerce_client_options({"a": "1", "b": "1.5", "c": "true", "d": "x"}) == {
        "a": 1,
        "b": 1.5,
        "c": True,
        "d": "x",
    }


def test_deterministic_routing() -> None:
    from magnetar.spark.options import java_string_hash, route

    # Java: "hello".hashCode() == 99162322; "polygenelubricants".hashCode() == Integer.MIN_VALUE
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("polygenelubricants") == 0
    assert java_string_hash("") == 0
    assert route("hello", 5, 4) == 99162322 % 4
    assert [route(None, i, 3) for i in range(4)] == [0, 1, 2, 0]
    assert route("x", 9, 1) == 0


def test_unknown_options_are_errors_not_ignored() -> None:
    with pytest.raises(ValueError, match=r"unknown option 'startingOffset'.*did you mean startingoffsets"):
        SourceOptions.parse({**BASE, "topic": "a", "startingOffset": "earliest"}, streaming=False)
    # The connector's auth options carry the pulsar.client. / pulsar.admin. prefix: say so.
    for plain in ("authPluginClassName", "authParams", "tlsTrustCertsFilePath"):
        with pytest.raises(ValueError, match=rf"unknown option '{plain}'.*pulsar\.client\.{plain}"):
            SourceOptions.parse({**BASE, "topic": "a", plain: "x"}, streaming=False)
    with pytest.raises(ValueError, match="not a supported argument of Client"):
        SourceOptions.parse({**BASE, "topic": "a", "pulsar.client.bogus": "1"}, streaming=False)
    with pytest.raises(ValueError, match=r"pulsar\.admin\.operationTimeoutSeconds: the admin client takes only"):
        SourceOptions.parse({**BASE, "topic": "a", "pulsar.admin.operationTimeoutSeconds": "1"}, streaming=False)
    with pytest.raises(ValueError, match="not a supported argument"):
        SourceOptions.parse({**BASE, "topic": "a", "pulsar.reader.start_message_id": "1"}, streaming=False)
    with pytest.raises(ValueError, match="unknown option 'maxRecords'"):
        SinkOptions.parse({"service.url": "pulsar://h:6650", "maxRecords": "1"})
    # Spark's own writer options are not ours to refuse.
    assert SinkOptions.parse({"service.url": "pulsar://h:6650", "checkpointLocation": "/tmp/c"}).topic is None


TOKEN_CLASS = "org.apache.pulsar.client.impl.auth.AuthenticationToken"


def test_auth_and_tls_options_for_client_and_admin(tmp_path: Any) -> None:
    from magnetar.admin_client.auth import BASIC, TOKEN, AuthConfigError, ClientSecurity, Credentials

    ca = tmp_path / "ca.pem"
    ca.write_text("not checked here")
    secured = {
        **BASE,
        "topic": "a",
        # Spark lower-cases option names; the connector's spellings and the Python client's both work.
        "pulsar.client.authpluginclassname": TOKEN_CLASS,
        "pulsar.client.authParams": "token:jwt",
        "pulsar.client.tlsTrustCertsFilePath": str(ca),
        "pulsar.client.tlsAllowInsecureConnection": "false",
        "pulsar.client.tlsHostnameVerificationEnable": "true",
        "pulsar.client.operationTimeoutSeconds": "9",
    }
    o = SourceOptions.parse(secured, streaming=False)
    expected = ClientSecurity(Credentials(TOKEN, token="jwt"), o.client_security.tls)
    assert o.client_security == expected and o.admin_security == expected  # admin calls default to the client's
    assert (o.client_security.tls.trust_certs_file, o.client_security.tls.hostname_verification) == (str(ca), True)
    assert o.client_options == {"operation_timeout_seconds": 9}  # the rest still passes through
    # pulsar.admin.* overrides for the admin calls only (StreamNative's names).
    o = SourceOptions.parse(
        {**secured, "pulsar.admin.authPluginClassName": "basic", "pulsar.admin.authParams": "userId:a,password:b"},
        streaming=True,
    )
    assert o.admin_security.credentials == Credentials(BASIC, user_id="a", password="b")
    assert o.admin_security.tls == o.client_security.tls and o.client_security.credentials.token == "jwt"
    sink = SinkOptions.parse({"service.url": "pulsar+ssl://h:6651", **{k: v for k, v in secured.items() if "." in k}})
    assert sink.client_security == expected and sink.admin_security == expected
    assert SourceOptions.parse({**BASE, "topic": "a"}, streaming=False).client_security.is_default
    with pytest.raises(AuthConfigError, match="unsupported authentication plugin"):
        SourceOptions.parse({**BASE, "topic": "a", "pulsar.client.authPluginClassName": "x.Y"}, streaming=False)
    with pytest.raises(AuthConfigError, match="tlsTrustCertsFilePath: no such file"):
        SinkOptions.parse({"service.url": "pulsar://h:6650", "pulsar.client.tlsTrustCertsFilePath": "/nope.pem"})


def test_pass_through_options_typed_java_or_python_names() -> None:
    o = SourceOptions.parse(
        {
            **BASE,
            "topic": "a",
            "pulsar.reader.receiverQueueSize": "5",
            "pulsar.reader.is_read_compacted": "true",
            "pulsar.client.connection_timeout_ms": "500",
        },
        streaming=False,
    )
    assert o.reader_options == {"receiver_queue_size": 5, "is_read_compacted": True}
    assert o.client_options == {"connection_timeout_ms": 500}
    # Spark lower-cases option names.
    low = SourceOptions.parse({**BASE, "topic": "a", "pulsar.reader.receiverqueuesize": "7"}, streaming=False)
    assert low.reader_options == {"receiver_queue_size": 7}
    sink = SinkOptions.parse({"service.url": "pulsar://h:6650", "pulsar.producer.sendTimeoutMillis": "100"})
    assert sink.producer_options == {"send_timeout_millis": 100}


def test_subscription_options() -> None:
    stream = SourceOptions.parse({**BASE, "topic": "a"}, streaming=True)
    assert stream.commit_subscription and stream.commit_subscription.startswith("spark-")
    # The default name depends only on the topics: a restarted query finds its subscription again.
    assert SourceOptions.parse({**BASE, "topic": "a"}, streaming=True).commit_subscription == stream.commit_subscription
    assert SourceOptions.parse({**BASE, "topic": "b"}, streaming=True).commit_subscription != stream.commit_subscription
    assert SourceOptions.parse({**BASE, "topic": "a"}, streaming=False).commit_subscription is None
    off = SourceOptions.parse({**BASE, "topic": "a", "commitSubscription": "none"}, streaming=True)
    assert off.commit_subscription is None
    named = SourceOptions.parse({**BASE, "topic": "a", "predefinedSubscription": "mine"}, streaming=True)
    assert named.commit_subscription == "mine"
    prefixed = SourceOptions.parse({**BASE, "topic": "a", "subscriptionPrefix": "job"}, streaming=True)
    assert prefixed.commit_subscription == "job-" + stream.commit_subscription.removeprefix("spark-")
    with pytest.raises(ValueError, match="exclusive"):
        SourceOptions.parse({**BASE, "topic": "a", "commitSubscription": "x", "subscriptionPrefix": "y"}, True)


def test_short_pattern_default_admin_url_and_serialized_message_ids() -> None:
    import base64

    import pulsar

    o = SourceOptions.parse({"service.url": "pulsar://broker.ns.svc:6650", "topicsPattern": "topic.*"}, False)
    assert o.topics_pattern == "persistent://public/default/topic.*"
    assert o.admin_url == "http://broker.ns.svc:8080"
    assert (
        SourceOptions.parse({"service.url": "pulsar+ssl://b:6651", "topic": "t"}, False).admin_url == "https://b:8443"
    )
    plain = pulsar.MessageId(-1, 7, 3, -1).serialize()
    batched = pulsar.MessageId(2, 7, 4, 5).serialize()
    spec = json.dumps({"t": list(plain), "u": base64.b64encode(batched).decode()})
    s = SourceOptions.parse({**BASE, "topics": "t,u", "startingOffsets": spec}, streaming=False)
    t, u = "persistent://public/default/t", "persistent://public/default/u"
    assert s.starting == {t: Position(7, 3), u: Position(7, 4, 5)}
    with pytest.raises(ValueError, match="serialized MessageId"):
        SourceOptions.parse({**BASE, "topic": "t", "startingOffsets": '{"t": [255, 255]}'}, streaming=False)


def test_min_records_per_trigger_and_max_trigger_delay() -> None:
    from magnetar.spark.options import parse_duration_ms

    s = SourceOptions.parse({**BASE, "topic": "a", "minRecordsPerTrigger": "100000"}, streaming=True)
    assert s.min_records_per_trigger == 100000 and s.max_trigger_delay_ms == 15 * 60 * 1000  # Kafka's default
    s = SourceOptions.parse(
        {**BASE, "topic": "a", "minrecordspertrigger": "10", "maxTriggerDelay": "5s", "maxRecordsPerTrigger": "10"},
        streaming=True,
    )
    assert (s.min_records_per_trigger, s.max_trigger_delay_ms, s.max_records_per_trigger) == (10, 5000, 10)
    assert SourceOptions.parse({**BASE, "topic": "a"}, streaming=True).min_records_per_trigger is None
    # Spark's time strings as the Kafka source takes them (a bare number is milliseconds).
    assert [parse_duration_ms(v, "d") for v in ("250", "250ms", "5s", "2 min", "15m", "1h", "1d")] == [
        250,
        250,
        5000,
        120000,
        900000,
        3600000,
        86400000,
    ]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"minRecordsPerTrigger": "0"}, "minRecordsPerTrigger must be positive"),
        ({"minRecordsPerTrigger": "many"}, "invalid literal"),
        ({"minRecordsPerTrigger": "10", "maxTriggerDelay": "soon"}, "maxTriggerDelay: expected a duration"),
        ({"minRecordsPerTrigger": "10", "maxTriggerDelay": "-5s"}, "maxTriggerDelay: expected a duration"),
        ({"minRecordsPerTrigger": "10", "maxTriggerDelay": "0s"}, "maxTriggerDelay must be positive"),
        ({"maxTriggerDelay": "5s"}, "maxTriggerDelay applies with minRecordsPerTrigger"),
        ({"minRecordsPerTrigger": "11", "maxRecordsPerTrigger": "10"}, "exceeds maxRecordsPerTrigger"),
    ],
)
def test_min_records_per_trigger_rejected(extra: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SourceOptions.parse({**BASE, "topic": "a", **extra}, streaming=True)


def test_min_records_per_trigger_streams_only() -> None:
    with pytest.raises(ValueError, match="streams only"):
        SourceOptions.parse({**BASE, "topic": "a", "minRecordsPerTrigger": "5"}, streaming=False)


def test_entries_between() -> None:
    from magnetar.spark.offsets import entries_between

    ledgers = [(3, 10), (5, 0), (7, 4)]
    assert entries_between(Position(3, 2), Position(3, 6), ledgers) == 4
    assert entries_between(Position(3, 2, 5), Position(3, 6), ledgers) == 4  # a started batch counts whole
    assert entries_between(Position(3, 8), Position(7, 3), ledgers) == 2 + 3
    assert entries_between(EARLIEST, Position(7, 4), ledgers) == 14
    assert entries_between(EARLIEST, Position(9, 2), ledgers) == 16  # a ledger newer than the layout
    assert entries_between(Position(7, 4), Position(7, 4), ledgers) == 0
    assert entries_between(Position(7, 4), Position(3, 1), ledgers) == 0
