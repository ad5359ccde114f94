"""Registration and cookie logic in-process, on the embedded in-memory metadata store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from magnetar.bookie.bookie import Bookie
from magnetar.bookie.config import BookieConfig
from magnetar.bookie.cookie import CookieMismatchError, verify_or_create_cookie
from magnetar.bookie.registration import (
    BookieRegistration,
    RegistrationConflictError,
    readonly_path,
    writable_path,
)
from magnetar.ledger.etcd_registry import MetadataBookieRegistry
from magnetar.metadata import open_metadata_store

pytestmark = pytest.mark.timeout(30)


async def test_registration_moves_and_conflicts(tmp_path: Path) -> None:
    store = open_metadata_store("memory:")
    await store.start()  # type: ignore[attr-defined]
    bookie = Bookie(BookieConfig(data_dir=tmp_path / "b", min_free_bytes=0, checkpoint_interval_s=3600))
    await bookie.start()
    registry = MetadataBookieRegistry(store)
    try:
        # A leftover of another instance under this address: refuse.
        await store.put(writable_path("h:1"), json.dumps({"instanceId": "other"}).encode())
        reg = BookieRegistration(store, bookie, "h:1", info={"instanceId": "me"}, check_interval_s=0.05)
        with pytest.raises(RegistrationConflictError):
            await reg.start()
        # Our own leftover (crash, lease not yet expired): replaced.
        await store.put(writable_path("h:1"), json.dumps({"instanceId": "me"}).encode())
        await reg.start()
        assert await registry.writable_bookies() == ["h:1"]
        bookie.set_read_only(True)
        await reg._sync()
        assert reg.read_only is True
        assert await store.get(writable_path("h:1")) is None
        assert json.loads((await store.get(readonly_path("h:1"))).data)["readOnly"] is True  # type: ignore[union-attr]
        assert await registry.writable_bookies() == [] and await registry.available_bookies() == ["h:1"]
        await reg.close()
        assert await registry.available_bookies() == []
    finally:
        await registry.close()
        await bookie.close()
        await store.close()


async def test_cookie_first_start_then_checks(tmp_path: Path) -> None:
    store = open_metadata_store("memory:")
    await store.start()  # type: ignore[attr-defined]
    try:
        j, lg = tmp_path / "j", tmp_path / "l"
        first = await verify_or_create_cookie(store, "h:1", j, [lg])
        assert await verify_or_create_cookie(store, "h:1", j, [lg]) == first
        with pytest.raises(CookieMismatchError, match="no cookie"):
            await verify_or_create_cookie(store, "h:1", j, [tmp_path / "new"])
        with pytest.raises(CookieMismatchError, match="metadata store has no cookie"):
            await verify_or_create_cookie(store, "h:2", j, [lg])
        (lg / "cookie.json").write_text("{not json")
        with pytest.raises(CookieMismatchError, match="unreadable"):
            await verify_or_create_cookie(store, "h:1", j, [lg])
    finally:
        await store.close()
