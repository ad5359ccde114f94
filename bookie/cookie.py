"""Bookie cookies: stop a bookie from starting on swapped or wiped disks.

On first start a bookie writes a cookie (instance id, address, directories) to every one of its
directories and to the metadata store (``/ledgers/cookies/<address>``). Later starts compare
all copies: a directory without a cookie while the store has one means a wiped or new disk; a
different instance id or directory list means disks were swapped or the address is reused.
Either way the bookie refuses to start: serving would silently lose acknowledged entries.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from dataclasses import dataclass
from pathlib import Path

from magnetar.metadata.api import NOT_EXISTS, BadVersionError, MetadataStore

from .api import BookieError

COOKIE_FILE = "cookie.json"
COOKIES_ROOT = "/ledgers/cookies"


class CookieMismatchError(BookieError):
    """The cookies in the directories and the metadata store disagree; the bookie must not start."""


@dataclass(frozen=True, slots=True)
class Cookie:
    """What identifies one bookie's storage."""

    instance_id: str
    address: str
    journal_dir: str
    ledger_dirs: tuple[str, ...]

    def to_bytes(self) -> bytes:
        return json.dumps(
            {
                "instanceId": self.instance_id,
                "address": self.address,
                "journalDir": self.journal_dir,
                "ledgerDirs": list(self.ledger_dirs),
            },
            sort_keys=True,
        ).encode()

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> Cookie:
        try:
            d = json.loads(data)
            return cls(d["instanceId"], d["address"], d["journalDir"], tuple(d["ledgerDirs"]))
        except (ValueError, KeyError, TypeError) as e:
            raise CookieMismatchError(f"unreadable bookie cookie in {where}: {e!r}") from e

    def same_storage(self, other: Cookie) -> bool:
        return (self.instance_id, self.journal_dir, self.ledger_dirs) == (
            other.instance_id,
            other.journal_dir,
            other.ledger_dirs,
        )


def _read_file(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def _write_file(path: Path, data: bytes) -> None:
    """Write atomically and durably (tmp + fsync + rename + fsync of the directory)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


async def verify_or_create_cookie(
    store: MetadataStore,
    address: str,
    journal_dir: Path,
    ledger_dirs: list[Path],
) -> Cookie:
    """Check this bookie's cookies, writing them on first start; :class:`CookieMismatchError` if they disagree."""
    journal_dir, *ledger_dirs = await asyncio.to_thread(lambda: [d.resolve() for d in (journal_dir, *ledger_dirs)])
    dirs = list(dict.fromkeys([journal_dir, *ledger_dirs]))
    expected_dirs = (str(journal_dir), tuple(str(d) for d in ledger_dirs))
    path = f"{COOKIES_ROOT}/{address}"
    stored = await store.get(path)
    found: dict[Path, Cookie | None] = {}
    for d in dirs:
        raw = await asyncio.to_thread(_read_file, d / COOKIE_FILE)
        found[d] = None if raw is None else Cookie.from_bytes(raw, str(d / COOKIE_FILE))
    local = [c for c in found.values() if c is not None]

    if stored is None and not local:
        cookie = Cookie(uuid.uuid4().hex, address, *expected_dirs)
        for d in dirs:
            await asyncio.to_thread(_write_file, d / COOKIE_FILE, cookie.to_bytes())
        try:
            await store.put(path, cookie.to_bytes(), NOT_EXISTS)
        except BadVersionError as e:
            raise CookieMismatchError(f"another bookie registered a cookie for {address} at the same time") from e
        return cookie

    if stored is None:
        raise CookieMismatchError(
            f"directories {[str(d) for d, c in found.items() if c]} hold a cookie of bookie "
            f"{local[0].address} (instance {local[0].instance_id}) but the metadata store has no cookie "
            f"for {address}: wrong metadata store, or a changed address?"
        )
    cookie = Cookie.from_bytes(stored.data, f"metadata store {path}")
    missing = [str(d) for d, c in found.items() if c is None]
    if missing:
        raise CookieMismatchError(
            f"bookie {address} (instance {cookie.instance_id}) has no cookie in {missing}: "
            "the disk was wiped or replaced; its entries are lost. Decommission the bookie "
            f"(delete {path}) before reusing the address with new disks."
        )
    for d, c in found.items():
        assert c is not None
        if not c.same_storage(cookie):
            raise CookieMismatchError(
                f"cookie in {d} (instance {c.instance_id}, journal {c.journal_dir}, ledgers {list(c.ledger_dirs)}) "
                f"does not match the metadata store's for {address} (instance {cookie.instance_id}, "
                f"journal {cookie.journal_dir}, ledgers {list(cookie.ledger_dirs)}): swapped disks or directories?"
            )
    if (cookie.journal_dir, cookie.ledger_dirs) != expected_dirs:
        raise CookieMismatchError(
            f"bookie {address} was set up with journal {cookie.journal_dir} and ledgers {list(cookie.ledger_dirs)}, "
            f"now started with journal {expected_dirs[0]} and ledgers {list(expected_dirs[1])}"
        )
    return cookie
