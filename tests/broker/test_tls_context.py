"""broker/tls.py in-process: the verified client certificate handed to authentication, tlsProtocols and
tlsCiphers honoured, a failed reload keeping the previous certificate, the refresh task cancelled on close."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import pytest

from magnetar.broker.tls import (
    ReloadingServerContext,
    TlsConfigError,
    TlsSettings,
    client_context,
    peer_certificate,
    server_context,
)
from tests.tlsutil import Pki, issue, make_pki, serial_of


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return make_pki(tmp_path, client_cn="alice")


def _settings(pki: Pki, **kw: object) -> TlsSettings:
    return TlsSettings(str(pki.server.cert), str(pki.server.key), str(pki.ca_cert), **kw)  # type: ignore[arg-type]


class _Recorder(asyncio.Protocol):
    seen: list[object] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        _Recorder.seen.append(peer_certificate(transport))
        transport.close()


async def _handshake(server_ctx: ssl.SSLContext, client_ctx: ssl.SSLContext) -> tuple[object, int]:
    """Connect once; the peer certificate the server saw and the serial of the server certificate."""
    _Recorder.seen = []
    server = await asyncio.get_running_loop().create_server(_Recorder, "127.0.0.1", 0, ssl=server_ctx)
    try:
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", port, ssl=client_ctx, server_hostname="127.0.0.1"), 10
        )
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        await asyncio.wait_for(reader.read(), 10)
        writer.close()
        for _ in range(100):
            if _Recorder.seen:
                break
            await asyncio.sleep(0.01)
        return _Recorder.seen[0], serial_of(der)
    finally:
        server.close()


async def test_client_certificate_is_available_for_authentication(pki: Pki) -> None:
    ctx = server_context(_settings(pki))
    assert ctx.verify_mode == ssl.CERT_OPTIONAL  # a trust file without the requirement: optional
    cert, _ = await _handshake(ctx, client_context(str(pki.ca_cert), str(pki.client.cert), str(pki.client.key)))
    assert cert is not None and dict(x[0] for x in cert["subject"])["commonName"] == "alice"  # type: ignore[index]
    anonymous, _ = await _handshake(ctx, client_context(str(pki.ca_cert)))
    assert anonymous is None


def test_required_client_certificate_needs_a_trust_file(pki: Pki) -> None:
    assert server_context(_settings(pki, require_client_cert=True)).verify_mode == ssl.CERT_REQUIRED
    with pytest.raises(TlsConfigError):
        server_context(TlsSettings(str(pki.server.cert), str(pki.server.key), require_client_cert=True))
    insecure = server_context(_settings(pki, require_client_cert=True, allow_insecure=True))
    assert insecure.verify_mode == ssl.CERT_NONE


async def test_protocols_and_ciphers_are_honoured(pki: Pki) -> None:
    only_13 = server_context(_settings(pki, protocols="TLSv1.3"))
    client_12 = client_context(str(pki.ca_cert))
    client_12.maximum_version = ssl.TLSVersion.TLSv1_2
    with pytest.raises((ssl.SSLError, ConnectionResetError)):
        await _handshake(only_13, client_12)
    cipher = "ECDHE-ECDSA-AES128-GCM-SHA256"
    ctx = server_context(_settings(pki, protocols="TLSv1.2", ciphers=cipher))
    assert [c["name"] for c in ctx.get_ciphers() if c["protocol"] == "TLSv1.2"] == [cipher]
    # Pulsar's (Java's) standard names are mapped to OpenSSL's.
    java = server_context(
        _settings(pki, ciphers="TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,TLS_RSA_WITH_AES_128_CBC_SHA")
    )
    assert {c["name"] for c in java.get_ciphers() if c["protocol"] != "TLSv1.3"} == {
        "ECDHE-ECDSA-AES256-GCM-SHA384",
        "AES128-SHA",
    }
    with pytest.raises(TlsConfigError):
        server_context(_settings(pki, ciphers="TLS_NOSUCH_RSA_WITH_AES_256_GCM_SHA384"))
    with pytest.raises(TlsConfigError):
        server_context(_settings(pki, protocols="SSLv3"))
    with pytest.raises(TlsConfigError):
        server_context(_settings(pki, ciphers="NO-SUCH-CIPHER"))


async def test_reload_switches_new_handshakes_and_survives_a_broken_rotation(pki: Pki, tmp_path: Path) -> None:
    reloading = ReloadingServerContext(_settings(pki), refresh_interval_s=3600)
    listener = await reloading.start()
    client = client_context(str(pki.ca_cert))
    try:
        assert (await _handshake(listener, client))[1] == pki.server.serial
        assert not await reloading.check()  # nothing changed
        pki.server.cert.write_bytes(b"half written")  # a broken rotation: the previous certificate stays
        assert not await reloading.check()
        assert (await _handshake(listener, client))[1] == pki.server.serial
        new = issue(pki.ca, tmp_path / "new", "server", "localhost", server=True, hosts=("127.0.0.1",))
        pki.server.cert.write_bytes(new.cert.read_bytes())
        pki.server.key.write_bytes(new.key.read_bytes())
        assert await reloading.check()
        assert (await _handshake(listener, client))[1] == new.serial
    finally:
        await reloading.close()


async def test_refresh_task_is_cancelled_on_close(pki: Pki) -> None:
    reloading = ReloadingServerContext(_settings(pki), refresh_interval_s=0.05)
    await reloading.start()
    names = {t.get_name() for t in asyncio.all_tasks()}
    assert "tls certificate refresh" in names
    await reloading.close()
    assert "tls certificate refresh" not in {t.get_name() for t in asyncio.all_tasks() if not t.done()}


async def test_broker_to_broker_calls_use_https_only_without_http(pki: Pki) -> None:
    from magnetar.broker.config import BrokerConfig
    from magnetar.broker.tls import broker_web_target

    config = BrokerConfig()
    config.tls_trust_certs_file_path = str(pki.ca_cert)
    assert await broker_web_target(config, "http://b:8080", "https://b:8443") == ("http://b:8080", None)
    url, ctx = await broker_web_target(config, "", "https://b:8443")
    assert url == "https://b:8443" and ctx is not None and ctx.verify_mode == ssl.CERT_REQUIRED
    assert ctx.get_ca_certs()[0]["subject"] == ((("commonName", "magnetar-test-ca"),),)


async def test_https_request_sees_the_client_certificate(pki: Pki) -> None:
    """The admin API's side: an aiohttp handler reads the verified client certificate of its request."""
    import aiohttp
    from aiohttp import web

    from magnetar.broker.tls import request_peer_certificate

    async def whoami(request: web.Request) -> web.Response:
        cert = request_peer_certificate(request)
        subject = dict(x[0] for x in cert["subject"]) if cert else {}
        return web.Response(text=subject.get("commonName", "-"))

    app = web.Application()
    app.router.add_get("/whoami", whoami)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_context(_settings(pki)))
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
            with_cert = client_context(str(pki.ca_cert), str(pki.client.cert), str(pki.client.key))
            async with http.get(f"https://127.0.0.1:{port}/whoami", ssl=with_cert) as resp:
                assert await resp.text() == "alice"
            async with http.get(f"https://127.0.0.1:{port}/whoami", ssl=client_context(str(pki.ca_cert))) as resp:
                assert await resp.text() == "-"
    finally:
        await runner.cleanup()
