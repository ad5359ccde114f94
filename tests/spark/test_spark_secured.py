"""The Spark source and sink against a secured standalone (real PySpark, the official client): TLS-only listeners
(``pulsar+ssl://`` and HTTPS admin calls) trusted through ``pulsar.client.tlsTrustCertsFilePath``, and the
errors users see for a wrong trust file or wrong credentials."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.broker.test_tls import TlsStandalone
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
