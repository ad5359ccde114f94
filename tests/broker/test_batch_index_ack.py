"""Batch-index acknowledgement: partly acked batches are redelivered without their acked messages."""

from __future__ import annotations

import time

import pulsar

from tests.conftest import StandaloneProcess

E = pulsar.InitialPosition.Earliest


def _client(node: StandaloneProcess) -> pulsar.Client:
    return pulsar.Client(
        node.service_url, operation_timeout_seconds=10, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
    )


def _fill_one_batch(client: pulsar.Client, topic: str, n: int) -> None:
    producer = client.create_producer(
        topic, batching_enabled=True, batching_max_publish_delay_ms=100, batching_max_messages=n
    )
    for i in range(n):
        producer.send_async(f"b{i}".encode(), None)
    producer.flush()
    producer.close()


def _receive_all(consumer: pulsar.Consumer) -> list[pulsar.Message]:
    out = []
    while True:
        try:
            out.append(consumer.receive(timeout_millis=1500))
        except pulsar.Timeout:
            return out


def test_partial_batch_acks_survive_reconnect_and_restart(fresh_standalone: StandaloneProcess) -> None:
    node = fresh_standalone
    node.start()  # acknowledgmentAtBatchIndexLevelEnabled is on by default (Pulsar 4.1, PIP-391)
    topic = "persistent://public/default/batch-index-ack"
    client = _client(node)
    consumer = client.subscribe(topic, "s", initial_position=E, batch_index_ack_enabled=True)
    _fill_one_batch(client, topic, 10)
    msgs = _receive_all(consumer)
    assert len(msgs) == 10 and len({(m.message_id().ledger_id(), m.message_id().entry_id()) for m in msgs}) == 1
    for m in msgs[:4]:
        consumer.acknowledge(m)
    consumer.close()  # flushes the acks
    consumer = client.subscribe(topic, "s", batch_index_ack_enabled=True)
    assert [m.data() for m in _receive_all(consumer)] == [f"b{i}".encode() for i in range(4, 10)]
    consumer.close()
    client.close()
    time.sleep(0.3)  # cursor state is flushed every 100 ms
    assert node.stop() == 0
    node.start()
    client = _client(node)
    consumer = client.subscribe(topic, "s", batch_index_ack_enabled=True)
    again = _receive_all(consumer)
    assert [m.data() for m in again] == [f"b{i}".encode() for i in range(4, 10)]
    for m in again:
        consumer.acknowledge(m)
    consumer.close()
    consumer = client.subscribe(topic, "s", batch_index_ack_enabled=True)
    assert _receive_all(consumer) == []
    client.close()


def test_on_by_default_acked_messages_of_a_batch_stay_acked(client: pulsar.Client, topic_name: str) -> None:
    consumer = client.subscribe(topic_name, "s", initial_position=E, batch_index_ack_enabled=True)
    _fill_one_batch(client, topic_name, 6)
    msgs = _receive_all(consumer)
    for m in msgs[:3]:
        consumer.acknowledge(m)
    consumer.close()
    consumer = client.subscribe(topic_name, "s", batch_index_ack_enabled=True)
    assert [m.data() for m in _receive_all(consumer)] == [b"b3", b"b4", b"b5"]


def test_turned_off_the_whole_batch_returns(fresh_standalone: StandaloneProcess) -> None:
    node = fresh_standalone
    node.extra_config["acknowledgmentAtBatchIndexLevelEnabled"] = "false"  # Pulsar's default before 4.1
    node.start()
    topic = "persistent://public/default/batch-index-ack-off"
    client = _client(node)
    consumer = client.subscribe(topic, "s", initial_position=E, batch_index_ack_enabled=True)
    _fill_one_batch(client, topic, 6)
    msgs = _receive_all(consumer)
    for m in msgs[:3]:
        consumer.acknowledge(m)
    consumer.close()
    consumer = client.subscribe(topic, "s", batch_index_ack_enabled=True)
    assert len(_receive_all(consumer)) == 6  # the entry is redelivered whole
    client.close()
