"""Option parsing of the ``pulsar`` Spark source and sink (pure, no Spark).

Names follow StreamNative's Scala connector where they overlap (``service.url``, ``admin.url``,
``topic``/``topics``/``topicsPattern``, ``startingOffsets``/``endingOffsets``, ``startingTime``/``endingTime``,
``failOnDataLoss``, ``pollTimeoutMs``, ``maxBytesPerTrigger``); Spark passes option keys case-insensitively
(lower-cased), so lookups here ignore case. ``pulsar.client.*`` / ``pulsar.reader.*`` / ``pulsar.producer.*``
keys are passed to ``pulsar.Client`` / ``create_reader`` / ``create_producer`` (Python or Java-style names:
``operation_timeout_seconds`` or ``operationTimeoutSeconds``). Any other option is an error, never ignored.

Secured clusters: the Spark connector's ``pulsar.client.authPluginClassName`` / ``authParams`` /
``tlsTrustCertsFilePath`` / ``tlsAllowInsecureConnection`` / ``tlsHostnameVerificationEnable`` set the
credentials and TLS trust of the client and, unless ``pulsar.admin.<same name>`` overrides them, of the admin
calls (:class:`magnetar.admin_client.auth.ClientSecurity`).
"""

from __future__ import annotations

import base64
import difflib
import hashlib
import inspect
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from magnetar.admin_client.auth import ClientSecurity
from magnetar.admin_client.paths import parse_topic
from magnetar.spark.offsets import Position

EARLIEST = "earliest"
LATEST = "latest"

#: Start/end specification: "earliest", "latest", or a per-partition mapping of positions / those words.
OffsetSpec = str | dict[str, "Position | str"]


def _get(options: Mapping[str, str], name: str, default: str | None = None) -> str | None:
    lowered = {k.lower(): v for k, v in options.items()}
    value = lowered.get(name.lower())
    return default if value is None else str(value)


def _bool(value: str | None, default: bool) -> bool:
    if value is None:
        return default
    v = value.strip().lower()
    if v in ("true", "1", "yes"):
        return True
    if v in ("false", "0", "no"):
        return False
    raise ValueError(f"not a boolean: {value!r}")


def _int(value: str | None, name: str) -> int | None:
    if value is None or value == "":
        return None
    n = int(value)
    if n <= 0:
        raise ValueError(f"{name} must be positive, got {n}")
    return n


#: Options of the source (lower-cased, as Spark hands them over).
SOURCE_OPTIONS = frozenset(
    {
        "service.url",
        "admin.url",
        "topic",
        "topics",
        "topicspattern",
        "startingoffsets",
        "endingoffsets",
        "startingtime",
        "endingtime",
        "failondataloss",
        "polltimeoutms",
        "maxrecordspertrigger",
        "maxbytespertrigger",
        "minrecordspertrigger",
        "maxtriggerdelay",
        "maxentriesperpartition",
        "commitsubscription",
        "predefinedsubscription",
        "subscriptionprefix",
        "waitingfornonexistedtopic",
        "allowdifferenttopicschemas",
    }
)
#: Options of the sink.
SINK_OPTIONS = frozenset({"service.url", "admin.url", "topic", "exactlyonce", "producernameprefix"})
#: Options Spark itself may add to a data source's options (file-style ``path``, ``writeStream`` checkpoint).
SPARK_OPTIONS = frozenset({"path", "checkpointlocation"})


#: Security settings inside ``pulsar.client.*`` / ``pulsar.admin.*`` (squashed names -> ClientSecurity argument):
#: the Spark connector's / Java client's names and the Python client's.
SECURITY_KEYS = {
    "authpluginclassname": "auth_plugin",
    "authplugin": "auth_plugin",
    "authparams": "auth_params",
    "tlstrustcertsfilepath": "tls_trust_certs_file",
    "tlsallowinsecureconnection": "tls_allow_insecure",
    "tlshostnameverificationenable": "tls_hostname_verification",
    "tlsenablehostnameverification": "tls_hostname_verification",
    "tlsvalidatehostname": "tls_hostname_verification",
}
#: Their spelling in messages.
_SECURITY_NAMES = (
    "authPluginClassName",
    "authParams",
    "tlsTrustCertsFilePath",
    "tlsAllowInsecureConnection",
    "tlsHostnameVerificationEnable",
)


