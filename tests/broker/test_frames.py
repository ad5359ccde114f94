"""FrameDecoder: frames split anywhere across reads decode the same; entries are the frame's own bytes
(copied out of the shared read buffer, or the decoder's own buffer a big entry was read into)."""

from __future__ import annotations

import struct

from magnetar.broker.protocol import pulsar_api_pb2 as pb
from magnetar.broker.protocol.frames import FrameDecoder, FrameError, build_entry, encode_command, verify_entry

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
        assert [f.send and (f.send.producer_id, f.send.sequence_id) for f in frames] == [None, (1, 0), (1, 1), (1, 2)]
        assert frames[0].entry is None
        for frame, (_, entry) in zip(frames[1:], parts, strict=True):
            assert type(frame.entry) in (bytes, bytearray) and frame.entry == entry
            assert verify_entry(frame.entry) is frame.entry  # stored as it came, no copy


def _read_into(decoder: FrameDecoder, stream: memoryview, sizes: list[int]) -> tuple[list, memoryview]:  # type: ignore[type-arg]
    """Reads as the transport makes them: each at most as long as the buffer handed out."""
    frames = []
    for size in sizes:
        if not stream:
            break
        buf = decoder.get_buffer()
        assert len(buf) > 0
        n = min(size, len(buf), len(stream))
        buf[:n] = stream[:n]
        frames += decoder.buffer_updated(n)
        stream = stream[n:]
    return frames, stream


def test_buffered_reads_of_any_size_decode_alike() -> None:
    """get_buffer/buffer_updated (the BufferedProtocol path), frames bigger than the shared scratch too."""
    parts = [_send_frame(i, bytes([i]) * n) for i, n in enumerate((10, 3000, 300_000, 1, 700_000))]
    ping = encode_command(T(type=T.PING, ping=pb.CommandPing()))
    stream = memoryview(ping + b"".join(f for f, _ in parts) + ping)
    for read in (7, 97, 4096, 65536, 1 << 20):
        decoder = FrameDecoder(1 << 21)
        frames, rest = _read_into(decoder, stream, [read] * (len(stream) // read + 10))
        assert not rest
        assert [f.command.type for f in frames] == [T.PING, *[T.SEND] * len(parts), T.PING]
        for frame, (_, entry) in zip(frames[1:-1], parts, strict=True):
            assert type(frame.entry) in (bytes, bytearray) and frame.entry == entry


def test_a_big_entry_is_handed_on_in_the_buffer_it_was_read_into() -> None:
    """A frame cut after its command: its entry is read into a buffer of its own, which becomes the
    frame's entry as it is (no copy). A frame complete in the shared scratch buffer is copied out of it."""
    small, small_entry = _send_frame(1, b"s" * 100)
    big, big_entry = _send_frame(2, bytes(range(256)) * 2000)
    stream = memoryview(small + big)
    decoder = FrameDecoder(1 << 21)
    first = len(small) + len(big) // 3
    buf = decoder.get_buffer()
    buf[:first] = stream[:first]
    (done,) = decoder.buffer_updated(first)
    assert type(done.entry) is bytes and done.entry == small_entry  # a copy: the scratch is reused
    own = decoder.get_buffer()
    assert len(own) == len(stream) - first  # exactly the rest of the big entry
    buffers = set()
    frames = []
    rest = stream[first:]
    while rest:  # bounded: every read fills at least one byte
        buf = decoder.get_buffer()
        buffers.add(id(buf.obj))
        n = min(len(buf), len(rest), 50_000)
        buf[:n] = rest[:n]
        frames += decoder.buffer_updated(n)
        rest = rest[n:]
    (frame,) = frames
    assert frame.send is not None and frame.send.sequence_id == 2  # read off the wire, not by protobuf
    assert frame.entry is own.obj and buffers == {id(own.obj)}
    assert type(frame.entry) is bytearray and frame.entry == big_entry
    assert verify_entry(frame.entry) is frame.entry
    assert decoder.get_buffer().obj is not own.obj  # the decoder lets go of it: never written again


def test_a_big_frame_cut_inside_its_command_is_copied_out_once_complete() -> None:
    big, big_entry = _send_frame(3, b"b" * 100_000)
    # Cut before the command size or inside the command: the frame's buffer holds it all, the entry is
    # copied out. Cut before the length: the next read fills a small header buffer first, which then
    # holds the command, so the entry gets its own buffer after all.
    for cut, kind in ((6, bytes), (9, bytes), (2, bytearray)):
        decoder = FrameDecoder(1 << 21)
        frames, rest = _read_into(decoder, memoryview(big), [cut, 1 << 20, 1 << 20])
        assert not rest
        (frame,) = frames
        assert type(frame.entry) is kind and frame.entry == big_entry


def test_byte_by_byte_reads_decode() -> None:
    parts = [_send_frame(i, bytes([i]) * n) for i, n in enumerate((10, 300, 1))]
    stream = memoryview(encode_command(T(type=T.PING, ping=pb.CommandPing())) + b"".join(f for f, _ in parts))
    frames, rest = _read_into(FrameDecoder(1 << 20), stream, [1] * len(stream))
    assert not rest
    assert [f.command.type for f in frames] == [T.PING, T.SEND, T.SEND, T.SEND]
    assert [f.entry for f in frames[1:]] == [e for _, e in parts]


def test_connections_sharing_the_scratch_buffer_do_not_mix() -> None:
    """Two decoders read alternately (as two connections on one loop do): each gets its own frames intact."""
    a = memoryview(b"".join(_send_frame(i, b"a" * (1000 * i + 5))[0] for i in range(40)))
    b = memoryview(b"".join(_send_frame(i, b"b" * (7000 * i + 3))[0] for i in range(40)))
    da, db = FrameDecoder(1 << 21), FrameDecoder(1 << 21)
    got_a: list = []  # type: ignore[type-arg]
    got_b: list = []  # type: ignore[type-arg]
    while a or b:
        frames, a = _read_into(da, a, [1500])
        got_a += frames
        frames, b = _read_into(db, b, [2900])
        got_b += frames
    assert [f.entry[-1:] for f in got_a] == [b"a"] * 40
    assert [f.entry[-1:] for f in got_b] == [b"b"] * 40
    assert [len(f.entry) for f in got_a] == [len(_send_frame(i, b"a" * (1000 * i + 5))[1]) for i in range(40)]


def test_frame_over_the_limit_fails_before_its_body_arrives() -> None:
    decoder = FrameDecoder(1024)
    buf = decoder.get_buffer()
    buf[:8] = struct.pack(">II", 2000, 10)
    try:
        decoder.buffer_updated(8)
    except FrameError:
        return
    raise AssertionError("a frame over max_frame_size was accepted")
