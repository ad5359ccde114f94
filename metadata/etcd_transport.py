"""The gRPC connection of :class:`~magnetar.metadata.etcd.EtcdMetadataStore`, shared with its watch hub.

:class:`EtcdTransport` is everything the store's operations and its
:class:`~magnetar.metadata.etcd_watch.WatchHub` have in common: the endpoints and the channel to
the current one, the root prefix that maps Magnetar paths to etcd keys, the newest revision seen,
the bound event loop, and the open/closing/closed state.

Failures
    Every call carries a gRPC deadline of ``op_timeout_seconds``; an unreachable etcd, a deadline
    or a leader loss raise :class:`StoreUnavailableError`. gRPC reconnects on its own (backoff
    capped at 1 s). With several endpoints, an unavailable error moves the client to the next one
    (and restarts the watch stream on it).

TLS
    :class:`EtcdTls` (``etcd://...?tls=true&tlsTrustCertsFilePath=...``, or Pulsar's
    ``metadataStoreConfigPath`` YAML: :func:`tls_from_pulsar_config`) makes the channel a TLS one: etcd's
    certificate verified against the trust file (else the system's CAs), and a client certificate for
    etcd's ``--client-cert-auth``. The files are read on each (re)connect, so rotated files are picked up.

The channel is bound to the event loop of the first call: use a store from one loop only.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import parse_qsl, urlsplit

import grpc
from aetcd import rpc

from magnetar.common.tasks import TaskSet
from magnetar.metadata.api import MetadataError, StoreUnavailableError

log = logging.getLogger(__name__)

DEFAULT_PREFIX = "/magnetar"
DEFAULT_PORT = 2379
#: Keys per page of a paged range read.
LIST_PAGE = 1000

_UNAVAILABLE_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.ABORTED,
    }
)

_CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    # Reconnect quickly after an etcd restart (gRPC's default backoff grows to 120 s).
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    # Detect dead peers under long-lived watch streams; etcd refuses pings more often than 5 s.
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 0),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.enable_retries", 0),
]


# ---------------------------------------------------------------------- URL


@dataclass(frozen=True, slots=True)
class EtcdTls:
    """TLS to etcd (Pulsar's metadata-store names): CA file, and a client certificate and key for mTLS."""

    trust_certs_file: str = ""
    certificate_file: str = ""
    key_file: str = ""

    def credentials(self) -> grpc.ChannelCredentials:
        """gRPC channel credentials from the files (read now: small files, read once per connect)."""

        def read(name: str) -> bytes | None:
            return Path(name).read_bytes() if name else None

        try:
            return grpc.ssl_channel_credentials(
                root_certificates=read(self.trust_certs_file),
                private_key=read(self.key_file),
                certificate_chain=read(self.certificate_file),
            )
        except OSError as exc:
            raise StoreUnavailableError(f"cannot read the etcd TLS files: {exc}") from exc


#: URL query parameters of :class:`EtcdTls` (Pulsar's metadata-store setting names).
_TLS_PARAMS = {
    "tlsTrustCertsFilePath": "trust_certs_file",
    "tlsCertificateFilePath": "certificate_file",
    "tlsKeyFilePath": "key_file",
}


def tls_from_pulsar_config(path: str) -> EtcdTls | None:
    """TLS settings from Pulsar's ``metadataStoreConfigPath`` YAML (``useTls``, ``tlsTrustCertsFilePath``,
    ``tlsCertificateFilePath``, ``tlsKeyFilePath``); ``None`` when ``useTls`` is not true."""
    import yaml

    data = yaml.safe_load(Path(path).read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a YAML mapping")
    if str(data.get("useTls", "false")).lower() != "true":
        return None
    return EtcdTls(**{attr: str(data.get(name) or "") for name, attr in _TLS_PARAMS.items()})


@dataclass(frozen=True, slots=True)
class EtcdUrl:
    """A parsed ``etcd://host:port[,host:port][?prefix=/root&timeout=5&tls=true&tlsTrustCertsFilePath=...]``."""

    endpoints: tuple[tuple[str, int], ...]
    prefix: str = DEFAULT_PREFIX
    timeout: float | None = None
    tls: EtcdTls | None = None


def parse_etcd_url(url: str) -> EtcdUrl:
    """Parse an ``etcd://`` metadata-store URL (``ValueError`` when malformed)."""
    parts = urlsplit(url)
    if parts.scheme != "etcd":
        raise ValueError(f"not an etcd URL: {url!r}")
    if parts.path not in ("", "/") or parts.fragment:
        raise ValueError(f"etcd URL takes no path (use ?prefix=): {url!r}")
    endpoints = tuple(_parse_endpoint(e, url) for e in parts.netloc.split(",") if e.strip())
    if not endpoints:
        raise ValueError(f"etcd URL needs at least one host:port: {url!r}")
    prefix, timeout = DEFAULT_PREFIX, None
    use_tls: bool | None = None
    tls_files: dict[str, str] = {}
    for name, value in parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query)):
        if name == "tls":
            if value.lower() not in ("true", "false"):
                raise ValueError(f"tls must be true or false in {url!r}")
            use_tls = value.lower() == "true"
        elif name in _TLS_PARAMS:
            tls_files[_TLS_PARAMS[name]] = value
        elif name == "prefix":
            prefix = value
        elif name == "timeout":
            try:
                timeout = float(value)
            except ValueError:
                raise ValueError(f"bad timeout in {url!r}") from None
            if not timeout > 0:
                raise ValueError(f"timeout must be positive in {url!r}")
        else:
            raise ValueError(f"unknown etcd URL parameter {name!r} in {url!r}")
    # A TLS file implies TLS unless tls=false says otherwise.
    tls = EtcdTls(**tls_files) if (use_tls if use_tls is not None else bool(tls_files)) else None
    return EtcdUrl(endpoints, normalize_prefix(prefix), timeout, tls)


