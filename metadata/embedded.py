"""Durable embedded metadata store (sqlite) for ``magnetar standalone``.

All sqlite work happens on one dedicated thread; the event loop only enqueues requests and
receives results through ``call_soon_threadsafe``. Requests that queue up while a batch is being
committed are applied together in the next single sqlite transaction (group commit), so many
concurrent cursor flushes cost one fsync. Each write in a batch runs inside its own SAVEPOINT so
a failed compare-and-swap affects only its caller.

Keys form a tree through an indexed ``parent`` column. As in etcd, parents need not exist as
keys: creating ``/a/b/c`` inserts placeholder rows (``data IS NULL``) for ``/a/b`` and ``/a`` so
``get_children('/a')`` finds ``b``; placeholders are invisible to ``get``/``exists`` and are pruned
when their last child goes.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from magnetar.common.tasks import TaskSet
from magnetar.metadata.api import (
    NOT_EXISTS,
    BadVersionError,
    DeleteOp,
    Listener,
    MetadataError,
    MetadataStore,
    NotFoundError,
    Notification,
    NotificationType,
    PutOp,
    Session,
    Stat,
    StoreUnavailableError,
    Value,
    check_path,
    check_transaction,
    invoke_listener,
)

try:  # POSIX only: keeps two processes from sharing (and wiping each other's ephemerals in) one file
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS kv (
    path        TEXT PRIMARY KEY,
    parent      TEXT NOT NULL,
    data        BLOB,               -- NULL: placeholder parent of deeper keys, not a key
    version     INTEGER NOT NULL,
    created_ms  INTEGER NOT NULL,
    modified_ms INTEGER NOT NULL,
    session     INTEGER             -- non-NULL: ephemeral key of that session
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS kv_parent ON kv(parent, path);
CREATE INDEX IF NOT EXISTS kv_session ON kv(session) WHERE session IS NOT NULL;
"""

_WRITE_KINDS = frozenset({"put", "delete", "delete_recursive", "transact", "close_session"})
_STOP = object()


def _parent(path: str) -> str:
    i = path.rfind("/")
    return "/" if i == 0 else path[:i]


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(slots=True, eq=False)
class _Request:
    kind: str
    args: tuple[Any, ...]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]
    #: Set when the caller gave up (timeout / cancel): skip it if it has not started yet.
    abandoned: bool = False


@dataclass(slots=True, eq=False)
class _Watcher:
    prefix: str
    listener: Listener
    loop: asyncio.AbstractEventLoop | None


@dataclass(slots=True)
class StoreStats:
    """Counters for tests and metrics."""

    commits: int = 0
    write_ops: int = 0
    read_ops: int = 0
    failed_commits: int = 0


class EmbeddedSession(Session):
    """A session of the embedded store: it lives until closed or until the process ends."""

    def __init__(self, session_id: int, ttl_seconds: float, closer: Callable[[int], Awaitable[None]]) -> None:
        self._closer = closer
        self._id = session_id
        self.ttl_seconds = ttl_seconds
        self._closed = False

    @property
    def id(self) -> int:
        return self._id

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._closer(self._id)


@dataclass(slots=True)
class _Batch:
    """Outcome of one worker batch, delivered to one event loop."""

    results: list[tuple[_Request, bool, Any]] = field(default_factory=list)
    notifications: list[Notification] = field(default_factory=list)


