"""The network :class:`BookieClient`: one pipelined connection to one bookie.

Requests get increasing request ids and a future each; responses may arrive in any order.
Frames written in one loop turn leave in one ``transport.write``. ``add_entry_nowait`` returns
a future without creating a task (the ledger client's hot path). Adds time out through one
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
from .api import BookieClient, BookieError, BookieUnavailableError, FutureAdds

log = logging.getLogger(__name__)

_SWEEP_S = 0.25
_ADD_RESPONSE = p.OP_ADD | p.RESPONSE
#: A request waiting in the client: (op, rid, encoder, encoder args, future, deadline).
_Queued = tuple[int, int, Callable[..., bytes], tuple[Any, ...], "asyncio.Future[Any]", float | None]


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
        #: rid -> (op, future, frame size) of requests written and not answered yet.
        self.pending: dict[int, tuple[int, asyncio.Future[Any], int]] = {}
        self.pending_bytes = 0
        #: The transport's buffer is over its high-water mark (the bookie does not read).
        self.write_paused = False
        #: (deadline, request id) of adds in send order, swept by a timer.
        self.deadlines: collections.deque[tuple[float, int]] = collections.deque()
        self.out: list[bytes] = []
        self.flush_scheduled = False
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
            if length == 7 and op == _ADD_RESPONSE and chunk[off + p.HEADER_SIZE] == p.OK:
                entry = pending.pop(rid, None)
                if entry is not None:
                    self.pending_bytes -= entry[2]
                    if entry[0] == p.OP_ADD and not entry[1].done():
                        entry[1].set_result(None)
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
        req_op, fut, size = entry
        self.pending_bytes -= size
        if fut.done():
            return True
        if op != req_op | p.RESPONSE:
            fut.set_exception(BookieError(f"bookie answered op {op} to op {req_op}"))
            return True
        try:
            err = p.decode_status(body)
            if err is not None:
                fut.set_exception(err)
            elif req_op == p.OP_READ:
                fut.set_result(p.decode_entries(body))
            elif req_op in (p.OP_READ_LAC, p.OP_FENCE):
                fut.set_result(p.decode_lac(body))
            else:
                fut.set_result(None)
        except p.ProtocolError as e:
            fut.set_exception(BookieError(f"bad response from bookie {self._client.address}: {e}"))
        return True

    # ---------------------------------------------------------------- sending

    def forget(self, rid: int) -> None:
        """Stop waiting for ``rid`` (its caller timed out)."""
        entry = self.pending.pop(rid, None)
        if entry is not None:
            self.pending_bytes -= entry[2]

    def send(self, op: int, rid: int, frame: bytes, fut: asyncio.Future[Any], deadline: float | None) -> None:
        self.pending[rid] = (op, fut, len(frame))
        self.pending_bytes += len(frame)
        if deadline is not None:
            self.deadlines.append((deadline, rid))
            if self.sweeper is None:
                self.sweeper = self._loop.call_later(_SWEEP_S, self._sweep)
        self.out.append(frame)
        if not self.flush_scheduled:
            self.flush_scheduled = True
            self._loop.call_soon(self.flush)

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
        deadlines, pending = self.deadlines, self.pending
        while deadlines and deadlines[0][0] <= now:
            _, rid = deadlines.popleft()
            entry = pending.pop(rid, None)
            if entry is not None:
                self.pending_bytes -= entry[2]
                if not entry[1].done():
                    entry[1].set_exception(BookieUnavailableError(f"add to bookie {self._client.address} timed out"))
        # Answered adds leave stale deadlines behind; drop them from the front too.
        while deadlines and deadlines[0][1] not in pending:
            deadlines.popleft()
        if deadlines:
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
        self.deadlines.clear()
        self.out.clear()
        for _, fut, _ in pending.values():
            if not fut.done():
                fut.set_exception(exc)
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
        #: Requests waiting for the connection or for room on it, not encoded yet:
        #: (op, rid, encoder, encoder args, future, deadline).
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
        return sum(1 for q in self._queued if not q[4].done())

    def buffered_bytes(self) -> int:
        """Bytes this client holds for the bookie: frames not answered yet plus the transport's buffer."""
        conn = self._conn
        if conn is None or conn.transport is None:
            return 0
        return conn.pending_bytes + conn.transport.get_write_buffer_size()

    def _submit(
        self, op: int, rid: int, encode: Callable[..., bytes], args: tuple[Any, ...], timeout: float | None
    ) -> asyncio.Future[Any]:
        if self._closed:
            raise BookieUnavailableError(f"client of bookie {self.address} is closed")
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        deadline = None if timeout is None else loop.time() + timeout
        conn = self._conn
        if conn is not None and not self._queued and conn.can_send():
            conn.send(op, rid, encode(*args), fut, deadline)
            return fut
        self._queued.append((op, rid, encode, args, fut, deadline))
        if self._queue_sweeper is None:
            self._queue_sweeper = loop.call_later(_SWEEP_S, self._sweep_queue)
        if conn is None and self._connecting is None:
            self._connecting = self._tasks.spawn(self._connect(), name=f"bookie-connect-{self.address}")
        return fut

    def _drain(self) -> None:
        """Send queued requests while the connection has room (in arrival order)."""
        conn, queued = self._conn, self._queued
        if conn is None:
            return
        now = None
        while queued and conn.can_send():
            op, rid, encode, args, fut, deadline = queued.popleft()
            if fut.done():
                continue
            if deadline is not None:
                now = now if now is not None else conn._loop.time()
                if deadline <= now:
                    fut.set_exception(BookieUnavailableError(f"add to bookie {self.address} timed out in its queue"))
                    continue
            conn.send(op, rid, encode(*args), fut, deadline)

    def _sweep_queue(self) -> None:
        """Fail queued adds whose deadline passed (a stalled bookie must not hold them forever)."""
        self._queue_sweeper = None
        loop = self._loop
        if loop is None or self._closed:
            return
        now = loop.time()
        queued = self._queued
        while queued:
            deadline, fut = queued[0][5], queued[0][4]
            if fut.done():
                queued.popleft()
            elif deadline is not None and deadline <= now:
                queued.popleft()
                fut.set_exception(BookieUnavailableError(f"add to bookie {self.address} timed out in its queue"))
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
                    if not q[4].done():
                        q[4].set_exception(err)
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
        fut = self._submit(op, rid, encode, (rid, *args), None)
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
        rid = self._next_rid()
        args = (rid, ledger_id, entry_id, master_key, last_add_confirmed, data, recovery)
        return self._submit(p.OP_ADD, rid, p.encode_add, args, self.add_timeout_s)

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
            if not q[4].done():
                q[4].set_exception(err)
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