def _parse_endpoint(text: str, url: str) -> tuple[str, int]:
    text = text.strip()
    if text.startswith("["):  # [v6]:port
        host, sep, rest = text[1:].partition("]")
        if not sep:
            raise ValueError(f"bad IPv6 endpoint {text!r} in {url!r}")
        port_text = rest[1:] if rest.startswith(":") else ""
        if rest and not rest.startswith(":"):
            raise ValueError(f"bad endpoint {text!r} in {url!r}")
    else:
        host, _, port_text = text.partition(":")
    if "@" in host or not host:
        raise ValueError(f"bad endpoint {text!r} in {url!r}")
    try:
        port = int(port_text) if port_text else DEFAULT_PORT
    except ValueError:
        raise ValueError(f"bad port in {text!r} of {url!r}") from None
    if not 0 < port < 65536:
        raise ValueError(f"bad port in {text!r} of {url!r}")
    return host, port


def normalize_prefix(prefix: str) -> str:
    """``/root`` form of a root prefix; ``""`` (or ``/``) puts Magnetar's paths at etcd's top level."""
    if prefix in ("", "/"):
        return ""
    if not prefix.startswith("/") or prefix.endswith("/") or "//" in prefix:
        raise ValueError(f"etcd root prefix must look like /name[/name...], got {prefix!r}")
    return prefix


def _target(host: str, port: int) -> str:
    try:
        if isinstance(ipaddress.ip_address(host), ipaddress.IPv6Address):
            return f"[{host}]:{port}"
    except ValueError:
        pass
    return f"{host}:{port}"


# ---------------------------------------------------------------------- errors


def map_error(e: grpc.aio.AioRpcError, what: str) -> MetadataError:
    """The :class:`MetadataError` a failed gRPC call of ``what`` raises."""
    code, details = e.code(), e.details() or ""
    if "too large" in details or "larger than max" in details:
        return MetadataError(f"etcd rejected {what}: {details}")
    if code in _UNAVAILABLE_CODES or code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return StoreUnavailableError(f"etcd unavailable for {what}: {code.name} {details}")
    if code == grpc.StatusCode.NOT_FOUND and "lease" in details:
        return SessionExpiredError(f"{what}: the session's lease is gone ({details})")
    if code == grpc.StatusCode.OUT_OF_RANGE and "compacted" in details:
        return CompactedError(details)
    return MetadataError(f"etcd error in {what}: {code.name} {details}")


class SessionExpiredError(MetadataError):
    """The session's lease no longer exists (expired or revoked)."""


class CompactedError(MetadataError):
    """A read at a pinned revision that etcd has compacted away."""


@dataclass(slots=True)
class EtcdStats:
    """Counters for tests and metrics."""

    calls: int = 0
    batches: int = 0
    batched_ops: int = 0
    largest_batch: int = 0


@dataclass(slots=True)
class Stubs:
    """The channel to one endpoint and its service stubs."""

    channel: Any
    kv: Any
    watch: Any
    lease: Any
    target: str


# ---------------------------------------------------------------------- transport