class EmbeddedMetadataStore(MetadataStore):
    """Durable sqlite-backed :class:`MetadataStore` (WAL, ``synchronous=FULL``), one worker thread.

    ``path`` is a database file (its directory is created) or ``":memory:"``. The constructor does
    no I/O on the caller's thread; the database is opened by the worker, and :meth:`start` (or any
    first call) reports an open failure. On open, ephemeral keys left by a previous process are
    deleted.
    """

    def __init__(
        self,
        path: str,
        *,
        op_timeout_seconds: float = 30.0,
        max_batch_requests: int = 2048,
    ) -> None:
        self.path = path
        self.op_timeout_seconds = op_timeout_seconds
        self.max_batch_requests = max_batch_requests
        self.stats = StoreStats()
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._closed = False
        self._watchers: list[_Watcher] = []
        self._tasks = TaskSet("embedded metadata store")
        self._session_ids = itertools.count(1)
        self._live_sessions: set[int] = set()  # mutated by the loop (add) and the worker (discard)
        self._conn: sqlite3.Connection | None = None
        self._lock_fd: int | None = None
        self._init_error: BaseException | None = None
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"metadata-sqlite:{path}", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ public API

    async def start(self) -> None:
        """Wait until the database is open; raises :class:`StoreUnavailableError` if it cannot be."""
        await self._call("ping")

    async def get(self, path: str) -> Value | None:
        check_path(path)
        return await self._call("get", path)

    async def put(
        self,
        path: str,
        data: bytes,
        expected_version: int | None = None,
        *,
        session: Session | None = None,
    ) -> Stat:
        check_path(path)
        return await self._call("put", path, bytes(data), expected_version, session.id if session else None)

    async def delete(self, path: str, expected_version: int | None = None) -> None:
        check_path(path)
        await self._call("delete", path, expected_version)

    async def get_children(self, path: str) -> list[str]:
        check_path(path, allow_root=True)
        return await self._call("children", path)

    async def delete_recursive(self, path: str) -> None:
        check_path(path, allow_root=True)
        await self._call("delete_recursive", path)

    async def transact(self, ops: list[PutOp | DeleteOp]) -> list[Stat | None]:
        check_transaction(ops)
        if not ops:
            return []
        return await self._call("transact", list(ops))

    def watch(self, prefix: str, listener: Listener) -> Callable[[], None]:
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        watcher = _Watcher(prefix, listener, loop)
        self._watchers.append(watcher)

        def unsubscribe() -> None:
            with contextlib.suppress(ValueError):
                self._watchers.remove(watcher)

        return unsubscribe

    async def create_session(self, ttl_seconds: float = 10.0) -> Session:
        # The embedded store lives and dies with this process, so the TTL needs no keep-alive.
        if self._closed:
            raise StoreUnavailableError("metadata store is closed")
        sid = next(self._session_ids)
        self._live_sessions.add(sid)
        return EmbeddedSession(sid, ttl_seconds, self._close_session)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._queue.put(_STOP)
        loop = asyncio.get_running_loop()
        ok = await loop.run_in_executor(None, self._stopped.wait, self.op_timeout_seconds)
        if not ok:
            log.warning("metadata store worker did not stop within %.1fs", self.op_timeout_seconds)
        self._tasks.cancel()  # (listeners may run on other loops: cancel only, as their loops finish them)

    async def _close_session(self, session_id: int) -> None:
        await self._call("close_session", session_id)

    # ------------------------------------------------------------------ loop side plumbing

    async def _call(self, kind: str, *args: Any) -> Any:
        if self._closed:
            raise StoreUnavailableError("metadata store is closed")
        loop = asyncio.get_running_loop()
        req = _Request(kind, args, loop, loop.create_future())
        self._queue.put(req)
        try:
            async with asyncio.timeout(self.op_timeout_seconds):
                return await req.future
        except TimeoutError:
            req.abandoned = True
            raise StoreUnavailableError(
                f"metadata store did not answer {kind} within {self.op_timeout_seconds}s"
            ) from None
        except asyncio.CancelledError:
            req.abandoned = True
            raise

    def _deliver(self, batch: _Batch) -> None:
        for req, ok, value in batch.results:
            if req.future.done():
                continue
            if ok:
                req.future.set_result(value)
            else:
                req.future.set_exception(value)
        for note in batch.notifications:
            self._notify(note)

    def _notify(self, note: Notification) -> None:
        current = asyncio.get_running_loop()
        for w in list(self._watchers):
            if not note.path.startswith(w.prefix):
                continue
            if w.loop is not None and w.loop is not current:
                if not w.loop.is_closed():
                    w.loop.call_soon_threadsafe(invoke_listener, w.listener, note, self._tasks)
            else:
                invoke_listener(w.listener, note, self._tasks)

    # ------------------------------------------------------------------ worker thread

    def _run(self) -> None:
        try:
            self._open_db()
        except BaseException as e:  # reported to every caller
            log.error("cannot open metadata store %s: %s", self.path, e)
            self._init_error = e
        try:
            stop = False
            while not stop:
                item = self._queue.get()
                if item is _STOP:
                    break
                batch = [item]
                while len(batch) < self.max_batch_requests:
                    try:
                        item = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if item is _STOP:
                        stop = True
                        break
                    batch.append(item)
                self._process(batch)
        finally:
            self._shutdown_db()
            # Anything enqueued after the stop marker (racing close()) is failed, not left hanging.
            leftovers: list[_Request] = []
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is not _STOP:
                    leftovers.append(item)
            self._fail_all(leftovers, StoreUnavailableError("metadata store is closed"))
            self._stopped.set()

    def _open_db(self) -> None:
        if self.path != ":memory:":
            directory = os.path.dirname(os.path.abspath(self.path))
            os.makedirs(directory, exist_ok=True)
            if fcntl is not None:
                fd = os.open(self.path + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    os.close(fd)
                    raise StoreUnavailableError(f"metadata store {self.path} is in use by another process") from None
                self._lock_fd = fd
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=True)
        if self.path != ":memory:":
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StoreUnavailableError(f"cannot enable WAL on {self.path} (got {mode})")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA busy_timeout=5000")
        conn.executescript(_SCHEMA)
        self._conn = conn
        # Sessions do not outlive their process: ephemeral keys still here belong to a dead owner.
        stale = [r[0] for r in conn.execute("SELECT path FROM kv WHERE session IS NOT NULL")]
        if stale:
            conn.execute("BEGIN IMMEDIATE")
            for p in stale:
                self._remove(p)
            conn.execute("COMMIT")
            log.info("removed %d ephemeral keys left by a previous process", len(stale))

    def _shutdown_db(self) -> None:
        conn = self._conn
        self._conn = None
        if conn is not None:
            try:
                stale = [r[0] for r in conn.execute("SELECT path FROM kv WHERE session IS NOT NULL")]
                if stale:
                    conn.execute("BEGIN IMMEDIATE")
                    for p in stale:
                        self._remove_with(conn, p)
                    conn.execute("COMMIT")
            except sqlite3.Error:
                log.exception("could not remove ephemeral keys on close")
            conn.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _fail_all(self, reqs: list[_Request], exc: BaseException) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, _Batch] = {}
        for req in reqs:
            by_loop.setdefault(req.loop, _Batch()).results.append((req, False, exc))
        self._send(by_loop)

    def _send(self, by_loop: dict[asyncio.AbstractEventLoop, _Batch]) -> None:
        for loop, batch in by_loop.items():
            with contextlib.suppress(RuntimeError):  # loop already closed: nobody is waiting
                loop.call_soon_threadsafe(self._deliver, batch)

    def _process(self, batch: list[_Request]) -> None:
        conn = self._conn
        if conn is None:
            err = self._init_error
            exc = StoreUnavailableError(f"metadata store {self.path} could not be opened: {err}")
            self._fail_all(batch, exc)
            return
        live = [r for r in batch if not r.abandoned]
        writing = any(r.kind in _WRITE_KINDS for r in live)
        outcome: list[tuple[_Request, bool, Any, list[Notification]]] = []
        try:
            if writing:
                conn.execute("BEGIN IMMEDIATE")
            for req in live:
                handler = getattr(self, "_op_" + req.kind)
                if req.kind in _WRITE_KINDS:
                    notes: list[Notification] = []
                    conn.execute("SAVEPOINT op")
                    try:
                        value = handler(notes, *req.args)
                    except (MetadataError, ValueError) as e:
                        conn.execute("ROLLBACK TO op")
                        conn.execute("RELEASE op")
                        outcome.append((req, False, e, []))
                    else:
                        conn.execute("RELEASE op")
                        outcome.append((req, True, value, notes))
                else:
                    try:
                        outcome.append((req, True, handler(*req.args), []))
                    except (MetadataError, ValueError) as e:
                        outcome.append((req, False, e, []))
            if writing:
                conn.execute("COMMIT")
                self.stats.commits += 1
        except sqlite3.Error as e:
            log.error("metadata store batch failed: %s", e)
            self.stats.failed_commits += 1
            if conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
            self._fail_all(live, StoreUnavailableError(f"metadata store error: {e}"))
            return
        by_loop: dict[asyncio.AbstractEventLoop, _Batch] = {}
        for req, ok, value, notes in outcome:
            b = by_loop.setdefault(req.loop, _Batch())
            b.results.append((req, ok, value))
            b.notifications.extend(notes)
            if req.kind in _WRITE_KINDS:
                self.stats.write_ops += 1
            else:
                self.stats.read_ops += 1
        self._send(by_loop)

    # -- operations (worker thread only). Writes append their notifications to ``notes``.

    def _op_ping(self) -> None:
        return None

    def _op_get(self, path: str) -> Value | None:
        assert self._conn is not None
        row = self._conn.execute(
            "SELECT data, version, created_ms, modified_ms, session FROM kv WHERE path=?", (path,)
        ).fetchone()
        if row is None or row[0] is None:
            return None
        return Value(row[0], Stat(path, row[1], row[2], row[3], row[4] is not None))

    def _op_children(self, path: str) -> list[str]:
        assert self._conn is not None
        cut = 1 if path == "/" else len(path) + 1
        rows = self._conn.execute("SELECT path FROM kv WHERE parent=? ORDER BY path", (path,))
        return [r[0][cut:] for r in rows]

    def _op_put(
        self,
        notes: list[Notification],
        path: str,
        data: bytes,
        expected: int | None,
        session: int | None,
    ) -> Stat:
        conn = self._conn
        assert conn is not None
        if session is not None and session not in self._live_sessions:
            raise MetadataError(f"session {session} is closed")
        row = conn.execute(
            "SELECT data IS NOT NULL, version, created_ms, session FROM kv WHERE path=?", (path,)
        ).fetchone()
        exists = row is not None and bool(row[0])
        if expected is not None:
            if expected == NOT_EXISTS:
                if exists:
                    raise BadVersionError(f"{path} already exists")
            elif not exists:
                raise BadVersionError(f"{path} does not exist (expected version {expected})")
            elif row[1] != expected:
                raise BadVersionError(f"{path} is at version {row[1]}, expected {expected}")
        now = _now_ms()
        if exists:
            version, created = row[1] + 1, row[2]
            # An update without a session keeps the key's current owner.
            owner = session if session is not None else row[3]
            conn.execute(
                "UPDATE kv SET data=?, version=?, modified_ms=?, session=? WHERE path=?",
                (data, version, now, owner, path),
            )
            notes.append(Notification(NotificationType.MODIFIED, path))
        else:
            version, created, owner = 0, now, session
            if row is not None:  # a placeholder becomes a real key
                conn.execute(
                    "UPDATE kv SET data=?, version=0, created_ms=?, modified_ms=?, session=? WHERE path=?",
                    (data, now, now, owner, path),
                )
            else:
                conn.execute(
                    "INSERT INTO kv(path, parent, data, version, created_ms, modified_ms, session) "
                    "VALUES (?, ?, ?, 0, ?, ?, ?)",
                    (path, _parent(path), data, now, now, owner),
                )
                self._ensure_parents(path, now)
            notes.append(Notification(NotificationType.CREATED, path))
        return Stat(path, version, created, now, owner is not None)

    def _op_delete(self, notes: list[Notification], path: str, expected: int | None) -> None:
        assert self._conn is not None
        row = self._conn.execute("SELECT data IS NOT NULL, version FROM kv WHERE path=?", (path,)).fetchone()
        if row is None or not row[0]:
            raise NotFoundError(path)
        if expected is not None and row[1] != expected:
            raise BadVersionError(f"{path} is at version {row[1]}, expected {expected}")
        self._remove(path)
        notes.append(Notification(NotificationType.DELETED, path))

    def _op_delete_recursive(self, notes: list[Notification], path: str) -> None:
        conn = self._conn
        assert conn is not None
        params: tuple[str, ...]
        if path == "/":
            where, params = "1", ()
        else:
            # Descendants are exactly the keys in [path + '/', path + '0') since '0' follows '/'.
            where, params = "path=? OR (path>=? AND path<?)", (path, path + "/", path + "0")
        gone = [r[0] for r in conn.execute(f"SELECT path FROM kv WHERE ({where}) AND data IS NOT NULL", params)]
        conn.execute(f"DELETE FROM kv WHERE {where}", params)
        if path != "/":
            self._prune(_parent(path))
        notes.extend(Notification(NotificationType.DELETED, p) for p in gone)

    def _op_transact(self, notes: list[Notification], ops: list[PutOp | DeleteOp]) -> list[Stat | None]:
        results: list[Stat | None] = []
        for op in ops:
            if isinstance(op, PutOp):
                results.append(self._op_put(notes, op.path, bytes(op.data), op.expected_version, None))
            else:
                self._op_delete(notes, op.path, op.expected_version)
                results.append(None)
        return results

    def _op_close_session(self, notes: list[Notification], session: int) -> None:
        assert self._conn is not None
        self._live_sessions.discard(session)
        paths = [r[0] for r in self._conn.execute("SELECT path FROM kv WHERE session=?", (session,))]
        for p in paths:
            self._remove(p)
            notes.append(Notification(NotificationType.DELETED, p))

    # -- tree maintenance

    def _ensure_parents(self, path: str, now: int) -> None:
        assert self._conn is not None
        p = _parent(path)
        while p != "/":
            cur = self._conn.execute(
                "INSERT OR IGNORE INTO kv(path, parent, data, version, created_ms, modified_ms, session) "
                "VALUES (?, ?, NULL, -1, ?, ?, NULL)",
                (p, _parent(p), now, now),
            )
            if cur.rowcount == 0:  # exists already, and so do all of its ancestors
                return
            p = _parent(p)

    def _remove(self, path: str) -> None:
        assert self._conn is not None
        self._remove_with(self._conn, path)

    def _remove_with(self, conn: sqlite3.Connection, path: str) -> None:
        if conn.execute("SELECT 1 FROM kv WHERE parent=? LIMIT 1", (path,)).fetchone():
            conn.execute("UPDATE kv SET data=NULL, version=-1, session=NULL WHERE path=?", (path,))
            return
        conn.execute("DELETE FROM kv WHERE path=?", (path,))
        self._prune_with(conn, _parent(path))

    def _prune(self, path: str) -> None:
        assert self._conn is not None
        self._prune_with(self._conn, path)

    def _prune_with(self, conn: sqlite3.Connection, p: str) -> None:
        while p != "/":
            row = conn.execute("SELECT data IS NULL FROM kv WHERE path=?", (p,)).fetchone()
            if row is None or not row[0]:
                return
            if conn.execute("SELECT 1 FROM kv WHERE parent=? LIMIT 1", (p,)).fetchone():
                return
            conn.execute("DELETE FROM kv WHERE path=?", (p,))
            p = _parent(p)
