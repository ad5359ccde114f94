"""Protocol details the official Python client does not expose, checked with a raw connection."""

from __future__ import annotations

import time

import pulsar

from magnetar.broker.protocol import pulsar_api_pb2 as pb
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
