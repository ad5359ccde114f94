"""A socket read's worth of SENDs is published as runs (one per producer in a row): receipts and errors stay
per SEND and in order, and what is stored is exactly the valid SENDs in the order they were sent."""

from __future__ import annotations

import struct

import pulsar

from magnetar.broker.protocol import pulsar_api_pb2 as pb
from magnetar.broker.protocol.frames import build_entry
from tests.conftest import StandaloneProcess
from tests.rawclient import RawClient

T = pb.BaseCommand


def send_frame(producer_id: int, sequence_id: int, payload: bytes, *, corrupt: bool = False) -> bytes:
    """A SEND frame as the raw client would write it (built here so that many go out in one write)."""
    meta = pb.MessageMetadata(producer_name=f"raw-{producer_id}", sequence_id=sequence_id, publish_time=1)
    entry = bytearray(build_entry(meta, payload))
    if corrupt:
        entry[-1] ^= 0xFF
    cmd = T(type=T.SEND)
    cmd.send.producer_id = producer_id
    cmd.send.sequence_id = sequence_id
    body = cmd.SerializeToString()
    return struct.pack(">II", 4 + len(body) + len(entry), len(body)) + body + bytes(entry)


def answers(raw: RawClient, count: int) -> list[T]:
    """The next ``count`` SEND_RECEIPT / SEND_ERROR frames, in arrival order."""
    return [raw.recv_until_any({T.SEND_RECEIPT, T.SEND_ERROR}) for _ in range(count)]


def stored(client: pulsar.Client, topic: str, count: int) -> list[bytes]:
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    got = [reader.read_next(timeout_millis=5000).data() for _ in range(count)]
    assert not reader.has_message_available()
    reader.close()
    return got


def test_a_bad_send_inside_a_run_is_refused_alone(
    standalone: StandaloneProcess, client: pulsar.Client, topic_name: str
) -> None:
    raw = RawClient(standalone.port)
    try:
        raw.connect()
        assert raw.create_producer(topic_name).type == T.PRODUCER_SUCCESS
        # Twenty SENDs in one write (one socket read on the broker's side), the eighth with a bad checksum.
        raw.send_raw(b"".join(send_frame(1, i, b"msg-%d" % i, corrupt=i == 7) for i in range(20)))
        got = answers(raw, 20)
        errors = [a.send_error for a in got if a.type == T.SEND_ERROR]
        receipts = [a.send_receipt for a in got if a.type == T.SEND_RECEIPT]
        assert [(e.sequence_id, e.error) for e in errors] == [(7, pb.ChecksumError)]
        assert [r.sequence_id for r in receipts] == [i for i in range(20) if i != 7]  # in SEND order
        ids = [(r.message_id.ledgerId, r.message_id.entryId) for r in receipts]
        assert ids == sorted(ids) and len(set(ids)) == 19
    finally:
        raw.close()
    assert stored(client, topic_name, 19) == [b"msg-%d" % i for i in range(20) if i != 7]


def test_sends_of_two_producers_interleaved_in_one_read(
    standalone: StandaloneProcess, client: pulsar.Client, topic_name: str
) -> None:
    raw = RawClient(standalone.port)
    try:
        raw.connect()
        assert raw.create_producer(topic_name, producer_id=1, request_id=1).type == T.PRODUCER_SUCCESS
        assert raw.create_producer(topic_name, producer_id=2, request_id=2).type == T.PRODUCER_SUCCESS
        # 1 1 1 2 2 1 2 2 2 ... in one write: runs of each producer alternate.
        order = [1, 1, 1, 2, 2, 1, 2, 2, 2, 1, 1, 2] * 3
        seq = {1: 0, 2: 0}
        frames, sent = [], []
        for pid in order:
            frames.append(send_frame(pid, seq[pid], b"p%d-%d" % (pid, seq[pid])))
            sent.append(b"p%d-%d" % (pid, seq[pid]))
            seq[pid] += 1
        raw.send_raw(b"".join(frames))
        got = answers(raw, len(order))
        assert all(a.type == T.SEND_RECEIPT for a in got)
        for pid in (1, 2):
            mine = [a.send_receipt for a in got if a.send_receipt.producer_id == pid]
            assert [r.sequence_id for r in mine] == list(range(seq[pid]))
        by_entry = sorted(got, key=lambda a: (a.send_receipt.message_id.ledgerId, a.send_receipt.message_id.entryId))
        assert [(a.send_receipt.producer_id, a.send_receipt.sequence_id) for a in by_entry] == [
            (pid, int(payload.split(b"-")[1])) for pid, payload in zip(order, sent, strict=True)
        ]
    finally:
        raw.close()
    assert stored(client, topic_name, len(sent)) == sent  # stored in the order they were sent


def test_close_producer_behind_its_sends_in_one_read(
    standalone: StandaloneProcess, client: pulsar.Client, topic_name: str
) -> None:
    """A command after SENDs in the same read sees them issued: here every SEND is answered and stored."""
    raw = RawClient(standalone.port)
    try:
        raw.connect()
        assert raw.create_producer(topic_name).type == T.PRODUCER_SUCCESS
        close = T(type=T.CLOSE_PRODUCER)
        close.close_producer.producer_id = 1
        close.close_producer.request_id = 9
        body = close.SerializeToString()
        sends = b"".join(send_frame(1, i, b"c%d" % i) for i in range(10))
        raw.send_raw(sends + struct.pack(">II", 4 + len(body), len(body)) + body)
        assert raw.recv_until(T.SUCCESS).success.request_id == 9
    finally:
        raw.close()
    assert stored(client, topic_name, 10) == [b"c%d" % i for i in range(10)]
