"""Broker configuration, with Pulsar's setting names.

Settings are dataclass fields in snake_case; each is also known by Pulsar's camelCase name
(``max_message_size`` <-> ``maxMessageSize``). Sources, later wins: defaults, a
``key=value`` properties file (Pulsar's ``broker.conf`` / ``standalone.conf`` format),
environment variables ``MAGNETAR_<name>`` (either spelling), command-line flags.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(slots=True)
class BrokerConfig:
    """Every broker setting Magnetar understands (defaults as in Pulsar's standalone.conf)."""

    cluster_name: str = "standalone"
    bind_address: str = "0.0.0.0"
    #: Host name in this broker's URLs; blank: the internal listener's host, else ``localhost``.
    #: Must stay blank when ``advertised_listeners`` is set.
    advertised_address: str = ""
    #: Named routes to this broker, ``name:pulsar://host:port[,name:pulsar+ssl://host:port],...``: a client's
    #: ``listener_name`` picks the URLs its lookups answer with (e.g. an external address outside Kubernetes).
    advertised_listeners: str = ""
    #: The listener giving this broker's own URLs (blank: the first of ``advertised_listeners``).
    internal_listener_name: str = ""
    #: Extra sockets, ``name:pulsar://host:port,...`` (PIP-95): lookups arriving on one without a listener
    #: name answer with that listener's URLs.
    bind_addresses: str = ""
    broker_service_port: int = 6650
    web_service_port: int = 8080
    data_dir: str = "data"
    #: Metadata store of a cluster broker (``etcd://host:port[,host:port]``); standalone embeds its own.
    metadata_store_url: str = ""
    #: Run bookie auto-recovery inside this (cluster) broker (BookKeeper's autoRecoveryDaemonEnabled).
    auto_recovery_daemon_enabled: bool = True
    #: Seconds between auto-recovery passes (auditorPeriodicCheckInterval, here in seconds).
    auditor_periodic_check_interval: float = 30
    #: Seconds a bookie must be gone before its ledgers are re-replicated (BookKeeper's lostBookieRecoveryDelay).
    lost_bookie_recovery_delay: float = 30
    #: Largest message (payload + metadata) a producer may send; the frame limit adds 10 KiB.
    max_message_size: int = 5 * 1024 * 1024
    keep_alive_interval_seconds: int = 30
    #: Advertise and serve topic-list watchers (PIP-145, WATCH_TOPIC_LIST) in CONNECTED's feature flags.
    enable_broker_topic_list_watcher: bool = True
    #: Evaluate clients' topics patterns on the broker; off: WATCH_TOPIC_LIST is refused (NotAllowedError).
    enable_broker_side_subscription_pattern_evaluation: bool = True
    #: Longest topics pattern a WATCH_TOPIC_LIST may carry (longer: refused with NotAllowedError).
    subscription_pattern_max_length: int = 50
    allow_auto_topic_creation: bool = True
    allow_auto_topic_creation_type: str = "non-partitioned"
    default_num_partitions: int = 1
    #: Upper bound of a partitioned topic's partition count (0: the built-in ceiling of 100000).
    max_num_partitions_per_partitioned_topic: int = 0
    allow_auto_subscription_creation: bool = True
    max_producers_per_topic: int = 0
    max_consumers_per_subscription: int = 0
    max_unacked_messages_per_consumer: int = 50_000
    #: Track acknowledgements of single messages inside batches (clients' batchIndexAckEnabled): on by
    #: default since Pulsar 4.1 (PIP-391); false restores the 3.x behaviour (a partly acked batch is
    #: redelivered whole).
    acknowledgment_at_batch_index_level_enabled: bool = True
    dispatcher_max_read_batch_size: int = 100
    #: Key_Shared with the pre-4.0 dispatcher: a joining consumer gets only entries read before it joined
    #: until the mark-delete position reaches that point, instead of PIP-379's per-key "draining hashes".
    subscription_key_shared_use_classic_persistent_implementation: bool = False
    #: How often rates (msgRateIn, ...) are recomputed for stats and metrics.
    stats_update_frequency_in_secs: int = 10
    # Policy enforcement (Pulsar's names and defaults)
    message_expiry_check_interval_in_minutes: float = 5
    backlog_quota_check_enabled: bool = True
    backlog_quota_check_interval_in_seconds: float = 60
    subscription_expiry_check_interval_in_minutes: float = 5
    broker_delete_inactive_topics_enabled: bool = True
    broker_delete_inactive_topics_frequency_seconds: float = 60
    # Storage (Pulsar's managedLedger* settings)
    managed_ledger_default_ensemble_size: int = 1
    managed_ledger_default_write_quorum: int = 1
    managed_ledger_default_ack_quorum: int = 1
    managed_ledger_max_entries_per_ledger: int = 50_000
    managed_ledger_max_size_per_ledger_mbytes: int = 2048
    managed_ledger_min_ledger_rollover_time_minutes: float = 10
    managed_ledger_max_ledger_rollover_time_minutes: float = 240
    managed_ledger_cursor_flush_interval_ms: int = 100
    default_retention_time_in_minutes: int = 0
    default_retention_size_in_mb: int = 0
    # Bookie (standalone's in-process bookie)
    journal_directory: str = ""
    ledger_directories: str = ""
    journal_sync_data: bool = True
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def max_frame_size(self) -> int:
        return self.max_message_size + 10 * 1024

    def apply(self, values: dict[str, Any]) -> list[str]:
        """Set known settings from ``values`` (either spelling); returns the unknown keys."""
        unknown = []
        names = {f.name: f for f in dataclasses.fields(self) if f.name != "extra"}
        for key, raw in values.items():
            name = snake_case(key)
            f = names.get(name)
            if f is None:
                self.extra[key] = str(raw)
                unknown.append(key)
                continue
            setattr(self, name, _coerce(f.type, raw, key))
        return unknown

    def to_pulsar_dict(self) -> dict[str, Any]:
        """Settings under Pulsar's camelCase names (for the admin API's configuration endpoints)."""
        out = {camel_case(f.name): getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extra"}
        out.update(self.extra)
        return out


def snake_case(name: str) -> str:
    """``maxMessageSize`` -> ``max_message_size`` (already snake names pass through)."""
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name).lower()


def camel_case(name: str) -> str:
    """``max_message_size`` -> ``maxMessageSize``."""
    first, *rest = name.split("_")
    return first + "".join(p[:1].upper() + p[1:] for p in rest)


def _coerce(type_name: Any, raw: Any, key: str) -> Any:
    text = str(raw).strip()
    try:
        if type_name in ("bool", bool):
            if isinstance(raw, bool):
                return raw
            if text.lower() in ("true", "1", "yes", "on"):
                return True
            if text.lower() in ("false", "0", "no", "off"):
                return False
            raise ValueError(text)
        if type_name in ("int", int):
            return int(text)
        if type_name in ("float", float):
            return float(text)
    except ValueError:
        raise ValueError(f"invalid value for {key}: {raw!r}") from None
    return text


def read_properties(path: Path) -> dict[str, str]:
    """Parse a Java-style ``key=value`` properties file (``#`` and ``!`` comments)."""
    values: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line[0] in "#!":
            continue
        key, sep, value = line.partition("=")
        if not sep:
            key, _, value = line.partition(":")
        values[key.strip()] = value.strip()
    return values


def load_config(
    config_file: str | None,
    overrides: dict[str, Any],
    env: dict[str, str] | None = None,
    defaults: dict[str, Any] | None = None,
) -> BrokerConfig:
    """Build the effective configuration: defaults (``defaults`` over the built-in ones) < file <
    ``MAGNETAR_*`` env < ``overrides``."""
    config = BrokerConfig()
    if defaults:
        config.apply(defaults)
    if config_file:
        config.apply(read_properties(Path(config_file)))
    env = os.environ if env is None else env
    config.apply({k[len("MAGNETAR_") :]: v for k, v in env.items() if k.startswith("MAGNETAR_")})
    config.apply({k: v for k, v in overrides.items() if v is not None})
    return config
