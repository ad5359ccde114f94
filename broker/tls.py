"""TLS for the broker's listeners (``pulsar+ssl://``, HTTPS) and for its own client connections.

:class:`ReloadingServerContext` gives the one ``ssl.SSLContext`` every TLS listener is created with, from
PEM files (``tlsCertificateFilePath``, ``tlsKeyFilePath``, ``tlsTrustCertsFilePath``), and follows those
files as cert-manager rotates them: a task re-reads them every ``tlsCertRefreshCheckDurationSec`` and, when
their content changed, builds a new context off the event loop. A listener's context is fixed when it is
created (asyncio and aiohttp take it once), so the listeners' context switches each new handshake to the
newest one from its server-name callback (OpenSSL calls it for every ClientHello, with or without SNI):
new connections get the new certificate, open ones keep theirs. A failed reload (a half-written rotation)
is logged and the previous certificate stays in use until the next check.

Client-certificate verification: ``tlsRequireTrustedClientCertOnConnect`` makes it CERT_REQUIRED against
the trust file; otherwise a given trust file makes it CERT_OPTIONAL, so a client certificate is verified
when presented and :func:`peer_certificate` can hand it to TLS authentication.

:func:`client_context` builds the context of an outgoing connection (broker -> bookie, -> etcd).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aiohttp import web

log = logging.getLogger(__name__)

#: Pulsar's ``tlsProtocols`` names -> ssl versions.
_PROTOCOLS = {
    "TLSv1": ssl.TLSVersion.TLSv1,
    "TLSv1.1": ssl.TLSVersion.TLSv1_1,
    "TLSv1.2": ssl.TLSVersion.TLSv1_2,
    "TLSv1.3": ssl.TLSVersion.TLSv1_3,
}


class TlsConfigError(ValueError):
    """TLS settings a listener cannot start with (missing or unreadable files, unknown protocol)."""


@dataclass(frozen=True, slots=True)
class TlsSettings:
    """What a TLS context is built from (the broker's ``tls*`` settings, or a bookie's)."""

    cert_file: str
    key_file: str
    trust_file: str = ""
    require_client_cert: bool = False
    allow_insecure: bool = False
    protocols: str = ""
    ciphers: str = ""

    @classmethod
    def of_broker(cls, config: Any) -> TlsSettings:
        """The listeners' settings from a :class:`~magnetar.broker.config.BrokerConfig`."""
        return cls(
            config.tls_certificate_file_path,
            config.tls_key_file_path,
            config.tls_trust_certs_file_path,
            config.tls_require_trusted_client_cert_on_connect,
            config.tls_allow_insecure_connection,
            config.tls_protocols,
            config.tls_ciphers,
        )

    def files(self) -> tuple[str, ...]:
        return tuple(f for f in (self.cert_file, self.key_file, self.trust_file) if f)


def _restrict(ctx: ssl.SSLContext, protocols: str, ciphers: str) -> None:
    names = [p.strip() for p in protocols.split(",") if p.strip()]
    if names:
        try:
            versions = sorted(_PROTOCOLS[n] for n in names)
        except KeyError as exc:
            raise TlsConfigError(f"unknown TLS protocol {exc.args[0]!r} (known: {', '.join(_PROTOCOLS)})") from None
        ctx.minimum_version, ctx.maximum_version = versions[0], versions[-1]
    suites = [c.strip() for c in ciphers.split(",") if c.strip()]
    if suites:
        names = _openssl_cipher_names(suites)
        try:
            if names:
                ctx.set_ciphers(":".join(names))
        except ssl.SSLError:
            raise TlsConfigError(f"no usable cipher in tlsCiphers {ciphers!r}") from None
        if not names and any("_WITH_" in s for s in suites):
            raise TlsConfigError(f"no usable cipher in tlsCiphers {ciphers!r}")


