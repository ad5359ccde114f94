"""``magnetar bookie``: one networked bookie of a cluster.

Start-up order: metadata store -> cookie check (refuses swapped or wiped disks) -> bookie
storage (journal replay) -> TCP server -> registration (leased key) -> HTTP. Shutdown
(SIGTERM/SIGINT) goes in reverse, so the bookie leaves placement before it stops answering.
"""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from magnetar.cli.logs import setup_logging
from magnetar.cli.process import Closers, freeze_startup_objects, run_event_loop, stop_on_signals

if TYPE_CHECKING:
    from aiohttp import web

    from magnetar.bookie.bookie import Bookie
    from magnetar.bookie.gc import LedgerGarbageCollector
    from magnetar.bookie.registration import BookieRegistration
    from magnetar.bookie.server import BookieServer

log = logging.getLogger("magnetar.bookie")

#: Exit status when the cookie or registration check refuses to start (distinct from crashes).
EXIT_COOKIE_MISMATCH = 3


class BookieNode:
    """The assembled bookie process; :meth:`start` brings it up, :meth:`close` takes it down in reverse."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self._closers = Closers()
        self.bookie: Bookie | None = None
        self.server: BookieServer | None = None
        self.registration: BookieRegistration | None = None
        self.gc: LedgerGarbageCollector | None = None
        self.address = ""

    async def start(self) -> None:
        from magnetar.bookie.bookie import Bookie
        from magnetar.bookie.config import BookieConfig
        from magnetar.bookie.cookie import verify_or_create_cookie
        from magnetar.bookie.gc import LedgerGarbageCollector
        from magnetar.bookie.registration import BookieRegistration
        from magnetar.bookie.server import BookieServer
        from magnetar.metadata import open_metadata_store

        a = self.args
        data_dir, journal_dir = Path(a.data_dir), Path(a.journal_dir)  # made absolute by run()
        ledger_dirs = [Path(d) for d in a.ledger_dirs]
        host = a.advertised_address or ("127.0.0.1" if a.bind_address in ("0.0.0.0", "::") else a.bind_address)
        self.address = f"{host}:{a.port}"

        store = open_metadata_store(a.metadata_url)
        start = getattr(store, "start", None)
        if start is not None:
            await start()
        self._closers.add(store.close)

        cookie = await verify_or_create_cookie(store, self.address, journal_dir, ledger_dirs)

        bookie = self.bookie = Bookie(
            BookieConfig(
                data_dir=data_dir,
                address=self.address,
                journal_dir=journal_dir,
                ledger_dir=ledger_dirs[0],
                min_free_bytes=a.min_free_bytes,
                write_cache_max_bytes=a.write_cache_max_bytes,
                max_throttle_time_s=a.max_throttle_time,
                gc_wait_time_s=a.gc_wait_time,
            )
        )
        bookie.jobs.free_space_every_s = a.disk_check_interval
        await bookie.start()
        self._closers.add(bookie.close)

        ssl_context = None
        if a.tls_certificate_path:  # TLS on the bookie port, reloaded as cert-manager rotates the files
            from magnetar.broker.tls import ReloadingServerContext, TlsSettings

            tls = ReloadingServerContext(
                TlsSettings(a.tls_certificate_path, a.tls_key_store, a.tls_trust_store, a.tls_client_authentication),
                a.tls_cert_files_refresh_duration_seconds,
            )
            ssl_context = await tls.start()
            self._closers.add(tls.close)
        server = self.server = BookieServer(
            bookie, a.bind_address, a.port, max_inflight_adds=a.max_inflight_adds, ssl_context=ssl_context
        )
        await server.start()
        self._closers.add(server.close)

        info: dict[str, Any] = {"instanceId": cookie.instance_id}
        if a.http_port is not None:
            info["httpAddress"] = f"{host}:{a.http_port}"
        reg = self.registration = BookieRegistration(store, bookie, self.address, ttl_s=a.registration_ttl, info=info)
        await reg.start()
        self._closers.add(reg.close)

        # Ledgers deleted while this bookie was away: reclaimed by comparing with the metadata.
        gc = self.gc = LedgerGarbageCollector(bookie, store)
        gc.start()
        self._closers.add(gc.close)

        if a.http_port is not None:
            runner = await self._start_http(a.bind_address, a.http_port)
            self._closers.add(runner.cleanup)
        log.info(
            "bookie %s listening on %s:%d (http %s), journal %s, ledgers %s, instance %s",
            self.address,
            a.bind_address,
            server.port,
            a.http_port if a.http_port is not None else "off",
            journal_dir,
            ledger_dirs[0],
            cookie.instance_id,
        )

    # ---------------------------------------------------------------- HTTP

    async def _start_http(self, host: str, port: int) -> web.AppRunner:
        from aiohttp import web

        app = web.Application()
        app.router.add_get("/health", self._health)
        app.router.add_get("/ready", self._ready)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/api/v1/bookie/state/readonly", self._get_readonly)
        app.router.add_put("/api/v1/bookie/state/readonly", self._put_readonly)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, host, port, reuse_address=True).start()
        return runner

    def _running(self) -> bool:
        from magnetar.bookie.bookie import BookieStatus

        return self.bookie is not None and self.bookie.status is BookieStatus.RUNNING

    async def _health(self, request: web.Request) -> web.Response:
        from aiohttp import web

        ok = self._running()
        return web.json_response({"status": "ok" if ok else "down"}, status=200 if ok else 503)

    async def _ready(self, request: web.Request) -> web.Response:
        """Ready = serving and registered (read-only bookies are ready: they serve reads)."""
        from aiohttp import web

        reg = self.registration
        ok = self._running() and reg is not None and reg.registered
        body = {"ready": ok, "readOnly": None if reg is None else reg.read_only}
        return web.json_response(body, status=200 if ok else 503)

    async def _get_readonly(self, request: web.Request) -> web.Response:
        from aiohttp import web

        assert self.bookie is not None
        return web.json_response({"readOnly": self.bookie.read_only})

    async def _put_readonly(self, request: web.Request) -> web.Response:
        """BookKeeper's admin call: ``{"readOnly": true}`` takes the bookie out of placement."""
        from aiohttp import web

        try:
            body = await request.json()
            value = body["readOnly"]
            if not isinstance(value, bool):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            return web.json_response({"reason": 'expected {"readOnly": true|false}'}, status=400)
        assert self.bookie is not None
        self.bookie.set_read_only(value)
        return web.json_response({"readOnly": self.bookie.read_only})

    async def _metrics(self, request: web.Request) -> web.Response:
        from aiohttp import web

        lines: list[str] = []

        def metric(name: str, kind: str, value: float, help_text: str) -> None:
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} {kind}")
            lines.append(f'{name}{{bookie="{self.address}"}} {value}')

        if self.server is not None:
            s = self.server.stats
            metric("bookie_add_entry_total", "counter", s.adds, "Adds accepted")
            metric("bookie_add_entry_errors_total", "counter", s.add_errors, "Adds refused or failed")
            metric("bookie_add_entry_bytes_total", "counter", s.add_bytes, "Entry bytes added")
            metric("bookie_add_entry_inflight", "gauge", s.inflight_adds, "Adds waiting for the journal")
            metric("bookie_read_requests_total", "counter", s.reads, "Read requests")
            metric("bookie_read_entries_total", "counter", s.read_entries, "Entries returned by reads")
            metric("bookie_read_errors_total", "counter", s.read_errors, "Failed read requests")
            metric("bookie_other_requests_total", "counter", s.other_requests, "Fence, LAC and delete requests")
            metric("bookie_bad_frames_total", "counter", s.bad_frames, "Malformed frames received")
            metric("bookie_connections", "gauge", s.connections, "Open client connections")
            metric("bookie_connections_total", "counter", s.connections_total, "Accepted connections")
            metric("bookie_read_pauses_total", "counter", s.read_pauses, "Back-pressure pauses of reading")
        if self.bookie is not None:
            metric("bookie_read_only", "gauge", int(self.bookie.read_only), "1 while the bookie refuses adds")
            metric("bookie_ledgers", "gauge", len(self.bookie.ledger_ids()), "Ledgers stored")
            metric("bookie_up", "gauge", int(self._running()), "1 while the bookie is running")
            b = self.bookie
            metric("bookie_write_cache_bytes", "gauge", b.cache_bytes, "Write cache bytes not yet flushing")
            metric("bookie_throttled_adds_total", "counter", b.throttled_adds, "Adds held back by a full write cache")
            metric("bookie_rejected_adds_total", "counter", b.rejected_adds, "Adds rejected after max throttle time")
            read_bytes = b.storage.reader.bytes_read
            metric("bookie_entry_log_read_bytes_total", "counter", read_bytes, "Bytes read from entry logs")
        if self.gc is not None:
            metric("bookie_gc_ledgers_total", "counter", self.gc.ledgers_collected, "Ledgers reclaimed by metadata GC")
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    async def close(self) -> None:
        """Close components in reverse order of start; each step is bounded."""
        await self._closers.close_all()


