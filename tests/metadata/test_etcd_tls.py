"""TLS to etcd: the settings (URL parameters, Pulsar's ``metadataStoreConfigPath`` YAML) and a real etcd serving
TLS with client certificates required: the store works with the CA and a client certificate, and gets nothing
in plaintext or without a certificate."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from magnetar.metadata import open_metadata_store
from magnetar.metadata.api import StoreUnavailableError
from magnetar.metadata.etcd import EtcdMetadataStore
from magnetar.metadata.etcd_transport import EtcdTls, parse_etcd_url, tls_from_pulsar_config
from tests.etcd_server import EtcdServer, find_etcd_binary
from tests.tlsutil import Pki, make_pki

pytestmark = pytest.mark.timeout(60)


def test_plaintext_by_default() -> None:
    assert parse_etcd_url("etcd://127.0.0.1:2379").tls is None


def test_tls_from_url_parameters() -> None:
    spec = parse_etcd_url(
        "etcd://a:2379,b:2379?prefix=/m&tlsTrustCertsFilePath=/ca.pem&tlsCertificateFilePath=/c.pem&tlsKeyFilePath=/k.pem"
    )
    assert spec.tls == EtcdTls("/ca.pem", "/c.pem", "/k.pem")
    assert spec.prefix == "/m"
    assert parse_etcd_url("etcd://a:2379?tls=true").tls == EtcdTls()  # the system's CAs
    assert parse_etcd_url("etcd://a:2379?tls=false&tlsTrustCertsFilePath=/ca.pem").tls is None
    with pytest.raises(ValueError):
        parse_etcd_url("etcd://a:2379?tls=maybe")
    store = open_metadata_store("etcd://a:2379?tlsTrustCertsFilePath=/ca.pem")
    assert isinstance(store, EtcdMetadataStore)


def test_tls_from_pulsar_metadata_store_config(tmp_path: Path) -> None:
    conf = tmp_path / "metadata.yaml"
    conf.write_text(
        "useTls: true\ntlsProvider: OPENSSL\ntlsTrustCertsFilePath: /ca.pem\n"
        "tlsCertificateFilePath: /c.pem\ntlsKeyFilePath: /k.pem\n"
    )
    assert tls_from_pulsar_config(str(conf)) == EtcdTls("/ca.pem", "/c.pem", "/k.pem")
    conf.write_text("useTls: false\ntlsTrustCertsFilePath: /ca.pem\n")
    assert tls_from_pulsar_config(str(conf)) is None


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("etcd-pki"), client_cn="broker")


@pytest.fixture(scope="module")
def tls_etcd(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[EtcdServer]:
    if find_etcd_binary() is None:
        pytest.skip("no etcd binary")
    files = {
        "cert": pki.server.cert,
        "key": pki.server.key,
        "ca": pki.ca_cert,
        "client_cert": pki.client.cert,
        "client_key": pki.client.key,
    }
    server = EtcdServer(tmp_path_factory.mktemp("etcd-tls") / "data", tls=files)
    server.start()
    yield server
    server.stop()


async def test_store_over_tls(tls_etcd: EtcdServer, pki: Pki) -> None:
    url = (
        f"{tls_etcd.url}?prefix=/tls&tlsTrustCertsFilePath={pki.ca_cert}"
        f"&tlsCertificateFilePath={pki.client.cert}&tlsKeyFilePath={pki.client.key}"
    )
    store = open_metadata_store(url)
    try:
        await store.put("/a", b"secret", -1)
        got = await store.get("/a")
        assert got is not None and got.data == b"secret"
    finally:
        await store.close()


@pytest.mark.parametrize("query", ["", "?tlsTrustCertsFilePath={ca}"], ids=["plaintext", "no-client-cert"])
async def test_store_refused_without_tls_or_certificate(tls_etcd: EtcdServer, pki: Pki, query: str) -> None:
    store = open_metadata_store(tls_etcd.url + query.format(ca=pki.ca_cert), op_timeout_seconds=2)
    try:
        with pytest.raises(StoreUnavailableError):
            await store.get("/a")
    finally:
        await store.close()
