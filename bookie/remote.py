"""The network :class:`BookieClient`: one pipelined connection to one bookie.

Requests get increasing request ids; responses may arrive in any order. Frames written in one
loop turn leave in one ``transport.write``. The ledger client's hot path is :meth:`add_entry_cb`:
the response calls ``callback(token, error)`` directly from ``data_received`` (no future, no task,
no ``call_soon`` per add); ``add_entry_nowait`` wraps it in a future. Adds are flagged so the
bookie may answer a batch of them with one ADD_ACKS frame (see :mod:`.protocol`). Adds time out through one
sweep timer per connection (a timer per add would cost more than the add); other calls are
bounded by ``wait_for``. A lost connection fails what is in flight with
:class:`BookieUnavailableError`; the next call reconnects.

Back-pressure: a connection takes at most ``max_pending`` requests / ``max_pending_bytes`` of
frames that are unanswered, and nothing while its transport has paused writing (the bookie is
not reading). Further requests wait in the client's queue un-encoded (a reference to the
caller's data, no copy) until there is room, failing at their deadline like any other.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import socket
import ssl
from collections.abc import Callable
from typing import Any

from magnetar.common.tasks import TaskSet

from . import protocol as p
from .api import BookieClient, BookieError, BookieUnavailableError, FutureAdds, settle

log = logging.getLogger(__name__)

_SWEEP_S = 0.25
_ADD_RESPONSE = p.OP_ADD | p.RESPONSE
_ACKS_RESPONSE = p.OP_ADD_ACKS | p.RESPONSE
_OP_ADD = p.OP_ADD
_ADD_HEADER = p.add_header
_HEADER_SIZE = p.HEADER_SIZE
#: Completion of an add: ``callback(token, error)``, error None once the bookie has it durably.
AddCallback = Callable[[Any, "BaseException | None"], None]
#: A request waiting in the client: (op, rid, encoder, encoder args, target, token, deadline);
#: an add has no encoder (its args are its encoded body) and an AddCallback as target (called
#: with token); any other request has a future.
_Queued = tuple[int, int, Callable[..., bytes] | None, tuple[Any, ...], Any, Any, float | None]
#: A request written and not answered: (op, target, token, frame size, deadline).
_Pending = tuple[int, Any, Any, int, float | None]


def _finish(op: int, target: Any, token: Any, exc: BaseException | None, result: Any = None) -> None:
    """Complete a request: call an add's callback, or resolve a future (unless it is done)."""
    if op == _OP_ADD:
        try:
            target(token, exc)
        except Exception:  # a caller's bug must not break the connection's other requests
            log.exception("add callback failed")
    elif not target.done():
        if exc is None:
            target.set_result(result)
        else:
            target.set_exception(exc)


def _live(q: _Queued) -> bool:
    """A queued request someone still waits for (a call that timed out has a done future)."""
    return q[0] == _OP_ADD or not q[4].done()


