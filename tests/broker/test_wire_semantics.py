"""Protocol details the official Python client does not expose, checked with a raw connection."""

from __future__ import annotations

import json
import time

import pulsar

from magnetar.broker.protocol import pulsar_api_pb2 as pb
from magnetar.broker.protocol.frames import encode_command
from tests.admin.rest import call
from tests.conftest import StandaloneProcess
from tests.rawclient import RawClient

T = pb.BaseCommand
Sub = pb.CommandSubscribe


def _ack(raw: RawClient, consumer_id: int, ledger: int, entry: int, cumulative: bool, request_id: int) -> T:
    cmd = T(type=T.ACK)
    a = cmd.ack
    a.consumer_id = consumer_id
    a.ack_type = pb.CommandAck.Cumulative if cumulative else pb.CommandAck.Individual
    mid = a.message_id.add()
    mid.ledgerId, mid.entryId = ledger, entry
    a.request_id = request_id
    raw.send(cmd)
    return raw.recv_until(T.ACK_RESPONSE)


def test_ack_response_and_cumulative_refused_on_shared(
    standalone: StandaloneProcess, client: pulsar.Client, topic_name: str
) -> None:
    msg_id = client.create_producer(topic_name).send(b"one")
    raw = RawClient(standalone.port)
    try:
        raw.connect()
        assert raw.subscribe(topic_name, "shared", sub_type=Sub.Shared).type == T.SUCCESS
        raw.flow(1, 10)
        message = raw.recv_until(T.MESSAGE).message
        assert (message.message_id.ledgerId, message.message_id.entryId) == (msg_id.ledger_id(), msg_id.entry_id())
        refused = _ack(raw, 1, msg_id.ledger_id(), msg_id.entry_id(), cumulative=True, request_id=11)
        assert refused.ackResponse.request_id == 11 and refused.ackResponse.error == pb.NotAllowedError
        done = _ack(raw, 1, msg_id.ledger_id(), msg_id.entry_id(), cumulative=False, request_id=12)
        assert done.ackResponse.request_id == 12 and not done.ackResponse.HasField("error")
    finally:
        raw.close()


def test_failover_active_consumer_change(standalone: StandaloneProcess, topic_name: str) -> None:
    a, b = RawClient(standalone.port), RawClient(standalone.port)
    try:
        a.connect()
        b.connect()
        assert b.subscribe(topic_name, "fo", sub_type=Sub.Failover, name="b").type == T.SUCCESS
        assert b.recv_until(T.ACTIVE_CONSUMER_CHANGE).active_consumer_change.is_active
        assert a.subscribe(topic_name, "fo", sub_type=Sub.Failover, name="a").type == T.SUCCESS
        a_active = a.recv_until(T.ACTIVE_CONSUMER_CHANGE).active_consumer_change.is_active
        if a_active:  # the topic name hashed to "a": "b" is told it is now standby
            assert not b.recv_until(T.ACTIVE_CONSUMER_CHANGE).active_consumer_change.is_active
            a.close()
            assert b.recv_until(T.ACTIVE_CONSUMER_CHANGE).active_consumer_change.is_active
        else:  # "b" stays active; closing it hands over to "a"
            b.close()
            assert a.recv_until(T.ACTIVE_CONSUMER_CHANGE).active_consumer_change.is_active
    finally:
        a.close()
        b.close()


def test_shutdown_closes_producers_and_consumers(fresh_standalone: StandaloneProcess) -> None:
    fresh_standalone.start()
    raw = RawClient(fresh_standalone.port, timeout=15)
    try:
        raw.connect()
        topic = "persistent://public/default/shutdown"
        assert raw.create_producer(topic, producer_id=3, request_id=1).type == T.PRODUCER_SUCCESS
        assert raw.subscribe(topic, "s", consumer_id=4, request_id=2).type == T.SUCCESS
        fresh_standalone.proc.send_signal(15)  # SIGTERM: the broker asks clients to reconnect elsewhere
        seen = {}
        while len(seen) < 2:
            cmd = raw.recv_until_any({T.CLOSE_PRODUCER, T.CLOSE_CONSUMER})
            if cmd.type == T.CLOSE_PRODUCER:
                seen["producer"] = cmd.close_producer.producer_id
            else:
                seen["consumer"] = cmd.close_consumer.consumer_id
        assert seen == {"producer": 3, "consumer": 4}
        assert fresh_standalone.proc.wait(30) == 0
    finally:
        raw.close()


def test_non_durable_consumer_joins_durable_subscription(standalone: StandaloneProcess, topic_name: str) -> None:
    durable, transient = RawClient(standalone.port), RawClient(standalone.port)
    try:
        durable.connect()
        transient.connect()
        assert durable.subscribe(topic_name, "both", sub_type=Sub.Shared).type == T.SUCCESS
        cmd = T(type=T.SUBSCRIBE)
        s = cmd.subscribe
        s.topic, s.subscription, s.subType, s.consumer_id, s.request_id = topic_name, "both", Sub.Shared, 7, 2
        s.durable = False
        transient.send(cmd)
        assert transient.recv_until_response(2).type == T.SUCCESS
    finally:
        durable.close()
        transient.close()