class WatchEvents(Protocol):
    """What the transport tells the store's watch hub."""

    def kick(self) -> None:
        """A call is about to use the connection: start the watch stream if it is wanted."""

    def on_revision_known(self, revision: int) -> None:
        """The first revision was read (watches registered before connecting start after it)."""

    def restart_stream(self) -> None:
        """The client moved to another endpoint: reopen the watch stream there."""


class EtcdTransport:
    """One store's connection to etcd: endpoints, channel, deadlines, key mapping and revision.

    ``endpoints``: ``"host:port"``, a list of them, or ``(host, port)`` pairs. ``prefix`` is the
    root under which Magnetar paths are stored. ``op_timeout_seconds`` bounds every call.
    """

    def __init__(
        self,
        endpoints: str | Sequence[str | tuple[str, int]],
        *,
        prefix: str = DEFAULT_PREFIX,
        op_timeout_seconds: float = 5.0,
        tls: EtcdTls | None = None,
    ) -> None:
        #: TLS to etcd (``None``: plaintext).
        self.tls = tls
        if isinstance(endpoints, str):
            endpoints = [e for e in endpoints.split(",") if e.strip()]
        self.endpoints: list[tuple[str, int]] = [
            e if isinstance(e, tuple) else _parse_endpoint(e, str(e)) for e in endpoints
        ]
        if not self.endpoints:
            raise ValueError("at least one etcd endpoint is needed")
        self.prefix = normalize_prefix(prefix)
        #: ``prefix`` as key bytes.
        self.root = self.prefix.encode()
        self.op_timeout_seconds = op_timeout_seconds
        self.stats = EtcdStats()
        #: Newest etcd revision this client has seen (0 until connected).
        self.revision = 0
        self._endpoint_index = 0
        self._conn: Stubs | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._connect_lock = asyncio.Lock()
        self._closing = False
        self._closed = False
        self._tasks = TaskSet("etcd transport")
        self._watch: WatchEvents | None = None

    def set_watch_events(self, watch: WatchEvents) -> None:
        """Tell ``watch`` about connections, the first revision and endpoint switches."""
        self._watch = watch

    # ------------------------------------------------------------------ state

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The event loop the channel is bound to (``None`` before the first call)."""
        return self._loop

    @property
    def closing(self) -> bool:
        """Whether the store is closing: new calls are refused, internal ones still run."""
        return self._closing

    @property
    def closed(self) -> bool:
        """Whether the store is closed: nothing runs any more."""
        return self._closed

    def begin_close(self) -> None:
        """Refuse new calls (see :attr:`closing`)."""
        self._closing = True

    def mark_closed(self) -> None:
        """Refuse every call; background loops stop."""
        self._closed = True

    async def close(self) -> None:
        """Stop background tasks and close the channel (after :meth:`mark_closed`)."""
        await self._tasks.close()
        if self._conn is not None:
            conn, self._conn = self._conn, None
            await conn.channel.close()

    # ------------------------------------------------------------------ key mapping

    def key(self, path: str) -> bytes:
        """The etcd key of a Magnetar path."""
        return self.root + path.encode()

    def key_prefix(self, prefix: str) -> bytes:
        """The etcd key prefix of a watched path prefix."""
        # Magnetar paths start with '/': an empty watch prefix means the whole tree.
        return self.root + (prefix or "/").encode()

    def path_of(self, key: bytes) -> str:
        """The Magnetar path of an etcd key."""
        return key[len(self.root) :].decode()

    # ------------------------------------------------------------------ connection

    def stubs(self) -> Stubs:
        """The stubs of the current endpoint (creating its channel; no I/O)."""
        if self._conn is None:
            host, port = self.endpoints[self._endpoint_index]
            target = _target(host, port)
            if self.tls is not None:
                channel = rpc.secure_channel(target, self.tls.credentials(), options=_CHANNEL_OPTIONS)
            else:
                channel = rpc.insecure_channel(target, options=_CHANNEL_OPTIONS)
            self._conn = Stubs(channel, rpc.KVStub(channel), rpc.WatchStub(channel), rpc.LeaseStub(channel), target)
        return self._conn

    def observe(self, revision: int) -> None:
        """Record a revision seen in a response."""
        if revision > self.revision:
            self.revision = revision

    async def ensure_connected(self) -> Stubs:
        """Bind to the running loop and learn the first revision; the stubs to call."""
        if self._closed:
            raise StoreUnavailableError("metadata store is closed")
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif loop is not self._loop:
            raise RuntimeError("EtcdMetadataStore is bound to the event loop that first used it")
        if self.revision == 0:
            async with self._connect_lock:
                if self.revision == 0:
                    await self._probe()
        if self._watch is not None:
            self._watch.kick()
        return self.stubs()

    async def _probe(self) -> None:
        """Read the current revision, trying each endpoint once."""
        # The first revision anchors watches registered before connecting: every change made
        # after this point is newer.
        req = rpc.RangeRequest(key=self.root + b"/", count_only=True)
        for attempt in range(len(self.endpoints)):
            try:
                resp = await self.stubs().kv.Range(req, timeout=self.op_timeout_seconds)
            except grpc.aio.AioRpcError as e:
                self.rotate(e)
                if attempt + 1 < len(self.endpoints) and e.code() in _UNAVAILABLE_CODES:
                    continue
                raise map_error(e, "connect") from None
            self.stats.calls += 1
            self.observe(resp.header.revision)
            if self._watch is not None:
                self._watch.on_revision_known(resp.header.revision)
            return

    def rotate(self, e: grpc.aio.AioRpcError) -> None:
        """After an unavailable error, use the next endpoint (if there are several)."""
        if len(self.endpoints) < 2 or e.code() not in _UNAVAILABLE_CODES or self._conn is None:
            return
        old = self._conn
        self._conn = None
        self._endpoint_index = (self._endpoint_index + 1) % len(self.endpoints)
        log.info("etcd %s unavailable, switching to %s", old.target, self.endpoints[self._endpoint_index])
        self._tasks.spawn(old.channel.close(grace=1.0), name=f"close channel {old.target}")
        if self._watch is not None:
            self._watch.restart_stream()

    async def rpc(self, what: str, method: Callable[[Stubs], Any], request: Any, *, internal: bool = False) -> Any:
        """One unary call with a deadline; gRPC errors become :class:`MetadataError`.

        ``internal`` calls (lease revocation, watch listings) still run while the store is closing.
        """
        if self._closing and not internal:
            raise StoreUnavailableError("metadata store is closed")
        stubs = await self.ensure_connected()
        try:
            async with asyncio.timeout(self.op_timeout_seconds + 1.0):  # belt and braces over the deadline
                resp = await method(stubs)(request, timeout=self.op_timeout_seconds)
        except grpc.aio.AioRpcError as e:
            self.rotate(e)
            raise map_error(e, what) from None
        except TimeoutError:
            raise StoreUnavailableError(f"etcd did not answer {what} within {self.op_timeout_seconds}s") from None
        self.stats.calls += 1
        header = getattr(resp, "header", None)
        if header is not None:
            self.observe(header.revision)
        return resp

    async def renew(self, lease_id: int, *, deadline: float) -> int:
        """One lease keep-alive round trip (``deadline`` seconds); returns the remaining TTL (0 = gone)."""
        stubs = await self.ensure_connected()
        call = stubs.lease.LeaseKeepAlive(iter([rpc.LeaseKeepAliveRequest(ID=lease_id)]), timeout=deadline)
        try:
            async with asyncio.timeout(deadline + 1.0):
                async for resp in call:
                    self.stats.calls += 1
                    return int(resp.TTL)
        except grpc.aio.AioRpcError as e:
            self.rotate(e)
            raise map_error(e, "lease keep-alive") from None
        except TimeoutError:
            raise StoreUnavailableError("lease keep-alive timed out") from None
        finally:
            call.cancel()
        raise StoreUnavailableError("lease keep-alive stream ended without an answer")

    async def list_prefix(self, key_prefix: bytes) -> tuple[list[Any], int]:
        """Every key (``keys_only``) under ``key_prefix`` at one revision, and that revision."""
        for _attempt in range(3):
            kvs: list[Any] = []
            start, end, revision = key_prefix, prefix_end(key_prefix), 0
            try:
                while True:
                    req = rpc.RangeRequest(key=start, range_end=end, keys_only=True, limit=LIST_PAGE, revision=revision)
                    resp = await self.rpc("list", lambda s: s.kv.Range, req, internal=True)
                    revision = revision or resp.header.revision
                    kvs.extend(resp.kvs)
                    if not resp.more or not resp.kvs:
                        return kvs, revision
                    start = resp.kvs[-1].key + b"\0"
            except CompactedError:
                continue
        raise StoreUnavailableError("listing kept being compacted away")


def prefix_end(prefix: bytes) -> bytes:
    """The ``range_end`` that makes ``[prefix, end)`` cover every key starting with ``prefix``."""
    s = bytearray(prefix)
    for i in reversed(range(len(s))):
        if s[i] < 0xFF:
            s[i] += 1
            return bytes(s[: i + 1])
    return b"\0"  # all keys
