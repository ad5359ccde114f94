"""The bookie's TCP server: the wire protocol (:mod:`.protocol`) in front of a :class:`Bookie`.

Adds take the bookie's ``add_parts_many`` path, as a local publish does: the consecutive adds of one
ledger in a socket read (a ledger client pipelines a broker's run of entries to each bookie in one
write) are one call with one waiter, so they are cached and journaled together (entries with
consecutive ids in one journal record) and answered together. No task per add; all responses completed
in one loop turn leave in one ``transport.write``. Each connection bounds its in-flight adds and pauses
reading beyond that (and while the transport's write buffer is full), so a fast client cannot grow the
bookie's memory without limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from dataclasses import dataclass
from functools import partial

from magnetar.common.tasks import TaskSet

from . import protocol as p
from .api import BookieError, BookieUnavailableError
from .bookie import Bookie

log = logging.getLogger(__name__)

_ADD_UNPACK = p.ADD_FIXED.unpack_from
_ADD_FIXED_SIZE = p.ADD_FIXED.size
_OK_PACK = p.OK_RESPONSE.pack
_ADD_RESPONSE = p.OP_ADD | p.RESPONSE


@dataclass(slots=True)
class ServerStats:
    """Counters exported as metrics."""

    connections: int = 0
    connections_total: int = 0
    adds: int = 0
    add_errors: int = 0
    add_bytes: int = 0
    reads: int = 0
    read_entries: int = 0
    read_errors: int = 0
    other_requests: int = 0
    bad_frames: int = 0
    inflight_adds: int = 0
    read_pauses: int = 0


@dataclass(slots=True)
class _AddRun:
    """Consecutive add requests of one ledger in one socket read, as one call to the bookie."""

    ledger_id: int
    master_key: bytes
    recovery: bool
    #: The highest last-add-confirmed the adds carry: they become durable together.
    lac: int
    rids: list[int]
    entry_ids: list[int]
    datas: list[bytes]


class BookieServerProtocol(asyncio.Protocol):
    """One client connection."""

    def __init__(self, server: BookieServer) -> None:
        self._server = server
        self._bookie = server.bookie
        self._stats = server.stats
        self._reader = p.FrameReader(server.max_frame)
        self._transport: asyncio.Transport | None = None
        self._loop = asyncio.get_running_loop()
        self._out: list[bytes] = []
        self._flush_scheduled = False
        #: Requests in flight (adds and others) and adds alone (for the shared gauge).
        self._inflight = 0
        self._inflight_adds = 0
        self._max_inflight = server.max_inflight_adds
        self._read_paused = False
        self._write_paused = False
        # Reads wait while the peer does not take its responses, a few at a time per connection:
        # the entries of a read are in memory from the disk read until the response is written.
        self._writable = asyncio.Event()
        self._writable.set()
        self._read_slots = asyncio.Semaphore(server.max_concurrent_reads)
        self._tasks = TaskSet("bookie connection")
        self._closed = False
        #: The client takes ADD_ACKS frames (it flagged its adds so).
        self._acks = False
        self.peer = "?"

    # ---------------------------------------------------------------- transport callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self._tasks.name = f"bookie connection {self.peer}"
        self._server._connections.add(self)
        self._stats.connections += 1
        self._stats.connections_total += 1
        log.debug("bookie connection from %s", self.peer)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._server._connections.discard(self)
        self._stats.connections -= 1
        self._stats.inflight_adds -= self._inflight_adds
        self._inflight = self._inflight_adds = 0
        self._tasks.cancel()
        log.debug("bookie connection from %s closed: %r", self.peer, exc)

    def pause_writing(self) -> None:
        self._write_paused = True
        self._writable.clear()
        self._update_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        self._writable.set()
        self._update_reading()

    def data_received(self, data: bytes) -> None:
        # Frames are parsed in place from the received chunk (adds inline: the hot path).
        chunk = self._reader.take(data)
        if chunk is None:
            return
        off = 0
        n = len(chunk)
        unpack = p.HEADER.unpack_from
        max_frame = self._reader.max_frame
        # Consecutive adds of one ledger go to the bookie as one run (see _submit).
        run: _AddRun | None = None
        while n - off >= p.HEADER_SIZE and not self._closed:
            length, version, op, rid = unpack(chunk, off)
            if length < p.HEADER_REST or length > max_frame:
                self._fatal(p.E_BAD_REQUEST, f"bad frame length {length}")
                break
            end = off + 4 + length
            if end > n:
                break
            if version != p.PROTOCOL_VERSION:
                self._fatal(p.E_BAD_VERSION, f"protocol version {version} not supported (speaks {p.PROTOCOL_VERSION})")
                break
            if op == p.OP_ADD:
                run = self._add(run, rid, chunk, off + p.HEADER_SIZE, end)
            else:
                if run is not None:  # the adds before a request reach the bookie before it
                    self._submit(run)
                    run = None
                self._request(op, rid, chunk[off + p.HEADER_SIZE : end])
            off = end
        if run is not None:
            self._submit(run)
        if self._inflight >= self._max_inflight and not self._read_paused:
            self._update_reading()
        if not self._closed:
            self._reader.keep(chunk, off)

    # ---------------------------------------------------------------- adds

    def _add(self, run: _AddRun | None, rid: int, chunk: bytes, start: int, end: int) -> _AddRun | None:
        """Read one add frame into ``run`` (or a new run after submitting ``run``, if it cannot join it);
        the run now open. A malformed add is answered at once and leaves ``run`` as it was."""
        key_start = start + _ADD_FIXED_SIZE
        if key_start > end:
            self._bad_add(rid, "truncated add request")
            return run
        lid, eid, lac, flags, key_len = _ADD_UNPACK(chunk, start)
        key_end = key_start + key_len
        if key_end > end:
            self._bad_add(rid, "add request key exceeds the frame")
            return run
        if lid < 0 or eid < 0:
            self._bad_add(rid, f"invalid entry {lid}:{eid}")
            return run
        if flags & p.FLAG_ACKS:
            self._acks = True  # the client reads ADD_ACKS: answer its adds in one frame per batch
        key = chunk[key_start:key_end]
        recovery = flags & 1 == 1
        if run is not None and run.ledger_id == lid and run.master_key == key and run.recovery == recovery:
            run.rids.append(rid)
            run.entry_ids.append(eid)
            run.datas.append(chunk[key_end:end])
            if lac > run.lac:
                run.lac = lac
            return run
        if run is not None:
            self._submit(run)
        return _AddRun(lid, key, recovery, lac, [rid], [eid], [chunk[key_end:end]])

    def _submit(self, run: _AddRun) -> None:
        """Hand a run of adds to the bookie with one waiter. It is stored as a whole: the journal answers
        a call once, so an error (a fenced ledger, a full or failed journal) is every add's answer."""
        count = len(run.rids)
        stats = self._stats
        try:
            self._bookie.add_parts_many(
                run.ledger_id,
                run.entry_ids,
                run.master_key,
                run.lac,
                (b"",) * count,
                run.datas,
                run.recovery,
                partial(self._adds_done, run.rids),
            )
        except BookieError as e:
            stats.add_errors += count
            self._refuse(run.rids, e)
            return
        stats.adds += count
        stats.add_bytes += sum(map(len, run.datas))
        stats.inflight_adds += count
        self._inflight_adds += count
        self._inflight += count

    def _refuse(self, rids: list[int], exc: BaseException) -> None:
        code, message = p.code_of(exc), str(exc)
        for rid in rids:
            self._send(p.encode_error(p.OP_ADD, rid, code, message))

    def _bad_add(self, rid: int, message: str) -> None:
        self._stats.bad_frames += 1
        self._send(p.encode_error(p.OP_ADD, rid, p.E_BAD_REQUEST, message))

    def _adds_done(self, rids: list[int], exc: BaseException | None) -> None:
        """A run is durable (``exc`` None) or failed: answer each of its adds (event loop)."""
        if self._closed:
            return  # the connection's counts were dropped with it
        count = len(rids)
        stats = self._stats
        if exc is None:
            if self._acks:
                self._send(p.encode_add_acks(rids))
            else:
                for rid in rids:
                    self._send(_OK_PACK(7, p.PROTOCOL_VERSION, _ADD_RESPONSE, rid, p.OK))
        else:
            stats.add_errors += count
            self._refuse(rids, exc)
        self._inflight -= count
        self._inflight_adds -= count
        stats.inflight_adds -= count
        if self._read_paused and self._inflight <= self._max_inflight // 2:
            self._update_reading()

    # ---------------------------------------------------------------- requests

    def _request(self, op: int, rid: int, body: bytes) -> None:
        if op not in p.OPS:
            self._stats.bad_frames += 1
            self._send(p.encode_error(op & ~p.RESPONSE, rid, p.E_BAD_REQUEST, f"unknown op {op}"))
            return
        # Other requests count against the same in-flight bound as adds (a task each).
        self._inflight += 1
        if self._inflight >= self._max_inflight and not self._read_paused:
            self._update_reading()
        self._tasks.spawn(self._serve(op, rid, body)).add_done_callback(self._request_done)

    def _request_done(self, task: asyncio.Task[None]) -> None:
        if self._closed:
            return
        self._inflight -= 1
        if self._read_paused and self._inflight <= self._max_inflight // 2:
            self._update_reading()

    async def _serve(self, op: int, rid: int, body: bytes) -> None:
        bookie = self._bookie
        stats = self._stats
        try:
            if op == p.OP_READ:
                lid, first, last = p.decode_read(body)
                stats.reads += 1
                async with self._read_slots:
                    if not self._writable.is_set():
                        try:
                            await asyncio.wait_for(self._writable.wait(), bookie.config.read_timeout_s)
                        except TimeoutError as e:
                            raise BookieUnavailableError(f"client {self.peer} does not read its responses") from e
                    # Bounded before anything is read from disk: the client asks again from where it stops.
                    entries, more = await bookie.read_entries_bounded(lid, first, last, self._server.max_read_bytes)
                    stats.read_entries += len(entries)
                    # Written before the slot is released, so the next read sees a full buffer.
                    self._send(p.encode_entries(rid, entries, more))
                    self._flush()
                return
            elif op == p.OP_READ_LAC:
                stats.other_requests += 1
                lac, last_entry = await bookie.read_last_add_confirmed(p.decode_ledger(body))
                out = p.encode_lac(op, rid, lac, last_entry)
            elif op == p.OP_FENCE:
                stats.other_requests += 1
                lid, key = p.decode_fence(body)
                lac, last_entry = await bookie.fence(lid, key)
                out = p.encode_lac(op, rid, lac, last_entry)
            else:  # OP_DELETE
                stats.other_requests += 1
                await bookie.delete_ledger(p.decode_ledger(body))
                out = p.encode_ok(op, rid)
        except p.ProtocolError as e:
            stats.bad_frames += 1
            out = p.encode_error(op, rid, p.E_BAD_REQUEST, str(e))
        except BookieError as e:
            if op == p.OP_READ:
                stats.read_errors += 1
            out = p.encode_error(op, rid, p.code_of(e), str(e))
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a bug must cost one request, not the connection or the server
            log.exception("bookie request op=%d from %s failed", op, self.peer)
            out = p.encode_error(op, rid, p.E_INTERNAL, repr(e))
        self._send(out)

    # ---------------------------------------------------------------- output

    def _send(self, frame: bytes) -> None:
        if self._closed:
            return
        self._out.append(frame)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            # Runs after every callback already queued in this loop turn: one write for all.
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        out = self._out
        if not out or self._closed or self._transport is None:
            out.clear()
            return
        self._out = []
        self._transport.write(out[0] if len(out) == 1 else b"".join(out))

    def _update_reading(self) -> None:
        """Pause reading while too many adds are in flight or the peer does not read its responses."""
        if self._closed or self._transport is None:
            return
        want_pause = self._write_paused or self._inflight >= self._max_inflight or self._server.closing
        if want_pause and not self._read_paused:
            self._read_paused = True
            self._stats.read_pauses += 1
            self._transport.pause_reading()
        elif not want_pause and self._read_paused and self._inflight <= self._max_inflight // 2:
            self._read_paused = False
            self._transport.resume_reading()

    def _fatal(self, code: int, message: str) -> None:
        """The stream cannot be trusted any more: tell the peer (request id 0) and close."""
        self._stats.bad_frames += 1
        log.warning("closing bookie connection from %s: %s", self.peer, message)
        self._send(p.encode_error(0, 0, code, message))
        self._flush()
        self._closed = True
        if self._transport is not None:
            self._transport.close()  # flushes what is buffered, then closes

    def close(self) -> None:
        if self._transport is not None and not self._closed:
            self._flush()
            if self._write_paused:
                self._transport.abort()  # the peer does not read: closing would wait for it forever
            else:
                self._transport.close()