def split_address(address: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` too) -> ``(host, port)``."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"bookie address must be host:port, got {address!r}")
    return host.strip("[]"), int(port)


class _Connection(asyncio.Protocol):
    """The protocol object of one TCP connection; owned by a :class:`RemoteBookieClient`."""

    def __init__(self, client: RemoteBookieClient) -> None:
        self._client = client
        self._loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.reader = p.FrameReader()
        #: Requests written and not answered yet, in send order (so add deadlines ascend).
        self.pending: dict[int, _Pending] = {}
        self.pending_bytes = 0
        #: The transport's buffer is over its high-water mark (the bookie does not read).
        self.write_paused = False
        self.out: list[bytes] = []
        self.flush_scheduled = False
        #: Deadline of adds sent in this loop turn (one clock read per turn, not per add).
        self.turn_deadline = 0.0
        self.closed = False
        self.sweeper: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self._shutdown(BookieUnavailableError(f"connection to bookie {self._client.address} lost: {exc!r}"))

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        self._client._drain()

    def can_send(self) -> bool:
        """Room for one more request (at least one is always allowed on an idle connection)."""
        if self.closed or self.write_paused:
            return False
        client = self._client
        return not self.pending or (
            len(self.pending) < client.max_pending and self.pending_bytes < client.max_pending_bytes
        )

    def _add_ok(self, entry: _Pending) -> None:
        """An add the bookie answered OK (alone or in ADD_ACKS): tell its caller."""
        self.pending_bytes -= entry[3]
        op = entry[0]
        _finish(op, entry[1], entry[2], None if op == _OP_ADD else BookieError(f"bookie acked op {op} as an add"))

    def data_received(self, data: bytes) -> None:
        # Parsed in place; a successful add (the hot path) costs one unpack and one dict pop.
        chunk = self.reader.take(data)
        if chunk is None:
            return
        pending = self.pending
        unpack = p.HEADER.unpack_from
        max_frame = self.reader.max_frame
        off = 0
        n = len(chunk)
        while n - off >= p.HEADER_SIZE:
            length, _version, op, rid = unpack(chunk, off)
            if length < p.HEADER_REST or length > max_frame:
                self.abort(BookieUnavailableError(f"bookie {self._client.address} sent a bad frame length {length}"))
                return
            end = off + 4 + length
            if end > n:
                break
            if op == _ACKS_RESPONSE:  # many adds answered at once (the hot path)
                if length != p.HEADER_REST + 4 * rid:
                    self.abort(BookieUnavailableError(f"bookie {self._client.address} sent a bad ADD_ACKS frame"))
                    return
                for acked in p.rids_struct(rid).unpack_from(chunk, off + p.HEADER_SIZE):
                    entry = pending.pop(acked, None)
                    if entry is not None:
                        self._add_ok(entry)
            elif length == 7 and op == _ADD_RESPONSE and chunk[off + p.HEADER_SIZE] == p.OK:
                entry = pending.pop(rid, None)
                if entry is not None:
                    self._add_ok(entry)
            elif not self._response(op, rid, chunk[off + p.HEADER_SIZE : end]):
                return
            off = end
        self.reader.keep(chunk, off)
        if self._client.has_queued:
            self._client._drain()

    def _response(self, op: int, rid: int, body: bytes) -> bool:
        """Complete the request ``rid`` (any response but a successful add); False if the connection ended."""
        if rid == 0:  # connection-level error: the bookie closes the connection
            try:
                err: BookieError | None = p.decode_status(body)
            except p.ProtocolError:
                err = None
            self.abort(BookieUnavailableError(f"bookie {self._client.address} closed the connection: {err}"))
            return False
        entry = self.pending.pop(rid, None)
        if entry is None:
            return True  # timed out or cancelled meanwhile
        req_op, target, token, size, _ = entry
        self.pending_bytes -= size
        if req_op != _OP_ADD and target.done():
            return True
        if op != req_op | p.RESPONSE:
            _finish(req_op, target, token, BookieError(f"bookie answered op {op} to op {req_op}"))
            return True
        try:
            err = p.decode_status(body)
            if err is not None:
                _finish(req_op, target, token, err)
            elif req_op == p.OP_READ:
                _finish(req_op, target, token, None, p.decode_entries(body))
            elif req_op in (p.OP_READ_LAC, p.OP_FENCE):
                _finish(req_op, target, token, None, p.decode_lac(body))
            else:
                _finish(req_op, target, token, None)
        except p.ProtocolError as e:
            _finish(req_op, target, token, BookieError(f"bad response from bookie {self._client.address}: {e}"))
        return True

    # ---------------------------------------------------------------- sending

    def forget(self, rid: int) -> None:
        """Stop waiting for ``rid`` (its caller timed out)."""
        entry = self.pending.pop(rid, None)
        if entry is not None:
            self.pending_bytes -= entry[3]

    def send_add(
        self, rid: int, body: tuple[bytes, bytes], callback: AddCallback, token: Any, deadline: float | None
    ) -> None:
        """Write an add (hot path: its header, then the shared body's two parts; the flush joins them);
        ``deadline`` None: the add timeout from this loop turn."""
        if not self.flush_scheduled:
            self._schedule_flush()
            if self.sweeper is None:
                self.sweeper = self._loop.call_later(_SWEEP_S, self._sweep)
        fields, data = body
        n = len(fields) + len(data)
        self.pending[rid] = (
            _OP_ADD,
            callback,
            token,
            n + _HEADER_SIZE,
            self.turn_deadline if deadline is None else deadline,
        )
        self.pending_bytes += n + _HEADER_SIZE
        out = self.out
        out += (_ADD_HEADER(rid, n), fields, data)

    def send(self, op: int, rid: int, frame: bytes, fut: asyncio.Future[Any]) -> None:
        """Write any other request (bounded by its caller's ``wait_for``)."""
        self.pending[rid] = (op, fut, None, len(frame), None)
        self.pending_bytes += len(frame)
        self.out.append(frame)
        if not self.flush_scheduled:
            self._schedule_flush()

    def _schedule_flush(self) -> None:
        """Write at the end of this loop turn; adds of this turn time out ``add_timeout_s`` from now."""
        self.flush_scheduled = True
        loop = self._loop
        self.turn_deadline = loop.time() + self._client.add_timeout_s
        loop.call_soon(self.flush)

    def flush(self) -> None:
        self.flush_scheduled = False
        out = self.out
        if not out or self.closed or self.transport is None:
            return
        self.out = []
        self.transport.write(out[0] if len(out) == 1 else b"".join(out))

    def _sweep(self) -> None:
        self.sweeper = None
        if self.closed:
            return
        now = self._loop.time()
        expired: list[int] = []
        waiting = False
        # Adds were sent in order with ascending deadlines: stop at the first one not due.
        for rid, entry in self.pending.items():
            deadline = entry[4]
            if deadline is None:
                continue  # not an add: its caller bounds it
            if deadline > now:
                waiting = True
                break
            expired.append(rid)
        if expired:
            err = BookieUnavailableError(f"add to bookie {self._client.address} timed out")
            for rid in expired:
                gone = self.pending.pop(rid, None)
                if gone is not None:  # (a callback may have ended the connection meanwhile)
                    self.pending_bytes -= gone[3]
                    _finish(gone[0], gone[1], gone[2], err)
        if waiting and not self.closed:
            self.sweeper = self._loop.call_later(_SWEEP_S, self._sweep)

    # ---------------------------------------------------------------- closing

    def abort(self, exc: BookieError) -> None:
        self._shutdown(exc)
        if self.transport is not None:
            self.transport.abort()

    def _shutdown(self, exc: BookieError) -> None:
        if self.closed:
            return
        self.closed = True
        if self.sweeper is not None:
            self.sweeper.cancel()
            self.sweeper = None
        pending, self.pending = self.pending, {}
        self.pending_bytes = 0
        self.out.clear()
        for op, target, token, _, _ in pending.values():
            _finish(op, target, token, exc)
        self._client._connection_gone(self)


class RemoteBookieClient(FutureAdds, BookieClient):
    """:class:`BookieClient` over TCP to the bookie at ``address`` (``host:port``).

    The connection is made on first use and again after a failure. Requests issued while it
    is being established are queued and sent once it is up (or failed if it cannot be made).
    """

    def __init__(
        self,
        address: str,
        *,
        connect_timeout_s: float = 5.0,
        add_timeout_s: float = 30.0,
        op_timeout_s: float = 30.0,
        max_pending: int = 8192,
        max_pending_bytes: int = 64 * 1024 * 1024,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.address = address
        #: TLS to the bookie (``None``: plaintext); the bookie's certificate must name its host.
        self.ssl_context = ssl_context
        #: Unanswered requests / frame bytes on the connection before further requests queue.
        self.max_pending = max_pending
        self.max_pending_bytes = max_pending_bytes
        self.host, self.port = split_address(address)
        self.connect_timeout_s = connect_timeout_s
        self.add_timeout_s = add_timeout_s
        self.op_timeout_s = op_timeout_s
        self._ids = itertools.count(1)
        self._conn: _Connection | None = None
        self._connecting: asyncio.Task[None] | None = None
        self._tasks = TaskSet(f"bookie client {self.address}")
        #: Requests waiting for the connection or for room on it, not encoded yet.
        self._queued: collections.deque[_Queued] = collections.deque()
        self._queue_sweeper: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self.connects = 0

    def __repr__(self) -> str:
        return f"RemoteBookieClient({self.address!r})"

    # ---------------------------------------------------------------- connection

    def _next_rid(self) -> int:
        rid = next(self._ids) & 0xFFFFFFFF
        return rid or next(self._ids) & 0xFFFFFFFF  # 0 is reserved for connection-level errors

    @property
    def has_queued(self) -> bool:
        return bool(self._queued)

    def queued_requests(self) -> int:
        """Requests waiting for the connection or for room on it (a metric)."""
        return sum(1 for q in self._queued if _live(q))

    def buffered_bytes(self) -> int:
        """Bytes this client holds for the bookie: frames not answered yet plus the transport's buffer."""
        conn = self._conn
        if conn is None or conn.transport is None:
            return 0
        return conn.pending_bytes + conn.transport.get_write_buffer_size()

    def _enqueue(self, q: _Queued) -> None:
        """Hold a request until the connection is up and has room."""
        assert self._loop is not None
        self._queued.append(q)
        if self._queue_sweeper is None:
            self._queue_sweeper = self._loop.call_later(_SWEEP_S, self._sweep_queue)
        if self._conn is None and self._connecting is None:
            self._connecting = self._tasks.spawn(self._connect(), name=f"bookie-connect-{self.address}")

    def _loop_of(self) -> asyncio.AbstractEventLoop:
        if self._closed:
            raise BookieUnavailableError(f"client of bookie {self.address} is closed")
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        return loop

    def _drain(self) -> None:
        """Send queued requests while the connection has room (in arrival order)."""
        conn, queued = self._conn, self._queued
        if conn is None:
            return
        now = None
        while queued and conn.can_send():
            q = queued.popleft()
            if not _live(q):
                continue
            op, rid, encode, args, target, token, deadline = q
            if encode is not None:
                conn.send(op, rid, encode(*args), target)
                continue
            now = now if now is not None else self._loop_of().time()
            if deadline is not None and deadline <= now:
                _finish(op, target, token, self._queue_timeout())
                continue
            conn.send_add(rid, args[0], target, token, deadline)

    def _queue_timeout(self) -> BookieUnavailableError:
        return BookieUnavailableError(f"add to bookie {self.address} timed out in its queue")

    def _sweep_queue(self) -> None:
        """Fail queued adds whose deadline passed (a stalled bookie must not hold them forever)."""
        self._queue_sweeper = None
        loop = self._loop
        if loop is None or self._closed:
            return
        now = loop.time()
        queued = self._queued
        while queued:
            q = queued[0]
            if not _live(q):
                queued.popleft()
            elif q[6] is not None and q[6] <= now:
                queued.popleft()
                _finish(q[0], q[4], q[5], self._queue_timeout())
            else:
                break
        if queued:
            self._queue_sweeper = loop.call_later(_SWEEP_S, self._sweep_queue)

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            try:
                tls: dict[str, Any] = {}
                if self.ssl_context is not None:
                    tls = {"ssl": self.ssl_context, "server_hostname": self.host}
                _, conn = await asyncio.wait_for(
                    loop.create_connection(lambda: _Connection(self), self.host, self.port, **tls),
                    self.connect_timeout_s,
                )
            except (OSError, TimeoutError) as e:
                err = BookieUnavailableError(f"cannot connect to bookie {self.address}: {e!r}")
                queued, self._queued = self._queued, collections.deque()
                for q in queued:
                    if _live(q):
                        _finish(q[0], q[4], q[5], err)
                log.debug("connect to bookie %s failed: %r", self.address, e)
                return
            if self._closed:
                conn.transport.close()  # type: ignore[union-attr]
                return
            _keepalive(conn.transport)
            self.connects += 1
            self._conn = conn
            self._drain()
        finally:
            self._connecting = None

    def _connection_gone(self, conn: _Connection) -> None:
        if self._conn is conn:
            self._conn = None
            if self._queued and not self._closed and self._connecting is None and self._loop is not None:
                # Requests still waiting for room go out on a new connection.
                self._connecting = self._tasks.spawn(self._connect(), name=f"bookie-connect-{self.address}")

    async def _call(self, op: int, rid: int, encode: Callable[..., bytes], *args: Any) -> Any:
        timeout = self.op_timeout_s
        fut: asyncio.Future[Any] = self._loop_of().create_future()
        conn = self._conn
        if conn is not None and not self._queued and conn.can_send():
            conn.send(op, rid, encode(rid, *args), fut)
        else:
            self._enqueue((op, rid, encode, (rid, *args), fut, None, None))
        try:
            return await asyncio.wait_for(fut, timeout)
        except TimeoutError as e:
            if self._conn is not None:
                self._conn.forget(rid)
            raise BookieUnavailableError(f"request to bookie {self.address} timed out after {timeout}s") from e

    # ---------------------------------------------------------------- BookieClient

    def add_entry_nowait(
        self,
        ledger_id: int,
        entry_id: int,
        master_key: bytes,
        last_add_confirmed: int,
        data: bytes,
        recovery: bool = False,
    ) -> asyncio.Future[None]:
        """Send one add; the future resolves when the bookie has it durably (no task per add)."""
        fut: asyncio.Future[None] = self._loop_of().create_future()
        self.add_entry_cb(ledger_id, entry_id, master_key, last_add_confirmed, data, recovery, settle, fut)
        return fut

    def add_entry_cb(
        self,
        ledger_id: int,
        entry_id: int,
        master_key: bytes,
        last_add_confirmed: int,
        data: bytes,
        recovery: bool,
        callback: AddCallback,
        token: Any,
    ) -> None:
        """Send one add; ``callback(token, error)`` runs once, error None when the bookie has it
        durably (called from the connection's ``data_received``, a sweep timer or a connection
        loss, never from here: a closed client raises instead)."""
        body = p.encode_add_parts(ledger_id, entry_id, master_key, last_add_confirmed, b"", data, recovery)
        self.add_encoded_cb(body, callback, token)

    #: Encodes an add for :meth:`add_encoded_cb` (once per entry for all the bookies it goes to;
    #: flagged: this client reads ADD_ACKS).
    encode_add_parts = staticmethod(p.encode_add_parts)

    def add_encoded_cb(self, body: tuple[bytes, bytes], callback: AddCallback, token: Any) -> None:
        """:meth:`add_entry_cb` with the request already encoded by :meth:`encode_add_parts`."""
        loop = self._loop_of()
        rid = next(self._ids) & 0xFFFFFFFF or self._next_rid()
        conn = self._conn
        if conn is not None and not self._queued and conn.can_send():
            conn.send_add(rid, body, callback, token, None)
            return
        self._enqueue((_OP_ADD, rid, None, (body,), callback, token, loop.time() + self.add_timeout_s))

    async def read_entries(self, ledger_id: int, first: int, last: int) -> list[tuple[int, bytes]]:
        out: list[tuple[int, bytes]] = []
        while True:
            rid = self._next_rid()
            entries, more = await self._call(p.OP_READ, rid, p.encode_read, ledger_id, first, last)
            out.extend(entries)
            if not more or not entries or entries[-1][0] >= last:
                return out
            first = entries[-1][0] + 1  # the bookie bounded the frame: ask for the rest

    async def read_last_add_confirmed(self, ledger_id: int) -> tuple[int, int]:
        rid = self._next_rid()
        return await self._call(p.OP_READ_LAC, rid, p.encode_read_lac, ledger_id)

    async def fence(self, ledger_id: int, master_key: bytes) -> tuple[int, int]:
        rid = self._next_rid()
        return await self._call(p.OP_FENCE, rid, p.encode_fence, ledger_id, master_key)

    async def delete_ledger(self, ledger_id: int) -> None:
        rid = self._next_rid()
        await self._call(p.OP_DELETE, rid, p.encode_delete, ledger_id)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._tasks.close(self.connect_timeout_s)
        err = BookieUnavailableError(f"client of bookie {self.address} is closed")
        if self._queue_sweeper is not None:
            self._queue_sweeper.cancel()
            self._queue_sweeper = None
        queued, self._queued = self._queued, collections.deque()
        for q in queued:
            if _live(q):
                _finish(q[0], q[4], q[5], err)
        conn = self._conn
        if conn is not None:
            # Close gracefully (buffered writes go out) and fail what still waits for an answer.
            conn.flush()
            conn._shutdown(err)
            if conn.transport is not None:
                conn.transport.close()


def _keepalive(transport: asyncio.BaseTransport | None) -> None:
    """TCP keep-alive probes: a bookie host that vanished without a reset is noticed in ~25 s."""
    sock = None if transport is None else transport.get_extra_info("socket")
    if sock is None:
        return
    with contextlib.suppress(OSError, AttributeError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 10)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 5)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3)
