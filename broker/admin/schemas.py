"""``/admin/v2/schemas/{tenant}/{namespace}/{topic}/...``: a topic's schema versions (Pulsar's SchemasResource).

JSON shapes are Pulsar's: ``GetSchemaResponse`` (``version``, ``type``, ``timestamp``, ``data``,
``properties``), ``PostSchemaPayload`` (``type``, ``schema``, ``properties``), ``{"version": n}``
answers, ``IsCompatibilityResponse``. Type names are Pulsar's ``SchemaType`` names (``AVRO``,
``KEY_VALUE``...). KEY_VALUE data is shown and accepted as ``{"key": ..., "value": ...}``.
An incompatible schema is 409, a missing one 404.
"""

from __future__ import annotations

import json
import re
import struct
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from magnetar.broker.admin.api import (
    Routes,
    bad_request,
    json_body,
    json_response,
    not_found,
    service_of,
)
from magnetar.broker.protocol import pulsar_api_pb2 as pb
from magnetar.broker.schema_compatibility import IncompatibleSchemaError, split_key_value
from magnetar.broker.schemas import SchemaRecord
from magnetar.broker.topic_name import TopicName

routes = Routes("schemas")
TOPIC = "/admin/v2/schemas/{tenant}/{namespace}/{topic}"
_SPECIAL = {"Bool": "BOOLEAN"}
_LEN = struct.Struct(">i")


class PostSchemaPayload(BaseModel):
    """Pulsar's ``PostSchemaPayload``."""

    model_config = ConfigDict(extra="ignore")
    type: str = "NONE"
    schema_: str = Field("", alias="schema")
    properties: dict[str, str] = Field(default_factory=dict)


def rest_type(wire_name: str) -> str:
    """Pulsar's SchemaType name of a protobuf enum name (``KeyValue`` -> ``KEY_VALUE``)."""
    return _SPECIAL.get(wire_name) or re.sub(r"(?<!^)(?=[A-Z])", "_", wire_name).upper()


def wire_type(rest_name: str) -> str:
    """The protobuf enum name of a SchemaType name; 400 for an unknown one."""
    wanted = rest_name.upper()
    if wanted == "BYTES":
        wanted = "NONE"
    for name in pb.Schema.Type.DESCRIPTOR.values_by_name:
        if rest_type(name) == wanted:
            return name
    raise bad_request(f"Invalid schema type {rest_name!r}")


def _topic(request: web.Request) -> TopicName:
    m = request.match_info
    return TopicName.parse(f"persistent://{m['tenant']}/{m['namespace']}/{m['topic']}")


async def _existing_namespace(request: web.Request) -> TopicName:
    topic = _topic(request)
    if not await service_of(request).resources.namespace_exists(topic.namespace):
        raise not_found("Namespace does not exist")
    return topic


def schema_json(record: SchemaRecord) -> dict[str, Any]:
    """``GetSchemaResponse`` of one stored version."""
    if record.type == "KeyValue":
        key, value = split_key_value(record.data)
        data = json.dumps({"key": _text(key), "value": _text(value)})
    else:
        data = record.data.decode("utf-8", errors="replace")
    return {
        "version": record.version,
        "type": rest_type(record.type),
        "timestamp": record.timestamp,
        "data": data,
        "properties": record.properties,
    }


def _text(data: bytes) -> Any:
    text = data.decode("utf-8", errors="replace")
    try:
        return json.loads(text)
    except ValueError:
        return text


def _payload_parts(payload: PostSchemaPayload) -> tuple[str, bytes, dict[str, str]]:
    type_name = wire_type(payload.type)
    if type_name != "KeyValue":
        return type_name, payload.schema_.encode(), payload.properties
    try:
        parts = json.loads(payload.schema_)
        key, value = (p if isinstance(p, str) else json.dumps(p) for p in (parts["key"], parts["value"]))
    except (ValueError, KeyError, TypeError):
        raise bad_request('KEY_VALUE schema must be {"key": ..., "value": ...}') from None
    data = b"".join(_LEN.pack(len(p.encode())) + p.encode() for p in (key, value))
    return type_name, data, payload.properties


@routes.get(f"{TOPIC}/schema", summary="The latest schema of a topic", responses={200: "schema", 404: "none"})
async def get_schema(request: web.Request) -> web.Response:
    topic = await _existing_namespace(request)
    record = await service_of(request).schemas.get_record(topic)
    if record is None:
        raise not_found("Schema not found")
    return json_response(schema_json(record))


