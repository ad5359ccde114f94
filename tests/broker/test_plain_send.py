"""SEND commands read off the wire without protobuf (``plain_send``): whatever it reads, protobuf reads the
same; what it does not read goes to protobuf; and the broker answers both kinds alike."""

from __future__ import annotations

import random

from magnetar.broker.protocol import pulsar_api_pb2 as pb
from magnetar.broker.protocol.frames import SendFields, build_entry, plain_send
from tests.conftest import StandaloneProcess
from tests.rawclient import RawClient

T = pb.BaseCommand
_VALUES = (0, 1, 127, 128, 300, 16_383, 16_384, 2**21, 2**35, 2**56 - 1, 2**62, 2**63 - 1, 2**63, 2**64 - 1)


def protobuf_reads(raw: bytes) -> SendFields | None:
    cmd = T()
    try:
        cmd.MergeFromString(raw)
    except Exception:
        return None
    s = cmd.send
    return SendFields(s.producer_id, s.sequence_id, s.num_messages, s.highest_sequence_id, s.is_chunk)


def random_send(rng: random.Random) -> tuple[bytes, bool]:
    """A serialized SEND command, and whether it uses only what plain_send reads (so it must not fall back)."""
    cmd = T(type=T.SEND)
    s = cmd.send
    plain = True
    if rng.random() < 0.95:
        s.producer_id = rng.choice(_VALUES)
    else:
        plain = False  # a required field missing: protobuf's reading (0) is not the client's intent
    if rng.random() < 0.95:
        s.sequence_id = rng.choice(_VALUES)
    else:
        plain = False
    if rng.random() < 0.5:
        s.num_messages = rng.choice((0, 1, 2, 1000, 2**31 - 1, -1, -(2**31)))
        plain = plain and s.num_messages >= 0
    if rng.random() < 0.3:
        s.highest_sequence_id = rng.choice(_VALUES)
    if rng.random() < 0.2:
        s.is_chunk = rng.random() < 0.5
    if rng.random() < 0.1:
        s.txnid_least_bits, s.txnid_most_bits = 7, 9
        plain = False
    if rng.random() < 0.05:
        s.marker = True
        plain = False
    if rng.random() < 0.05:
        s.message_id.ledgerId, s.message_id.entryId = 3, 4
        plain = False
    plain = plain and all(v < 2**63 for v in (s.producer_id, s.sequence_id, s.highest_sequence_id))
    return cmd.SerializePartialToString(), plain


def test_plain_send_reads_what_protobuf_reads_or_leaves_it_to_protobuf() -> None:
    rng = random.Random(1919)
    fast = 0
    for _ in range(5000):
        raw, plain = random_send(rng)
        got = plain_send(memoryview(raw))
        if got is not None:
            assert got == protobuf_reads(raw), raw.hex()
            fast += 1
        assert got is not None or not plain, f"a plain SEND was left to protobuf: {raw.hex()}"
    assert fast > 1500  # (about 44% of these commands are plain)


def test_damaged_sends_are_read_as_protobuf_reads_them_or_left_to_it() -> None:
    """Cut, grown and flipped commands: plain_send never raises, and never accepts what protobuf would read
    differently or refuse (a refused command is a framing error, which protobuf reports)."""
    rng = random.Random(77)
    for _ in range(3000):
        raw = bytearray(random_send(rng)[0])
        kind = rng.randrange(3)
        if kind == 0 and len(raw) > 4:
            raw = raw[: rng.randrange(4, len(raw))]
        elif kind == 1:
            raw += bytes(rng.randrange(256) for _ in range(rng.randrange(1, 4)))
        else:
            raw[rng.randrange(len(raw))] ^= 1 << rng.randrange(8)
        if len(raw) < 4 or raw[:2] != b"\x08\x06":
            continue  # the decoder tries plain_send only on commands that start as a SEND does
        got = plain_send(memoryview(bytes(raw)))
        if got is not None:
            assert got == protobuf_reads(bytes(raw)), raw.hex()


def test_common_client_layouts_are_read_without_protobuf() -> None:
    """The C++ and Java clients' SENDs: producer and sequence ids, the message count, and for a batch or a
    chunk the highest sequence id or the chunk flag."""
    for fields in (
        {"producer_id": 0, "sequence_id": 5, "num_messages": 1},
        {"producer_id": 3, "sequence_id": 2**40, "num_messages": 100, "highest_sequence_id": 2**40 + 99},
        {"producer_id": 1, "sequence_id": 9, "num_messages": 1, "is_chunk": True},
    ):
        raw = T(type=T.SEND, send=pb.CommandSend(**fields)).SerializeToString()  # type: ignore[arg-type]
        assert plain_send(memoryview(raw)) == protobuf_reads(raw)
        assert plain_send(memoryview(raw)) is not None


def _send(raw: RawClient, send: pb.CommandSend) -> None:
    meta = pb.MessageMetadata(producer_name="raw", sequence_id=send.sequence_id, publish_time=1)
    raw.send(T(type=T.SEND, send=send), build_entry(meta, b"payload"))


def test_plain_and_protobuf_read_sends_are_answered_alike(standalone: StandaloneProcess) -> None:
    raw = RawClient(standalone.port)
    try:
        raw.connect()
        assert raw.create_producer("persistent://public/default/plain-send", producer_id=4).type == T.PRODUCER_SUCCESS
        _send(raw, pb.CommandSend(producer_id=4, sequence_id=1))  # plain
        _send(raw, pb.CommandSend(producer_id=4, sequence_id=2, num_messages=3, highest_sequence_id=4))  # plain
        _send(raw, pb.CommandSend(producer_id=4, sequence_id=5, marker=False))  # a field plain_send leaves alone
        receipts = [raw.recv_until(T.SEND_RECEIPT).send_receipt for _ in range(3)]
        assert [(r.producer_id, r.sequence_id, r.highest_sequence_id) for r in receipts] == [
            (4, 1, 0),
            (4, 2, 4),
            (4, 5, 0),
        ]
        assert [r.message_id.entryId for r in receipts] == [0, 1, 2]
    finally:
        raw.close()


def test_a_plain_send_before_connect_is_refused_as_any_command(standalone: StandaloneProcess) -> None:
    raw = RawClient(standalone.port)
    try:
        _send(raw, pb.CommandSend(producer_id=1, sequence_id=1))
        reply = raw.recv_until(T.ERROR)
        assert reply.error.message == "Received command before CONNECT"
        assert raw.is_closed()
    finally:
        raw.close()
