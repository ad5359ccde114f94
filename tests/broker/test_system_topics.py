"""System topics: ``__change_events`` receives topic-policy events (readable, compactable), system
topics are hidden from listings and patterns and cannot be created through the admin API."""

from __future__ import annotations

import json
import time
import uuid

import pulsar
import pytest

from magnetar.broker.protocol import pulsar_api_pb2 as pb
from magnetar.broker.system_topics import is_system_topic
from tests.admin.rest import call
from tests.broker.test_compaction import compact, read_all
from tests.conftest import StandaloneProcess
from tests.rawclient import RawClient

T = pb.BaseCommand


@pytest.mark.parametrize(
    ("name", "system"),
    [
        ("persistent://t/ns/__change_events", True),
        ("persistent://t/ns/__change_events-partition-0", True),
        ("persistent://t/ns/__transaction_buffer_snapshot", True),
        ("persistent://t/ns/orders-sub-__transaction_pending_ack", True),
        ("persistent://t/ns/__mine", False),
        ("persistent://t/ns/change_events", False),
    ],
)
def test_system_topic_names(name: str, system: bool) -> None:
    assert is_system_topic(name) is system


@pytest.fixture
def namespace(standalone: StandaloneProcess):
    base = f"{standalone.http_url}/admin/v2"
    tenant = f"sys-{uuid.uuid4().hex[:8]}"
    assert call("PUT", f"{base}/tenants/{tenant}", {"allowedClusters": ["standalone"]}).status == 204
    assert call("PUT", f"{base}/namespaces/{tenant}/ns").status == 204
    yield f"{tenant}/ns"
    call("DELETE", f"{base}/tenants/{tenant}?force=true")


def test_topic_policy_events_are_written_hidden_and_compactable(
    standalone: StandaloneProcess, client: pulsar.Client, namespace: str
) -> None:
    base = f"{standalone.http_url}/admin/v2"
    for name in ("a", "b"):
        assert call("PUT", f"{base}/persistent/{namespace}/{name}").status == 204
    assert call("PUT", f"{base}/persistent/{namespace}/__change_events").status == 400
    assert call("PUT", f"{base}/persistent/{namespace}/__change_events/partitions", 2).status == 400
    assert call("POST", f"{base}/persistent/{namespace}/a/messageTTL?messageTTL=60").status == 204
    assert call("POST", f"{base}/persistent/{namespace}/b/messageTTL?messageTTL=30").status == 204
    assert call("POST", f"{base}/persistent/{namespace}/a/messageTTL?messageTTL=90").status == 204
    assert call("DELETE", f"{base}/persistent/{namespace}/b/messageTTL").status == 204
    events = f"persistent://{namespace}/__change_events"
    a, b = (f"persistent://{namespace}/{t}" for t in "ab")
    latest: dict[str, bytes] = {}
    for _ in range(100):  # events are written in the background
        reader = client.create_reader(events, pulsar.MessageId.earliest)
        got = read_all(reader)
        reader.close()
        latest = dict(got)
        if (
            b in latest
            and latest[b] == b""
            and json.loads(latest[a])["topicPoliciesEvent"]["policies"] == {"messageTTLInSeconds": 90}
        ):
            break
        time.sleep(0.05)
    assert {key for key, _ in got} == {a, b} and len(got) >= 4
    first = json.loads(got[0][1])
    assert first["eventType"] == "TOPIC_POLICY" and first["actionType"] == "UPDATE"
    assert first["topicPoliciesEvent"]["topic"] == "a"
    assert first["topicPoliciesEvent"]["policies"]["messageTTLInSeconds"] == 60
    assert latest[b] == b""  # b has no policy left: a tombstone

    # Hidden from listings (admin and binary protocol) unless asked for.
    listed = call("GET", f"{base}/persistent/{namespace}").json
    assert events not in listed and f"persistent://{namespace}/a" in listed
    assert events in call("GET", f"{base}/persistent/{namespace}?includeSystemTopic=true").json
    raw = RawClient(standalone.port)
    try:
        raw.connect()
        cmd = T(type=T.GET_TOPICS_OF_NAMESPACE)
        cmd.getTopicsOfNamespace.request_id, cmd.getTopicsOfNamespace.namespace = 5, namespace
        raw.send(cmd)
        topics = raw.recv_until(T.GET_TOPICS_OF_NAMESPACE_RESPONSE).getTopicsOfNamespaceResponse.topics
        assert a in topics and events not in topics
    finally:
        raw.close()

    # Compaction keeps one event per topic: a's latest; b's tombstone removes it.
    assert compact(standalone, events)["status"] == "SUCCESS"
    reader = client.create_reader(events, pulsar.MessageId.earliest, is_read_compacted=True)
    compacted = read_all(reader)
    reader.close()
    assert len(compacted) == 1 and compacted[0][0] == f"persistent://{namespace}/a"
    assert json.loads(compacted[0][1])["topicPoliciesEvent"]["policies"]["messageTTLInSeconds"] == 90
