"""Schema registry: each topic's schema versions, stored in the metadata store.

Versions are numbered from 0 and travel on the wire as 8-byte big-endian integers, as Pulsar
encodes them. Partitions share their partitioned topic's schemas. Compatibility checking is not
enforced yet: a schema that differs from every stored version becomes a new version.
"""

from __future__ import annotations

import base64
import json
import struct
import time
from typing import Any

from magnetar.broker.protocol import pulsar_api_pb2 as pb
from magnetar.broker.topic_name import TopicName
from magnetar.metadata.api import NOT_EXISTS, BadVersionError, MetadataStore

SCHEMAS = "/schemas"
_VERSION = struct.Struct(">q")


def encode_version(version: int) -> bytes:
    return _VERSION.pack(version)


class SchemaRegistry:
    """Stores and looks up schemas by topic and version."""

    def __init__(self, store: MetadataStore) -> None:
        self.store = store

    @staticmethod
    def _path(topic: TopicName) -> str:
        base = topic.partitioned_base
        return f"{SCHEMAS}/{base.tenant}/{base.namespace_portion}/{base.persistence_name.rsplit('/', 1)[1]}"

    async def _load(self, topic: TopicName) -> tuple[list[dict[str, Any]], int]:
        value = await self.store.get(self._path(topic))
        if value is None:
            return [], NOT_EXISTS
        return json.loads(value.data), value.stat.version

    async def get_schema(self, topic: TopicName, version: bytes | None = None) -> tuple[pb.Schema, bytes] | None:
        """The requested version (latest when ``version`` is None), or None if there is none."""
        versions, _ = await self._load(topic)
        if not versions:
            return None
        if version is None:
            record = versions[-1]
        else:
            if len(version) != 8:
                return None
            (wanted,) = _VERSION.unpack(version)
            if not 0 <= wanted < len(versions):
                return None
            record = versions[wanted]
        return _to_proto(record, topic), encode_version(record["version"])

    async def delete_schemas(self, topic: TopicName) -> None:
        """Forget every schema version of ``topic`` (when the topic is deleted)."""
        await self.store.delete_recursive(self._path(topic))

    async def add_schema(self, topic: TopicName, schema: pb.Schema) -> bytes:
        """Return the version of ``schema``, storing it as a new version if it is new."""
        record = {
            "type": pb.Schema.Type.Name(schema.type),
            "data": base64.b64encode(schema.schema_data).decode(),
            "properties": {kv.key: kv.value for kv in schema.properties},
        }
        for _ in range(10):
            versions, stat_version = await self._load(topic)
            for existing in versions:
                if all(existing[k] == record[k] for k in ("type", "data", "properties")):
                    return encode_version(existing["version"])
            new = dict(record, version=len(versions), timestamp=int(time.time() * 1000))
            try:
                await self.store.put(self._path(topic), json.dumps([*versions, new]).encode(), stat_version)
            except BadVersionError:
                continue  # a concurrent producer added a version; look again
            return encode_version(new["version"])
        raise RuntimeError("schema update kept conflicting")


def _to_proto(record: dict[str, Any], topic: TopicName) -> pb.Schema:
    schema = pb.Schema(name=str(topic.partitioned_base), type=pb.Schema.Type.Value(record["type"]))
    schema.schema_data = base64.b64decode(record["data"])
    for key, value in record["properties"].items():
        schema.properties.add(key=key, value=value)
    return schema