#: A TLS 1.2 suite's standard (IANA, Java) name: ``TLS_<kx>[_<auth>]_WITH_<cipher>_<mac>``.
_IANA_SUITE = re.compile(
    r"TLS_(?P<kx>[A-Z]+?)(?:_(?P<auth>RSA|ECDSA|DSS|anon))?_WITH_(?P<cipher>\w+?)_(?P<mac>SHA\d*|MD5)"
)


def _openssl_cipher_names(suites: list[str]) -> list[str]:
    """OpenSSL names for ``tlsCiphers``: OpenSSL names pass through; standard names as Pulsar (Java) takes
    them are matched to OpenSSL's suites by key exchange, authentication, cipher and MAC. TLS 1.3 suites
    (``TLS_AES_128_GCM_SHA256``, ...) cannot be restricted here and are left to OpenSSL's defaults."""
    everything = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    everything.set_ciphers("ALL:@SECLEVEL=0")
    known = [c for c in everything.get_ciphers() if c["protocol"] != "TLSv1.3"]
    out: list[str] = []
    for suite in suites:
        m = _IANA_SUITE.fullmatch(suite)
        if m is None:
            if "_" in suite:
                log.warning("tlsCiphers: %s applies to TLS 1.3, whose suites cannot be restricted; ignored", suite)
            else:
                out.append(suite)  # an OpenSSL name
            continue
        kx = m["kx"].lower()
        auth = (m["auth"] or ("rsa" if kx == "rsa" else "")).lower().replace("anon", "null")
        cipher = m["cipher"].lower().replace("_", "-")
        ccm8 = cipher.endswith("-8")
        symmetric = cipher.removesuffix("-8")
        digest = {"sha": "sha1"}.get(m["mac"].lower(), m["mac"].lower())
        found = [
            c["name"]
            for c in known
            if c["kea"] == f"kx-{kx}"
            and c["auth"] == f"auth-{auth}"
            and c["symmetric"] == symmetric
            and (c["aead"] or c["digest"] == digest)
            and c["name"].endswith("CCM8") == ccm8
        ]
        if not found:
            log.warning("tlsCiphers: OpenSSL has no cipher suite %s; ignored", suite)
        out += found
    return out


def server_context(settings: TlsSettings) -> ssl.SSLContext:
    """A listener's context from PEM files (blocking: reads files)."""
    if not settings.cert_file or not settings.key_file:
        raise TlsConfigError("a TLS listener needs tlsCertificateFilePath and tlsKeyFilePath")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    _restrict(ctx, settings.protocols, settings.ciphers)
    try:
        ctx.load_cert_chain(settings.cert_file, settings.key_file)
        if settings.trust_file and not settings.allow_insecure:
            ctx.load_verify_locations(cafile=settings.trust_file)
            ctx.verify_mode = ssl.CERT_REQUIRED if settings.require_client_cert else ssl.CERT_OPTIONAL
        elif settings.require_client_cert and not settings.allow_insecure:
            raise TlsConfigError("tlsRequireTrustedClientCertOnConnect needs tlsTrustCertsFilePath")
    except (OSError, ssl.SSLError) as exc:
        raise TlsConfigError(f"cannot load TLS files {settings.files()}: {exc}") from exc
    return ctx


def client_context(
    trust_file: str = "",
    cert_file: str = "",
    key_file: str = "",
    *,
    allow_insecure: bool = False,
    verify_hostname: bool = True,
) -> ssl.SSLContext:
    """An outgoing connection's context: the server verified against ``trust_file`` (empty: the system's
    CAs; ``allow_insecure``: not at all), and a client certificate when ``cert_file``/``key_file`` are given."""
    ctx = ssl.create_default_context(cafile=trust_file or None)
    if allow_insecure:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    elif not verify_hostname:
        ctx.check_hostname = False
    try:
        if cert_file and key_file:
            ctx.load_cert_chain(cert_file, key_file)
    except (OSError, ssl.SSLError) as exc:
        raise TlsConfigError(f"cannot load TLS client certificate {cert_file}: {exc}") from exc
    return ctx