class BookieServer:
    """Serves one :class:`Bookie` on ``host:port``.

    ``server = BookieServer(bookie, "0.0.0.0", 3181); await server.start()`` ...
    ``await server.close()`` (stops accepting, lets in-flight adds finish for a bounded time,
    closes connections; the bookie itself is closed by its owner).
    """

    def __init__(
        self,
        bookie: Bookie,
        host: str = "0.0.0.0",
        port: int = 3181,
        *,
        max_inflight_adds: int = 8192,
        max_frame: int = p.MAX_FRAME,
        max_read_bytes: int = p.MAX_READ_RESPONSE_BYTES,
        max_concurrent_reads: int = 4,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.bookie = bookie
        #: TLS on the bookie port (``None``: plaintext); every client must then use TLS.
        self.ssl_context = ssl_context
        self.host = host
        self.port = port
        self.max_inflight_adds = max_inflight_adds
        self.max_frame = max_frame
        #: A read response holds at most about this many entry bytes (at least one entry).
        self.max_read_bytes = max_read_bytes
        #: Reads of one connection holding entries in memory at once (each at most max_read_bytes).
        self.max_concurrent_reads = max_concurrent_reads
        self.stats = ServerStats()
        #: Set by close(): connections stop reading.
        self.closing = False
        self._server: asyncio.Server | None = None
        self._connections: set[BookieServerProtocol] = set()

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: BookieServerProtocol(self),
            self.host,
            self.port,
            reuse_address=True,
            backlog=256,
            ssl=self.ssl_context,
            ssl_handshake_timeout=10 if self.ssl_context is not None else None,
        )
        sock = self._server.sockets[0]
        self.port = sock.getsockname()[1]  # resolves port 0

    async def close(self, drain_timeout: float = 5.0) -> None:
        if self._server is None:
            return
        server, self._server = self._server, None
        server.close()
        # Take no new requests, but answer the adds already accepted.
        self.closing = True
        for conn in list(self._connections):
            conn._update_reading()
        # Give adds in flight the chance to be answered before the connections go.
        for _ in range(int(drain_timeout / 0.01)):
            if self.stats.inflight_adds <= 0:
                break
            await asyncio.sleep(0.01)
        for conn in list(self._connections):
            conn.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(server.wait_closed(), drain_timeout)
