"""Typed rows: Pulsar schema info -> Spark columns, and payloads encoded by the official client's schemas."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("fastavro")

import pulsar
from pulsar.schema import Array, AvroSchema, Double, Integer, JsonSchema, Record, String

from magnetar.spark.schemas import TopicSchema


class Order(Record):
    name = String()
    qty = Integer()
    price = Double()
    tags = Array(String())


def _info(schema: object) -> dict[str, object]:
    """What the admin API answers for a topic a producer with this schema created."""
    info = schema.schema_info()  # type: ignore[attr-defined]
    return {"type": str(info.schema_type()).rsplit(".", 1)[-1], "data": info.schema()}


@pytest.mark.parametrize("schema_cls", [JsonSchema, AvroSchema])
def test_record_topics_decode_and_encode(schema_cls: type) -> None:
    client_schema = schema_cls(Order)
    ts = TopicSchema.from_info(_info(client_schema))
    assert ts.is_record
    assert [(f.name, f.dataType.simpleString()) for f in ts.value_fields()] == [
        ("name", "string"),
        ("qty", "int"),
        ("price", "double"),
        ("tags", "array<string>"),
    ]
    payload = client_schema.encode(Order(name="a", qty=2, price=1.5, tags=["x"]))
    row = ts.decode(payload)
    assert row == {"name": "a", "qty": 2, "price": 1.5, "tags": ["x"]}
    back = client_schema.decode(ts.encode(row))
    assert (back.name, back.qty, back.price, back.tags) == ("a", 2, 1.5, ["x"])


def test_primitive_and_raw_topics() -> None:
    assert TopicSchema.from_info(None).value_fields()[0].dataType.simpleString() == "binary"
    assert TopicSchema.from_info({"type": "BYTES"}).decode(b"\x00") == {"value": b"\x00"}
    s = TopicSchema.from_info({"type": "STRING", "data": ""})
    assert s.value_fields()[0].dataType.simpleString() == "string"
    assert s.decode(pulsar.schema.StringSchema().encode("hé")) == {"value": "hé"}
    assert s.encode({"value": "hé"}) == "hé".encode()
    i = TopicSchema.from_info({"type": "INT64"})
    assert i.decode(i.encode({"value": -5})) == {"value": -5}


def test_unsupported_union_is_a_clear_error() -> None:
    definition = {"type": "record", "name": "R", "fields": [{"name": "u", "type": ["int", "string"]}]}
    with pytest.raises(ValueError, match="union"):
        TopicSchema.from_info({"type": "AVRO", "data": json.dumps(definition)}).value_fields()