async def serve(args: argparse.Namespace) -> int:
    """Run until SIGTERM/SIGINT, then shut down cleanly."""
    from magnetar.bookie.cookie import CookieMismatchError
    from magnetar.bookie.registration import RegistrationConflictError

    stop = stop_on_signals()
    node = BookieNode(args)
    try:
        try:
            await node.start()
        except (CookieMismatchError, RegistrationConflictError) as e:
            log.error("refusing to start: %s", e)
            return EXIT_COOKIE_MISMATCH
        freeze_startup_objects()
        await stop.wait()
        log.info("shutting down bookie %s", node.address)
    finally:
        await node.close()
    log.info("bookie stopped")
    return 0


def run(args: argparse.Namespace) -> int:
    setup_logging(args.log_level)
    args.data_dir = os.path.abspath(args.data_dir)
    args.journal_dir = os.path.abspath(args.journal_dir or os.path.join(args.data_dir, "journal"))
    dirs = args.ledger_dirs.split(",") if args.ledger_dirs else [os.path.join(args.data_dir, "ledgers")]
    args.ledger_dirs = [os.path.abspath(d) for d in dirs if d]
    if len(args.ledger_dirs) != 1:
        log.error("exactly one ledger directory is supported so far, got %s", args.ledger_dirs)
        return 2
    return run_event_loop(serve(args))


