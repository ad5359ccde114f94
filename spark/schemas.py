"""Typed rows for topics with a schema: Pulsar schema info -> Spark columns, payload <-> column values.

Like StreamNative's connector: a JSON or Avro topic's record fields become top-level columns, a primitive
topic's ``value`` column gets the primitive's type, and schemaless/BYTES topics keep ``value`` as raw bytes.
JSON and Avro schemas carry an Avro record definition (``data`` of the schema info); Avro payloads are
schemaless Avro binary, JSON payloads UTF-8 JSON objects, primitives big-endian as Pulsar encodes them.
"""

from __future__ import annotations

import io
import json
import struct
from dataclasses import dataclass
from typing import Any

#: Schema types read as raw ``value`` bytes.
RAW = "BYTES"
RECORD_KINDS = ("JSON", "AVRO")
#: Primitive schema type -> (struct format or None for text/bytes, Spark type name).
PRIMITIVES: dict[str, tuple[str | None, str]] = {
    "STRING": (None, "string"),
    "BOOLEAN": ("?", "boolean"),
    "INT8": (">b", "byte"),
    "INT16": (">h", "short"),
    "INT32": (">i", "integer"),
    "INT64": (">q", "long"),
    "FLOAT": (">f", "float"),
    "DOUBLE": (">d", "double"),
    "TIMESTAMP": (">q", "timestamp"),
}
_AVRO_PRIMITIVES = {
    "boolean": "boolean",
    "int": "integer",
    "long": "long",
    "float": "float",
    "double": "double",
    "bytes": "binary",
    "string": "string",
}


def avro_to_spark(avro: Any, named: dict[str, Any] | None = None) -> Any:
    """An Avro type -> a Spark DataType (``["null", T]`` unions are nullable T)."""
    from pyspark.sql import types as st

    named = {} if named is None else named
    simple = {
        "boolean": st.BooleanType(),
        "integer": st.IntegerType(),
        "long": st.LongType(),
        "float": st.FloatType(),
        "double": st.DoubleType(),
        "binary": st.BinaryType(),
        "string": st.StringType(),
    }
    if isinstance(avro, list):
        branches = [b for b in avro if b != "null"]
        if len(branches) != 1:
            raise ValueError(f"Avro union {avro!r} has no Spark type (only [null, T] unions are supported)")
        return avro_to_spark(branches[0], named)
    if isinstance(avro, str):
        if avro in _AVRO_PRIMITIVES:
            return simple[_AVRO_PRIMITIVES[avro]]
        if avro in named:
            return named[avro]
        raise ValueError(f"unknown Avro type {avro!r}")
    kind, logical = avro.get("type"), avro.get("logicalType")
    if logical in ("timestamp-millis", "timestamp-micros"):
        return st.TimestampType()
    if logical == "date":
        return st.DateType()
    if kind == "record":
        fields = []
        out = st.StructType()
        named[avro["name"]] = out  # recursive references resolve to the (filled below) struct
        for f in avro["fields"]:
            t = f["type"]
            nullable = isinstance(t, list) and "null" in t
            fields.append(st.StructField(f["name"], avro_to_spark(t, named), nullable))
        for f in fields:
            out.add(f)
        return out
    if kind == "array":
        return st.ArrayType(avro_to_spark(avro["items"], named))
    if kind == "map":
        return st.MapType(st.StringType(), avro_to_spark(avro["values"], named))
    if kind == "enum":
        return st.StringType()
    if kind == "fixed":
        return st.BinaryType()
    return avro_to_spark(kind, named)


