"""Namespace bundles on a standalone broker (it owns every bundle): list, split and unload as Pulsar's paths."""

from __future__ import annotations

import uuid

import pulsar

from magnetar.broker.bundles import Bundle, bundles_of, find_bundle, split_boundaries, topic_hash
from tests.admin.rest import call
from tests.conftest import StandaloneProcess


def test_bundle_hash_is_crc32_of_the_full_topic_name() -> None:
    # Guava's Hashing.crc32() is java.util.zip.CRC32 (IEEE): its standard check value.
    assert topic_hash("123456789") == 0xCBF43926
    assert topic_hash("persistent://public/default/my-topic") == 0x2BAD45F7
    bundles = bundles_of("public/default", ["0x00000000", "0x40000000", "0x80000000", "0xc0000000", "0xffffffff"])
    assert [b.range for b in bundles][:2] == ["0x00000000_0x40000000", "0x40000000_0x80000000"]
    assert find_bundle(bundles, "persistent://public/default/my-topic").range == "0x00000000_0x40000000"
    last = Bundle.parse("a/b", "0xc0000000_0xffffffff")
    assert last.contains(0xFFFFFFFF) and not bundles[0].contains(0x40000000)
    halves = split_boundaries(["0x00000000", "0xffffffff"], Bundle.parse("a/b", "0x00000000_0xffffffff"))
    assert halves == ["0x00000000", "0x7fffffff", "0xffffffff"]


def test_list_split_and_unload_bundles(standalone: StandaloneProcess) -> None:
    ns = f"public/b{uuid.uuid4().hex[:8]}"
    base = f"{standalone.http_url}/admin/v2/namespaces/{ns}"
    assert call("PUT", base, {"bundles": {"numBundles": 4}}).status == 204
    listed = call("GET", f"{base}/bundles").json
    assert listed == {"boundaries": ["0x00000000", "0x40000000", "0x80000000", "0xc0000000", "0xffffffff"],
                      "numBundles": 4}  # fmt: skip

    topic = f"persistent://{ns}/t"
    bundle = find_bundle(bundles_of(ns, listed["boundaries"]), topic)
    client = pulsar.Client(standalone.service_url, operation_timeout_seconds=10,
                           logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))  # fmt: skip
    try:
        consumer = client.subscribe(topic, "s")
        producer = client.create_producer(topic)
        producer.send(b"one")
        assert call("PUT", f"{base}/{bundle.range}/unload").status == 204  # clients reconnect
        producer.send(b"two")
        assert [consumer.receive(timeout_millis=10_000).data() for _ in range(2)] == [b"one", b"two"]

        reply = call("PUT", f"{base}/{bundle.range}/split?unload=false&splitAlgorithmName=range_equally_divide")
        assert reply.status == 204, reply
        after = call("GET", f"{base}/bundles").json
        assert after["numBundles"] == 5
        assert f"0x{bundle.lower + (bundle.upper - bundle.lower) // 2:08x}" in after["boundaries"]
        producer.send(b"three")
        assert consumer.receive(timeout_millis=10_000).data() == b"three"
    finally:
        client.close()
    assert call("PUT", f"{base}/0x00000000_0x00000010/unload").status == 404
    assert call("PUT", f"{base}/{bundle.range}/split?splitAlgorithmName=nope").status in (404, 412)
    assert call("PUT", f"{base}/unload").status == 204
    assert (
        call("PUT", f"{standalone.http_url}/admin/v2/namespaces/public/nope-{uuid.uuid4().hex[:6]}/unload").status
        == 404
    )
