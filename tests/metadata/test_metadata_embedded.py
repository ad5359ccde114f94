"""Tests of the embedded sqlite metadata store that only it has (group commit, locking, reopening).

The contract both stores share (CAS, children, delete_recursive, transactions) runs on the embedded
store, in memory and on disk, and on etcd in ``test_metadata_etcd.py``.
"""

from __future__ import annotations

import asyncio
import os
import sys
import textwrap
from pathlib import Path

import pytest

from magnetar.metadata import open_metadata_store
from magnetar.metadata.api import (
    NOT_EXISTS,
    BadVersionError,
    MetadataError,
    Notification,
    NotificationType,
    StoreUnavailableError,
)
from magnetar.metadata.embedded import EmbeddedMetadataStore


@pytest.fixture(params=["memory", "file"])
async def store(request: pytest.FixtureRequest, tmp_path: Path):
    s = EmbeddedMetadataStore(":memory:" if request.param == "memory" else str(tmp_path / "md.db"))
    await s.start()
    yield s
    await s.close()


async def test_failed_op_does_not_affect_its_batch(store: EmbeddedMetadataStore) -> None:
    await store.put("/k", b"")
    results = await asyncio.gather(
        store.put("/x1", b""),
        store.put("/k", b"", NOT_EXISTS),
        store.put("/x2", b""),
        return_exceptions=True,
    )
    assert isinstance(results[1], BadVersionError)
    assert await store.exists("/x1") and await store.exists("/x2")


async def test_watches(store: EmbeddedMetadataStore) -> None:
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
    await asyncio.sleep(0.01)
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
    await asyncio.sleep(0.01)
    assert len(seen) == 3 and len(async_seen) == 4
    await store.delete_recursive("/w")
    await asyncio.sleep(0.01)
    assert async_seen[-1] == "/w/c"


async def test_sessions(store: EmbeddedMetadataStore) -> None:
    s = await store.create_session()
    st = await store.put("/eph/one", b"", session=s)
    assert st.ephemeral
    await store.put("/eph/keep", b"")
    deleted: list[str] = []
    store.watch("/eph", lambda n: deleted.append(n.path) if n.type is NotificationType.DELETED else None)
    await s.close()
    assert await store.get("/eph/one") is None
    assert await store.exists("/eph/keep")
    assert deleted == ["/eph/one"]
    with pytest.raises(MetadataError):
        await store.put("/eph/two", b"", session=s)


async def test_timeout_maps_to_unavailable(tmp_path: Path) -> None:
    s = EmbeddedMetadataStore(":memory:", op_timeout_seconds=0.2)
    await s.start()
    # Park the worker on a held-up request to simulate a store that cannot answer.
    import threading

    gate = threading.Event()
    s._op_ping = lambda: gate.wait(5)  # type: ignore[method-assign]
    blocker = asyncio.ensure_future(s.start())
    await asyncio.sleep(0.05)
    with pytest.raises(StoreUnavailableError):
        await s.get("/x")
    gate.set()
    with pytest.raises(StoreUnavailableError):
        await blocker
    await s.close()
    with pytest.raises(StoreUnavailableError):
        await s.get("/x")


async def test_group_commit(tmp_path: Path) -> None:
    s = EmbeddedMetadataStore(str(tmp_path / "md.db"))
    await s.start()
    try:
        n = 2000
        before = s.stats.commits
        await asyncio.gather(*(s.put(f"/ml/t{i % 50}/c{i}", b"state" * 10) for i in range(n)))
        commits = s.stats.commits - before
        assert commits * 10 < n, commits
        assert len(await s.get_children("/ml")) == 50
        # concurrent CAS on one key: exactly one winner per version
        await s.put("/counter", b"0", NOT_EXISTS)
        res = await asyncio.gather(*(s.put("/counter", b"1", 0) for _ in range(20)), return_exceptions=True)
        assert sum(not isinstance(r, BaseException) for r in res) == 1
    finally:
        await s.close()


async def test_durable_across_reopen(tmp_path: Path) -> None:
    url = f"embedded://{tmp_path}/sub/md.db"
    s = open_metadata_store(url)
    await s.put("/a/b", b"data")
    await s.put("/a/b", b"data2")
    sess = await s.create_session()
    await s.put("/a/eph", b"", session=sess)
    await s.close()
    s2 = open_metadata_store(url)
    try:
        v = await s2.get("/a/b")
        assert v is not None and v.data == b"data2" and v.stat.version == 1
        assert await s2.get_children("/a") == ["b"]
    finally:
        await s2.close()


async def test_second_process_is_locked_out(tmp_path: Path) -> None:
    path = str(tmp_path / "md.db")
    s = EmbeddedMetadataStore(path)
    await s.start()
    try:
        other = EmbeddedMetadataStore(path)
        with pytest.raises(StoreUnavailableError):
            await other.start()
        await other.close()
    finally:
        await s.close()


_CRASHER = textwrap.dedent(
    """
    import asyncio, os, sys
    from magnetar.metadata.embedded import EmbeddedMetadataStore

    async def main():
        s = EmbeddedMetadataStore(sys.argv[1])
        sess = await s.create_session()
        await s.put("/live/broker-1", b"me", session=sess)
        await s.put("/durable/key", b"v1")
        await asyncio.gather(*(s.put(f"/durable/many/{i}", b"x") for i in range(100)))
        os._exit(0)  # die without closing anything

    asyncio.run(main())
    """
)


async def test_ephemeral_cleanup_and_durability_after_crash(tmp_path: Path) -> None:
    path = str(tmp_path / "md.db")
    env = dict(os.environ)
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", _CRASHER, path, env=env)
    assert await asyncio.wait_for(proc.wait(), 30) == 0
    s = EmbeddedMetadataStore(path)
    try:
        assert await s.get("/live/broker-1") is None
        assert await s.get_children("/") == ["durable"]
        v = await s.get("/durable/key")
        assert v is not None and v.data == b"v1"
        assert len(await s.get_children("/durable/many")) == 100
    finally:
        await s.close()


def test_open_metadata_store_urls() -> None:
    with pytest.raises(ValueError):
        open_metadata_store("zk://x")
    with pytest.raises(ValueError):
        open_metadata_store("embedded://host/x.db")
    s = open_metadata_store("memory:")
    assert isinstance(s, EmbeddedMetadataStore) and s.path == ":memory:"
    asyncio.run(s.close())
