"""TLS client certificates as credentials (``AuthenticationProviderTls``): the role is the certificate's CN, on
``pulsar+ssl://`` with the official client's ``AuthenticationTLS`` and on HTTPS; no certificate, no entry."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator

import pulsar
import pytest

from tests.auth.test_authentication import produce_consume, producer_refused
from tests.broker.test_tls import TlsStandalone
from tests.conftest import _quiet_logger
from tests.tlsutil import Pki, make_pki


class AuthTlsStandalone(TlsStandalone):
    def healthy(self) -> bool:  # the admin API needs credentials here: probe the open /status.html
        try:
            with urllib.request.urlopen(f"{self.https_url}/status.html", timeout=1, context=self.client_context()) as r:
                return r.status == 200
        except OSError:
            return False


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"), client_cn="svc-orders")


@pytest.fixture(scope="module")
def mtls_broker(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[AuthTlsStandalone]:
    node = AuthTlsStandalone(
        tmp_path_factory.mktemp("mtls") / "data",
        pki,
        authenticationEnabled="true",
        authenticationProviders="org.apache.pulsar.broker.authentication.AuthenticationProviderTls",
    )
    node.start()
    yield node
    assert node.stop() == 0, node.log()


def _https(node: AuthTlsStandalone, path: str, ctx: ssl.SSLContext) -> int:
    try:
        with urllib.request.urlopen(node.https_url + path, timeout=10, context=ctx) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_client_certificate_is_the_role(mtls_broker: AuthTlsStandalone, pki: Pki, topic_name: str) -> None:
    client = pulsar.Client(
        mtls_broker.tls_url,
        tls_trust_certs_file_path=str(pki.ca_cert),
        authentication=pulsar.AuthenticationTLS(str(pki.client.cert), str(pki.client.key)),
        operation_timeout_seconds=15,
        logger=_quiet_logger(),
    )
    produce_consume(client, topic_name)
    assert "authenticated as role svc-orders (tls)" in mtls_broker.log_path.read_text(errors="replace")


def test_tls_without_client_certificate_refused(mtls_broker: AuthTlsStandalone, pki: Pki, topic_name: str) -> None:
    client = pulsar.Client(
        mtls_broker.tls_url,
        tls_trust_certs_file_path=str(pki.ca_cert),
        operation_timeout_seconds=3,
        logger=_quiet_logger(),
    )
    producer_refused(client, topic_name)


def test_https_admin_with_and_without_client_certificate(mtls_broker: AuthTlsStandalone) -> None:
    assert _https(mtls_broker, "/admin/v2/tenants", mtls_broker.client_context(with_cert=True)) == 200
    assert _https(mtls_broker, "/admin/v2/tenants", mtls_broker.client_context(with_cert=False)) == 401
    with urllib.request.urlopen(
        mtls_broker.https_url + "/admin/v2/tenants", timeout=10, context=mtls_broker.client_context()
    ) as r:
        assert "public" in json.loads(r.read())
