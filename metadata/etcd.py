"""etcd-backed :class:`~magnetar.metadata.api.MetadataStore` for clusters (etcd v3 API through ``aetcd``).

Key layout
    A Magnetar path ``/a/b`` is the etcd key ``<root>/a/b`` (root prefix ``/magnetar`` by
    default, ``""`` allowed), the value is stored as given. One key per node keeps every write a
    single-key operation (so compare-and-swap and batching stay one etcd op per Magnetar op), keeps
    the data readable with ``etcdctl``, and makes ``delete_recursive`` one atomic txn of two range
    deletes (the key, and ``[path/, path0)``: ``'0'`` is the byte after ``'/'``).
    ``get_children`` is a ``keys_only`` range over ``[path/, path0)`` that keeps the first segment
    after ``path/``; this also yields implicit parents (``/a/b/c`` alone makes ``b`` a child of
    ``/a``, as in the embedded store) without any marker keys to maintain transactionally. To
    stay cheap when children have big subtrees, the scan is paged and each page that ends inside a
    child's subtree jumps to the end of that subtree (``<child>0``), so deep trees are skipped
    instead of read; pages are pinned to the first page's revision for a consistent answer.
    The rejected alternative, parent-indexed keys (``<depth>/<path>``), lists direct children
    in one range but needs placeholder parents kept in sync under concurrent creates and deletes.

Versions
    etcd's per-key ``version`` is 1 on create and +1 per update (0 = absent), so the Magnetar
    version is ``version - 1`` (0 on create, as ZooKeeper). CAS on Magnetar version ``v`` is the
    txn compare ``version == v + 1``; :data:`NOT_EXISTS` is ``create_revision == 0``; a plain
    delete requires ``create_revision > 0`` (else :class:`NotFoundError`). A failed compare runs the
    txn's failure branch, a ``keys_only`` read of the key, from which the same
    :class:`BadVersionError` / :class:`NotFoundError` as the embedded store is derived.
    etcd keeps no timestamps: ``Stat.created_ms``/``modified_ms`` are 0 (use versions).

Batching
    Independent single-key writes (``put``/``delete``) that are issued concurrently are queued and
    sent together as one etcd txn (group commit: a batch leaves as soon as the loop is idle, or when
    a previous batch returns). Each op is a nested txn ``if <its compare> then <write, read> else
    <read>``, so every op succeeds or fails on its own inside the shared txn. etcd allows a nested
    txn ``128 - <outer ops>`` ops, so a batch holds at most 126 ops (and ~1 MiB of data, under
    etcd's 1.5 MiB request limit). A key appears at most once among the in-flight batches, which
    keeps writes to one key in issue order. Writes with a session (a lease that may have expired
    and would fail the whole txn) are sent alone.

Sessions
    A session is an etcd lease (TTL at least 2 s, etcd's minimum) renewed every TTL/3 by a
    keep-alive task; ephemeral keys are put with the lease, so they vanish when the session is
    closed (lease revoked) or when the owner dies (lease expires). An update without a session
    keeps the key's current lease (``ignore_lease``), as the embedded store keeps the owner.

Failures
    Every call carries a gRPC deadline of ``op_timeout_seconds``; an unreachable etcd, a deadline
    or a leader loss raise :class:`StoreUnavailableError`. gRPC reconnects on its own (backoff
    capped at 1 s), watches resume from their last revision (see
    :mod:`magnetar.metadata.etcd_watch`), keep-alives retry. With several endpoints, an
    unavailable error moves the client to the next one. The connection (channel, endpoints,
    deadlines, key mapping, revision) is :class:`~magnetar.metadata.etcd_transport.EtcdTransport`,
    which the store, its sessions and its watch hub share.

The gRPC channel is bound to the event loop of the first call: use a store from one loop only.
Only ``aetcd``'s generated stubs are used (its ``Client`` lacks per-request options such as
``keys_only``, ``ignore_lease``, nested txns and watch ids); a second etcd gRPC library in the same
process would clash with it in protobuf's registry.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from aetcd import rpc

from magnetar.common.tasks import TaskSet
from magnetar.metadata.api import (
    MAX_TRANSACTION_OPS,
    NOT_EXISTS,
    BadVersionError,
    DeleteOp,
    Listener,
    MetadataError,
    MetadataStore,
    NotFoundError,
    PutOp,
    Session,
    Stat,
    StoreUnavailableError,
    Value,
    check_path,
    check_transaction,
)
from magnetar.metadata.etcd_session import MIN_LEASE_TTL, EtcdSession
from magnetar.metadata.etcd_transport import (
    DEFAULT_PREFIX,
    LIST_PAGE,
    CompactedError,
    EtcdStats,
    EtcdTls,
    EtcdTransport,
    EtcdUrl,
    SessionExpiredError,
    parse_etcd_url,
)
from magnetar.metadata.etcd_watch import WatchHub

log = logging.getLogger(__name__)

#: A batch op is a nested txn of up to 2 ops; etcd grants nested txns ``128 - outer ops``.
MAX_BATCH_OPS = 126


# ---------------------------------------------------------------------- helpers


def _cmp_exists(key: bytes) -> Any:
    return rpc.Compare(key=key, target=rpc.Compare.CREATE, result=rpc.Compare.GREATER, create_revision=0)


def _cmp_absent(key: bytes) -> Any:
    return rpc.Compare(key=key, target=rpc.Compare.CREATE, result=rpc.Compare.EQUAL, create_revision=0)


def _cmp_version(key: bytes, magnetar_version: int) -> Any:
    return rpc.Compare(key=key, target=rpc.Compare.VERSION, result=rpc.Compare.EQUAL, version=magnetar_version + 1)


def _cmp_mod(key: bytes, mod_revision: int) -> Any:
    return rpc.Compare(key=key, target=rpc.Compare.MOD, result=rpc.Compare.EQUAL, mod_revision=mod_revision)


def _read(key: bytes) -> Any:
    return rpc.RequestOp(request_range=rpc.RangeRequest(key=key, keys_only=True))


def _put(key: bytes, data: bytes, *, lease: int = 0, keep_lease: bool = False, prev_kv: bool = False) -> Any:
    req = rpc.PutRequest(key=key, value=data, lease=lease, ignore_lease=keep_lease, prev_kv=prev_kv)
    return rpc.RequestOp(request_put=req)


def _delete(key: bytes, range_end: bytes = b"") -> Any:
    return rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=key, range_end=range_end))


def _stat(path: str, kv: Any) -> Stat:
    return Stat(path, kv.version - 1, 0, 0, kv.lease != 0)


def _put_failure(path: str, expected: int | None, kv: Any | None) -> MetadataError:
    # Mirrors the embedded store's messages.
    if expected == NOT_EXISTS:
        return BadVersionError(f"{path} already exists")
    if kv is None:
        return BadVersionError(f"{path} does not exist (expected version {expected})")
    return BadVersionError(f"{path} is at version {kv.version - 1}, expected {expected}")


def _delete_failure(path: str, expected: int | None, kv: Any | None) -> MetadataError:
    if kv is None:
        return NotFoundError(path)
    return BadVersionError(f"{path} is at version {kv.version - 1}, expected {expected}")


def _violation(op: PutOp | DeleteOp, kv: Any | None) -> MetadataError | None:
    """The error ``op``'s condition raises against the key's state ``kv`` (``None``: absent)."""
    ev = op.expected_version
    if isinstance(op, PutOp):
        if ev is None or (ev == NOT_EXISTS and kv is None) or (kv is not None and kv.version - 1 == ev):
            return None
        return _put_failure(op.path, ev, kv)
    if kv is not None and (ev is None or kv.version - 1 == ev):
        return None
    return _delete_failure(op.path, ev, kv)


def _first_kv(resp: Any) -> Any | None:
    """The kv of a ``response_range`` op, or ``None``."""
    kvs = resp.response_range.kvs
    return kvs[0] if kvs else None


# ---------------------------------------------------------------------- store


@dataclass(slots=True, eq=False)
class _Op:
    """One queued single-key write: its nested txn and how to read its outcome."""

    path: str
    key: bytes
    request: Any
    parse: Callable[[Any], Any]
    future: asyncio.Future[Any]
    size: int
    alone: bool = False
    abandoned: bool = False


@dataclass(slots=True)
class _KeyState:
    exists: bool
    version: int = -1
    mod_revision: int = 0
    lease: int = 0


class EtcdMetadataStore(MetadataStore):
    """:class:`MetadataStore` on etcd v3.

    ``endpoints``: ``"host:port"``, a list of them, or ``(host, port)`` pairs. ``prefix`` is the
    root under which Magnetar paths are stored. ``op_timeout_seconds`` bounds every call.
    ``max_batch_ops``/``max_batch_bytes``/``max_inflight_batches`` tune write grouping.
    The constructor does no I/O; :meth:`start` (or any first call) connects.
    """

    def __init__(
        self,
        endpoints: str | Sequence[str | tuple[str, int]],
        *,
        prefix: str = DEFAULT_PREFIX,
        op_timeout_seconds: float = 5.0,
        max_batch_ops: int = MAX_BATCH_OPS,
        max_batch_bytes: int = 1 << 20,
        max_inflight_batches: int = 2,
        tls: EtcdTls | None = None,
    ) -> None:
        self._transport = EtcdTransport(endpoints, prefix=prefix, op_timeout_seconds=op_timeout_seconds, tls=tls)
        if not 1 <= max_batch_ops <= MAX_BATCH_OPS:
            raise ValueError(f"max_batch_ops must be within 1..{MAX_BATCH_OPS}")
        #: The endpoints as ``(host, port)`` pairs.
        self.endpoints = self._transport.endpoints
        #: The root prefix of Magnetar's keys (``""``: etcd's top level).
        self.prefix = self._transport.prefix
        self.op_timeout_seconds = op_timeout_seconds
        self.max_batch_ops = max_batch_ops
        self.max_batch_bytes = max_batch_bytes
        self.max_inflight_batches = max(1, max_inflight_batches)
        self._pending: deque[_Op] = deque()
        self._inflight_keys: set[bytes] = set()
        self._inflight = 0
        self._flush_handle: asyncio.Handle | None = None
        self._tasks = TaskSet("etcd store", expected=(MetadataError,))
        self._sessions: set[EtcdSession] = set()
        self._watch = WatchHub(self._transport)
        self._transport.set_watch_events(self._watch)

    # ------------------------------------------------------------------ connection

    @property
    def revision(self) -> int:
        """Newest etcd revision this client has seen (0 until connected)."""
        return self._transport.revision

    @property
    def stats(self) -> EtcdStats:
        """Call and batch counters (for tests and metrics)."""
        return self._transport.stats

    async def start(self) -> None:
        """Connect and read the current revision; :class:`StoreUnavailableError` if etcd is unreachable."""
        await self._transport.ensure_connected()

    # ------------------------------------------------------------------ reads

    async def get(self, path: str) -> Value | None:
        check_path(path)
        resp = await self._transport.rpc("get", lambda s: s.kv.Range, rpc.RangeRequest(key=self._transport.key(path)))
        if not resp.kvs:
            return None
        kv = resp.kvs[0]
        return Value(kv.value, _stat(path, kv))

    async def get_children(self, path: str) -> list[str]:
        check_path(path, allow_root=True)
        base = self._transport.root if path == "/" else self._transport.key(path)
        for _attempt in range(3):
            try:
                return await self._children_once(base)
            except CompactedError:
                continue  # compacted under a pinned page: list again at the new revision
        raise StoreUnavailableError(f"children of {path} kept being compacted away while listing")

    async def _children_once(self, base: bytes) -> list[str]:
        cut = len(base) + 1
        start, end = base + b"/", base + b"0"
        names: set[bytes] = set()
        revision = 0
        while True:
            req = rpc.RangeRequest(key=start, range_end=end, keys_only=True, limit=LIST_PAGE, revision=revision)
            resp = await self._transport.rpc("get_children", lambda s: s.kv.Range, req)
            revision = revision or resp.header.revision
            for kv in resp.kvs:
                name = kv.key[cut:].split(b"/", 1)[0]
                if name:
                    names.add(name)
            if not resp.more or not resp.kvs:
                break
            last = resp.kvs[-1].key
            name, sep, _ = last[cut:].partition(b"/")
            # Inside a child's subtree: skip the rest of it; on a leaf: continue right after it.
            start = base + b"/" + name + b"0" if sep else last + b"\0"
        return sorted(n.decode() for n in names)

    # ------------------------------------------------------------------ single-key writes (batched)

    async def put(
        self,
        path: str,
        data: bytes,
        expected_version: int | None = None,
        *,
        session: Session | None = None,
    ) -> Stat:
        check_path(path)
        lease = self._lease_of(session)
        key = self._transport.key(path)
        data = bytes(data)
        read = _read(key)
        if expected_version is None:
            if lease:
                nested = rpc.TxnRequest(success=[_put(key, data, lease=lease), read])
            else:
                # Existing key: keep its lease (owner); new key: no lease.
                nested = rpc.TxnRequest(
                    compare=[_cmp_exists(key)],
                    success=[_put(key, data, keep_lease=True), read],
                    failure=[_put(key, data), read],
                )
        elif expected_version == NOT_EXISTS:
            write = _put(key, data, lease=lease)
            nested = rpc.TxnRequest(compare=[_cmp_absent(key)], success=[write, read], failure=[read])
        elif expected_version >= 0:
            write = _put(key, data, lease=lease) if lease else _put(key, data, keep_lease=True)
            cmp = _cmp_version(key, expected_version)
            nested = rpc.TxnRequest(compare=[cmp], success=[write, read], failure=[read])
        else:
            raise ValueError(f"invalid expected version {expected_version}")

        def parse(resp: Any) -> Stat:
            kv = _first_kv(resp.responses[-1])
            if len(resp.responses) < 2:  # only the failure read ran
                raise _put_failure(path, expected_version, kv)
            assert kv is not None
            return _stat(path, kv)

        try:
            # A write with a lease goes alone: an expired lease fails its whole txn.
            return await self._submit(path, key, nested, parse, len(key) + len(data), alone=bool(lease))
        except SessionExpiredError:
            assert isinstance(session, EtcdSession)
            session.expired = True
            raise

    async def delete(self, path: str, expected_version: int | None = None) -> None:
        check_path(path)
        key = self._transport.key(path)
        cmp = _cmp_exists(key) if expected_version is None else _cmp_version(key, expected_version)
        nested = rpc.TxnRequest(compare=[cmp], success=[_delete(key)], failure=[_read(key)])

        def parse(resp: Any) -> None:
            if not resp.succeeded:
                raise _delete_failure(path, expected_version, _first_kv(resp.responses[0]))

        await self._submit(path, key, nested, parse, len(key))

    def _lease_of(self, session: Session | None) -> int:
        if session is None:
            return 0
        if not isinstance(session, EtcdSession) or session.transport is not self._transport:
            raise ValueError("session does not belong to this store")
        if session.closed:
            raise MetadataError(f"session {session.id:x} is closed")
        if session.expired:
            raise SessionExpiredError(f"session {session.id:x} has expired")
        return session.id

    async def _submit(
        self, path: str, key: bytes, nested: Any, parse: Callable[[Any], Any], size: int, *, alone: bool = False
    ) -> Any:
        if self._transport.closing:
            raise StoreUnavailableError("metadata store is closed")
        await self._transport.ensure_connected()
        loop = asyncio.get_running_loop()
        op = _Op(path, key, rpc.RequestOp(request_txn=nested), parse, loop.create_future(), size, alone)
        self._pending.append(op)
        self._schedule_flush()
        try:
            async with asyncio.timeout(self.op_timeout_seconds):
                return await op.future
        except TimeoutError:
            op.abandoned = True
            raise StoreUnavailableError(
                f"etcd did not answer a write of {path} within {self.op_timeout_seconds}s"
            ) from None
        except asyncio.CancelledError:
            op.abandoned = True
            raise

    def _schedule_flush(self) -> None:
        if self._flush_handle is None and self._pending and self._inflight < self.max_inflight_batches:
            loop = self._transport.loop
            assert loop is not None
            # call_soon: ops issued in the same loop iteration (asyncio.gather) join one batch.
            self._flush_handle = loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_handle = None
        while self._pending and self._inflight < self.max_inflight_batches and not self._transport.closed:
            batch = self._take_batch()
            if not batch:
                return
            self._inflight += 1
            self._inflight_keys.update(op.key for op in batch)
            self._tasks.spawn(self._send_batch(batch), name="etcd batch")

    def _take_batch(self) -> list[_Op]:
        batch: list[_Op] = []
        keys: set[bytes] = set()
        blocked: set[bytes] = set()  # keys of skipped ops: later ops on them must wait too (order)
        skipped: list[_Op] = []
        size = 0
        scan_budget = 4 * self.max_batch_ops
        while self._pending and len(batch) < self.max_batch_ops and scan_budget > 0:
            op = self._pending.popleft()
            scan_budget -= 1
            if op.abandoned or op.future.done():
                continue
            if op.key in keys or op.key in blocked or op.key in self._inflight_keys:
                skipped.append(op)
                blocked.add(op.key)
                continue
            if op.alone and batch:
                skipped.append(op)
                blocked.add(op.key)
                continue
            if batch and size + op.size > self.max_batch_bytes:
                skipped.append(op)
                break
            batch.append(op)
            keys.add(op.key)
            size += op.size
            if op.alone:
                break
        self._pending.extendleft(reversed(skipped))
        return batch

    async def _send_batch(self, batch: list[_Op]) -> None:
        try:
            req = rpc.TxnRequest(success=[op.request for op in batch])
            try:
                resp = await self._transport.rpc("write", lambda s: s.kv.Txn, req)
            except MetadataError as e:
                for op in batch:
                    if not op.future.done():
                        op.future.set_exception(type(e)(*e.args))
                return
            self.stats.batches += 1
            self.stats.batched_ops += len(batch)
            self.stats.largest_batch = max(self.stats.largest_batch, len(batch))
            for op, r in zip(batch, resp.responses, strict=True):
                if op.future.done():
                    continue
                try:
                    op.future.set_result(op.parse(r.response_txn))
                except MetadataError as e:
                    op.future.set_exception(e)
        finally:
            for op in batch:
                if not op.future.done():
                    op.future.set_exception(StoreUnavailableError("metadata store is closed"))
            self._inflight -= 1
            self._inflight_keys.difference_update(op.key for op in batch)
            self._schedule_flush()

    # ------------------------------------------------------------------ multi-key writes

    async def delete_recursive(self, path: str) -> None:
        check_path(path, allow_root=True)
        if path == "/":
            ops = [_delete(self._transport.root + b"/", self._transport.root + b"0")]
        else:
            key = self._transport.key(path)
            ops = [_delete(key), _delete(key + b"/", key + b"0")]
        await self._transport.rpc("delete_recursive", lambda s: s.kv.Txn, rpc.TxnRequest(success=ops))

    async def transact(self, ops: list[PutOp | DeleteOp]) -> list[Stat | None]:
        """Apply ``ops`` in one etcd txn, all or nothing; the first failing op's error is raised.

        Ops on distinct keys map to one txn whose compares are the ops' conditions. etcd cannot
        write a key twice in one txn: several ops on one key are simulated on a read of the keys
        and committed as their net effect (guarded by ``mod_revision``), which works unless that
        net effect is not one write (two puts, or delete then re-create): ``ValueError``.
        """
        check_transaction(ops)
        for op in ops:
            if op.expected_version is not None and op.expected_version < NOT_EXISTS:
                raise ValueError(f"invalid expected version {op.expected_version}")
        if not ops:
            return []
        distinct = len({op.path for op in ops}) == len(ops)
        # An unconditional put is a nested txn (to keep the key's lease); etcd allows nesting only
        # below 128 outer ops.
        nested = any(isinstance(op, PutOp) and op.expected_version is None for op in ops)
        if distinct and not (nested and len(ops) >= MAX_TRANSACTION_OPS):
            return await self._transact_direct(ops)
        return await self._transact_simulated(ops)

    async def _transact_direct(self, ops: list[PutOp | DeleteOp]) -> list[Stat | None]:
        compare: list[Any] = []
        success: list[Any] = []
        for op in ops:
            key = self._transport.key(op.path)
            if isinstance(op, PutOp):
                data = bytes(op.data)
                if op.expected_version is None:
                    success.append(
                        rpc.RequestOp(
                            request_txn=rpc.TxnRequest(
                                compare=[_cmp_exists(key)],
                                success=[_put(key, data, keep_lease=True, prev_kv=True)],
                                failure=[_put(key, data, prev_kv=True)],
                            )
                        )
                    )
                elif op.expected_version == NOT_EXISTS:
                    compare.append(_cmp_absent(key))
                    success.append(_put(key, data))
                else:
                    compare.append(_cmp_version(key, op.expected_version))
                    success.append(_put(key, data, keep_lease=True, prev_kv=True))
            else:
                ev = op.expected_version
                compare.append(_cmp_exists(key) if ev is None else _cmp_version(key, ev))
                success.append(_delete(key))
        failure = [_read(self._transport.key(op.path)) for op in ops]
        req = rpc.TxnRequest(compare=compare, success=success, failure=failure)
        resp = await self._transport.rpc("transact", lambda s: s.kv.Txn, req)
        if not resp.succeeded:
            for op, r in zip(ops, resp.responses, strict=True):
                error = _violation(op, _first_kv(r))
                if error is not None:
                    raise error
            raise BadVersionError("transaction compare failed on a concurrent change")  # pragma: no cover
        results: list[Stat | None] = []
        for op, r in zip(ops, resp.responses, strict=True):
            if isinstance(op, DeleteOp):
                results.append(None)
                continue
            if op.expected_version == NOT_EXISTS:
                results.append(Stat(op.path, 0, 0, 0, False))
                continue
            put_resp = r.response_txn.responses[0].response_put if op.expected_version is None else r.response_put
            if put_resp.HasField("prev_kv"):
                prev = put_resp.prev_kv
                results.append(Stat(op.path, prev.version, 0, 0, prev.lease != 0))
            else:
                results.append(Stat(op.path, 0, 0, 0, False))
        return results

    async def _transact_simulated(self, ops: list[PutOp | DeleteOp]) -> list[Stat | None]:
        paths = list(dict.fromkeys(op.path for op in ops))
        keys = [self._transport.key(p) for p in paths]
        for _attempt in range(10):
            req = rpc.TxnRequest(success=[_read(k) for k in keys])
            read = await self._transport.rpc("transact read", lambda s: s.kv.Txn, req)
            initial: dict[str, _KeyState] = {}
            for p, r in zip(paths, read.responses, strict=True):
                kv = _first_kv(r)
                if kv is None:
                    initial[p] = _KeyState(False)
                else:
                    initial[p] = _KeyState(True, kv.version - 1, kv.mod_revision, kv.lease)
            state = {p: _KeyState(s.exists, s.version, s.mod_revision, s.lease) for p, s in initial.items()}
            data: dict[str, bytes] = {}
            results: list[Stat | None] = []
            for op in ops:  # the embedded store's semantics, op by op
                st = state[op.path]
                ev = op.expected_version
                if isinstance(op, PutOp):
                    if ev is not None:
                        if ev == NOT_EXISTS:
                            if st.exists:
                                raise BadVersionError(f"{op.path} already exists")
                        elif not st.exists:
                            raise BadVersionError(f"{op.path} does not exist (expected version {ev})")
                        elif st.version != ev:
                            raise BadVersionError(f"{op.path} is at version {st.version}, expected {ev}")
                    st.version, st.lease = (st.version + 1, st.lease) if st.exists else (0, 0)
                    st.exists = True
                    data[op.path] = bytes(op.data)
                    results.append(Stat(op.path, st.version, 0, 0, st.lease != 0))
                else:
                    if not st.exists:
                        raise NotFoundError(op.path)
                    if ev is not None and st.version != ev:
                        raise BadVersionError(f"{op.path} is at version {st.version}, expected {ev}")
                    st.exists, st.version, st.lease = False, -1, 0
                    results.append(None)
            compare: list[Any] = []
            success: list[Any] = []
            for p, key in zip(paths, keys, strict=True):
                init, final = initial[p], state[p]
                compare.append(_cmp_mod(key, init.mod_revision) if init.exists else _cmp_absent(key))
                if final.exists:
                    if final.version != (init.version + 1 if init.exists else 0):
                        raise ValueError(
                            f"etcd cannot apply this transaction atomically: {p} would be written twice "
                            "(or deleted and re-created); split it"
                        )
                    success.append(_put(key, data[p], keep_lease=init.exists))
                elif init.exists:
                    success.append(_delete(key))
            resp = await self._transport.rpc(
                "transact", lambda s: s.kv.Txn, rpc.TxnRequest(compare=compare, success=success)
            )
            if resp.succeeded:
                return results
            # A key changed between the read and the commit: read and decide again.
        raise StoreUnavailableError("transaction kept conflicting with concurrent writes")

    # ------------------------------------------------------------------ watches and sessions

    def watch(self, prefix: str, listener: Listener) -> Callable[[], None]:
        if self._transport.closed:
            raise StoreUnavailableError("metadata store is closed")
        return self._watch.add(prefix, listener)

    async def create_session(self, ttl_seconds: float = 10.0) -> Session:
        if self._transport.closing:
            raise StoreUnavailableError("metadata store is closed")
        ttl = max(MIN_LEASE_TTL, math.ceil(ttl_seconds))
        resp = await self._transport.rpc("create session", lambda s: s.lease.LeaseGrant, rpc.LeaseGrantRequest(TTL=ttl))
        if resp.error:
            raise MetadataError(f"etcd refused a lease: {resp.error}")
        session = EtcdSession(self._transport, resp.ID, int(resp.TTL), self._sessions.discard)
        self._sessions.add(session)
        session.start()
        return session

    async def close(self) -> None:
        """Revoke this store's sessions, fail pending calls, stop watches, close the channel."""
        transport = self._transport
        if transport.closing:
            return
        transport.begin_close()
        sessions = list(self._sessions)
        if sessions and transport.loop is asyncio.get_running_loop():
            await asyncio.gather(*(s.close() for s in sessions), return_exceptions=True)
        transport.mark_closed()
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        while self._pending:
            op = self._pending.popleft()
            if not op.future.done():
                op.future.set_exception(StoreUnavailableError("metadata store is closed"))
        await self._watch.close()
        await self._tasks.close()
        await transport.close()


__all__ = [
    "DEFAULT_PREFIX",
    "EtcdMetadataStore",
    "EtcdSession",
    "EtcdStats",
    "EtcdTls",
    "EtcdUrl",
    "SessionExpiredError",
    "parse_etcd_url",
]