def test_subscribe_with_rollback_duration_starts_at_that_time(
    standalone: StandaloneProcess, client: pulsar.Client, topic_name: str
) -> None:
    """SUBSCRIBE's start_message_rollback_duration_sec (Java readers' startMessageFromRollbackDuration)
    resets the subscription to now minus that many seconds, by publish time, as Pulsar does."""
    producer = client.create_producer(topic_name, batching_enabled=False)
    producer.send(b"old")
    time.sleep(2.5)
    recent = [producer.send(f"new-{i}".encode()) for i in range(3)]
    raw = RawClient(standalone.port)
    try:
        raw.connect()
        cmd = T(type=T.SUBSCRIBE)
        s = cmd.subscribe
        s.topic, s.subscription, s.subType = topic_name, "rollback", Sub.Exclusive
        s.consumer_id, s.request_id = 1, 1
        s.initialPosition = Sub.Latest
        s.start_message_rollback_duration_sec = 2
        raw.send(cmd)
        assert raw.recv_until_response(1).type == T.SUCCESS
        raw.flow(1, 10)
        got = [raw.recv_until(T.MESSAGE).message.message_id for _ in range(3)]
        assert [(m.ledgerId, m.entryId) for m in got] == [(r.ledger_id(), r.entry_id()) for r in recent]
    finally:
        raw.close()


def _subscribe_cmd(topic: str, consumer_id: int, request_id: int) -> T:
    cmd = T(type=T.SUBSCRIBE)
    s = cmd.subscribe
    s.topic, s.subscription, s.subType = topic, "s", Sub.Exclusive
    s.consumer_id, s.request_id = consumer_id, request_id
    return cmd


def _stats(standalone: StandaloneProcess, topic: str) -> dict:
    reply = call("GET", f"{standalone.http_url}/admin/v2/{topic.replace('persistent://', 'persistent/')}/stats")
    assert reply.status == 200, reply.body
    return json.loads(reply.body)


def _stats_consumers(standalone: StandaloneProcess, topic: str) -> int:
    return sum(len(s["consumers"]) for s in _stats(standalone, topic)["subscriptions"].values())


def test_a_subscribe_for_a_consumer_still_being_created(standalone: StandaloneProcess, topic_name: str) -> None:
    """As Pulsar's ServerCnx: a second SUBSCRIBE for a consumer id whose creation is in progress is answered
    ServiceNotReady ("Consumer is already present on the connection"), which clients retry; a CLOSE_CONSUMER
    that arrives meanwhile is answered and the consumer, once created, is closed at once (no orphan)."""
    raw = RawClient(standalone.port)
    try:
        raw.connect()
        # One write: the first loads the topic and is still in progress when the broker reads the second.
        raw.send_raw(
            encode_command(_subscribe_cmd(topic_name, 7, 1)) + encode_command(_subscribe_cmd(topic_name, 7, 2))
        )
        second = raw.recv_until_response(2)
        assert second.type == T.ERROR and second.error.error == pb.ServiceNotReady, second
        assert second.error.message == "Consumer is already present on the connection"
        assert raw.recv_until_response(1).type == T.SUCCESS
        assert raw.subscribe(topic_name, "s", consumer_id=7, request_id=3).type == T.SUCCESS  # created: success

        other = topic_name + "-closed"
        close = T(type=T.CLOSE_CONSUMER)
        close.close_consumer.consumer_id, close.close_consumer.request_id = 8, 5
        raw.send_raw(encode_command(_subscribe_cmd(other, 8, 4)) + encode_command(close))
        assert raw.recv_until_response(5).type == T.SUCCESS
        refused = raw.recv_until_response(4)  # answered once done, but never registered
        assert refused.type == T.ERROR and refused.error.error == pb.ServiceNotReady, refused
        assert _stats_consumers(standalone, other) == 0, "the consumer closed while being created was left behind"
        # The id is free again once its first request is done: a new SUBSCRIBE creates the consumer.
        assert raw.subscribe(other, "s", consumer_id=8, request_id=6).type == T.SUCCESS
        assert _stats_consumers(standalone, other) == 1
    finally:
        raw.close()


def _producer_cmd(topic: str, producer_id: int, request_id: int) -> T:
    cmd = T(type=T.PRODUCER)
    cmd.producer.topic, cmd.producer.producer_id, cmd.producer.request_id = topic, producer_id, request_id
    return cmd


def test_a_producer_request_for_a_producer_still_being_created(standalone: StandaloneProcess, topic_name: str) -> None:
    """As for consumers: ServiceNotReady while the first PRODUCER is in progress, and a CLOSE_PRODUCER that
    arrives meanwhile leaves no producer behind."""

    def publishers(topic: str) -> int:
        return len(_stats(standalone, topic)["publishers"])

    raw = RawClient(standalone.port)
    try:
        raw.connect()
        raw.send_raw(encode_command(_producer_cmd(topic_name, 3, 1)) + encode_command(_producer_cmd(topic_name, 3, 2)))
        second = raw.recv_until_any({T.ERROR})
        assert second.error.request_id == 2 and second.error.error == pb.ServiceNotReady, second
        assert second.error.message == "Producer is already present on the connection"
        assert raw.recv_until(T.PRODUCER_SUCCESS).producer_success.request_id == 1

        other = topic_name + "-closed"
        close = T(type=T.CLOSE_PRODUCER)
        close.close_producer.producer_id, close.close_producer.request_id = 4, 4
        raw.send_raw(encode_command(_producer_cmd(other, 4, 3)) + encode_command(close))
        assert raw.recv_until_response(4).type == T.SUCCESS
        refused = raw.recv_until_response(3)  # answered, but never registered
        assert refused.type == T.ERROR and refused.error.error == pb.ServiceNotReady, refused
        assert publishers(other) == 0, "the producer closed while being created was left behind"
        assert raw.create_producer(other, producer_id=4, request_id=5).type == T.PRODUCER_SUCCESS
        assert publishers(other) == 1
    finally:
        raw.close()