@routes.get(f"{TOPIC}/schema/{{version}}", summary="One schema version", responses={200: "schema", 404: "none"})
async def get_schema_version(request: web.Request) -> web.Response:
    topic = await _existing_namespace(request)
    try:
        version = int(request.match_info["version"])
    except ValueError:
        raise bad_request("Invalid schema version") from None
    record = await service_of(request).schemas.get_record(topic, version)
    if record is None:
        raise not_found("Schema not found")
    return json_response(schema_json(record))


@routes.get(f"{TOPIC}/schemas", summary="Every live schema version", responses={200: "versions"})
async def get_all_schemas(request: web.Request) -> web.Response:
    topic = await _existing_namespace(request)
    records = await service_of(request).schemas.live(topic)
    return json_response({"getSchemaResponses": [schema_json(r) for r in records]})


@routes.post(
    f"{TOPIC}/schema",
    summary="Register a schema (checked against the topic's compatibility strategy)",
    body=PostSchemaPayload,
    responses={200: "version", 409: "incompatible"},
)
async def post_schema(request: web.Request) -> web.Response:
    topic = await _existing_namespace(request)
    type_name, data, props = _payload_parts(await json_body(request, PostSchemaPayload))
    version = await service_of(request).schemas.put(topic, type_name, data, props)
    return json_response({"version": version})


@routes.delete(f"{TOPIC}/schema", summary="Delete the topic's schema (a tombstone version)", responses={200: "version"})
async def delete_schema(request: web.Request) -> web.Response:
    topic = await _existing_namespace(request)
    version = await service_of(request).schemas.delete_schema(topic)
    return json_response({"version": version})


@routes.post(
    f"{TOPIC}/compatibility",
    summary="Whether a schema is compatible with the topic's",
    body=PostSchemaPayload,
    responses={200: "IsCompatibilityResponse"},
)
async def check_compatibility(request: web.Request) -> web.Response:
    topic = await _existing_namespace(request)
    type_name, data, props = _payload_parts(await json_body(request, PostSchemaPayload))
    registry = service_of(request).schemas
    try:
        strategy = await registry.check_compatibility(topic, type_name, data, props)
        ok = True
    except IncompatibleSchemaError:
        strategy, ok = (await registry.policy(topic)).strategy, False
    return json_response({"isCompatibility": ok, "schemaCompatibilityStrategy": strategy})


@routes.post(
    f"{TOPIC}/version",
    summary="The version of a schema already stored",
    body=PostSchemaPayload,
    responses={200: "version", 404: "not stored"},
)
async def schema_version(request: web.Request) -> web.Response:
    topic = await _existing_namespace(request)
    type_name, data, _ = _payload_parts(await json_body(request, PostSchemaPayload))
    for record in await service_of(request).schemas.live(topic):
        if record.key() == (type_name, data):
            return json_response({"version": record.version})
    raise not_found("Not found schema")


# ------------------------------------------------------------------ namespace schema flags (Pulsar's paths)
_NS = "/admin/v2/namespaces/{tenant}/{namespace}"
#: REST segment -> (Policies attribute, broker default setting).
_FLAGS = {
    "isAllowAutoUpdateSchema": ("is_allow_auto_update_schema", "is_allow_auto_update_schema_enabled"),
    "schemaValidationEnforced": ("schema_validation_enforced", "is_schema_validation_enforced"),
}


def _register_flag(segment: str, attr: str, default_setting: str) -> None:
    @routes.get(f"{_NS}/{segment}", summary=f"Get the namespace's {segment} flag", responses={200: "flag"})
    async def get_flag(request: web.Request) -> web.Response:
        ns = f"{request.match_info['tenant']}/{request.match_info['namespace']}"
        policies = await service_of(request).policies.namespace(ns)
        if policies is None:
            raise not_found("Namespace does not exist")
        value = getattr(policies, attr)
        return json_response(getattr(service_of(request).config, default_setting) if value is None else value)

    @routes.post(f"{_NS}/{segment}", summary=f"Set the namespace's {segment} flag", body=bool, responses={204: "set"})
    async def set_flag(request: web.Request) -> web.Response:
        ns = f"{request.match_info['tenant']}/{request.match_info['namespace']}"
        value = await json_body(request, bool)
        await service_of(request).policies.update_namespace(ns, lambda p: setattr(p, attr, value))
        return web.Response(status=204)


for _segment, (_attr, _default) in _FLAGS.items():
    _register_flag(_segment, _attr, _default)
