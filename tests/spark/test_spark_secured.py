"""The Spark source and sink against secured standalones (real PySpark, the official client): TLS-only listeners
(``pulsar+ssl://`` and HTTPS admin calls) trusted through ``pulsar.client.tlsTrustCertsFilePath``, token
authentication (``pulsar.client.authPluginClassName``/``authParams``, tokens made with PyJWT), and the errors
users see for a wrong trust file or a wrong token."""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from typing import Any

import pulsar
import pytest

from tests.broker.test_tls import TlsStandalone
from tests.conftest import StandaloneProcess, _quiet_logger
from tests.tlsutil import Pki, make_pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("spark-pki"))


@pytest.fixture(scope="module")
def tls_broker(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[TlsStandalone]:
    """TLS only: the plaintext ports are off, so every client and admin call of the source must use TLS."""
    node = TlsStandalone(tmp_path_factory.mktemp("spark-tls") / "data", pki, tls_only=True)
    node.start()
    yield node
    assert node.stop() == 0, node.log()


def _tls_options(broker: TlsStandalone, trust: str) -> dict[str, str]:
    # admin.url is left out: pulsar+ssl://host:port defaults to https://host:8443, so give the test's port.
    return {
        "service.url": broker.tls_url,
        "admin.url": broker.https_url,
        "pulsar.client.tlsTrustCertsFilePath": trust,
    }


def test_read_and_write_over_tls_only(spark: Any, tls_broker: TlsStandalone, pki: Pki, topic_name: str) -> None:
    client = tls_broker.client()
    try:
        producer = client.create_producer(topic_name)
        for i in range(20):
            producer.send(f"m{i}".encode(), partition_key=f"k{i % 3}")
    finally:
        client.close()
    opts = _tls_options(tls_broker, str(pki.ca_cert))
    df = spark.read.format("pulsar").options(**opts, topic=topic_name).load()
    assert sorted(r.value for r in df.select("value").collect()) == sorted(f"m{i}".encode() for i in range(20))
    df.select("value", "__key").write.format("pulsar").options(**opts, topic=f"{topic_name}-copy").mode("append").save()
    copied = spark.read.format("pulsar").options(**opts, topic=f"{topic_name}-copy").load()
    assert copied.count() == 20
    # A stream (commit subscription through the HTTPS admin API) reads it too.
    q = (
        spark.readStream.format("pulsar")
        .options(**opts, topic=f"{topic_name}-copy", startingOffsets="earliest")
        .load()
        .writeStream.format("memory")
        .queryName("secured_copy")
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination(120)
    assert spark.sql("select count(*) c from secured_copy").collect()[0].c == 20


def test_untrusted_broker_is_a_clear_error(
    spark: Any, tls_broker: TlsStandalone, tmp_path: Any, topic_name: str
) -> None:
    other = make_pki(tmp_path)  # a CA the broker's certificate does not come from
    opts = _tls_options(tls_broker, str(other.ca_cert))
    with pytest.raises(Exception, match="CERTIFICATE_VERIFY_FAILED"):
        spark.read.format("pulsar").options(**opts, topic=topic_name).load().collect()
    with pytest.raises(Exception, match="no such file"):
        spark.read.format("pulsar").options(
            **{**opts, "pulsar.client.tlsTrustCertsFilePath": str(tmp_path / "missing.pem")}, topic=topic_name
        ).load()


def test_client_certificate_through_authentication_tls(
    spark: Any, tmp_path_factory: pytest.TempPathFactory, pki: Pki, topic_name: str
) -> None:
    """A broker requiring client certificates: AuthenticationTls's files serve the binary protocol and HTTPS."""
    node = TlsStandalone(
        tmp_path_factory.mktemp("spark-mtls") / "data", pki, tls_only=True, tlsRequireTrustedClientCertOnConnect="true"
    )
    node.start()
    try:
        client = node.client(
            authentication=pulsar.AuthenticationTLS(str(pki.client.cert), str(pki.client.key)), logger=_quiet_logger()
        )
        try:
            client.create_producer(topic_name).send(b"mtls")
        finally:
            client.close()
        opts = {
            **_tls_options(node, str(pki.ca_cert)),
            "pulsar.client.authPluginClassName": "org.apache.pulsar.client.impl.auth.AuthenticationTls",
            "pulsar.client.authParams": f"tlsCertFile:{pki.client.cert},tlsKeyFile:{pki.client.key}",
        }
        rows = spark.read.format("pulsar").options(**opts, topic=topic_name).load().select("value").collect()
        assert [r.value for r in rows] == [b"mtls"]
    finally:
        assert node.stop() == 0, node.log()


# ---------------------------------------------------------------------------------------------- token auth
TOKEN_CLASS = "org.apache.pulsar.client.impl.auth.AuthenticationToken"
SECRET = b"spark-test-secret-key-of-32-bytes!!"


def _token(subject: str, key: bytes = SECRET) -> str:
    import jwt

    return jwt.encode({"sub": subject}, key, algorithm="HS256")


@pytest.fixture(scope="module")
def token_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneProcess]:
    node = StandaloneProcess(
        tmp_path_factory.mktemp("spark-token") / "data",
        {
            "authenticationEnabled": "true",
            "authenticationProviders": "org.apache.pulsar.broker.authentication.AuthenticationProviderToken",
            "tokenSecretKey": "data:;base64," + base64.b64encode(SECRET).decode(),
        },
    )
    node.start()
    yield node
    assert node.stop() == 0, node.log()


def _token_options(broker: StandaloneProcess, client_token: str, admin_token: str | None = None) -> dict[str, str]:
    opts = {
        "service.url": broker.service_url,
        "admin.url": broker.http_url,
        "pulsar.client.authPluginClassName": TOKEN_CLASS,
        "pulsar.client.authParams": f"token:{client_token}",
        "pulsar.client.operationTimeoutSeconds": "10",
    }
    if admin_token is not None:
        opts.update({"pulsar.admin.authPluginClassName": "token", "pulsar.admin.authParams": admin_token})
    return opts


def test_read_and_write_with_token(token_broker: StandaloneProcess, spark: Any, topic_name: str) -> None:
    client = pulsar.Client(
        token_broker.service_url, authentication=pulsar.AuthenticationToken(_token("producer")), logger=_quiet_logger()
    )
    try:
        producer = client.create_producer(topic_name)
        for i in range(10):
            producer.send(f"t{i}".encode())
    finally:
        client.close()
    opts = _token_options(token_broker, _token("spark"))
    df = spark.read.format("pulsar").options(**opts, topic=topic_name).load()
    assert sorted(r.value for r in df.select("value").collect()) == sorted(f"t{i}".encode() for i in range(10))
    df.select("value").write.format("pulsar").options(**opts, topic=f"{topic_name}-copy").mode("append").save()
    assert spark.read.format("pulsar").options(**opts, topic=f"{topic_name}-copy").load().count() == 10


def test_wrong_token_is_a_clear_error_not_a_hang(token_broker: StandaloneProcess, spark: Any, topic_name: str) -> None:
    client = pulsar.Client(
        token_broker.service_url, authentication=pulsar.AuthenticationToken(_token("producer")), logger=_quiet_logger()
    )
    try:
        client.create_producer(topic_name).send(b"x")
    finally:
        client.close()
    wrong = _token("spark", key=b"another-key-another-key-another-key")
    started = time.monotonic()
    # Admin calls (planning) refused: the broker's 401 reason.
    with pytest.raises(Exception, match="HTTP 401"):
        spark.read.format("pulsar").options(**_token_options(token_broker, wrong), topic=topic_name).load().collect()
    # Admin calls accepted, the binary protocol refused: the executors' client fails, the query with it.
    opts = _token_options(token_broker, wrong, admin_token=_token("admin"))
    with pytest.raises(Exception, match=r"the broker refused the client.s credentials .*HTTP 401"):
        spark.read.format("pulsar").options(**opts, topic=topic_name).load().collect()
    rows = spark.createDataFrame([(b"v",)], "value binary")
    with pytest.raises(Exception, match=r"the broker refused the client.s credentials .*HTTP 401"):
        rows.write.format("pulsar").options(**opts, topic=topic_name).mode("append").save()
    assert time.monotonic() - started < 120
