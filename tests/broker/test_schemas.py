"""Schema registry: compatibility strategies with the official client's Avro / JSON / String schemas,
refused producers and consumers (IncompatibleSchema), GET_SCHEMA on the wire, and the admin
``/admin/v2/schemas/...`` endpoints over real HTTP."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pulsar
import pytest
from pulsar.schema import AvroSchema, Integer, JsonSchema, Record, String, StringSchema

from magnetar.broker.protocol import pulsar_api_pb2 as pb
from magnetar.broker.schema_compatibility import compatible
from tests.admin.rest import call
from tests.conftest import StandaloneProcess, _quiet_logger
from tests.rawclient import RawClient

T = pb.BaseCommand


# ------------------------------------------------------------------ records (Avro definitions the client sends)
def _user(**fields: object) -> type[Record]:
    """A version of record ``test.User`` (Avro matches records by name, so every version shares it)."""
    return type("User", (Record,), {"_avro_namespace": "test", **fields})


V1 = _user(name=String())
V2 = _user(name=String(), age=Integer(required_default=True))  # optional with a default: compatible both ways
V3 = _user(name=String(), age=Integer(required=True))  # no default: old data cannot be read with it
Renamed = _user(name=Integer(required=True))  # the field changes type: incompatible both ways


def _avro(record: type[Record]) -> tuple[str, bytes, dict[str, str]]:
    return "Avro", AvroSchema(record).schema_info().schema().encode(), {}


def _def(fields: list[dict]) -> tuple[str, bytes, dict[str, str]]:
    return "Avro", json.dumps({"type": "record", "name": "R", "fields": fields}).encode(), {}


A = {"name": "a", "type": "string"}
B_DEFAULT = {"name": "b", "type": "int", "default": 0}
B_REQUIRED = {"name": "b", "type": "int"}


# ------------------------------------------------------------------ the checker alone
@pytest.mark.parametrize(
    ("strategy", "new", "ok"),
    [
        ("BACKWARD", [A, B_DEFAULT], True),
        ("FORWARD", [A, B_DEFAULT], True),
        ("FULL", [A, B_DEFAULT], True),
        ("BACKWARD", [A, B_REQUIRED], False),  # the new reader has no value for b in old data
        ("FORWARD", [A, B_REQUIRED], True),  # old readers skip b
        ("FULL", [A, B_REQUIRED], False),
        ("BACKWARD", [B_DEFAULT], True),  # dropping a: the new reader ignores it
        ("FORWARD", [B_DEFAULT], False),  # old readers need a
        ("BACKWARD", [{"name": "a", "type": "long"}], False),  # long cannot be read as string
        ("FORWARD", [{"name": "a", "type": "bytes"}], True),  # bytes -> string is a promotion
        ("ALWAYS_COMPATIBLE", [{"name": "a", "type": "long"}], True),
        ("ALWAYS_INCOMPATIBLE", [A, B_DEFAULT], False),
    ],
)
def test_avro_rules(strategy: str, new: list[dict], ok: bool) -> None:
    assert (compatible(strategy, _def(new), [_def([A])]) is None) is ok


def test_transitive_strategies_check_every_version() -> None:
    history = [_def([A]), _def([A, B_DEFAULT])]
    new = _def([A, B_REQUIRED])  # can read v2's data (it has b), not v1's (no b, no default)
    assert compatible("BACKWARD", new, history) is None
    assert compatible("BACKWARD_TRANSITIVE", new, history) is not None
    assert compatible("FULL_TRANSITIVE", new, history) is not None
    dropped = _def([B_DEFAULT])  # readable by a v2 whose a has a default, not by one without
    forward_history = [_def([A, B_DEFAULT]), _def([{**A, "default": ""}, B_DEFAULT])]
    assert compatible("FORWARD", dropped, forward_history) is None
    assert compatible("FORWARD_TRANSITIVE", dropped, forward_history) is not None


def test_old_style_json_schemas() -> None:
    old = ("Json", json.dumps({"$schema": "http://json-schema.org/draft-04/schema#", "type": "object"}).encode(), {})
    other = ("Json", json.dumps({"type": "object", "properties": {"a": {"type": "string"}}}).encode(), {})
    avro_json = ("Json", _def([A])[1], {})
    assert compatible("FULL", other, [old]) is None
    assert compatible("FULL", avro_json, [old]) is not None


def test_types_never_change_and_unions_resolve() -> None:
    assert compatible("FULL", ("String", b"", {}), [_def([A])]) is not None
    optional = _def([{"name": "a", "type": ["null", "string"], "default": None}])
    assert compatible("BACKWARD", optional, [_def([A])]) is None  # string fits the union
    assert compatible("FORWARD", optional, [_def([A])]) is not None  # null cannot be read as string
    assert compatible("FULL", ("String", b"", {}), [("String", b"", {})]) is None


# ------------------------------------------------------------------ through the official client
@pytest.fixture
def namespace(standalone: StandaloneProcess) -> Iterator[str]:
    base = f"{standalone.http_url}/admin/v2"
    tenant = f"schema-{uuid.uuid4().hex[:8]}"
    assert call("PUT", f"{base}/tenants/{tenant}", {"allowedClusters": ["standalone"]}).status == 204
    assert call("PUT", f"{base}/namespaces/{tenant}/ns").status == 204
    yield f"{tenant}/ns"
    call("DELETE", f"{base}/tenants/{tenant}?force=true")


def _strategy(standalone: StandaloneProcess, namespace: str, strategy: str) -> None:
    url = f"{standalone.http_url}/admin/v2/namespaces/{namespace}/schemaCompatibilityStrategy"
    assert call("PUT", url, strategy).status == 204


def _topic(namespace: str) -> str:
    return f"persistent://{namespace}/t-{uuid.uuid4().hex[:8]}"


def test_producer_gets_versions_and_incompatible_producer_is_refused(client: pulsar.Client, namespace: str) -> None:
    topic = _topic(namespace)
    p1 = client.create_producer(topic, schema=AvroSchema(V1))
    p1.send(V1(name="one"))
    p2 = client.create_producer(topic, schema=AvroSchema(V2))  # FULL (the default): compatible
    p2.send(V2(name="two", age=2))
    with pytest.raises(pulsar.IncompatibleSchema):
        client.create_producer(topic, schema=AvroSchema(Renamed))
    with pytest.raises(pulsar.IncompatibleSchema):
        client.create_producer(topic, schema=AvroSchema(V3))  # FULL: not backward compatible
    with pytest.raises(pulsar.IncompatibleSchema):
        client.create_producer(topic, schema=StringSchema())  # another type
    consumer = client.subscribe(topic, "s", schema=AvroSchema(V2), initial_position=pulsar.InitialPosition.Earliest)
    got = [consumer.receive(timeout_millis=5000) for _ in range(2)]
    assert [(m.value().name, m.value().age) for m in got] == [("one", None), ("two", 2)]
    # The client stamps each message with the version its producer was given.
    assert [m.schema_version() for m in got] == ["\x00" * 8, "\x00" * 7 + "\x01"]  # str in this client


def test_incompatible_consumer_is_refused_and_does_not_block_the_subscription(
    client: pulsar.Client, namespace: str
) -> None:
    topic = _topic(namespace)
    producer = client.create_producer(topic, schema=JsonSchema(V1))
    producer.send(V1(name="x"))
    for wrong in (AvroSchema(V1), StringSchema(), JsonSchema(Renamed)):
        with pytest.raises(pulsar.IncompatibleSchema):
            client.subscribe(topic, "sub", schema=wrong, initial_position=pulsar.InitialPosition.Earliest)
    consumer = client.subscribe(topic, "sub", schema=JsonSchema(V2), initial_position=pulsar.InitialPosition.Earliest)
    assert consumer.receive(timeout_millis=5000).value().name == "x"


@pytest.mark.parametrize(
    ("strategy", "accepted", "refused"),
    [
        ("BACKWARD", [V2], [V3]),
        ("FORWARD", [V2, V3], [Renamed]),
        ("FULL", [V2], [V3, Renamed]),
        ("ALWAYS_COMPATIBLE", [V3, Renamed], []),
        ("ALWAYS_INCOMPATIBLE", [], [V2, V3]),
        ("BACKWARD_TRANSITIVE", [V2], [V3]),
        ("FORWARD_TRANSITIVE", [V2, V3], [Renamed]),
        ("FULL_TRANSITIVE", [V2], [V3]),
    ],
)
@pytest.mark.parametrize("kind", [AvroSchema, JsonSchema])
def test_evolution_under_each_strategy(
    standalone: StandaloneProcess, client: pulsar.Client, namespace: str, strategy: str, accepted, refused, kind
) -> None:
    _strategy(standalone, namespace, strategy)
    topic = _topic(namespace)
    client.create_producer(topic, schema=kind(V1)).close()
    for record in refused:
        with pytest.raises(pulsar.IncompatibleSchema):
            client.create_producer(topic, schema=kind(record))
    for record in accepted:
        client.create_producer(topic, schema=kind(record)).close()
    url = f"{standalone.http_url}/admin/v2/schemas/{namespace}/{topic.rsplit('/', 1)[1]}/schemas"
    assert len(call("GET", url).json["getSchemaResponses"]) == 1 + len(accepted)


def test_auto_update_off_and_validation_enforced(
    standalone: StandaloneProcess, client: pulsar.Client, namespace: str
) -> None:
    base = f"{standalone.http_url}/admin/v2/namespaces/{namespace}"
    topic = _topic(namespace)
    client.create_producer(topic, schema=AvroSchema(V1)).close()
    client.create_producer(topic).close()  # no schema: allowed until enforced
    assert call("POST", f"{base}/isAllowAutoUpdateSchema", False).status == 204
    assert call("GET", f"{base}/isAllowAutoUpdateSchema").json is False
    with pytest.raises(pulsar.IncompatibleSchema):
        client.create_producer(topic, schema=AvroSchema(V2))
    client.create_producer(topic, schema=AvroSchema(V1)).close()  # a stored schema is still fine
    assert call("POST", f"{base}/schemaValidationEnforced", True).status == 204
    with pytest.raises(pulsar.IncompatibleSchema):
        client.create_producer(topic)


def test_get_schema_on_the_wire(standalone: StandaloneProcess, client: pulsar.Client, namespace: str) -> None:
    topic = _topic(namespace)
    client.create_producer(topic, schema=AvroSchema(V1)).close()
    raw = RawClient(standalone.port)
    try:
        raw.connect()
        cmd = T(type=T.GET_SCHEMA)
        cmd.getSchema.request_id, cmd.getSchema.topic = 7, topic
        raw.send(cmd)
        reply = raw.recv_until(T.GET_SCHEMA_RESPONSE).getSchemaResponse
        assert reply.request_id == 7 and not reply.HasField("error_code")
        assert reply.schema.type == pb.Schema.Avro and reply.schema_version == b"\x00" * 8
        assert json.loads(reply.schema.schema_data)["name"] == "User"
        cmd = T(type=T.GET_OR_CREATE_SCHEMA)
        cmd.getOrCreateSchema.request_id, cmd.getOrCreateSchema.topic = 8, topic
        cmd.getOrCreateSchema.schema.CopyFrom(
            pb.Schema(name="x", type=pb.Schema.Avro, schema_data=AvroSchema(Renamed).schema_info().schema().encode())
        )
        raw.send(cmd)
        reply = raw.recv_until(T.GET_OR_CREATE_SCHEMA_RESPONSE).getOrCreateSchemaResponse
        assert reply.error_code == pb.IncompatibleSchema
        cmd.getOrCreateSchema.request_id = 9
        cmd.getOrCreateSchema.schema.schema_data = AvroSchema(V2).schema_info().schema().encode()
        raw.send(cmd)
        reply = raw.recv_until(T.GET_OR_CREATE_SCHEMA_RESPONSE).getOrCreateSchemaResponse
        assert not reply.HasField("error_code") and reply.schema_version == b"\x00" * 7 + b"\x01"
    finally:
        raw.close()


# ------------------------------------------------------------------ admin endpoints over HTTP
def test_admin_schema_endpoints(standalone: StandaloneProcess, namespace: str) -> None:
    url = f"{standalone.http_url}/admin/v2/schemas/{namespace}/admin-topic"
    v1 = AvroSchema(V1).schema_info().schema()
    assert call("GET", f"{url}/schema").status == 404
    reply = call("POST", f"{url}/schema", {"type": "AVRO", "schema": v1, "properties": {"k": "v"}})
    assert reply.status == 200 and reply.json == {"version": 0}
    got = call("GET", f"{url}/schema").json
    assert got["version"] == 0 and got["type"] == "AVRO" and json.loads(got["data"]) == json.loads(v1)
    assert got["properties"] == {"k": "v"} and got["timestamp"] > 0
    assert call("GET", f"{url}/schema/0").json == got
    assert call("GET", f"{url}/schema/5").status == 404
    payload = {"type": "AVRO", "schema": AvroSchema(Renamed).schema_info().schema()}
    assert call("POST", f"{url}/compatibility", payload).json == {
        "isCompatibility": False,
        "schemaCompatibilityStrategy": "FULL",
    }
    refused = call("POST", f"{url}/schema", payload)
    assert refused.status == 409 and "Incompatible" in refused.reason
    v2 = {"type": "AVRO", "schema": AvroSchema(V2).schema_info().schema()}
    assert call("POST", f"{url}/compatibility", v2).json["isCompatibility"] is True
    assert call("POST", f"{url}/schema", v2).json == {"version": 1}
    assert call("POST", f"{url}/version", v2).json == {"version": 1}
    assert call("POST", f"{url}/version", payload).status == 404
    assert [s["version"] for s in call("GET", f"{url}/schemas").json["getSchemaResponses"]] == [0, 1]
    assert call("POST", f"{url}/schema", {"type": "NOPE", "schema": ""}).status == 400
    assert call("POST", f"{url}/schema", {"type": "AVRO", "schema": "{not json"}).status == 409
    # Deleting leaves a tombstone: the next schema starts a new history, whatever its type.
    assert call("DELETE", f"{url}/schema").json == {"version": 2}
    assert call("GET", f"{url}/schema").status == 404
    assert call("POST", f"{url}/schema", {"type": "STRING", "schema": ""}).json == {"version": 3}
    kv = {"type": "KEY_VALUE", "schema": json.dumps({"key": json.loads(v1), "value": json.loads(v1)}),
          "properties": {"key.schema.type": "AVRO", "value.schema.type": "AVRO"}}  # fmt: skip
    other = f"{standalone.http_url}/admin/v2/schemas/{namespace}/kv-topic"
    assert call("POST", f"{other}/schema", kv).json == {"version": 0}
    assert json.loads(call("GET", f"{other}/schema").json["data"])["key"]["name"] == "User"
    assert call("GET", f"{standalone.http_url}/admin/v2/schemas/nope/nope/t/schema").status == 404


def test_schemas_survive_a_restart(fresh_standalone: StandaloneProcess) -> None:
    node = fresh_standalone
    node.start()
    topic = "persistent://public/default/schema-restart"
    client = pulsar.Client(node.service_url, operation_timeout_seconds=10, logger=_quiet_logger())
    try:
        client.create_producer(topic, schema=AvroSchema(V1)).close()
        client.create_producer(topic, schema=AvroSchema(V2)).close()
    finally:
        client.close()
    node.restart()
    url = f"{node.http_url}/admin/v2/schemas/public/default/schema-restart/schema"
    assert call("GET", url).json["version"] == 1
    client = pulsar.Client(node.service_url, operation_timeout_seconds=10, logger=_quiet_logger())
    try:
        with pytest.raises(pulsar.IncompatibleSchema):
            client.create_producer(topic, schema=AvroSchema(V3))
        producer = client.create_producer(topic, schema=AvroSchema(V1))
        producer.send(V1(name="again"))
    finally:
        client.close()
