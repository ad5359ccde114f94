"""Schema registry: each topic's schema versions, stored in the metadata store, and the checks
producers, consumers and the admin API go through.

Versions are numbered from 0 and travel on the wire as 8-byte big-endian integers, as Pulsar
encodes them. Partitions share their partitioned topic's schemas. Deleting a topic's schema (admin
``DELETE``) stores a tombstone version, as Pulsar does: versions keep counting, and schemas before
the tombstone no longer take part in compatibility checks.

What is checked (Pulsar's rules, compatibility per :mod:`magnetar.broker.schema_compatibility`):

- a producer's schema: a stored version is reused; a new one must be compatible with the stored
  versions under the topic's strategy and the namespace must allow auto-update
  (``is_allow_auto_update_schema``); a producer without a schema is refused from a topic with one
  only when ``schema_validation_enforced``;
- a consumer's schema: registered when the topic has none; else accepted when stored, or when it
  can read the stored versions (``BACKWARD`` against the latest for the non-transitive and
  ``FORWARD_TRANSITIVE`` strategies, the strategy itself against all versions otherwise). Consumers
  never add versions to a topic that has a schema. ``AUTO_CONSUME`` consumers are not checked.
"""

from __future__ import annotations

import base64
import json
import struct
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from magnetar.broker.protocol import pulsar_api_pb2 as pb
from magnetar.broker.schema_compatibility import IncompatibleSchemaError, InvalidSchemaError, compatible, validate
from magnetar.broker.topic_name import TopicName
from magnetar.metadata.api import NOT_EXISTS, BadVersionError, MetadataStore

if TYPE_CHECKING:
    from magnetar.broker.config import BrokerConfig
    from magnetar.broker.policies import PolicyStore

SCHEMAS = "/schemas"
_VERSION = struct.Struct(">q")
#: Strategies under which a consumer's schema is checked BACKWARD against the latest version only.
_CONSUMER_LATEST = frozenset({"BACKWARD", "FORWARD", "FORWARD_TRANSITIVE", "FULL"})


def encode_version(version: int) -> bytes:
    return _VERSION.pack(version)


def decode_version(version: bytes) -> int | None:
    """The version number in an 8-byte wire version, ``None`` when malformed."""
    return _VERSION.unpack(version)[0] if len(version) == 8 else None


@dataclass(frozen=True, slots=True)
class SchemaRecord:
    """One stored version (``deleted``: a tombstone left by deleting the topic's schema)."""

    version: int
    type: str  # the protobuf enum name: "Avro", "Json", "String", "KeyValue", ...
    data: bytes
    properties: dict[str, str]
    timestamp: int
    deleted: bool = False

    def key(self) -> tuple[str, bytes]:
        return self.type, self.data

    def triple(self) -> tuple[str, bytes, dict[str, str]]:
        return self.type, self.data, self.properties

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "type": self.type,
            "data": base64.b64encode(self.data).decode(),
            "properties": self.properties,
            "timestamp": self.timestamp,
            "deleted": self.deleted,
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> SchemaRecord:
        return cls(
            version=raw["version"],
            type=raw["type"],
            data=base64.b64decode(raw["data"]),
            properties=dict(raw.get("properties") or {}),
            timestamp=raw.get("timestamp", 0),
            deleted=raw.get("deleted", False),
        )


@dataclass(frozen=True, slots=True)
class SchemaPolicy:
    """The settings a schema check needs, resolved for one topic."""

    strategy: str
    allow_auto_update: bool
    validation_enforced: bool


