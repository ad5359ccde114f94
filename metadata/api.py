"""The metadata-store interface every Magnetar component codes against.

Paths use Pulsar's layout (``/admin/policies/<tenant>/<ns>``, ``/managed-ledgers/...``,
``/ledgers/...``). Values are bytes; callers choose the encoding (JSON for policies).
Versions start at 0 on creation and grow by one on every update, as in ZooKeeper.
"""

from __future__ import annotations

import abc
import inspect
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import Enum

from magnetar.common.tasks import TaskSet, awaited

log = logging.getLogger(__name__)

#: ``expected_version`` for "the key must not exist yet".
NOT_EXISTS = -1

#: Most operations one :meth:`MetadataStore.transact` call may hold (etcd's per-txn limit).
MAX_TRANSACTION_OPS = 128


class MetadataError(Exception):
    """Base class of metadata-store failures."""


class NotFoundError(MetadataError):
    """The key does not exist."""


class BadVersionError(MetadataError):
    """A compare-and-swap failed: the key's version is not the expected one (or it exists)."""


class StoreUnavailableError(MetadataError):
    """The store cannot be reached right now; the operation may be retried."""


@dataclass(frozen=True, slots=True)
class Stat:
    """Version information of a stored key."""

    path: str
    version: int
    created_ms: int
    modified_ms: int
    ephemeral: bool = False


@dataclass(frozen=True, slots=True)
class Value:
    """A stored value with its stat."""

    data: bytes
    stat: Stat


class NotificationType(Enum):
    CREATED = "created"
    MODIFIED = "modified"
    DELETED = "deleted"


@dataclass(frozen=True, slots=True)
class Notification:
    """A change of one key, delivered to watchers."""

    type: NotificationType
    path: str


Listener = Callable[[Notification], Awaitable[None] | None]


def invoke_listener(listener: Listener, note: Notification, tasks: TaskSet) -> None:
    """Call a watch listener: a failure is logged, not raised; a coroutine runs as a task of ``tasks``."""
    try:
        res = listener(note)
    except Exception:
        log.exception("metadata watch listener failed for %s", note.path)
        return
    if inspect.isawaitable(res):
        tasks.spawn(awaited(res), name=f"watch listener {note.path}")


@dataclass(frozen=True, slots=True)
class PutOp:
    """One put inside :meth:`MetadataStore.transact`."""

    path: str
    data: bytes
    expected_version: int | None = None


@dataclass(frozen=True, slots=True)
class DeleteOp:
    """One delete inside :meth:`MetadataStore.transact`."""

    path: str
    expected_version: int | None = None


def check_path(path: str, *, allow_root: bool = False) -> None:
    """Raise ``ValueError`` unless ``path`` is ``/name[/name...]`` (or ``/`` with ``allow_root``).

    Every store applies these rules, so all of them accept exactly the same paths.
    """
    if path == "/":
        if allow_root:
            return
        raise ValueError("the root '/' cannot be written")
    if not path.startswith("/") or path.endswith("/") or "//" in path:
        raise ValueError(f"invalid metadata path {path!r}")


def check_transaction(ops: list[PutOp | DeleteOp]) -> None:
    """Raise ``ValueError`` for more than :data:`MAX_TRANSACTION_OPS` operations or a bad path."""
    if len(ops) > MAX_TRANSACTION_OPS:
        raise ValueError(f"at most {MAX_TRANSACTION_OPS} operations per transaction, got {len(ops)}")
    for op in ops:
        check_path(op.path)


class Session(abc.ABC):
    """A liveness session: ephemeral keys created with it vanish when it ends or its owner dies."""

    @property
    @abc.abstractmethod
    def id(self) -> int: ...

    @property
    def valid_until(self) -> float:
        """``time.monotonic()`` until which the session is surely alive (its keys still ours)."""
        return math.inf

    @abc.abstractmethod
    async def close(self) -> None:
        """End the session, deleting its ephemeral keys."""


class MetadataStore(abc.ABC):
    """Async key-value store with versions, compare-and-swap, children, watches and sessions.

    Every call is bounded by a timeout inside the implementation and raises
    :class:`StoreUnavailableError` when the backend cannot answer in time.
    """

    @abc.abstractmethod
    async def get(self, path: str) -> Value | None:
        """Return the value at ``path`` or ``None``."""

    @abc.abstractmethod
    async def put(
        self,
        path: str,
        data: bytes,
        expected_version: int | None = None,
        *,
        session: Session | None = None,
    ) -> Stat:
        """Create or update ``path``.

        ``expected_version``: ``None`` writes unconditionally, :data:`NOT_EXISTS` requires the key
        to be absent, any other number requires that exact current version (else
        :class:`BadVersionError`). With ``session`` the key is ephemeral.
        """

    @abc.abstractmethod
    async def delete(self, path: str, expected_version: int | None = None) -> None:
        """Delete ``path``; :class:`NotFoundError` if absent, :class:`BadVersionError` on mismatch."""

    @abc.abstractmethod
    async def get_children(self, path: str) -> list[str]:
        """Sorted names (not full paths) of the direct children of ``path``."""

    async def exists(self, path: str) -> bool:
        """Whether ``path`` exists."""
        return await self.get(path) is not None

    @abc.abstractmethod
    async def delete_recursive(self, path: str) -> None:
        """Delete ``path`` and everything below it; absent keys are not an error."""

    @abc.abstractmethod
    async def transact(self, ops: list[PutOp | DeleteOp]) -> list[Stat | None]:
        """Apply up to 128 operations atomically: all succeed or none (first failure raised)."""

    @abc.abstractmethod
    def watch(self, prefix: str, listener: Listener) -> Callable[[], None]:
        """Call ``listener`` for every change of a key starting with ``prefix``.

        Returns an unsubscribe function.
        """

    @abc.abstractmethod
    async def create_session(self, ttl_seconds: float = 10.0) -> Session:
        """Start a session for ephemeral keys, kept alive until closed."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release resources; pending operations fail with :class:`StoreUnavailableError`."""
