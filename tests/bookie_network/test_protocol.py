"""Bookie wire protocol: round trips through a real BookieServer + Bookie, and malformed frames.

The server runs in the test's event loop in front of a real bookie on tmp_path; clients are the
real :class:`RemoteBookieClient` or raw sockets for frames no client would send.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from magnetar.bookie import protocol as p
from magnetar.bookie.api import (
    BookieFencedError,
    BookieNoSuchEntryError,
    BookieReadOnlyError,
    BookieUnauthorizedError,
    BookieUnavailableError,
    settle,
)
from magnetar.bookie.bookie import Bookie
from magnetar.bookie.config import BookieConfig
from magnetar.bookie.remote import RemoteBookieClient
from magnetar.bookie.server import BookieServer

pytestmark = pytest.mark.timeout(30)

KEY = b"key"


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[Bookie, BookieServer]]:
    bookie = Bookie(BookieConfig(data_dir=tmp_path / "b", min_free_bytes=0, checkpoint_interval_s=3600))
    await bookie.start()
    server = BookieServer(bookie, "127.0.0.1", 0, max_inflight_adds=64)
    await server.start()
    yield bookie, server
    await server.close()
    await bookie.close()


def _client(server: BookieServer, **kw: float) -> RemoteBookieClient:
    return RemoteBookieClient(f"127.0.0.1:{server.port}", **kw)


async def test_round_trips(served: tuple[Bookie, BookieServer]) -> None:
    bookie, server = served
    c = _client(server)
    try:
        futs = [c.add_entry_nowait(7, e, KEY, e - 1, b"x%d" % e * 10) for e in range(500)]
        await asyncio.wait_for(asyncio.gather(*futs), 10)
        await c.add_entry(7, 500, KEY, 499, b"", recovery=True)  # empty entry, recovery flag
        got = await c.read_entries(7, 0, 600)
        assert [e for e, _ in got] == list(range(501))
        assert got[3][1] == b"x3" * 10 and got[500][1] == b""
        assert await c.read_last_add_confirmed(7) == (499, 500)
        with pytest.raises(BookieNoSuchEntryError):
            await c.read_entries(7, 1000, 1001)
        with pytest.raises(BookieNoSuchEntryError):
            await c.read_last_add_confirmed(8)
        with pytest.raises(BookieUnauthorizedError):
            await c.add_entry(7, 501, b"other", 500, b"d")
        with pytest.raises(BookieUnauthorizedError):
            await c.fence(7, b"other")
        assert await c.fence(7, KEY) == (499, 500)
        with pytest.raises(BookieFencedError):
            await c.add_entry(7, 501, KEY, 500, b"d")
        await c.add_entry(7, 501, KEY, 500, b"d", recovery=True)
        bookie.set_read_only(True)
        with pytest.raises(BookieReadOnlyError):
            await c.add_entry(9, 0, KEY, -1, b"d")
        bookie.set_read_only(False)
        await c.delete_ledger(7)
        with pytest.raises(BookieNoSuchEntryError):
            await c.read_entries(7, 0, 0)
        big = bytes(range(256)) * 8192  # 2 MiB entries, arriving in many pieces
        for e in range(3):
            await c.add_entry(10, e, KEY, e - 1, big[e:])
        # Responses are bounded at 3 MiB here: the client asks for the rest transparently.
        server.max_read_bytes = 3 * 1024 * 1024
        got = await c.read_entries(10, 0, 5)
        assert [(e, len(d)) for e, d in got] == [(e, len(big) - e) for e in range(3)]
        assert got[2][1] == big[2:]
        assert c.connects == 1
        assert server.stats.adds >= 503
    finally:
        await c.close()
    with pytest.raises(BookieUnavailableError):
        await c.read_last_add_confirmed(10)


def test_add_parts_carry_the_data_uncopied_and_encode_the_joined_request() -> None:
    data = bytes(range(256)) * 512
    head = b"H" * 12
    fields, rest = p.encode_add_parts(3, 4, KEY, 2, head, data, recovery=True)
    assert rest is data
    assert fields + rest == p.encode_add_body(3, 4, KEY, 2, head + data, recovery=True)
    assert p.decode_add(fields + rest) == (3, 4, 2, True, KEY, head + data)


async def test_adds_sent_as_parts_store_the_joined_entry(served: tuple[Bookie, BookieServer]) -> None:
    """What the write handle sends: the digest header and the data as two buffers, one request."""
    _, server = served
    c = _client(server)
    loop = asyncio.get_running_loop()
    try:
        datas = [bytes([e]) * (100 + 70_000 * e) for e in range(3)]
        futs = [loop.create_future() for _ in datas]
        for e, d in enumerate(datas):
            c.add_encoded_cb(c.encode_add_parts(8, e, KEY, e - 1, b"head%d" % e, d), settle, futs[e])
        await asyncio.wait_for(asyncio.gather(*futs), 10)
        got = await c.read_entries(8, 0, 2)
        assert [d for _, d in got] == [b"head%d" % e + d for e, d in enumerate(datas)]
    finally:
        await c.close()


async def test_unreachable_and_reconnect(served: tuple[Bookie, BookieServer], tmp_path: Path) -> None:
    _, server = served
    dead = RemoteBookieClient("127.0.0.1:1", connect_timeout_s=1)
    with pytest.raises(BookieUnavailableError):
        await dead.add_entry(1, 0, KEY, -1, b"x")
    await dead.close()
    c = _client(server)
    try:
        await c.add_entry(1, 0, KEY, -1, b"x")
        # Drop every server-side connection: the next call reconnects.
        for conn in list(server._connections):
            conn.close()
        for _ in range(500):  # bounded: the client notices the close on its next loop turns
            if c._conn is None:
                break
            await asyncio.sleep(0.01)
        assert c._conn is None
        assert await c.read_entries(1, 0, 0) == [(0, b"x")]
        assert c.connects == 2
    finally:
        await c.close()


async def test_add_timeout(tmp_path: Path) -> None:
    """A bookie that accepts the connection but never answers: the add fails within its timeout."""
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    c = RemoteBookieClient(f"127.0.0.1:{port}", add_timeout_s=0.5, op_timeout_s=0.5)
    try:
        t0 = asyncio.get_running_loop().time()
        with pytest.raises(BookieUnavailableError, match="timed out"):
            await c.add_entry(1, 0, KEY, -1, b"x")
        with pytest.raises(BookieUnavailableError, match="timed out"):
            await c.read_last_add_confirmed(1)
        assert asyncio.get_running_loop().time() - t0 < 3
    finally:
        await c.close()
        server.close()


async def test_add_callbacks_run_once_each(served: tuple[Bookie, BookieServer]) -> None:
    """``add_entry_cb``: every callback runs exactly once with its token; one that raises harms no other."""
    _, server = served
    c = _client(server)
    calls: list[tuple[int, BaseException | None]] = []

    def done(token: int, exc: BaseException | None) -> None:
        calls.append((token, exc))
        if token == 3:
            raise RuntimeError("a caller's bug")

    try:
        for e in range(300):
            c.add_entry_cb(11, e, KEY, e - 1, b"y%d" % e, False, done, e)
            if e % 50 == 0:
                await asyncio.sleep(0)  # several loop turns: several writes
        for _ in range(1000):  # bounded
            if len(calls) >= 300:
                break
            await asyncio.sleep(0.01)
        assert sorted(t for t, _ in calls) == list(range(300))
        assert all(exc is None for _, exc in calls)
        assert await c.read_last_add_confirmed(11) == (298, 299)
        assert c.buffered_bytes() == 0
    finally:
        await c.close()
    with pytest.raises(BookieUnavailableError):
        c.add_entry_cb(11, 300, KEY, 299, b"z", False, done, 300)
    assert len(calls) == 300


async def test_add_callbacks_fail_on_timeout_and_connection_loss() -> None:
    """A bookie that never answers: adds on the open connection time out (each once); adds
    in flight when the bookie closes the connection fail with BookieUnavailableError."""
    writers: list[asyncio.StreamWriter] = []
    server = await asyncio.start_server(lambda r, w: writers.append(w), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    c = RemoteBookieClient(f"127.0.0.1:{port}", add_timeout_s=0.4, op_timeout_s=0.4)
    calls: list[tuple[int, BaseException | None]] = []
    loop = asyncio.get_running_loop()

    async def wait_calls(n: int) -> None:
        for _ in range(500):  # bounded
            if len(calls) >= n:
                return
            await asyncio.sleep(0.01)

    try:
        with pytest.raises(BookieUnavailableError, match="timed out"):
            await c.read_last_add_confirmed(1)  # connects
        assert c.connects == 1
        t0 = loop.time()
        for e in range(10):  # sent on the live connection, over two loop turns
            c.add_entry_cb(1, e, KEY, -1, b"x", False, lambda t, exc: calls.append((t, exc)), e)
            if e == 4:
                await asyncio.sleep(0.05)
        await wait_calls(10)
        assert sorted(t for t, _ in calls) == list(range(10))
        assert all(isinstance(exc, BookieUnavailableError) and "timed out" in str(exc) for _, exc in calls)
        assert 0.3 < loop.time() - t0 < 3
        calls.clear()
        for e in range(10, 15):
            c.add_entry_cb(1, e, KEY, -1, b"x", False, lambda t, exc: calls.append((t, exc)), e)
        await asyncio.sleep(0.05)
        for w in writers:
            w.close()
        await wait_calls(5)
        assert sorted(t for t, _ in calls) == list(range(10, 15))
        assert all(isinstance(exc, BookieUnavailableError) and "lost" in str(exc) for _, exc in calls)
        await asyncio.sleep(0.6)  # past the add timeout: no second call from the sweep
        assert len(calls) == 5
    finally:
        await c.close()
        server.close()


async def test_add_after_another_request_in_one_loop_turn_keeps_its_timeout() -> None:
    """An add written in the same loop turn as another request still gets the full add timeout."""
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)  # never answers
    port = server.sockets[0].getsockname()[1]
    c = RemoteBookieClient(f"127.0.0.1:{port}", add_timeout_s=1, op_timeout_s=5)
    loop = asyncio.get_running_loop()
    failed_at: dict[int, float] = {}
    lac = None
    try:
        c.add_entry_cb(1, 0, KEY, -1, b"x", False, lambda t, exc: failed_at.setdefault(t, loop.time()), 0)
        await asyncio.sleep(0.8)
        lac = asyncio.ensure_future(c.read_last_add_confirmed(1))
        await asyncio.sleep(0)  # the read is written first in this loop turn, then the add
        sent = loop.time()
        c.add_entry_cb(1, 1, KEY, -1, b"x", False, lambda t, exc: failed_at.setdefault(t, loop.time()), 1)
        for _ in range(300):  # bounded
            if 1 in failed_at:
                break
            await asyncio.sleep(0.01)
        assert 0 in failed_at and 1 in failed_at
        assert failed_at[1] - sent >= 0.95  # not the deadline of an earlier loop turn
    finally:
        if lac is not None:
            lac.cancel()
            with contextlib.suppress(asyncio.CancelledError, BookieUnavailableError):
                await lac
        await c.close()
        server.close()


async def _raw(server: BookieServer) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", server.port)


async def _read_frame(reader: asyncio.StreamReader) -> tuple[int, int, int, bytes]:
    header = await asyncio.wait_for(reader.readexactly(p.HEADER_SIZE), 5)
    length, version, op, rid = p.HEADER.unpack(header)
    body = await asyncio.wait_for(reader.readexactly(length - p.HEADER_REST), 5)
    return version, op, rid, body


async def test_flagged_adds_are_answered_by_add_acks_frames(served: tuple[Bookie, BookieServer]) -> None:
    """Adds flagged FLAG_ACKS get ADD_ACKS frames (many request ids each); unflagged adds, from a
    client that does not know the frame, still get one ADD response each."""
    _, server = served
    reader, writer = await _raw(server)
    old_reader, old_writer = await _raw(server)
    try:
        body = [p.encode_add_body(21, e, KEY, e - 1, b"d%d" % e) for e in range(5)]
        writer.write(b"".join(p.add_header(100 + e, len(b)) + b for e, b in enumerate(body)))
        acked: list[int] = []
        for _ in range(5):  # bounded: at most one frame per add
            if len(acked) == 5:
                break
            _, op, count, rest = await _read_frame(reader)
            assert op == p.OP_ADD_ACKS | p.RESPONSE and len(rest) == 4 * count
            acked.extend(p.rids_struct(count).unpack(rest))
        assert sorted(acked) == [100, 101, 102, 103, 104]
        old_writer.write(b"".join(p.encode_add(200 + e, 22, e, KEY, e - 1, b"x") for e in range(3)))
        for e in range(3):
            _, op, rid, rest = await _read_frame(old_reader)
            assert (op, rid, rest) == (p.OP_ADD | p.RESPONSE, 200 + e, bytes([p.OK]))
        # Errors stay single ADD responses on a flagged connection too.
        wrong_key = p.encode_add_body(21, 5, b"other", 4, b"x")
        writer.write(p.add_header(105, len(wrong_key)) + wrong_key)
        _, op, rid, rest = await _read_frame(reader)
        assert (op, rid, rest[0]) == (p.OP_ADD | p.RESPONSE, 105, p.E_UNAUTHORIZED)
    finally:
        writer.close()
        old_writer.close()


async def test_client_works_with_a_bookie_answering_each_add_alone() -> None:
    """A bookie that predates ADD_ACKS answers every add with its own frame: adds still complete."""

    async def old_bookie(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        frames = p.FrameReader()
        with contextlib.suppress(ConnectionError):
            while data := await r.read(65536):
                for _, op, rid, _ in frames.feed(data):
                    w.write(p.encode_ok(op, rid))

    server = await asyncio.start_server(old_bookie, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    c = RemoteBookieClient(f"127.0.0.1:{port}")
    try:
        futs = [c.add_entry_nowait(1, e, KEY, e - 1, b"x") for e in range(50)]
        await asyncio.wait_for(asyncio.gather(*futs), 10)
    finally:
        await c.close()
        server.close()


async def test_malformed_frames_get_errors(served: tuple[Bookie, BookieServer]) -> None:
    _, server = served
    good = _client(server)
    try:
        await good.add_entry(1, 0, KEY, -1, b"x")
        reader, writer = await _raw(server)
        # A truncated add body, a key longer than the frame, an unknown op, a short read request:
        # each gets BAD_REQUEST and the connection goes on.
        bad = [
            p.HEADER.pack(p.HEADER_REST + 3, 1, p.OP_ADD, 11) + b"abc",
            p.HEADER.pack(p.HEADER_REST + p.ADD_FIXED.size, 1, p.OP_ADD, 12) + p.ADD_FIXED.pack(1, 1, 0, 0, 999),
            p.HEADER.pack(p.HEADER_REST, 1, 42, 13),
            p.HEADER.pack(p.HEADER_REST + 4, 1, p.OP_READ, 14) + b"\0\0\0\0",
            p.HEADER.pack(p.HEADER_REST + 3, 1, p.OP_FENCE, 15) + b"\0\0\0",
        ]
        writer.write(b"".join(bad))
        for rid in range(11, 16):
            _, op, got_rid, body = await _read_frame(reader)
            assert got_rid == rid and op & p.RESPONSE and body[0] == p.E_BAD_REQUEST
        writer.write(p.encode_read_lac(16, 1))
        _, _, rid, body = await _read_frame(reader)
        assert rid == 16 and p.decode_lac(body) == (-1, 0)
        writer.write(p.encode_add(17, -1, 0, KEY, -1, b"x") + p.encode_add(18, 1, -2, KEY, -1, b"x"))
        for rid in (17, 18):
            _, _, got_rid, body = await _read_frame(reader)
            assert got_rid == rid and body[0] == p.E_BAD_REQUEST
        # An impossible length: error with request id 0, then the server closes.
        writer.write(struct.pack(">I", 0xFFFFFFF0) + b"\x01\x01\0\0\0\x01")
        _, _, rid, body = await _read_frame(reader)
        assert rid == 0 and body[0] == p.E_BAD_REQUEST
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()
        # A version nobody speaks: error and close as well.
        reader, writer = await _raw(server)
        writer.write(p.HEADER.pack(p.HEADER_REST + 8, 99, p.OP_READ_LAC, 5) + b"\0" * 8)
        _, _, rid, body = await _read_frame(reader)
        assert rid == 0 and body[0] == p.E_BAD_VERSION
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()
        # Garbage then a half frame and a hang-up: nothing to answer, nothing breaks.
        reader, writer = await _raw(server)
        writer.write(b"\0\0\0")
        writer.close()
        # The well-behaved connection never noticed any of this.
        await good.add_entry(1, 1, KEY, 0, b"y")
        assert await good.read_entries(1, 0, 1) == [(0, b"x"), (1, b"y")]
        assert good.connects == 1
        assert server.stats.bad_frames >= 7
    finally:
        await good.close()


async def test_back_pressure_pauses_reading(served: tuple[Bookie, BookieServer]) -> None:
    """More adds in flight than the per-connection bound: reading pauses, everything still completes."""
    _, server = served
    c = _client(server)
    try:
        futs = [c.add_entry_nowait(3, e, KEY, e - 1, b"z" * 100) for e in range(2000)]
        await asyncio.wait_for(asyncio.gather(*futs), 20)
        assert server.stats.read_pauses >= 1
        assert server.stats.inflight_adds == 0
        assert len(await c.read_entries(3, 0, 1999)) == 2000
        # Pipelined reads share the bound (one task each on the server).
        pauses = server.stats.read_pauses
        reads = await asyncio.wait_for(asyncio.gather(*(c.read_entries(3, e, e) for e in range(1000))), 20)
        assert [r[0][0] for r in reads] == list(range(1000))
        assert server.stats.read_pauses > pauses
    finally:
        await c.close()


def test_frame_reader_splits_anywhere() -> None:
    frames = b"".join(p.encode_add(i + 1, 1, i, KEY, i - 1, b"d" * i) for i in range(20))
    for step in (1, 3, 7, 64, len(frames)):
        reader = p.FrameReader()
        got = []
        for i in range(0, len(frames), step):
            got.extend(reader.feed(frames[i : i + step]))
        assert [rid for _, _, rid, _ in got] == list(range(1, 21))
        assert [p.decode_add(body)[5] for *_, body in got] == [b"d" * i for i in range(20)]


async def test_fuzzed_frames_never_break_the_server(served: tuple[Bookie, BookieServer]) -> None:
    """Random bodies under valid headers (every op) and random garbage streams, on many connections."""
    import random

    _, server = served
    rng = random.Random(1234)
    good = _client(server)
    try:
        for round_ in range(30):
            reader, writer = await _raw(server)
            frames = []
            for i in range(20):
                op = rng.choice([1, 2, 3, 4, 5, 0, 77, 0x81])
                body = rng.randbytes(rng.randrange(0, 64))
                if op == p.OP_ADD and rng.random() < 0.5:  # plausible adds with random fields
                    key = rng.randbytes(rng.randrange(0, 8))
                    lid, eid, flags = rng.randrange(-5, 5), rng.randrange(-5, 50), rng.randrange(256)
                    body = p.ADD_FIXED.pack(lid, eid, -1, flags, len(key)) + key + rng.randbytes(rng.randrange(0, 30))
                frames.append(p.HEADER.pack(p.HEADER_REST + len(body), 1, op, i + 1) + body)
            stream = b"".join(frames)
            if round_ % 3 == 0:
                stream += rng.randbytes(rng.randrange(1, 40))  # trailing garbage
            writer.write(stream)
            with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError, TimeoutError):
                for _ in range(20):
                    await _read_frame(reader)
            writer.close()
        await good.add_entry(99, 0, KEY, -1, b"still fine")
        assert await good.read_entries(99, 0, 0) == [(0, b"still fine")]
        assert good.connects == 1
    finally:
        await good.close()


async def test_server_close_answers_accepted_adds(served: tuple[Bookie, BookieServer]) -> None:
    """Closing the server stops reading, answers the adds it accepted, then closes: nothing hangs."""
    _, server = served
    c = _client(server)
    try:
        await c.add_entry(4, 0, KEY, -1, b"first")
        futs = [c.add_entry_nowait(4, e, KEY, e - 1, b"y" * 100) for e in range(1, 3000)]
        for _ in range(50):  # let some of them reach the bookie
            if server.stats.adds > 1:
                break
            await asyncio.sleep(0.001)
        await asyncio.wait_for(server.close(), 10)
        results = await asyncio.wait_for(asyncio.gather(*futs, return_exceptions=True), 10)
        ok = sum(r is None for r in results)
        assert all(r is None or isinstance(r, BookieUnavailableError) for r in results)
        assert ok == server.stats.adds - 1  # every accepted add was answered with success
    finally:
        await c.close()


async def test_huge_read_range_reads_only_what_fits_the_reply(served: tuple[Bookie, BookieServer]) -> None:
    """A read of a whole ledger (and a hostile range past it) reads from disk only what one
    bounded reply holds; the client gets the rest by asking again."""
    bookie, server = served
    c = _client(server)
    try:
        entry = b"r" * (256 * 1024)
        futs = [c.add_entry_nowait(4, e, KEY, e - 1, entry) for e in range(64)]  # 16 MiB
        await asyncio.wait_for(asyncio.gather(*futs), 20)
        await bookie.checkpoint()
        server.max_read_bytes = 1024 * 1024
        before = bookie.storage.reader.bytes_read
        reader, writer = await _raw(server)
        writer.write(p.encode_read(21, 4, 0, 2**62))
        _, _, rid, body = await _read_frame(reader)
        writer.close()
        entries, more = p.decode_entries(body)
        assert rid == 21 and more and 1 <= len(entries) <= 4
        read = bookie.storage.reader.bytes_read - before
        assert read <= server.max_read_bytes + len(entry), f"read {read} bytes from disk for a 1 MiB reply"
        got = await c.read_entries(4, 0, 2**62)  # the client follows "more" to the end
        assert [e for e, _ in got] == list(range(64)) and all(d == entry for _, d in got)
    finally:
        await c.close()


async def test_client_output_is_bounded_when_the_bookie_does_not_read() -> None:
    """A bookie that accepts but never reads: the client honours ``pause_writing`` and its
    pending bound, so what it buffers stays bounded; the held-back adds time out, nothing grows."""
    conns: list[asyncio.StreamWriter] = []

    async def stalled(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conns.append(writer)  # never reads

    server = await asyncio.start_server(stalled, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    c = RemoteBookieClient(f"127.0.0.1:{port}", add_timeout_s=1.0, max_pending=256, max_pending_bytes=1 << 20)
    try:
        entry = b"q" * 4096
        futs = []
        peak = 0
        for e in range(20000):  # 80 MiB offered
            futs.append(c.add_entry_nowait(1, e, KEY, e - 1, entry))
            if e % 500 == 0:
                await asyncio.sleep(0.01)
                peak = max(peak, c.buffered_bytes())
        await asyncio.sleep(0.2)
        peak = max(peak, c.buffered_bytes())
        # Socket buffers take a few MiB; the client itself holds at most its byte bound.
        assert peak <= (1 << 20) + 256 * 1024, f"client buffered {peak} bytes"
        assert c.queued_requests() > 0
        results = await asyncio.wait_for(asyncio.gather(*futs, return_exceptions=True), 20)
        assert all(isinstance(r, BookieUnavailableError) for r in results)
        assert c.queued_requests() == 0
    finally:
        await c.close()
        for w in conns:
            w.close()
        server.close()
        await server.wait_closed()


async def test_server_stops_reading_from_disk_for_a_client_that_does_not_read(
    served: tuple[Bookie, BookieServer],
) -> None:
    """Pipelined big reads from a client that never reads its responses: once the connection's
    transport pauses writing, the server reads no more from disk for it (memory stays bounded)."""
    bookie, server = served
    c = _client(server)
    try:
        entry = b"w" * (256 * 1024)
        await asyncio.wait_for(asyncio.gather(*(c.add_entry_nowait(5, e, KEY, e - 1, entry) for e in range(16))), 20)
        await bookie.checkpoint()
    finally:
        await c.close()
    server.max_read_bytes = 1024 * 1024
    before = bookie.storage.reader.bytes_read
    _, writer = await _raw(server)
    writer.transport.pause_reading()  # and the kernel buffers fill up: the client reads nothing
    writer.write(b"".join(p.encode_read(100 + i, 5, 0, 15) for i in range(60)))  # 60 x 1 MiB asked
    await asyncio.sleep(3)
    read = bookie.storage.reader.bytes_read - before
    assert server.stats.read_pauses >= 1
    assert read <= 12 * 1024 * 1024, f"{read} bytes read from disk for a client that reads nothing"
    writer.close()


class _CallsSpy:
    """Records the size of each ``add_parts_many`` call and passes it on to the real bookie."""

    def __init__(self, bookie: Bookie) -> None:
        self.calls: list[tuple[int, list[int]]] = []
        self._real = bookie.add_parts_many

    def __call__(self, ledger_id: int, entry_ids: list[int], *rest: object) -> None:
        self.calls.append((ledger_id, list(entry_ids)))
        self._real(ledger_id, entry_ids, *rest)  # type: ignore[arg-type]


async def _acked(reader: asyncio.StreamReader, count: int) -> list[int]:
    """Request ids of ``count`` adds answered OK, by ADD_ACKS frames or single responses."""
    acked: list[int] = []
    for _ in range(count):  # bounded: at most one frame per add
        if len(acked) == count:
            break
        _, op, rid, rest = await _read_frame(reader)
        if op == p.OP_ADD_ACKS | p.RESPONSE:
            acked.extend(p.rids_struct(rid).unpack(rest))
        else:
            assert (op, rest) == (p.OP_ADD | p.RESPONSE, bytes([p.OK])), (op, rest)
            acked.append(rid)
    return acked


async def test_adds_of_a_ledger_in_one_read_reach_the_bookie_as_one_run(
    served: tuple[Bookie, BookieServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client's pipelined adds of one ledger, read in one chunk, are one call to the bookie (one waiter,
    one journal record for consecutive small entries), answered by one ADD_ACKS frame; the bookie
    remembers the highest last-add-confirmed they carry."""
    bookie, server = served
    spy = _CallsSpy(bookie)
    monkeypatch.setattr(bookie, "add_parts_many", spy)
    reader, writer = await _raw(server)
    try:
        bodies = [p.encode_add_body(31, e, KEY, e - 1, b"r%d" % e, acks=True) for e in range(60)]
        writer.write(b"".join(p.add_header(1000 + e, len(b)) + b for e, b in enumerate(bodies)))
        assert sorted(await _acked(reader, 60)) == list(range(1000, 1060))
        assert spy.calls == [(31, list(range(60)))]  # ~3 KB written at once on loopback: one read
        writer.write(p.encode_read_lac(2000, 31))
        _, op, rid, rest = await _read_frame(reader)
        assert (op, rid) == (p.OP_READ_LAC | p.RESPONSE, 2000)
        assert p.LAC_RESP.unpack(rest) == (p.OK, 58, 59)
    finally:
        writer.close()
    c = _client(server)
    try:
        got = await c.read_entries(31, 0, 59)
        assert got == [(e, b"r%d" % e) for e in range(60)]
    finally:
        await c.close()