def check_option_names(options: Mapping[str, str], known: frozenset[str], prefixes: tuple[str, ...], what: str) -> None:
    """Unknown options are an error (a typo must not silently change what a job does)."""
    for key in options:
        low = key.lower()
        if low in known or low in SPARK_OPTIONS or low.startswith(prefixes):
            continue
        if _squash(low) in SECURITY_KEYS:
            name = next((n for n in _SECURITY_NAMES if n.lower() == low), key)
            raise ValueError(
                f"unknown option {key!r} of the pulsar {what}: use pulsar.client.{name} (and "
                f"pulsar.admin.{name} for the admin calls when they differ)"
            )
        close = difflib.get_close_matches(low, sorted(known), n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        passing = ", ".join(prefixes)
        raise ValueError(f"unknown option {key!r} of the pulsar {what}{hint}; options prefixed {passing} pass through")


def _squash(name: str) -> str:
    return name.replace("_", "").lower()


def pass_through(raw: Mapping[str, str], func: Callable[..., Any], reserved: set[str], prefix: str) -> dict[str, Any]:
    """``<prefix><name>`` options -> keyword arguments of ``func`` (names checked, values typed).

    Names match the Python argument case- and underscore-insensitively, so the Java clients' camelCase names
    work too (``receiverQueueSize`` -> ``receiver_queue_size``). Arguments the source sets itself are refused.
    """
    params = [n for n in inspect.signature(func).parameters if n not in ("self", "args", "kwargs")]
    by_squash = {_squash(n): n for n in params if n not in reserved}
    out: dict[str, str] = {}
    for key, value in raw.items():
        name = by_squash.get(_squash(key))
        if name is None:
            allowed = ", ".join(sorted(by_squash.values()))
            target = func.__qualname__
            raise ValueError(f"option {prefix}{key}: not a supported argument of {target} (one of: {allowed})")
        out[name] = value
    return coerce_client_options(out)


def client_kwargs(raw: Mapping[str, str]) -> dict[str, Any]:
    """``pulsar.client.*`` -> ``pulsar.Client`` keyword arguments (service URL, logger and security are ours)."""
    plain = {k: v for k, v in raw.items() if _squash(k) not in SECURITY_KEYS}
    if not plain:
        return {}  # no pulsar import (0.05-0.1 CPU-s) in a streaming query's planner process for nothing
    import pulsar

    reserved = {"service_url", "authentication", "logger"}
    reserved |= {"tls_trust_certs_file_path", "tls_allow_insecure_connection", "tls_validate_hostname"}
    return pass_through(plain, pulsar.Client.__init__, reserved, "pulsar.client.")


def _security_settings(raw: Mapping[str, str]) -> dict[str, str]:
    return {SECURITY_KEYS[_squash(k)]: v for k, v in raw.items() if _squash(k) in SECURITY_KEYS}


def securities(options: Mapping[str, str]) -> tuple[ClientSecurity, ClientSecurity]:
    """``(client, admin)`` credentials and TLS trust from ``pulsar.client.*`` and ``pulsar.admin.*``.

    The admin calls use the client's settings unless ``pulsar.admin.<name>`` gives their own (an admin plugin
    replaces the client's plugin and params as a pair). Bad values raise ``AuthConfigError`` (a ValueError).
    """
    client = _security_settings(_client_options(options))
    admin_raw = _client_options(options, "pulsar.admin.")
    for key in admin_raw:
        if _squash(key) not in SECURITY_KEYS:
            raise ValueError(f"option pulsar.admin.{key}: the admin client takes only {', '.join(_SECURITY_NAMES)}")
    admin = dict(client)
    own = _security_settings(admin_raw)
    if {"auth_plugin", "auth_params"} & own.keys():
        admin.pop("auth_plugin", None)
        admin.pop("auth_params", None)
    admin.update(own)
    client_security = ClientSecurity.from_settings(**client)
    return client_security, (client_security if admin == client else ClientSecurity.from_settings(**admin))


def reader_kwargs(raw: Mapping[str, str]) -> dict[str, Any]:
    """``pulsar.reader.*`` -> ``create_reader`` keyword arguments (start, schema and listener are ours)."""
    if not raw:
        return {}
    import pulsar

    reserved = {"topic", "start_message_id", "schema", "reader_listener", "start_message_id_inclusive"}
    reserved |= {"crypto_key_reader", "crypto_failure_action"}
    return pass_through(raw, pulsar.Client.create_reader, reserved, "pulsar.reader.")


def producer_kwargs(raw: Mapping[str, str]) -> dict[str, Any]:
    """``pulsar.producer.*`` -> ``create_producer`` keyword arguments."""
    if not raw:
        return {}
    import pulsar

    reserved = {"topic", "schema", "message_routing_mode", "message_router", "crypto_key_reader", "encryption_key"}
    return pass_through(raw, pulsar.Client.create_producer, reserved, "pulsar.producer.")


def parse_message_id(value: object) -> Position:
    """A position from a serialized ``MessageId`` (``MessageIdData`` bytes as a JSON byte array or base64).

    That is what ``MessageId.serialize()`` (Python) / ``toByteArray()`` (Java) give, and what StreamNative's
    connector puts into its offsets; ``ledger:entry[:batch]`` text is accepted too.
    """
    from magnetar.broker.protocol import pulsar_api_pb2 as pb

    if isinstance(value, list):
        data = bytes(value)
    elif isinstance(value, str) and ":" in value:
        return Position.parse(value)
    elif isinstance(value, str):
        data = base64.b64decode(value, validate=True)
    else:
        raise ValueError(f"not a message id: {value!r}")
    mid = pb.MessageIdData()
    mid.ParseFromString(data)
    if not mid.IsInitialized():
        raise ValueError(f"not a serialized message id: {value!r}")
    batch = mid.batch_index if mid.HasField("batch_index") and mid.batch_index >= 0 else -1
    return Position(mid.ledgerId, mid.entryId, batch)


def parse_offset_spec(value: str | None, default: str, name: str) -> OffsetSpec:
    """``earliest`` | ``latest`` | JSON ``{"topic-partition": "L:E[:B]" | "earliest" | "latest"}``."""
    if value is None or value.strip() == "":
        return default
    text = value.strip()
    if text.lower() in (EARLIEST, LATEST):
        return text.lower()
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{name}: expected earliest, latest or a JSON object: {value!r}") from exc
    if not isinstance(raw, dict):
        raise ValueError(f"{name}: expected a JSON object per topic-partition: {value!r}")
    spec: dict[str, Position | str] = {}
    for topic, pos in raw.items():
        if isinstance(pos, str) and pos.lower() in (EARLIEST, LATEST):
            spec[normalize_topic(topic)] = pos.lower()
        else:
            try:
                spec[normalize_topic(topic)] = parse_message_id(pos)
            except Exception as exc:
                raise ValueError(
                    f"{name}: {topic}: expected ledger:entry[:batch], a serialized MessageId "
                    f"(byte array or base64), earliest or latest; got {pos!r}"
                ) from exc
    return spec


def parse_time(value: str | None, name: str) -> int | None:
    """Epoch milliseconds (an integer) or None."""
    if value is None or value.strip() == "":
        return None
    try:
        return int(value)
    except ValueError as exc:
        raise ValueError(f"{name}: expected epoch milliseconds, got {value!r}") from exc


#: ``maxTriggerDelay`` when not given: Kafka's default (15 minutes).
DEFAULT_MAX_TRIGGER_DELAY_MS = 15 * 60 * 1000

_DURATION_UNITS_MS = {
    "ms": 1, "s": 1000, "sec": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000
}  # fmt: skip


def parse_duration_ms(value: str, name: str) -> int:
    """A Spark time string as the Kafka source reads ``maxTriggerDelay`` (``500ms``, ``5s``, ``15m``, ``1h``; a
    bare number is milliseconds) -> milliseconds."""
    text = value.strip().lower()
    digits = len(text) - len(text.lstrip("0123456789"))
    unit = text[digits:].strip() or "ms"
    if not digits or unit not in _DURATION_UNITS_MS:
        raise ValueError(f"{name}: expected a duration such as 500ms, 5s, 15m or 1h; got {value!r}")
    return int(text[:digits]) * _DURATION_UNITS_MS[unit]


def _min_per_trigger(
    options: Mapping[str, str], streaming: bool | None, max_records: int | None
) -> tuple[int | None, int]:
    """``minRecordsPerTrigger`` and ``maxTriggerDelay`` (ms), checked: streams only, the minimum not above the
    maximum, the delay only beside a minimum."""
    min_records = _int(_get(options, "minRecordsPerTrigger"), "minRecordsPerTrigger")
    delay_raw = _get(options, "maxTriggerDelay")
    if streaming is False and (min_records or delay_raw):
        raise ValueError("minRecordsPerTrigger/maxTriggerDelay apply to streams only")
    if delay_raw is not None and not min_records:
        raise ValueError("maxTriggerDelay applies with minRecordsPerTrigger (how long a micro-batch may wait for it)")
    delay_ms = DEFAULT_MAX_TRIGGER_DELAY_MS
    if delay_raw is not None:
        delay_ms = parse_duration_ms(delay_raw, "maxTriggerDelay")
        if delay_ms <= 0:
            raise ValueError(f"maxTriggerDelay must be positive, got {delay_raw!r}")
    if min_records and max_records and min_records > max_records:
        raise ValueError(f"minRecordsPerTrigger ({min_records}) exceeds maxRecordsPerTrigger ({max_records})")
    return min_records, delay_ms


def normalize_topic(name: str) -> str:
    """Short names (``t``, ``tenant/ns/t``) -> ``persistent://tenant/ns/t`` as Pulsar clients do."""
    return str(parse_topic(name))


def default_admin_url(service_url: str) -> str:
    """``admin.url`` when not given: the service URL's host on Pulsar's default web port (8080, TLS 8443).

    With several hosts in the service URL the first is used.
    """
    scheme, _, rest = service_url.partition("://")
    host = rest.split(",")[0].split("/")[0].rsplit(":", 1)[0] if rest else ""
    if not host:
        raise ValueError(f"service.url {service_url!r}: expected pulsar://host:port")
    return f"https://{host}:8443" if scheme == "pulsar+ssl" else f"http://{host}:8080"


#: Written to ``commitSubscription`` to run a stream without a durable subscription.
NO_SUBSCRIPTION = "none"


def commit_subscription(options: Mapping[str, str], streaming: bool, topics: str) -> str | None:
    """The durable subscription a stream keeps at its committed offsets (None: none).

    ``commitSubscription`` (alias ``predefinedSubscription``, StreamNative's name) names it;
    ``subscriptionPrefix`` names it ``<prefix>-<digest of the topics>``. Streams have one by default
    (``spark-<digest>``) so the broker neither deletes the topics as inactive nor trims what the query has not
    read; batch reads have none unless named. ``commitSubscription=none`` turns it off.
    """
    given = {n: _get(options, n) for n in ("commitSubscription", "predefinedSubscription", "subscriptionPrefix")}
    given = {n: v.strip() for n, v in given.items() if v and v.strip()}
    if len(given) > 1:
        raise ValueError(f"options {' and '.join(given)} are exclusive")
    digest = hashlib.sha1(topics.encode()).hexdigest()[:10]
    if "subscriptionPrefix" in given:
        return f"{given['subscriptionPrefix']}-{digest}"
    name = given.get("commitSubscription") or given.get("predefinedSubscription")
    if name is not None:
        return None if name.lower() == NO_SUBSCRIPTION else name
    return f"spark-{digest}" if streaming else None


def _client_options(options: Mapping[str, str], prefix: str = "pulsar.client.") -> dict[str, str]:
    return {k[len(prefix) :]: v for k, v in options.items() if k.lower().startswith(prefix)}


def coerce_client_options(raw: Mapping[str, str]) -> dict[str, Any]:
    """String pass-through values -> ints/floats/bools where they look like one (``pulsar.Client`` is typed)."""
    out: dict[str, Any] = {}
    for k, v in raw.items():
        low = v.strip().lower()
        if low in ("true", "false"):
            out[k] = low == "true"
            continue
        try:
            out[k] = int(v)
        except ValueError:
            try:
                out[k] = float(v)
            except ValueError:
                out[k] = v
    return out


@dataclass(frozen=True)
class SourceOptions:
    """Parsed options of a read (batch or streaming)."""

    service_url: str
    admin_url: str
    topics: tuple[str, ...] = ()
    topics_pattern: str | None = None
    starting: OffsetSpec = LATEST
    ending: OffsetSpec = LATEST
    starting_time: int | None = None
    ending_time: int | None = None
    fail_on_data_loss: bool = True
    wait_for_topics: bool = False
    allow_different_schemas: bool = False
    poll_timeout_ms: int = 2000
    max_records_per_trigger: int | None = None
    max_bytes_per_trigger: int | None = None
    min_records_per_trigger: int | None = None
    max_trigger_delay_ms: int = DEFAULT_MAX_TRIGGER_DELAY_MS
    max_entries_per_partition: int = 50000
    commit_subscription: str | None = None
    client_options: dict[str, Any] = field(default_factory=dict)
    reader_options: dict[str, Any] = field(default_factory=dict)
    client_security: ClientSecurity = field(default_factory=ClientSecurity)
    admin_security: ClientSecurity = field(default_factory=ClientSecurity)

    @classmethod
    def parse(cls, options: Mapping[str, str], streaming: bool | None) -> SourceOptions:
        """Validate and parse; ``streaming`` changes the starting default (batch: earliest, stream: latest).

        ``None``: not known yet (Spark asks for the row schema first), so mode-specific checks are skipped.
        """
        check_option_names(options, SOURCE_OPTIONS, ("pulsar.client.", "pulsar.admin.", "pulsar.reader."), "source")
        service_url = _get(options, "service.url")
        if not service_url:
            raise ValueError("option service.url is required (e.g. pulsar://localhost:6650)")
        admin_url = _get(options, "admin.url") or default_admin_url(service_url)
        topic = _get(options, "topic")
        topics = _get(options, "topics")
        pattern = _get(options, "topicsPattern")
        given = [x for x in (topic, topics, pattern) if x]
        if len(given) != 1:
            raise ValueError("exactly one of the options topic, topics, topicsPattern is required")
        names: tuple[str, ...] = ()
        if pattern:
            pattern = normalize_topic(pattern.strip())  # short `topic.*` -> persistent://public/default/topic.*
        if topic:
            names = (normalize_topic(topic.strip()),)
        elif topics:
            names = tuple(normalize_topic(t.strip()) for t in topics.split(",") if t.strip())
        starting_time = parse_time(_get(options, "startingTime"), "startingTime")
        ending_time = parse_time(_get(options, "endingTime"), "endingTime")
        starting_raw = _get(options, "startingOffsets")
        if starting_time is not None and starting_raw:
            raise ValueError("startingOffsets and startingTime are exclusive")
        ending_raw = _get(options, "endingOffsets")
        if streaming is True and (ending_raw or ending_time is not None):
            raise ValueError("endingOffsets/endingTime apply to batch reads only")
        if ending_time is not None and ending_raw:
            raise ValueError("endingOffsets and endingTime are exclusive")
        ending = parse_offset_spec(ending_raw, LATEST, "endingOffsets")
        if ending == EARLIEST:
            raise ValueError("endingOffsets cannot be earliest")
        starting = parse_offset_spec(starting_raw, LATEST if streaming else EARLIEST, "startingOffsets")
        if streaming is False and starting == LATEST:
            raise ValueError("startingOffsets cannot be latest for batch reads")
        client_security, admin_security = securities(options)
        max_records = _int(_get(options, "maxRecordsPerTrigger"), "maxRecordsPerTrigger")
        min_records, max_delay_ms = _min_per_trigger(options, streaming, max_records)
        return cls(
            service_url=service_url,
            admin_url=admin_url.rstrip("/"),
            topics=names,
            topics_pattern=pattern,
            starting=starting,
            ending=ending,
            starting_time=starting_time,
            ending_time=ending_time,
            fail_on_data_loss=_bool(_get(options, "failOnDataLoss"), True),
            wait_for_topics=_bool(_get(options, "waitingForNonExistedTopic"), False),
            allow_different_schemas=_bool(_get(options, "allowDifferentTopicSchemas"), False),
            poll_timeout_ms=_int(_get(options, "pollTimeoutMs"), "pollTimeoutMs") or 2000,
            max_records_per_trigger=max_records,
            min_records_per_trigger=min_records,
            max_trigger_delay_ms=max_delay_ms,
            max_bytes_per_trigger=_int(_get(options, "maxBytesPerTrigger"), "maxBytesPerTrigger"),
            max_entries_per_partition=_int(_get(options, "maxEntriesPerPartition"), "maxEntriesPerPartition") or 50000,
            commit_subscription=commit_subscription(options, bool(streaming), pattern or ",".join(names)),
            client_options=client_kwargs(_client_options(options)),
            reader_options=reader_kwargs(_client_options(options, "pulsar.reader.")),
            client_security=client_security,
            admin_security=admin_security,
        )


@dataclass(frozen=True)
class SinkOptions:
    """Parsed options of a write."""

    service_url: str
    admin_url: str | None = None
    topic: str | None = None
    exactly_once: bool = True
    producer_prefix: str = "spark"
    client_options: dict[str, Any] = field(default_factory=dict)
    producer_options: dict[str, Any] = field(default_factory=dict)
    client_security: ClientSecurity = field(default_factory=ClientSecurity)
    admin_security: ClientSecurity = field(default_factory=ClientSecurity)

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SinkOptions:
        check_option_names(options, SINK_OPTIONS, ("pulsar.client.", "pulsar.admin.", "pulsar.producer."), "sink")
        service_url = _get(options, "service.url")
        if not service_url:
            raise ValueError("option service.url is required (e.g. pulsar://localhost:6650)")
        topic = _get(options, "topic")
        if _get(options, "topics") or _get(options, "topicsPattern"):
            raise ValueError("the sink takes option topic (or a __topic column), not topics/topicsPattern")
        client_security, admin_security = securities(options)
        return cls(
            service_url=service_url,
            admin_url=(_get(options, "admin.url") or "").rstrip("/") or None,
            topic=normalize_topic(topic.strip()) if topic else None,
            exactly_once=_bool(_get(options, "exactlyOnce"), True),
            producer_prefix=_get(options, "producerNamePrefix", "spark") or "spark",
            client_options=client_kwargs(_client_options(options)),
            producer_options=producer_kwargs(_client_options(options, "pulsar.producer.")),
            client_security=client_security,
            admin_security=admin_security,
        )


#: Sequence ids: batch id times this stride plus the row index inside the task, so ids grow across batches
#: for one producer name and a replayed batch reuses exactly its ids (room for 10^9 rows per task and batch).
SEQUENCE_STRIDE = 1_000_000_000


def sequence_id(batch_id: int, row_index: int) -> int:
    """Deterministic, per-producer increasing sequence id of a row of a micro-batch."""
    if row_index >= SEQUENCE_STRIDE:
        raise ValueError(f"more than {SEQUENCE_STRIDE} rows in one task of one micro-batch")
    return batch_id * SEQUENCE_STRIDE + row_index


def producer_name(prefix: str, query_id: str, partition_id: int) -> str:
    """Deterministic producer name per (query, Spark partition): a replay reconnects as the same producer."""
    return f"{prefix}-{query_id}-{partition_id}"


def java_string_hash(key: str) -> int:
    """Java's ``String.hashCode() & Integer.MAX_VALUE`` (the Java client's default key hashing)."""
    h = 0
    data = key.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h & 0x7FFFFFFF


def route(key: str | None, row_index: int, partitions: int) -> int:
    """Deterministic partition of a row: by key hash like the Java client, else round-robin by row index.

    Exactly-once writes need the same row to land on the same partition when a micro-batch is replayed
    (deduplication is per partition and producer); the clients' default round-robin starts at a random one.
    """
    if partitions <= 1:
        return 0
    if key:
        return java_string_hash(key) % partitions
    return row_index % partitions