class SchemaRegistry:
    """Stores and looks up schemas by topic and version, and checks new ones."""

    def __init__(self, store: MetadataStore, policies: PolicyStore, config: BrokerConfig) -> None:
        self.store = store
        self.policies = policies
        self.config = config

    @staticmethod
    def _path(topic: TopicName) -> str:
        base = topic.partitioned_base
        return f"{SCHEMAS}/{base.tenant}/{base.namespace_portion}/{base.persistence_name.rsplit('/', 1)[1]}"

    async def _load(self, topic: TopicName) -> tuple[list[SchemaRecord], int]:
        value = await self.store.get(self._path(topic))
        if value is None:
            return [], NOT_EXISTS
        return [SchemaRecord.from_json(r) for r in json.loads(value.data)], value.stat.version

    async def policy(self, topic: TopicName) -> SchemaPolicy:
        """The topic's compatibility strategy and its namespace's auto-update and enforcement flags."""
        effective = await self.policies.effective(topic)
        ns = await self.policies.namespace(topic.namespace)
        auto = ns.is_allow_auto_update_schema if ns is not None else None
        return SchemaPolicy(
            strategy=effective.schema_compatibility_strategy,
            allow_auto_update=self.config.is_allow_auto_update_schema_enabled if auto is None else auto,
            validation_enforced=bool(ns and ns.schema_validation_enforced) or self.config.is_schema_validation_enforced,
        )

    # ------------------------------------------------------------------------------------- reads
    async def history(self, topic: TopicName) -> list[SchemaRecord]:
        """Every stored version, tombstones included, oldest first."""
        return (await self._load(topic))[0]

    async def live(self, topic: TopicName) -> list[SchemaRecord]:
        """The versions after the last tombstone (the ones checks consider), oldest first."""
        return _live(await self.history(topic))

    async def get_record(self, topic: TopicName, version: int | None = None) -> SchemaRecord | None:
        """The requested version (latest when ``None``); ``None`` if missing or deleted."""
        versions = await self.history(topic)
        if not versions:
            return None
        if version is None:
            record = versions[-1]
        elif 0 <= version < len(versions):
            record = versions[version]
        else:
            return None
        return None if record.deleted else record

    async def get_schema(self, topic: TopicName, version: bytes | None = None) -> tuple[pb.Schema, bytes] | None:
        """GET_SCHEMA: the requested version (latest when ``version`` is None), or None if there is none."""
        wanted = None
        if version is not None:
            wanted = decode_version(version)
            if wanted is None:
                return None
        record = await self.get_record(topic, wanted)
        if record is None:
            return None
        return to_proto(record, topic), encode_version(record.version)

    # ------------------------------------------------------------------------------------- checks
    async def check_compatibility(self, topic: TopicName, type_name: str, data: bytes, props: dict[str, str]) -> str:
        """The strategy used; raises :class:`IncompatibleSchemaError` when the schema would be refused."""
        _check_valid(type_name, data, props)
        policy = await self.policy(topic)
        live = await self.live(topic)
        if any(r.key() == (type_name, data) for r in live):
            return policy.strategy
        reason = compatible(policy.strategy, (type_name, data, props), [r.triple() for r in live])
        if reason is not None:
            raise IncompatibleSchemaError(reason)
        return policy.strategy

    async def for_producer(self, topic: TopicName, schema: pb.Schema | None) -> bytes | None:
        """The schema version a new producer publishes with (registering its schema if new)."""
        if schema is None or schema.type == pb.Schema.Type.Value("None"):
            policy = await self.policy(topic)
            if policy.validation_enforced and await self.live(topic):
                raise IncompatibleSchemaError(
                    "Producers cannot connect or send message without a schema to topics with a schema"
                )
            return None
        return await self.add_schema(topic, schema)

    async def for_consumer(self, topic: TopicName, schema: pb.Schema | None) -> None:
        """Refuse a consumer whose schema cannot read the topic's (register it when the topic has none)."""
        if schema is None or schema.type in (pb.Schema.Type.Value("None"), pb.Schema.AutoConsume):
            return
        type_name, data, props = _parts(schema)
        _check_valid(type_name, data, props)
        live = await self.live(topic)
        if not live:
            await self.add_schema(topic, schema, check=False)
            return
        if any(r.key() == (type_name, data) for r in live):
            return
        policy = await self.policy(topic)
        if policy.strategy in _CONSUMER_LATEST:
            reason = compatible("BACKWARD", (type_name, data, props), [live[-1].triple()])
        else:
            reason = compatible(policy.strategy, (type_name, data, props), [r.triple() for r in live])
        if reason is not None:
            raise IncompatibleSchemaError(reason)

    # ------------------------------------------------------------------------------------- writes
    async def add_schema(self, topic: TopicName, schema: pb.Schema, *, check: bool = True) -> bytes:
        """Return the version of ``schema``, storing it as a new version if it is new (and allowed)."""
        type_name, data, props = _parts(schema)
        return encode_version(await self.put(topic, type_name, data, props, check=check))

    async def put(
        self, topic: TopicName, type_name: str, data: bytes, props: dict[str, str], *, check: bool = True
    ) -> int:
        """Store a schema version (or find the stored one); raises :class:`IncompatibleSchemaError`."""
        _check_valid(type_name, data, props)
        policy = await self.policy(topic) if check else None
        for _ in range(10):
            versions, stat_version = await self._load(topic)
            live = _live(versions)
            for existing in live:
                if existing.key() == (type_name, data):
                    return existing.version
            if policy is not None:
                if not policy.allow_auto_update:
                    raise IncompatibleSchemaError("Schema not found and schema auto updating is disabled.")
                reason = compatible(policy.strategy, (type_name, data, props), [r.triple() for r in live])
                if reason is not None:
                    raise IncompatibleSchemaError(reason)
            new = SchemaRecord(len(versions), type_name, data, props, int(time.time() * 1000))
            if await self._store(topic, versions, new, stat_version):
                return new.version
        raise RuntimeError("schema update kept conflicting")

    async def delete_schema(self, topic: TopicName) -> int | None:
        """Store a tombstone; its version, or ``None`` when there is no live schema to delete."""
        for _ in range(10):
            versions, stat_version = await self._load(topic)
            if not _live(versions):
                return None
            tomb = SchemaRecord(len(versions), versions[-1].type, b"", {}, int(time.time() * 1000), deleted=True)
            if await self._store(topic, versions, tomb, stat_version):
                return tomb.version
        raise RuntimeError("schema update kept conflicting")

    async def _store(self, topic: TopicName, versions: list[SchemaRecord], new: SchemaRecord, stat: int) -> bool:
        payload = json.dumps([r.to_json() for r in [*versions, new]]).encode()
        try:
            await self.store.put(self._path(topic), payload, stat)
        except BadVersionError:
            return False  # a concurrent writer added a version; look again
        return True

    async def delete_schemas(self, topic: TopicName) -> None:
        """Forget every schema version of ``topic`` (when the topic is deleted)."""
        await self.store.delete_recursive(self._path(topic))


def _live(versions: list[SchemaRecord]) -> list[SchemaRecord]:
    for i in range(len(versions) - 1, -1, -1):
        if versions[i].deleted:
            return versions[i + 1 :]
    return versions


def _parts(schema: pb.Schema) -> tuple[str, bytes, dict[str, str]]:
    return pb.Schema.Type.Name(schema.type), bytes(schema.schema_data), {kv.key: kv.value for kv in schema.properties}


def _check_valid(type_name: str, data: bytes, props: dict[str, str]) -> None:
    try:
        validate(type_name, data, props)
    except InvalidSchemaError as exc:
        raise IncompatibleSchemaError(str(exc)) from None


def to_proto(record: SchemaRecord, topic: TopicName) -> pb.Schema:
    schema = pb.Schema(name=str(topic.partitioned_base), type=pb.Schema.Type.Value(record.type))
    schema.schema_data = record.data
    for key, value in record.properties.items():
        schema.properties.add(key=key, value=value)
    return schema
