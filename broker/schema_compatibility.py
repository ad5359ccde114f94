"""Schema compatibility checking, as Pulsar's broker applies it to producers, consumers and the admin API.

A *strategy* says which stored versions a new schema is checked against and in which direction:

- ``BACKWARD``: the new schema can read data written with the latest version (``_TRANSITIVE``: with
  every version); ``FORWARD``: the stored version(s) can read data written with the new schema;
  ``FULL``: both. ``ALWAYS_COMPATIBLE`` accepts anything, ``ALWAYS_INCOMPATIBLE`` only a schema
  already stored.

AVRO, JSON and PROTOBUF schema data are Avro record definitions in Pulsar (the clients' JSON and
protobuf schemas are described with Avro), so one checker applies the Avro schema-resolution rules
(`fastavro` parses and validates the definitions; the reader/writer rules are Avro's specification).
KEY_VALUE data holds two length-prefixed component schemas, each checked on its own. Other types
(STRING, BYTES, the primitives) are compatible only with the same type. Types never change.
"""

from __future__ import annotations

import json
import struct
from typing import Any

from magnetar.broker.errors import BrokerError
from magnetar.broker.protocol import pulsar_api_pb2 as pb

STRATEGIES = (
    "ALWAYS_COMPATIBLE",
    "ALWAYS_INCOMPATIBLE",
    "BACKWARD",
    "FORWARD",
    "FULL",
    "BACKWARD_TRANSITIVE",
    "FORWARD_TRANSITIVE",
    "FULL_TRANSITIVE",
)
#: Types whose data is an Avro definition.
AVRO_BASED = frozenset({"Avro", "Json", "Protobuf"})

_LEN = struct.Struct(">i")
_PROMOTIONS = {
    "int": {"long", "float", "double"},
    "long": {"float", "double"},
    "float": {"double"},
    "string": {"bytes"},
    "bytes": {"string"},
}
_NAMED = ("record", "enum", "fixed", "error")


class IncompatibleSchemaError(BrokerError):
    """A schema the topic's compatibility strategy refuses (Pulsar's ``IncompatibleSchema``)."""

    code = pb.IncompatibleSchema
    http_status = 409  # the admin API's Conflict, as Pulsar


class InvalidSchemaError(ValueError):
    """Schema data that does not parse as its type requires."""


def split_key_value(data: bytes) -> tuple[bytes, bytes]:
    """The key and value schema data of a KEY_VALUE schema (two ``[len i32][bytes]`` parts)."""
    try:
        (klen,) = _LEN.unpack_from(data, 0)
        key = data[4 : 4 + max(klen, 0)]
        (vlen,) = _LEN.unpack_from(data, 4 + max(klen, 0))
        start = 8 + max(klen, 0)
        value = data[start : start + max(vlen, 0)]
    except struct.error:
        raise InvalidSchemaError("KEY_VALUE schema data must hold two length-prefixed schemas") from None
    return key, value


def parse_avro(data: bytes) -> Any:
    """The Avro definition in ``data`` (JSON), validated by fastavro."""
    # Imported by the first schema check, not by every broker (fastavro costs a few MiB resident).
    import fastavro
    from fastavro.schema import SchemaParseException

    try:
        definition = json.loads(data)
        fastavro.parse_schema(definition, _write_hint=False)
    except (ValueError, SchemaParseException, TypeError, KeyError) as exc:
        raise InvalidSchemaError(f"Invalid Avro schema definition: {exc}") from None
    return definition


def _is_avro(data: bytes) -> bool:
    try:
        parse_avro(data)
    except InvalidSchemaError:
        return False
    return True


def validate(type_name: str, data: bytes, properties: dict[str, str]) -> None:
    """Refuse schema data that does not parse (raises :class:`InvalidSchemaError`)."""
    if type_name == "Json" and data and not _is_avro(data):
        try:
            json.loads(data)  # an old-style JSON-schema definition (Pulsar 2.0 clients)
        except ValueError:
            raise InvalidSchemaError("Invalid JSON schema definition") from None
    elif type_name in AVRO_BASED and data:
        parse_avro(data)
    elif type_name == "KeyValue":
        key, value = split_key_value(data)
        for part, component in ((key, "key"), (value, "value")):
            kind = properties.get(f"{component}.schema.type", "")
            if kind.upper() in ("AVRO", "JSON", "PROTOBUF") and part:
                parse_avro(part)


def can_read(reader_type: str, reader: bytes, writer_type: str, writer: bytes, props: tuple[dict, dict]) -> bool:
    """Whether data written with schema (``writer_type``, ``writer``) can be read with ``reader``."""
    if reader_type != writer_type:
        return False
    if reader_type in AVRO_BASED:
        if not reader or not writer:
            return reader == writer
        if reader_type == "Json" and not (_is_avro(reader) and _is_avro(writer)):
            # Old-style JSON-schema definitions: compatible with each other, not with Avro-based ones.
            return not _is_avro(reader) and not _is_avro(writer)
        return _avro_can_read(parse_avro(reader), parse_avro(writer))
    if reader_type == "KeyValue":
        rk, rv = split_key_value(reader)
        wk, wv = split_key_value(writer)
        rprops, wprops = props
        for part, r, w in (("key", rk, wk), ("value", rv, wv)):
            rt = _component_type(rprops, part)
            wt = _component_type(wprops, part)
            if not can_read(rt, r, wt, w, ({}, {})):
                return False
        return True
    return True  # same primitive type: always readable