def add_parser(sub: argparse._SubParsersAction) -> None:
    env = os.environ.get
    p = sub.add_parser("bookie", help="run one networked bookie (storage node of a cluster)")
    p.add_argument("--metadata-url", required=True, help="metadata store, e.g. etcd://host:2379[,host:2379]")
    p.add_argument("--data-dir", default="data/bookie", help="base of the default directories (./data/bookie)")
    p.add_argument("--journal-dir", help="journal directory (default <data-dir>/journal)")
    p.add_argument("--ledger-dirs", help="entry log + index directory (default <data-dir>/ledgers)")
    p.add_argument("--port", type=int, default=3181, help="bookie protocol port (default 3181)")
    p.add_argument("--bind-address", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
    p.add_argument("--advertised-address", help="host name other nodes use (default 127.0.0.1 / bind address)")
    p.add_argument("--http-port", type=int, help="HTTP port for /health, /ready and /metrics (off if unset)")
    p.add_argument("--min-free-bytes", type=int, default=256 * 1024 * 1024, help="read-only below this free space")
    p.add_argument("--disk-check-interval", type=float, default=10.0, help="seconds between free-space checks")
    p.add_argument("--registration-ttl", type=float, default=10.0, help="lease TTL of the registration (s)")
    p.add_argument("--max-inflight-adds", type=int, default=8192, help="per connection, before reads pause")
    p.add_argument(
        "--write-cache-max-bytes",
        type=int,
        default=64 * 1024 * 1024,
        help="write cache size (BookKeeper dbStorage_writeCacheMaxSizeMb)",
    )
    p.add_argument(
        "--max-throttle-time",
        type=float,
        default=10.0,
        help="seconds an add waits for write cache room (BookKeeper dbStorage_maxThrottleTimeMs)",
    )
    # TLS with BookKeeper's bookie setting names (PEM files; tlsKeyStore is the PEM key, as tlsKeyStoreType=PEM).
    p.add_argument("--tlsCertificatePath", dest="tls_certificate_path", default="", help="PEM certificate: TLS on")
    p.add_argument("--tlsKeyStore", dest="tls_key_store", default="", help="PEM private key of the certificate")
    p.add_argument("--tlsTrustStore", dest="tls_trust_store", default="", help="PEM CAs trusted for client certs")
    p.add_argument(
        "--tlsClientAuthentication", dest="tls_client_authentication", action="store_true",
        help="require a client certificate trusted by --tlsTrustStore",
    )  # fmt: skip
    p.add_argument(
        "--tlsCertFilesRefreshDurationSeconds", dest="tls_cert_files_refresh_duration_seconds", type=float,
        default=300.0, help="seconds between checks of the TLS files for rotation (0: never)",
    )  # fmt: skip
    p.add_argument("--gc-wait-time", type=float, default=900.0, help="s between metadata GC scans (gcWaitTime)")
    p.add_argument("--log-level", default=env("MAGNETAR_LOG_LEVEL", "INFO"))
    p.set_defaults(run=run)


__all__ = ["EXIT_COOKIE_MISMATCH", "BookieNode", "add_parser"]
