"""FrameDecoder: frames split anywhere across reads decode the same; entries are the frame's own bytes."""

from __future__ import annotations

import struct

from magnetar.broker.protocol import pulsar_api_pb2 as pb
from magnetar.broker.protocol.frames import FrameDecoder, build_entry, encode_command, verify_entry

T = pb.BaseCommand


def _send_frame(seq: int, payload: bytes) -> tuple[bytes, bytes]:
    cmd = T(type=T.SEND)
    cmd.send.producer_id, cmd.send.sequence_id = 1, seq
    body = cmd.SerializeToString()
    entry = build_entry(pb.MessageMetadata(producer_name="p", sequence_id=seq, publish_time=1), payload)
    return struct.pack(">II", 4 + len(body) + len(entry), len(body)) + body + entry, entry


def test_frames_split_at_any_byte_decode_alike() -> None:
    parts = [_send_frame(i, bytes([i]) * (10 + 3000 * i)) for i in range(3)]
    stream = encode_command(T(type=T.PING, ping=pb.CommandPing())) + b"".join(f for f, _ in parts)
    for cut in range(1, len(stream), 97):
        decoder = FrameDecoder(1 << 20)
        frames = decoder.feed(stream[:cut]) + decoder.feed(stream[cut:])
        assert [f.command.type for f in frames] == [T.PING, T.SEND, T.SEND, T.SEND]
        assert frames[0].entry is None
        for frame, (_, entry) in zip(frames[1:], parts, strict=True):
            assert type(frame.entry) is bytes and frame.entry == entry
            assert verify_entry(frame.entry) is frame.entry  # stored as it came, no copy