def _component_type(props: dict[str, str], part: str) -> str:
    kind = props.get(f"{part}.schema.type", "BYTES").upper()
    return {"AVRO": "Avro", "JSON": "Json", "PROTOBUF": "Protobuf", "STRING": "String"}.get(kind, kind)


def compatible(
    strategy: str,
    new: tuple[str, bytes, dict[str, str]],
    existing: list[tuple[str, bytes, dict[str, str]]],
) -> str | None:
    """``None`` if ``new`` may join ``existing`` (oldest first) under ``strategy``, else why not."""
    if not existing or strategy == "ALWAYS_COMPATIBLE":
        return None
    if strategy == "ALWAYS_INCOMPATIBLE":
        return "Incompatible schema: the strategy is ALWAYS_INCOMPATIBLE"
    new_type, new_data, new_props = new
    for old_type, _, _ in existing:
        if old_type != new_type:
            return f"Incompatible schema: exists schema type {_upper(old_type)}, new schema type {_upper(new_type)}"
    against = existing if strategy.endswith("_TRANSITIVE") else existing[-1:]
    base = strategy.removesuffix("_TRANSITIVE")
    for old_type, old_data, old_props in reversed(against):
        backward = can_read(new_type, new_data, old_type, old_data, (new_props, old_props))
        if base in ("BACKWARD", "FULL") and not backward:
            return f"Incompatible schema: the new schema cannot read data written with an existing one ({strategy})"
        if base in ("FORWARD", "FULL") and not can_read(old_type, old_data, new_type, new_data, (old_props, new_props)):
            return f"Incompatible schema: an existing schema cannot read data written with the new one ({strategy})"
    return None


def _upper(type_name: str) -> str:
    return {"KeyValue": "KEY_VALUE", "None": "NONE"}.get(type_name, type_name.upper())


# -------------------------------------------------------------------------------- Avro resolution rules
def _avro_can_read(reader: Any, writer: Any) -> bool:
    return _Resolver().check(reader, writer, "", "")


class _Resolver:
    """Avro's schema-resolution rules (specification, "Schema Resolution"), named types resolved by name."""

    def __init__(self) -> None:
        self.reader_names: dict[str, Any] = {}
        self.writer_names: dict[str, Any] = {}
        self.seen: set[tuple[str, str]] = set()  # recursive types: a pair under check counts as compatible

    def _resolve(self, schema: Any, names: dict[str, Any], namespace: str) -> tuple[Any, str]:
        if isinstance(schema, str) and schema not in _PRIMITIVES:
            full = schema if "." in schema or not namespace else f"{namespace}.{schema}"
            found = names.get(full, names.get(schema))
            if found is None:
                return schema, namespace
            return found, found.get("namespace", namespace) if isinstance(found, dict) else namespace
        if isinstance(schema, dict) and schema.get("type") in _NAMED:
            name = schema.get("name", "")
            ns = schema.get("namespace", namespace)
            full = name if "." in name or not ns else f"{ns}.{name}"
            names.setdefault(full, schema)
            names.setdefault(name, schema)
            return schema, ns
        return schema, namespace

    def check(self, reader: Any, writer: Any, rns: str, wns: str) -> bool:
        reader, rns = self._resolve(reader, self.reader_names, rns)
        writer, wns = self._resolve(writer, self.writer_names, wns)
        if isinstance(writer, list):
            return all(self.check(reader, branch, rns, wns) for branch in writer)
        if isinstance(reader, list):
            return any(self.check(branch, writer, rns, wns) for branch in reader)
        rtype = _type_of(reader)
        wtype = _type_of(writer)
        if rtype in _PRIMITIVES or wtype in _PRIMITIVES:
            return rtype == wtype or rtype in _PROMOTIONS.get(wtype, ())
        if rtype != wtype and {rtype, wtype} != {"record", "error"}:
            return False
        if rtype == "array":
            return self.check(reader["items"], writer["items"], rns, wns)
        if rtype == "map":
            return self.check(reader["values"], writer["values"], rns, wns)
        if not _names_match(reader, writer):
            return False
        if rtype == "fixed":
            return reader.get("size") == writer.get("size")
        if rtype == "enum":
            symbols = set(reader.get("symbols", []))
            return "default" in reader or all(s in symbols for s in writer.get("symbols", []))
        key = (json.dumps(reader, sort_keys=True), json.dumps(writer, sort_keys=True))
        if key in self.seen:
            return True
        self.seen.add(key)
        writer_fields = {f["name"]: f for f in writer.get("fields", [])}
        for field in reader.get("fields", []):
            match = writer_fields.get(field["name"])
            if match is None:
                match = next((writer_fields[a] for a in field.get("aliases", []) if a in writer_fields), None)
            if match is None:
                if "default" not in field:
                    return False
            elif not self.check(field["type"], match["type"], rns, wns):
                return False
        return True


_PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})


def _type_of(schema: Any) -> str:
    if isinstance(schema, str):
        return schema
    if isinstance(schema, dict):
        return str(schema.get("type"))  # a logical type reads as its underlying type
    return "?"


def _names_match(reader: dict[str, Any], writer: dict[str, Any]) -> bool:
    def short(name: str) -> str:
        return name.rsplit(".", 1)[-1]

    wname = short(writer.get("name", ""))
    return short(reader.get("name", "")) == wname or wname in {short(a) for a in reader.get("aliases", [])}
