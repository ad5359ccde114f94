"""TLS between the ledger client and a bookie: a TLS bookie (client certificates required) serves a client with
the CA and a client certificate; plaintext clients, clients without a certificate and clients that do not trust
the bookie's certificate get nothing. The broker builds its client context from the ``bookkeeperTLS*`` settings."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from magnetar.bookie.api import BookieUnavailableError
from magnetar.bookie.bookie import Bookie
from magnetar.bookie.config import BookieConfig
from magnetar.bookie.remote import RemoteBookieClient
from magnetar.bookie.server import BookieServer
from magnetar.broker.config import BrokerConfig
from magnetar.broker.tls import ReloadingServerContext, TlsSettings, bookie_client_context, client_context
from tests.tlsutil import Pki, make_ca, make_pki

pytestmark = pytest.mark.timeout(30)

KEY = b"key"


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return make_pki(tmp_path / "pki", client_cn="broker")


@pytest.fixture
async def tls_bookie(tmp_path: Path, pki: Pki) -> AsyncIterator[BookieServer]:
    bookie = Bookie(BookieConfig(data_dir=tmp_path / "b", min_free_bytes=0, checkpoint_interval_s=3600))
    await bookie.start()
    tls = ReloadingServerContext(
        TlsSettings(str(pki.server.cert), str(pki.server.key), str(pki.ca_cert), require_client_cert=True), 300
    )
    server = BookieServer(bookie, "127.0.0.1", 0, ssl_context=await tls.start())
    await server.start()
    yield server
    await server.close()
    await tls.close()
    await bookie.close()


def _broker_config(pki: Pki, **overrides: str) -> BrokerConfig:
    config = BrokerConfig()
    config.apply(
        {
            "bookkeeperTLSClientAuthentication": "true",
            "bookkeeperTLSTrustCertsFilePath": str(pki.ca_cert),
            "bookkeeperTLSCertificateFilePath": str(pki.client.cert),
            "bookkeeperTLSKeyFilePath": str(pki.client.key),
            **overrides,
        }
    )
    return config


def test_plaintext_to_bookies_by_default() -> None:
    assert bookie_client_context(BrokerConfig()) is None


async def test_round_trip_over_tls(tls_bookie: BookieServer, pki: Pki) -> None:
    ctx = bookie_client_context(_broker_config(pki))
    assert ctx is not None
    client = RemoteBookieClient(f"127.0.0.1:{tls_bookie.port}", ssl_context=ctx)
    try:
        await asyncio.wait_for(
            asyncio.gather(*(client.add_entry_nowait(3, e, KEY, e - 1, b"e%d" % e) for e in range(50))), 10
        )
        got = await client.read_entries(3, 0, 49)
        assert [data for _, data in got] == [b"e%d" % e for e in range(50)]
    finally:
        await client.close()


async def test_refused_clients(tls_bookie: BookieServer, pki: Pki, tmp_path: Path) -> None:
    address = f"127.0.0.1:{tls_bookie.port}"
    other = make_ca(tmp_path / "other", "other-ca")
    contexts = [
        None,  # plaintext
        client_context(str(pki.ca_cert)),  # no client certificate
        client_context(str(other.cert), str(pki.client.cert), str(pki.client.key)),  # does not trust the bookie
    ]
    for ctx in contexts:
        client = RemoteBookieClient(address, ssl_context=ctx, connect_timeout_s=3, op_timeout_s=3, add_timeout_s=3)
        try:
            with pytest.raises((BookieUnavailableError, asyncio.TimeoutError)):
                await client.add_entry(4, 0, KEY, -1, b"x")
        finally:
            await client.close()
