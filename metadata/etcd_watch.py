"""Prefix watches of :class:`~magnetar.metadata.etcd.EtcdMetadataStore` over one gRPC Watch stream.

Each distinct watched prefix is one etcd watch (``start_revision`` = the next revision it has not
seen yet) multiplexed on a single bidirectional stream; the listeners of that prefix share it.

* **Exactly the changes after registration.** :meth:`WatchHub.add` is synchronous, so the etcd
  watch is created later; it starts at ``transport.revision + 1`` (the newest revision this client has
  observed), and each listener drops events at or below that revision. A change made by this
  client after ``watch()`` returned is therefore always delivered, and nothing older is.
* **Resume after a disconnect.** When the stream breaks (etcd restart, network), it is reopened
  with a backoff and every watch is re-created from its own next revision: nothing is lost or
  repeated.
* **Compaction.** If that revision has been compacted (etcd answers ``compact_revision``), the
  prefix is listed again at the current revision and compared with the key set the watch kept
  (path -> create revision, updated from the events): vanished keys produce DELETED, new ones
  CREATED, re-created ones DELETED + CREATED, and keys modified since the last seen revision
  MODIFIED. That key set costs memory proportional to the keys under each watched prefix; it is
  the price of reporting deletions that compaction erased from the history.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
from aetcd import rpc

from magnetar.common.backoff import Backoff
from magnetar.common.tasks import TaskSet
from magnetar.metadata.api import Listener, Notification, NotificationType, invoke_listener
from magnetar.metadata.etcd_transport import EtcdTransport, prefix_end

log = logging.getLogger(__name__)

_PUT = rpc.Event.PUT


@dataclass(slots=True, eq=False)
class _Listener:
    listener: Listener
    #: Events at or below this revision happened before the listener registered.
    min_revision: int


@dataclass(slots=True, eq=False)
class _PrefixWatch:
    prefix: str
    key: bytes
    listeners: list[_Listener] = field(default_factory=list)
    #: First revision not delivered yet; ``None`` until the store has learnt a revision.
    next_revision: int | None = None
    #: Server-side watch id while the watch exists on the current stream.
    watch_id: int | None = None
    #: Keys under the prefix -> create revision (for compaction resync); ``None`` until listed.
    keys: dict[str, int] | None = None
    #: A listing or resync task is running for this watch.
    busy: bool = False


class WatchHub:
    """All prefix watches of one store; runs the stream while at least one watch exists.

    It reaches etcd through the store's ``transport`` and, as its
    :class:`~magnetar.metadata.etcd_transport.WatchEvents`, hears when that connects or moves.
    """

    def __init__(self, transport: EtcdTransport) -> None:
        self._transport = transport
        self._watches: dict[str, _PrefixWatch] = {}
        self._by_id: dict[int, _PrefixWatch] = {}
        self._ids = itertools.count(1)
        self._requests: asyncio.Queue[Any] | None = None
        self._task: asyncio.Task[None] | None = None
        self._tasks = TaskSet("etcd watch")
        self._wakeup: asyncio.Event | None = None
        self._call: Any = None
        self._stream_up = False
        #: Suspends (re)connecting; tests use it to miss events across a compaction.
        self.enabled: asyncio.Event | None = None
        self.streams_opened = 0
        self.resyncs = 0

    # ------------------------------------------------------------------ registration

    def add(self, prefix: str, listener: Listener) -> Callable[[], None]:
        pw = self._watches.get(prefix)
        if pw is None:
            key = self._transport.key_prefix(prefix)
            pw = _PrefixWatch(prefix, key)
            if self._transport.revision > 0:
                pw.next_revision = self._transport.revision + 1
            self._watches[prefix] = pw
        entry = _Listener(listener, self._transport.revision)
        pw.listeners.append(entry)
        self.kick()

        def unsubscribe() -> None:
            with contextlib.suppress(ValueError):
                pw.listeners.remove(entry)
            if not pw.listeners and self._watches.get(pw.prefix) is pw:
                del self._watches[pw.prefix]
                self._cancel_server_watch(pw)

        return unsubscribe

    def on_revision_known(self, revision: int) -> None:
        """The store learnt its first revision: watches registered before connecting start after it."""
        for pw in self._watches.values():
            if pw.next_revision is None:
                pw.next_revision = revision + 1
                for entry in pw.listeners:
                    entry.min_revision = max(entry.min_revision, revision)

    def kick(self) -> None:
        """Make sure the stream task runs (if there is a loop and something to watch)."""
        if not self._watches or self._transport.closed:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # started by the store's next async call
        if self._transport.loop is not None and loop is not self._transport.loop:
            return
        if self._wakeup is None:
            self._wakeup = asyncio.Event()
            self.enabled = asyncio.Event()
            self.enabled.set()
        if self._task is None or self._task.done():
            self._task = self._tasks.spawn(self._run(), name="etcd-watch")
        self._wakeup.set()
        if self._stream_up:
            for pw in list(self._watches.values()):
                if pw.watch_id is None:
                    self._job(pw, self._activate)

    async def close(self) -> None:
        await self._tasks.close()
        self._watches.clear()
        self._by_id.clear()

    @property
    def connected(self) -> bool:
        """Whether a watch stream is open (its watches may still be being created)."""
        return self._call is not None

    def restart_stream(self) -> None:
        """Drop the current stream (it is reopened unless :attr:`enabled` is cleared)."""
        if self._call is not None:
            # Half-closing the request side would not end etcd's side of the stream: cancel it.
            self._call.cancel()

    # ------------------------------------------------------------------ stream

    async def _run(self) -> None:
        assert self._wakeup is not None and self.enabled is not None
        backoff = Backoff(0.05, 1.0)
        while not self._transport.closed:
            if not self._watches:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            await self.enabled.wait()
            loop = asyncio.get_running_loop()
            started = loop.time()
            try:
                await self._transport.ensure_connected()
                await self._stream_once()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # a broken stream is expected while etcd is down
                log.debug("etcd watch stream ended: %r", e)
                if isinstance(e, grpc.aio.AioRpcError):
                    self._transport.rotate(e)
            finally:
                if loop.time() - started > 1.0:
                    backoff.reset()  # the stream worked for a while: reconnect promptly
                self._stream_up = False
                self._requests = None
                self._by_id.clear()
                for pw in self._watches.values():
                    pw.watch_id = None
            if self._transport.closed:
                return
            await asyncio.sleep(backoff.next())

    async def _stream_once(self) -> None:
        requests: asyncio.Queue[Any] = asyncio.Queue()
        self._requests = requests

        async def request_iter() -> AsyncIterator[Any]:
            while True:
                req = await requests.get()
                if req is None:
                    return
                yield req

        stub = self._transport.stubs().watch
        call = stub.Watch(request_iter())
        self._call = call
        self.streams_opened += 1
        try:
            self._stream_up = True
            for pw in list(self._watches.values()):
                self._job(pw, self._activate)
            async for resp in call:
                self._handle(resp)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise
            # restart_stream() cancelled the call, not this task: reconnect.
        finally:
            self._call = None
            call.cancel()
            requests.put_nowait(None)  # ends request_iter, and with it gRPC's task reading from it

    def _job(self, pw: _PrefixWatch, job: Callable[[_PrefixWatch], Any]) -> None:
        """Run ``job(pw)`` in a task unless one already runs for ``pw``."""
        if pw.busy:
            return
        pw.busy = True

        async def run() -> None:
            try:
                await job(pw)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # etcd unreachable: the next stream retries
                log.debug("etcd watch on %s: %r", pw.prefix, e)
                self.restart_stream()
            finally:
                pw.busy = False

        self._tasks.spawn(run(), name=f"etcd watch job {pw.prefix}")

    async def _activate(self, pw: _PrefixWatch) -> None:
        """Create the server watch of ``pw`` (listing its keys first if never listed)."""
        if pw.keys is None or pw.next_revision is None:
            await self._list_initial(pw)
        self._create_server_watch(pw)

    async def _list_initial(self, pw: _PrefixWatch) -> None:
        kvs, revision = await self._transport.list_prefix(pw.key)
        if pw.next_revision is None:
            pw.next_revision = revision + 1
        # The listing is at ``revision`` >= next_revision - 1; the events replayed from
        # next_revision on bring the map to the same state, in order.
        pw.keys = {self._transport.path_of(kv.key): kv.create_revision for kv in kvs}

    def _create_server_watch(self, pw: _PrefixWatch) -> None:
        if self._requests is None or self._watches.get(pw.prefix) is not pw or pw.watch_id is not None:
            return
        assert pw.next_revision is not None
        wid = next(self._ids)
        pw.watch_id = wid
        self._by_id[wid] = pw
        create = rpc.WatchCreateRequest(
            key=pw.key,
            range_end=prefix_end(pw.key),
            start_revision=pw.next_revision,
            progress_notify=True,
            watch_id=wid,
        )
        self._requests.put_nowait(rpc.WatchRequest(create_request=create))

    def _cancel_server_watch(self, pw: _PrefixWatch) -> None:
        wid = pw.watch_id
        pw.watch_id = None
        if wid is None:
            return
        self._by_id.pop(wid, None)
        if self._requests is not None:
            cancel = rpc.WatchCancelRequest(watch_id=wid)
            self._requests.put_nowait(rpc.WatchRequest(cancel_request=cancel))

    def _handle(self, resp: Any) -> None:
        self._transport.observe(resp.header.revision)
        pw = self._by_id.get(resp.watch_id)
        if pw is None or pw.watch_id != resp.watch_id:
            return  # a cancelled watch's leftovers
        if resp.compact_revision:
            # Our start revision is gone from the history: the server cancelled the watch.
            self._by_id.pop(resp.watch_id, None)
            pw.watch_id = None
            self._job(pw, self._resync)
            return
        if resp.canceled:
            log.warning("etcd cancelled watch on %s: %s", pw.prefix, resp.cancel_reason)
            self._by_id.pop(resp.watch_id, None)
            pw.watch_id = None
            self.restart_stream()
            return
        assert pw.next_revision is not None
        if not resp.events:
            if not resp.created and resp.header.revision >= pw.next_revision:
                pw.next_revision = resp.header.revision + 1  # progress notification: synced up to here
            return
        last = pw.next_revision - 1
        for ev in resp.events:
            kv = ev.kv
            rev = kv.mod_revision
            if rev < pw.next_revision:
                continue
            path = self._transport.path_of(kv.key)
            if ev.type == _PUT:
                kind = NotificationType.CREATED if kv.version == 1 else NotificationType.MODIFIED
                if pw.keys is not None:
                    pw.keys[path] = kv.create_revision
            else:
                kind = NotificationType.DELETED
                if pw.keys is not None:
                    pw.keys.pop(path, None)
            self._dispatch(pw, Notification(kind, path), rev)
            last = max(last, rev)
        pw.next_revision = last + 1

    async def _resync(self, pw: _PrefixWatch) -> None:
        """Re-list after a compaction and synthesise what the missed history would have said."""
        self.resyncs += 1
        kvs, revision = await self._transport.list_prefix(pw.key)
        assert pw.next_revision is not None
        old = pw.keys or {}
        new: dict[str, int] = {}
        notes: list[Notification] = []
        for kv in kvs:
            path = self._transport.path_of(kv.key)
            new[path] = kv.create_revision
            before = old.get(path)
            if before is None:
                notes.append(Notification(NotificationType.CREATED, path))
            elif before != kv.create_revision:
                notes.append(Notification(NotificationType.DELETED, path))
                notes.append(Notification(NotificationType.CREATED, path))
            elif kv.mod_revision >= pw.next_revision:
                notes.append(Notification(NotificationType.MODIFIED, path))
        notes.extend(Notification(NotificationType.DELETED, p) for p in old if p not in new)
        notes.sort(key=lambda n: n.path)  # stable: DELETED stays before CREATED for one path
        pw.keys = new
        pw.next_revision = revision + 1
        log.info("etcd watch on %s resynced after compaction: %d changes", pw.prefix, len(notes))
        for note in notes:
            self._dispatch(pw, note, revision)
        self._create_server_watch(pw)

    # ------------------------------------------------------------------ listeners

    def _dispatch(self, pw: _PrefixWatch, note: Notification, revision: int) -> None:
        for entry in list(pw.listeners):
            if revision > entry.min_revision:
                invoke_listener(entry.listener, note, self._tasks)