async def test_a_run_ends_at_another_ledger_and_before_any_other_request(
    served: tuple[Bookie, BookieServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    bookie, server = served
    spy = _CallsSpy(bookie)
    monkeypatch.setattr(bookie, "add_parts_many", spy)
    reader, writer = await _raw(server)
    try:
        frames = [p.encode_add(1, 41, 0, KEY, -1, b"a0"), p.encode_add(2, 41, 1, KEY, 0, b"a1")]
        frames += [p.encode_add(3, 42, 0, KEY, -1, b"b0")]  # another ledger
        frames += [p.encode_read(4, 41, 0, 1)]  # sees the adds before it
        frames += [p.encode_add(5, 41, 2, KEY, 1, b"a2"), p.encode_add(6, 41, 3, KEY, 2, b"a3", recovery=True)]
        writer.write(b"".join(frames))
        answers: dict[int, tuple[int, bytes]] = {}
        for _ in range(6):
            _, op, rid, rest = await _read_frame(reader)
            answers[rid] = (op, rest)
        assert sorted(answers) == [1, 2, 3, 4, 5, 6]
        assert all(answers[r] == (p.OP_ADD | p.RESPONSE, bytes([p.OK])) for r in (1, 2, 3, 5, 6))
        op, rest = answers[4]
        assert op == p.OP_READ | p.RESPONSE and rest[0] == p.OK
        # The recovery flag is part of a run's identity too: a recovery add is a call of its own.
        assert spy.calls == [(41, [0, 1]), (42, [0]), (41, [2]), (41, [3])]
    finally:
        writer.close()


async def test_a_refused_run_answers_every_add_with_the_error(
    served: tuple[Bookie, BookieServer],
) -> None:
    _, server = served
    c = _client(server)
    try:
        await c.add_entry(51, 0, KEY, -1, b"first")
        await c.fence(51, KEY)
    finally:
        await c.close()
    reader, writer = await _raw(server)
    try:
        writer.write(b"".join(p.encode_add(10 + e, 51, e, KEY, e - 1, b"late") for e in range(1, 6)))
        answers = [await _read_frame(reader) for _ in range(5)]
        assert sorted(rid for _, _, rid, _ in answers) == [11, 12, 13, 14, 15]
        assert {(op, rest[0]) for _, op, _, rest in answers} == {(p.OP_ADD | p.RESPONSE, p.E_FENCED)}
        assert server.stats.add_errors == 5 and server.stats.inflight_adds == 0
        # Then a recovery run of the fenced ledger is taken, as a whole too.
        writer.write(b"".join(p.encode_add(20 + e, 51, e, KEY, e - 1, b"r", recovery=True) for e in range(1, 4)))
        assert sorted(await _acked(reader, 3)) == [21, 22, 23]
    finally:
        writer.close()