def bookie_client_context(config: Any) -> ssl.SSLContext | None:
    """The ledger client's TLS context to the bookies from the ``bookkeeperTLS*`` settings of a
    :class:`~magnetar.broker.config.BrokerConfig` (``None``: plaintext, the default)."""
    if not config.bookkeeper_tls_client_authentication:
        return None
    return client_context(
        config.bookkeeper_tls_trust_certs_file_path,
        config.bookkeeper_tls_certificate_file_path,
        config.bookkeeper_tls_key_file_path,
    )


async def broker_web_target(config: Any, http_url: str, http_url_tls: str) -> tuple[str, ssl.SSLContext | None]:
    """Where this broker calls another broker's web service (bundle unloads): its plain HTTP URL when it has
    one, else its HTTPS URL verified against ``tlsTrustCertsFilePath`` (the CA of the cluster's brokers)."""
    if http_url or not http_url_tls:
        return http_url, None
    trust = config.tls_trust_certs_file_path
    return http_url_tls, await asyncio.to_thread(client_context, trust)


def _digest(files: tuple[str, ...]) -> str:
    """Content digest of the files (blocking); cert-manager swaps a symlink, so the content is what counts."""
    h = hashlib.sha256()
    for name in files:
        h.update(Path(name).read_bytes())
        h.update(b"\0")
    return h.hexdigest()


class ReloadingServerContext:
    """The TLS context of the listeners, following rotations of its files (see the module docstring)."""

    def __init__(self, settings: TlsSettings, refresh_interval_s: float) -> None:
        self.settings = settings
        self.refresh_interval_s = refresh_interval_s
        #: The context listeners are created with; it hands each handshake to :attr:`current`.
        self.listener_context: ssl.SSLContext | None = None
        #: The newest successfully loaded context.
        self.current: ssl.SSLContext | None = None
        self.reloads = 0
        self._digest = ""
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> ssl.SSLContext:
        """Load the files (raising :class:`TlsConfigError` if unusable) and start watching them."""
        self._digest, ctx = await asyncio.to_thread(self._load)
        self.current = self.listener_context = ctx
        ctx.sni_callback = self._on_client_hello
        if self.refresh_interval_s > 0:
            self._task = asyncio.get_running_loop().create_task(self._watch(), name="tls certificate refresh")
        return ctx

    def _load(self) -> tuple[str, ssl.SSLContext]:
        try:
            digest = _digest(self.settings.files())
        except OSError as exc:
            raise TlsConfigError(f"cannot read TLS files {self.settings.files()}: {exc}") from exc
        return digest, server_context(self.settings)

    def _on_client_hello(
        self, conn: ssl.SSLObject | ssl.SSLSocket, server_name: str | None, ctx: ssl.SSLContext
    ) -> None:
        current = self.current
        if current is not None and current is not ctx:
            conn.context = current  # the newest certificate; verification mode and ciphers are the same settings

    async def check(self) -> bool:
        """Reload when the files' content changed; whether a new context was installed."""
        try:
            digest = await asyncio.to_thread(_digest, self.settings.files())
            if digest == self._digest:
                return False
            digest, ctx = await asyncio.to_thread(self._load)
        except TlsConfigError as exc:
            log.warning("TLS files changed but cannot be loaded (keeping the previous certificate): %s", exc)
            return False
        except OSError as exc:
            log.warning("cannot read TLS files (keeping the previous certificate): %s", exc)
            return False
        self._digest, self.current = digest, ctx
        self.reloads += 1
        log.info("TLS certificate reloaded from %s", self.settings.cert_file)
        return True

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.refresh_interval_s)
            await self.check()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None


def request_peer_certificate(request: web.Request) -> Mapping[str, Any] | None:
    """The verified TLS client certificate of an HTTPS request (``None``: plain HTTP or none presented)."""
    return peer_certificate(request.transport)


def peer_certificate(transport: Any) -> Mapping[str, Any] | None:
    """The verified client certificate of a TLS transport (``getpeercert()`` dict), else ``None`` (plaintext,
    or no certificate presented)."""
    if transport is None:
        return None
    cert = transport.get_extra_info("peercert")
    return cert or None
