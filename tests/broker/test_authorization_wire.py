"""Authorization on the binary protocol, with the official client: roles refused outside their grants,
revocation reaching live producers and consumers, subscription permissions and the Prefix auth mode."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pulsar
import pytest

from magnetar.broker.protocol import pulsar_api_pb2 as pb
from tests.authz_broker import SUPERUSER, AuthzBroker, running_with_tenants
from tests.rawclient import RawClient

T = pb.BaseCommand


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuthzBroker]:
    yield from running_with_tenants(tmp_path_factory.mktemp("authz-wire") / "data")


def _unique(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _grant(broker: AuthzBroker, namespace: str, role: str, actions: list[str]) -> None:
    reply = broker.rest(SUPERUSER, "POST", f"/admin/v2/namespaces/{namespace}/permissions/{role}", actions)
    assert reply.status == 204, reply.body


def _revoke(broker: AuthzBroker, namespace: str, role: str) -> None:
    assert broker.rest(SUPERUSER, "DELETE", f"/admin/v2/namespaces/{namespace}/permissions/{role}").status == 204


def test_role_refused_on_another_tenants_topic(broker: AuthzBroker) -> None:
    role = _unique("alice")
    _grant(broker, "acme/ns", role, ["produce", "consume"])
    client = broker.client(role)
    try:
        own = f"persistent://acme/ns/{_unique()}"
        client.create_producer(own).send(b"mine")
        client.subscribe(own, "s").close()
        # Another tenant's namespace, and a tenant that does not exist: the same refusal, nothing revealed.
        for topic in (f"persistent://globex/ns/{_unique()}", f"persistent://ghost/ns/{_unique()}"):
            with pytest.raises(pulsar.AuthorizationError):
                client.create_producer(topic)
            with pytest.raises(pulsar.AuthorizationError):
                client.subscribe(topic, "s")
    finally:
        client.close()


def test_wire_errors_are_authorization_errors(broker: AuthzBroker) -> None:
    """LOOKUP, PARTITIONED_METADATA, PRODUCER, SUBSCRIBE and GET_TOPICS_OF_NAMESPACE answer AuthorizationError."""
    raw = RawClient(broker.port)
    try:
        connect = T(type=T.CONNECT)
        connect.connect.client_version = "raw"
        connect.connect.protocol_version = 20
        connect.connect.auth_method_name = "token"
        connect.connect.auth_data = broker.token(_unique("nobody")).encode()
        raw.send(connect)
        raw.recv_until(T.CONNECTED)
        topic = "persistent://globex/ns/secret"

        answer = raw.lookup(topic, request_id=1)
        assert answer.lookupTopicResponse.response == pb.CommandLookupTopicResponse.Failed
        assert answer.lookupTopicResponse.error == pb.AuthorizationError
        assert answer.lookupTopicResponse.message == "Client is not authorized to Lookup"

        meta = T(type=T.PARTITIONED_METADATA)
        meta.partitionMetadata.topic = topic
        meta.partitionMetadata.request_id = 2
        raw.send(meta)
        reply = raw.recv_until(T.PARTITIONED_METADATA_RESPONSE)
        assert reply.partitionMetadataResponse.error == pb.AuthorizationError

        producer = raw.create_producer(topic, producer_id=1, request_id=3)
        assert producer.type == T.ERROR and producer.error.error == pb.AuthorizationError
        assert producer.error.message == "Client is not authorized to Produce"

        listing = T(type=T.GET_TOPICS_OF_NAMESPACE)
        listing.getTopicsOfNamespace.namespace = "globex/ns"
        listing.getTopicsOfNamespace.request_id = 4
        raw.send(listing)
        refused = raw.recv_until_response(4)
        assert refused.type == T.ERROR and refused.error.error == pb.AuthorizationError

        watch = T(type=T.WATCH_TOPIC_LIST)
        watch.watchTopicList.namespace = "globex/ns"
        watch.watchTopicList.watcher_id = 1
        watch.watchTopicList.request_id = 5
        watch.watchTopicList.topics_pattern = "persistent://globex/ns/.*"
        raw.send(watch)
        refused = raw.recv_until_response(5)
        assert refused.type == T.ERROR and refused.error.error == pb.AuthorizationError

        schema = T(type=T.GET_SCHEMA)
        schema.getSchema.topic = topic
        schema.getSchema.request_id = 6
        raw.send(schema)
        answer = raw.recv_until(T.GET_SCHEMA_RESPONSE)
        assert answer.getSchemaResponse.error_code == pb.AuthorizationError
        assert not raw.is_closed(timeout=0.2)  # refusals keep the connection
    finally:
        raw.close()


def _wait(condition: object, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return True
        time.sleep(0.1)
    return False


def test_grant_then_revoke_on_live_producer_and_consumer(broker: AuthzBroker) -> None:
    role = _unique("app")
    topic = f"persistent://acme/ns/{_unique()}"
    _grant(broker, "acme/ns", role, ["produce", "consume"])
    client = broker.client(role)
    admin = broker.client(SUPERUSER)
    try:
        producer = client.create_producer(topic, send_timeout_millis=3000, batching_enabled=False)
        consumer = client.subscribe(topic, "live")
        producer.send(b"before")
        assert consumer.receive(5000).data() == b"before"

        _revoke(broker, "acme/ns", role)

        # The broker disconnects both; the client's reconnection is refused, so sends fail...
        def send_fails() -> bool:
            try:
                producer.send(b"after")
            except pulsar.PulsarException:
                return True
            return False

        assert _wait(send_fails, 15)
        # ...and the consumer is gone from the subscription: nothing more reaches it.
        stats_path = "/admin/v2/persistent/" + topic.removeprefix("persistent://") + "/stats"

        def consumer_gone() -> bool:
            stats = broker.rest(SUPERUSER, "GET", stats_path).json
            return not stats["subscriptions"]["live"]["consumers"]

        assert _wait(consumer_gone)
        admin.create_producer(topic).send(b"from-root")
        with pytest.raises(pulsar.Timeout):
            consumer.receive(1500)

        # Granted again: new producers and consumers work (the old ones were given up).
        _grant(broker, "acme/ns", role, ["produce", "consume"])
        fresh = broker.client(role)
        try:
            fresh.create_producer(topic).send(b"again")
        finally:
            fresh.close()
    finally:
        client.close()
        admin.close()


def test_namespace_vs_topic_permissions(broker: AuthzBroker) -> None:
    role = _unique("bob")
    granted = f"persistent://acme/ns/{_unique()}"
    other = f"persistent://acme/ns/{_unique()}"
    path = "/admin/v2/persistent/" + granted.removeprefix("persistent://") + f"/permissions/{role}"
    assert broker.rest("acme-admin", "POST", path, ["produce"]).status == 204
    client = broker.client(role)
    try:
        client.create_producer(granted).send(b"ok")
        with pytest.raises(pulsar.AuthorizationError):
            client.create_producer(other)
        with pytest.raises(pulsar.AuthorizationError):
            client.subscribe(granted, "s")  # produce only
        # A namespace grant covers every topic of the namespace.
        _grant(broker, "acme/ns", role, ["produce"])
        client.create_producer(other).send(b"ok too")
    finally:
        client.close()


def test_subscription_roles_and_prefix_mode(broker: AuthzBroker) -> None:
    broker.rest(SUPERUSER, "PUT", "/admin/v2/namespaces/acme/prefixed")
    alice, bob = _unique("alice"), _unique("bob")
    for role in (alice, bob):
        _grant(broker, "acme/prefixed", role, ["consume"])
    topic = f"persistent://acme/prefixed/{_unique()}"
    reply = broker.rest("acme-admin", "POST", "/admin/v2/namespaces/acme/prefixed/permissions/subscription/billing",
                        [alice])  # fmt: skip
    assert reply.status == 204
    a, b = broker.client(alice), broker.client(bob)
    try:
        a.subscribe(topic, "billing").close()
        with pytest.raises(pulsar.AuthorizationError):
            b.subscribe(topic, "billing")
        b.subscribe(topic, "reports").close()

        mode = "/admin/v2/namespaces/acme/prefixed/subscriptionAuthMode"
        assert broker.rest("acme-admin", "POST", mode, "Prefix").status == 204
        with pytest.raises(pulsar.AuthorizationError):
            b.subscribe(topic, "reports")
        b.subscribe(topic, f"{bob}-reports").close()
    finally:
        a.close()
        b.close()


def test_tenant_admin_and_superuser(broker: AuthzBroker) -> None:
    admin, root = broker.client("acme-admin"), broker.client(SUPERUSER)
    try:
        admin.create_producer(f"persistent://acme/ns/{_unique()}").send(b"admin")
        with pytest.raises(pulsar.AuthorizationError):
            admin.create_producer(f"persistent://globex/ns/{_unique()}")
        for tenant in ("acme", "globex"):
            root.create_producer(f"persistent://{tenant}/ns/{_unique()}").send(b"root")
    finally:
        admin.close()
        root.close()