@dataclass(frozen=True)
class TopicSchema:
    """A topic's schema as the source and sink use it; ``kind`` is Pulsar's schema type name."""

    kind: str = RAW
    definition: dict[str, Any] | None = None

    @classmethod
    def from_info(cls, info: dict[str, Any] | None) -> TopicSchema:
        """From the admin API's ``GET /admin/v2/schemas/.../schema`` answer (None: no schema -> raw bytes)."""
        if not info:
            return cls()
        kind = str(info.get("type", RAW)).upper()
        if kind in RECORD_KINDS:
            data = info.get("data") or "{}"
            return cls(kind, json.loads(data) if isinstance(data, str) else data)
        if kind in PRIMITIVES:
            return cls(kind)
        return cls()

    @property
    def is_record(self) -> bool:
        return self.kind in RECORD_KINDS

    def value_fields(self) -> list[Any]:
        """The Spark fields holding the payload: the record's fields, or one ``value`` column."""
        from pyspark.sql import types as st

        if self.is_record:
            struct = avro_to_spark(self.definition)
            return list(struct.fields)
        if self.kind in PRIMITIVES:
            spark_type = {
                "string": st.StringType(),
                "boolean": st.BooleanType(),
                "byte": st.ByteType(),
                "short": st.ShortType(),
                "integer": st.IntegerType(),
                "long": st.LongType(),
                "float": st.FloatType(),
                "double": st.DoubleType(),
                "timestamp": st.TimestampType(),
            }[PRIMITIVES[self.kind][1]]
            return [st.StructField("value", spark_type, True)]
        return [st.StructField("value", st.BinaryType(), True)]

    def decode(self, payload: bytes) -> dict[str, Any]:
        """A payload -> ``{column: value}`` for :meth:`value_fields`."""
        if self.kind == "JSON":
            record = json.loads(payload)
            return {f["name"]: _from_json(record.get(f["name"]), f["type"]) for f in self._fields()}
        if self.kind == "AVRO":
            import fastavro

            record = fastavro.schemaless_reader(io.BytesIO(payload), self._parsed(), None)
            return dict(record)  # type: ignore[arg-type]
        if self.kind == "STRING":
            return {"value": payload.decode("utf-8")}
        if self.kind in PRIMITIVES:
            fmt = PRIMITIVES[self.kind][0]
            assert fmt is not None
            (value,) = struct.unpack(fmt, payload)
            return {"value": value * 1000 if self.kind == "TIMESTAMP" else value}  # ms -> Arrow's us
        return {"value": payload}

    def encode(self, row: dict[str, Any]) -> bytes:
        """Row columns -> a payload in this schema (the sink)."""
        if self.kind == "JSON":
            return json.dumps({f["name"]: _to_json(row.get(f["name"])) for f in self._fields()}).encode()
        if self.kind == "AVRO":
            import fastavro

            out = io.BytesIO()
            fastavro.schemaless_writer(out, self._parsed(), {f["name"]: row.get(f["name"]) for f in self._fields()})
            return out.getvalue()
        value: Any = row.get("value")
        if self.kind == "STRING":
            return value.encode() if isinstance(value, str) else bytes(value)
        if self.kind in PRIMITIVES and not isinstance(value, bytes | bytearray):
            fmt = PRIMITIVES[self.kind][0]
            assert fmt is not None
            return struct.pack(fmt, value)
        return value.encode() if isinstance(value, str) else bytes(value)

    def pulsar_schema(self) -> Any:
        """A ``pulsar.schema.Schema`` declaring this schema on a producer while sending encoded bytes."""
        import _pulsar
        from pulsar.schema import BytesSchema, Schema

        if not self.is_record:
            return BytesSchema()
        schema_type = getattr(_pulsar.SchemaType, self.kind)
        definition = self.definition

        class Declared(Schema):
            def __init__(self) -> None:
                super().__init__(bytes, schema_type, definition, self.__class__.__name__)

            def encode(self, obj: bytes) -> bytes:
                return obj

            def decode(self, data: bytes) -> bytes:
                return data

        return Declared()

    def _fields(self) -> list[dict[str, Any]]:
        return list((self.definition or {}).get("fields", []))

    def _parsed(self) -> Any:
        import fastavro

        return fastavro.parse_schema(self.definition or {})


def _logical(avro: Any) -> str | None:
    if isinstance(avro, list):
        branches = [b for b in avro if b != "null"]
        return _logical(branches[0]) if len(branches) == 1 else None
    return avro.get("logicalType") if isinstance(avro, dict) else None


def _from_json(value: Any, avro: Any) -> Any:
    """JSON numbers for timestamp fields are epoch ms (Pulsar's JSON schema); Arrow wants us."""
    if value is not None and _logical(avro) == "timestamp-millis":
        return int(value) * 1000
    return value


def _to_json(value: Any) -> Any:
    import datetime as dt

    if isinstance(value, dt.datetime):
        return int(value.timestamp() * 1000)
    if isinstance(value, bytes | bytearray):
        return value.decode("latin-1")
    if isinstance(value, dict):
        return {k: _to_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_to_json(v) for v in value]
    if hasattr(value, "asDict"):
        return {k: _to_json(v) for k, v in value.asDict().items()}
    return value
