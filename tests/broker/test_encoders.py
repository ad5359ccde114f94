"""Hand-encoded hot-path frames are byte for byte what protobuf encodes."""

from __future__ import annotations

import struct

import pytest

from magnetar.broker.protocol import commands
from magnetar.broker.protocol import pulsar_api_pb2 as pb
from magnetar.broker.protocol.frames import encode_command

T = pb.BaseCommand
_U32X2 = struct.Struct(">II")
VALUES = [0, 1, 127, 128, 300, 16383, 16384, 2**21 - 1, 2**21, 2**28, 2**35 + 7, 2**63 - 1]


@pytest.mark.parametrize("value", VALUES)
def test_send_receipt_matches_protobuf(value: int) -> None:
    for producer_id, sequence_id, ledger_id, entry_id, highest in (
        (value, value, value, value, value),
        (1, value, 7, value % 100_000, 0),
        (value % 5, 3, -1, -1, 0),  # a deduplicated send
    ):
        cmd = T(type=T.SEND_RECEIPT)
        r = cmd.send_receipt
        r.producer_id, r.sequence_id = producer_id, sequence_id
        r.message_id.ledgerId, r.message_id.entryId = ledger_id % 2**64, entry_id % 2**64
        if highest:
            r.highest_sequence_id = highest
        assert commands.send_receipt(producer_id, sequence_id, ledger_id, entry_id, highest) == encode_command(cmd)


@pytest.mark.parametrize("value", VALUES)
def test_message_header_matches_protobuf(value: int) -> None:
    cmd = T(type=T.MESSAGE)
    m = cmd.message
    m.consumer_id, m.message_id.ledgerId, m.message_id.entryId = value, value, value % 100_000
    if value % 3:
        m.redelivery_count = value % 3
    entry = b"e" * 37
    assert commands.message_header(value, value, value % 100_000, len(entry), value % 3) == _protobuf_header(cmd, entry)


def _protobuf_header(command: pb.BaseCommand, entry: bytes) -> bytes:
    """The reference: protobuf's encoding of ``command`` framed ahead of ``entry``."""
    body = command.SerializeToString()
    return _U32X2.pack(len(body) + 4 + len(entry), len(body)) + body
