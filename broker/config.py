"""Broker configuration, with Pulsar's setting names.

Every setting is a typed field of :class:`BrokerConfig` with one default and a description
(``field(metadata={"doc": ...})``, readable at run time through :func:`settings`). Fields are
snake_case; each is also known by Pulsar's camelCase name (``max_message_size`` <->
``maxMessageSize``; a name whose acronym camelCase cannot derive, e.g. ``bookkeeperTLSClientAuthentication``,
is given with the field: :func:`pulsar_name`). Sources, later wins: defaults, a ``key=value`` properties file (Pulsar's
``broker.conf`` / ``standalone.conf`` format), environment variables ``MAGNETAR_<name>`` (either
spelling), command-line flags.

Defaults are Pulsar 4.x's (``ServiceConfiguration``) unless a field's description says otherwise.
Names Magnetar does not know are accepted and logged once, as Pulsar ignores unknown keys of
``broker.conf``: an operator's config map written for Pulsar never stops a broker.

``python -m magnetar.broker.config --markdown`` prints the README's settings table.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def _setting(default: Any, doc: str, pulsar_name: str | None = None) -> Any:
    """A setting's field: its one default and its description (shown in the README table); ``pulsar_name``
    when Pulsar's name is not the camelCase of the field's."""
    metadata = {"doc": doc} if pulsar_name is None else {"doc": doc, "pulsar_name": pulsar_name}
    return field(default=default, metadata=metadata)


@dataclass(slots=True)
class BrokerConfig:
    """Every broker setting Magnetar understands."""

    # -- server
    cluster_name: str = _setting("standalone", "Cluster this broker belongs to; created on a standalone's first start.")
    bind_address: str = _setting("0.0.0.0", "Address the binary protocol and HTTP listeners bind to.")
    advertised_address: str = _setting(
        "",
        "Host name in this broker's URLs (blank: the internal listener's host, else `localhost`); "
        "must stay blank when `advertisedListeners` is set.",
    )
    advertised_listeners: str = _setting(
        "",
        "Named routes to this broker, `name:pulsar://host:port[,name:pulsar+ssl://host:port],...`: a client's "
        "`listener_name` picks the URLs its lookups answer with.",
    )
    internal_listener_name: str = _setting(
        "", "Listener giving this broker's own URLs (blank: the first of `advertisedListeners`)."
    )
    bind_addresses: str = _setting(
        "", "Extra sockets `name:pulsar://host:port,...` (PIP-95); lookups on one default to listener `name`."
    )
    broker_service_port: int | None = _setting(
        6650, "Binary protocol port (empty: no plaintext listener, TLS only on `brokerServicePortTls`)."
    )
    web_service_port: int | None = _setting(
        8080, "HTTP port (admin REST API, lookups, metrics) (empty: HTTPS only, on `webServicePortTls`)."
    )
    data_dir: str = _setting("data", "Where a standalone keeps messages and metadata (Magnetar's own).")
    metadata_store_url: str = _setting(
        "", "Metadata store of a cluster broker (`etcd://host:port[,host:port]`); standalone embeds its own."
    )
    max_message_size: int = _setting(
        5 * 1024 * 1024, "Largest message (payload + metadata) a producer may send; frames may be 10 KiB larger."
    )
    max_uncompressed_message_size: int = _setting(
        64 * 1024 * 1024,
        "Largest uncompressed size a stored message may declare for the admin API to decompress it "
        "(Magnetar's own; larger: 409). Bounds the memory one message read through the admin API costs.",
    )
    keep_alive_interval_seconds: int = _setting(30, "PING interval; a peer silent for two intervals is dropped.")
    enable_broker_topic_list_watcher: bool = _setting(
        True, "Serve and advertise topic-list watchers (PIP-145, WATCH_TOPIC_LIST)."
    )
    enable_broker_side_subscription_pattern_evaluation: bool = _setting(
        True, "Evaluate clients' topics patterns on the broker; off: WATCH_TOPIC_LIST is refused (NotAllowedError)."
    )
    subscription_pattern_max_length: int = _setting(
        50, "Longest topics pattern a WATCH_TOPIC_LIST may carry (longer: refused with NotAllowedError)."
    )
    stats_update_frequency_in_secs: int = _setting(
        10, "How often rates (msgRateIn, ...) are recomputed for stats and metrics (Pulsar: 60)."
    )
    topic_level_policies_enabled: bool = _setting(
        True, "Serve topic-level policies; when false their admin endpoints answer 405."
    )
    event_loop_probe_interval_ms: int = _setting(
        0,
        "Debug (Magnetar's own): measure the event loop's lag every this many ms and time GC collections, "
        "as histograms `magnetar_event_loop_lag_seconds` and `magnetar_gc_pause_seconds` on /metrics (0: off).",
    )
    event_loop_lag_warn_ms: int = _setting(
        100, "With the event-loop probe on, log a loop lag or a GC collection at least this long (Magnetar's own)."
    )
    # -- several brokers on one metadata store (cluster mode; standalone owns every bundle itself)
    metadata_store_session_timeout_millis: int = _setting(
        30_000, "Lease of this broker's registration and bundle ownership: a broker silent this long loses its bundles."
    )
    load_balancer_report_update_min_interval_millis: int = _setting(
        5_000, "How often this broker publishes its load report (topics, bundles, rates, CPU, memory)."
    )
    load_balancer_enabled: bool = _setting(True, "Run the load manager (bundle shedding and automatic splits).")
    load_balancer_shedding_enabled: bool = _setting(True, "Let the leader unload bundles from overloaded brokers.")
    load_balancer_shedding_interval_minutes: float = _setting(1, "Period of the leader's shedding pass.")
    load_balancer_broker_overloaded_threshold_percentage: int = _setting(
        85, "A broker whose load exceeds the mean by more than this (percent) sheds a bundle."
    )
    load_balancer_auto_bundle_split_enabled: bool = _setting(True, "Split bundles with too many topics.")
    load_balancer_namespace_bundle_max_topics: int = _setting(
        1000, "A bundle with more topics than this is split in two by its owner."
    )
    topic_load_timeout_seconds: float = _setting(
        60,
        "Longest wait of a topic load for the topic's previous instance to finish closing (an unload or bundle "
        "move in progress); past it the client gets ServiceNotReady and retries.",
    )
    broker_shutdown_timeout_ms: int = _setting(
        60_000, "Longest graceful shutdown (SIGTERM: readiness off, bundles unloaded, then close)."
    )
    # -- auto-recovery (BookKeeper's names; a cluster broker can run it in-process)
    auto_recovery_daemon_enabled: bool = _setting(
        True, "Run bookie auto-recovery inside this (cluster) broker (BookKeeper's autoRecoveryDaemonEnabled)."
    )
    auditor_periodic_check_interval: float = _setting(
        30, "Seconds between auto-recovery passes (BookKeeper's auditorPeriodicCheckInterval)."
    )
    lost_bookie_recovery_delay: float = _setting(
        30, "Seconds a bookie must be gone before its ledgers are re-replicated (BookKeeper's lostBookieRecoveryDelay)."
    )
    # -- topics and subscriptions
    allow_auto_topic_creation: bool = _setting(True, "Create topics on first use.")
    allow_auto_topic_creation_type: str = _setting(
        "non-partitioned", "Type of auto-created topics: `non-partitioned` or `partitioned`."
    )
    default_num_partitions: int = _setting(1, "Partitions of an auto-created partitioned topic.")
    max_num_partitions_per_partitioned_topic: int = _setting(
        0, "Upper bound of a partitioned topic's partition count (0: the built-in ceiling of 100000)."
    )
    allow_auto_subscription_creation: bool = _setting(True, "Create subscriptions on first subscribe.")
    max_producers_per_topic: int = _setting(0, "Producers a topic accepts (0: unlimited).")
    max_consumers_per_topic: int = _setting(0, "Consumers a topic accepts (0: unlimited).")
    max_consumers_per_subscription: int = _setting(0, "Consumers a subscription accepts (0: unlimited).")
    max_subscriptions_per_topic: int = _setting(0, "Subscriptions a topic accepts (0: unlimited).")
    max_unacked_messages_per_consumer: int = _setting(
        50_000, "Shared consumers stop receiving while they hold this many unacknowledged messages (0: unlimited)."
    )
    max_unacked_messages_per_subscription: int = _setting(
        200_000, "Unacknowledged messages per Shared subscription (0: unlimited); the applied default of the policy."
    )
    acknowledgment_at_batch_index_level_enabled: bool = _setting(
        True,
        "Track acknowledgements of single messages inside batches (Pulsar 4.1, PIP-391); false restores the 3.x "
        "behaviour (a partly acked batch is redelivered whole).",
    )
    dispatcher_max_read_batch_size: int = _setting(100, "Entries read from storage per dispatch round.")
    dispatcher_read_failure_backoff_initial_time_in_ms: int = _setting(
        15000, "Wait (ms) before a dispatcher retries a failed read; doubles per failure, reset by a success."
    )
    dispatcher_read_failure_backoff_max_time_in_ms: int = _setting(
        60000, "Longest wait (ms) between a dispatcher's read retries."
    )
    dispatcher_read_failure_backoff_mandatory_stop_time_in_ms: int = _setting(
        0, "Time (ms) after the first failed read at which one retry is made however long the wait has grown (0: none)."
    )
    # -- namespace defaults and limits
    default_number_of_namespace_bundles: int = _setting(
        1, "Bundles of a namespace created without a bundle count (Pulsar: 4)."
    )
    load_balancer_namespace_maximum_bundles: int = _setting(128, "Most bundles a namespace may have.")
    force_delete_namespace_allowed: bool = _setting(True, "Allow `force=true` namespace deletion (Pulsar: false).")
    force_delete_tenant_allowed: bool = _setting(True, "Allow `force=true` tenant deletion (Pulsar: false).")
    # -- message TTL, backlog quotas, expiry of subscriptions and topics
    ttl_duration_default_in_seconds: int = _setting(
        0, "Message TTL of namespaces and topics without their own (0: none)."
    )
    message_expiry_check_interval_in_minutes: float = _setting(5, "How often expired messages are acknowledged.")
    backlog_quota_check_enabled: bool = _setting(True, "Enforce backlog quotas.")
    backlog_quota_check_interval_in_seconds: float = _setting(60, "How often backlog quotas are checked.")
    backlog_quota_default_limit_bytes: int = _setting(
        -1, "Backlog quota by size of topics without their own (bytes; negative: none)."
    )
    backlog_quota_default_limit_second: int = _setting(
        -1, "Backlog quota by age of topics without their own (seconds; negative: none)."
    )
    backlog_quota_default_retention_policy: str = _setting(
        "producer_request_hold",
        "What an exceeded default quota does: `producer_request_hold`, `producer_exception` or "
        "`consumer_backlog_eviction`.",
    )
    subscription_expiration_time_minutes: int = _setting(0, "Delete subscriptions inactive this long (0: never).")
    subscription_expiry_check_interval_in_minutes: float = _setting(
        5, "How often inactive subscriptions are looked for."
    )
    broker_delete_inactive_topics_enabled: bool = _setting(True, "Delete inactive topics.")
    broker_delete_inactive_topics_frequency_seconds: float = _setting(60, "How often inactive topics are looked for.")
    broker_delete_inactive_topics_mode: str = _setting(
        "delete_when_no_subscriptions",
        "Which inactive topics go: `delete_when_no_subscriptions` or `delete_when_subscriptions_caught_up`.",
    )
    broker_delete_inactive_topics_max_inactive_duration_seconds: int | None = _setting(
        None, "Seconds a topic must be inactive before deletion (unset: the check frequency)."
    )
    broker_unload_inactive_topics_seconds: int = _setting(
        300,
        "Unload a topic without producers or consumers that has been idle this long (Magnetar's own; 0: never): "
        "its data and subscriptions stay stored and it loads again on next use. Bounds the broker's memory to "
        "the topics in use; checked every `brokerDeleteInactiveTopicsFrequencySeconds`.",
    )
    # -- publish back-pressure
    max_pending_publish_requests_per_connection: int = _setting(
        1000, "Sends awaiting persistence after which a connection is no longer read until half completed (0: off)."
    )
    max_message_publish_buffer_size_in_mb: int = _setting(
        256,
        "Payload of sends awaiting persistence, broker-wide, after which connections with producers are no longer "
        "read until it is below half (0: off; Pulsar: half the direct memory).",
        "maxMessagePublishBufferSizeInMB",
    )
    # -- deduplication
    broker_deduplication_enabled: bool = _setting(
        False, "Deduplicate messages of namespaces and topics that do not decide for themselves."
    )
    broker_deduplication_entries_interval: int = _setting(
        1000, "Entries between snapshots of a topic's deduplication state."
    )
    broker_deduplication_max_number_of_producers: int = _setting(
        10000,
        "Producer names a deduplication snapshot persists (connected ones first, then the most recently active); "
        "bounds the stored value.",
    )
    broker_deduplication_producer_inactivity_timeout_minutes: int = _setting(
        360, "A disconnected producer's deduplication state is forgotten after this long."
    )
    # -- delayed delivery
    delayed_delivery_enabled: bool = _setting(
        True, "Hold messages with a delivery time until it comes (Shared and Key_Shared)."
    )
    delayed_delivery_tick_time_millis: int = _setting(
        1000, "Resolution of delayed delivery: a message may go out this much early unless strict."
    )
    delayed_delivery_max_delay_in_millis: int = _setting(
        0, "Longest delivery delay (0: unlimited); reported in the applied delayed-delivery policy."
    )
    is_delayed_delivery_deliver_at_time_strict: bool = _setting(
        False, "Never deliver a delayed message before its time (otherwise up to one tick early)."
    )
    # -- Key_Shared
    subscription_key_shared_use_classic_persistent_implementation: bool = _setting(
        False,
        "Key_Shared with the pre-4.0 dispatcher (a joining consumer gets only entries read before it joined) "
        "instead of PIP-379's draining hashes.",
    )
    subscription_key_shared_use_consistent_hashing: bool = _setting(
        False, "Key_Shared auto-split by consistent hashing instead of hash ranges (Pulsar: true)."
    )
    subscription_key_shared_consistent_hashing_replica_points: int = _setting(
        100, "Points per consumer on the consistent-hashing ring."
    )
    key_shared_look_ahead_msg_in_replay_threshold_per_subscription: int = _setting(
        20_000, "Key_Shared stops reading ahead while this many entries wait for busy keys."
    )
    # -- schemas
    schema_compatibility_strategy: str = _setting(
        "FULL", "Schema compatibility of namespaces and topics without their own strategy."
    )
    is_allow_auto_update_schema_enabled: bool = _setting(
        True, "Producers may register new schema versions (namespaces' `is_allow_auto_update_schema` default)."
    )
    is_schema_validation_enforced: bool = _setting(
        False, "Refuse producers without a schema on topics that have one (namespaces may enforce it too)."
    )
    # -- system topics
    system_topic_enabled: bool = _setting(
        True, "Write topic-policy change events to each namespace's `__change_events` system topic."
    )
    # -- compaction
    broker_service_compaction_monitor_interval_in_seconds: int = _setting(
        60, "How often topics are checked against their compaction threshold."
    )
    broker_service_compaction_threshold_in_bytes: int = _setting(
        0, "Compact a topic once its backlog after the last compaction exceeds this (namespaces' default; 0 = never)."
    )
    topic_compaction_retain_null_key: bool = _setting(
        False, "Keep messages without a key in the compacted view (PIP-318; Pulsar 3.2+ default: dropped)."
    )
    # -- storage (Pulsar's managedLedger* settings)
    managed_ledger_default_ensemble_size: int = _setting(
        1, "Bookies per ledger (E) (Pulsar's broker.conf: 2; standalone.conf and Magnetar: 1)."
    )
    managed_ledger_default_write_quorum: int = _setting(
        1, "Copies of each entry (Qw) (Pulsar's broker.conf: 2; standalone.conf and Magnetar: 1)."
    )
    managed_ledger_default_ack_quorum: int = _setting(
        1, "Copies acknowledged before a write completes (Qa) (Pulsar's broker.conf: 2; standalone.conf: 1)."
    )
    managed_ledger_max_ensemble_size: int = _setting(5, "Largest ensemble a persistence policy may ask for.")
    managed_ledger_max_write_quorum: int = _setting(5, "Largest write quorum a persistence policy may ask for.")
    managed_ledger_max_ack_quorum: int = _setting(5, "Largest ack quorum a persistence policy may ask for.")
    managed_ledger_default_mark_delete_rate_limit: float = _setting(
        1.0, "Mark-delete rate of the applied persistence policy (reported; acks are persisted by flush interval)."
    )
    managed_ledger_max_entries_per_ledger: int = _setting(50_000, "Ledger rollover by entries.")
    managed_ledger_max_size_per_ledger_mbytes: int = _setting(2048, "Ledger rollover by size.")
    managed_ledger_min_ledger_rollover_time_minutes: float = _setting(
        10, "A ledger is not rolled over before this age."
    )
    managed_ledger_max_ledger_rollover_time_minutes: float = _setting(240, "A ledger is rolled over at this age.")
    managed_ledger_max_unacked_ranges_to_persist: int = _setting(
        10000, "Ack holes (individually acked ranges) persisted per cursor; more are kept in memory only."
    )
    managed_ledger_max_batch_deleted_index_to_persist: int = _setting(
        10000, "Partly acked batches whose index state is persisted per cursor; more are kept in memory only."
    )
    managed_ledger_cache_size_mb: int = _setting(
        64,
        "Entry cache of recently added entries, shared by all topics, in MiB; counts each entry's "
        "in-memory overhead, not only its payload (Magnetar's own default; Pulsar's is a share of direct memory).",
        "managedLedgerCacheSizeMB",
    )
    managed_ledger_cache_eviction_time_threshold_millis: int = _setting(
        1000, "Cached entries are evicted after one to two of this (0: only the cache size evicts)."
    )
    managed_ledger_cursor_flush_interval_ms: int = _setting(
        100, "Cursor acks are persisted in groups at this interval; ACKs with a receipt wait for it (Magnetar's own)."
    )
    default_retention_time_in_minutes: int = _setting(
        0, "Keep acknowledged data this long (-1: forever) where no retention policy is set."
    )
    default_retention_size_in_mb: int = _setting(
        0,
        "Keep this much acknowledged data (-1: unlimited) where no retention policy is set.",
        "defaultRetentionSizeInMB",
    )
    # -- bookie (standalone's in-process bookie)
    journal_directory: str = _setting("", "Bookie journal directory (empty: `<dataDir>/bookie/journal`).")
    ledger_directories: str = _setting("", "Bookie entry-log directories (empty: `<dataDir>/bookie/ledgers`).")
    journal_sync_data: bool = _setting(True, "fdatasync the journal before acknowledging an add.")
    journal_max_group_wait_ms: float = _setting(
        1.0,
        "How long an add that finds the journal writer idle waits for others to share its fdatasync (0: never; "
        "Pulsar's bookkeeper.conf also sets 1).",
        "journalMaxGroupWaitMSec",
    )
    journal_adaptive_group_wait: bool = _setting(
        True,
        "Wait only while such waits gather more adds, so a producer awaiting each receipt is never held (false: "
        "always wait, as BookKeeper does; Magnetar's own).",
    )
    journal_reuse_files: int = _setting(
        4,
        "Obsolete journal files kept to be reused instead of pre-writing new ones with zeros (0: delete them).",
        "journalReuseFiles",
    )
    db_storage_write_cache_max_size_mb: int = _setting(
        16,
        "Write cache of the standalone's bookie, MiB of memory (entries' bytes and ~160 bytes of bookkeeping "
        "each): a checkpoint flushes it to the entry log when full (memory peaks near twice this while one "
        "flushes; the `bookie` command's default is 64).",
        "dbStorage_writeCacheMaxSizeMb",
    )
    # -- process
    malloc_trim_interval_seconds: float = _setting(
        0.0,
        "Give heap memory freed since the last time back to the OS (glibc `malloc_trim`) this often; 0: never "
        "(glibc keeps it for reuse). Lowers resident memory after bursts of large entries; each trim takes ~10-70 ms "
        "on a worker thread (Magnetar's own). Off by default: every 1 s it doubled the broker CPU per batched 1 KB "
        "message (pages given back are faulted in again) without lowering the benchmark's RSS peak.",
    )
    # -- TLS (PEM files; reloaded when they change)
    broker_service_port_tls: int | None = _setting(
        None, "Binary protocol port with TLS (`pulsar+ssl://`; Pulsar's docs use 6651) (unset: no TLS listener)."
    )
    web_service_port_tls: int | None = _setting(
        None, "HTTPS port (admin REST API, lookups, metrics; Pulsar's docs use 8443) (unset: no HTTPS listener)."
    )
    tls_certificate_file_path: str = _setting("", "PEM certificate (chain) of this broker's TLS listeners.")
    tls_key_file_path: str = _setting("", "PEM private key of `tlsCertificateFilePath` (unencrypted).")
    tls_trust_certs_file_path: str = _setting(
        "", "PEM CA certificates that client certificates are verified against (empty: none are asked for)."
    )
    tls_require_trusted_client_cert_on_connect: bool = _setting(
        False,
        "Refuse TLS clients without a certificate trusted by `tlsTrustCertsFilePath` (mutual TLS); otherwise a "
        "client certificate is optional, and verified when given (for TLS authentication).",
    )
    tls_allow_insecure_connection: bool = _setting(
        False,
        "Accept TLS clients whatever certificate they present: client certificates are then not verified, "
        "so they cannot be used for authentication.",
    )
    tls_cert_refresh_check_duration_sec: float = _setting(
        300,
        "How often the certificate, key and trust files are checked for changes (e.g. rotated by cert-manager); "
        "new connections get the new certificate, open ones keep theirs (0: never).",
    )
    tls_protocols: str = _setting(
        "", "Comma list of TLS versions the listeners accept, e.g. `TLSv1.3,TLSv1.2` (empty: TLSv1.2 and later)."
    )
    tls_ciphers: str = _setting(
        "",
        "Comma list of TLS 1.2 cipher suites the listeners accept, by standard (Java) or OpenSSL names "
        "(empty: OpenSSL's defaults; TLS 1.3 suites cannot be restricted).",
    )
    bookkeeper_tls_client_authentication: bool = _setting(
        False,
        "Talk TLS to the bookies (cluster mode; the bookies must serve TLS), verifying them against "
        "`bookkeeperTLSTrustCertsFilePath` and presenting `bookkeeperTLSCertificateFilePath` when set.",
        "bookkeeperTLSClientAuthentication",
    )
    bookkeeper_tls_trust_certs_file_path: str = _setting(
        "",
        "PEM CA certificates the bookies' certificates are verified against (empty: the system's).",
        "bookkeeperTLSTrustCertsFilePath",
    )
    bookkeeper_tls_certificate_file_path: str = _setting(
        "",
        "PEM client certificate this broker presents to the bookies (empty: none).",
        "bookkeeperTLSCertificateFilePath",
    )
    bookkeeper_tls_key_file_path: str = _setting(
        "", "PEM private key of `bookkeeperTLSCertificateFilePath`.", "bookkeeperTLSKeyFilePath"
    )
    metadata_store_config_path: str = _setting(
        "",
        "Pulsar's metadata-store YAML: `useTls: true` with `tlsTrustCertsFilePath`, `tlsCertificateFilePath`, "
        "`tlsKeyFilePath` connects to etcd with TLS (or give them as `metadataStoreUrl` parameters: "
        "`etcd://host:2379?tls=true&tlsTrustCertsFilePath=...`).",
    )
    # -- authentication
    authentication_enabled: bool = _setting(False, "Require clients (binary protocol and HTTP) to authenticate.")
    authentication_providers: str = _setting(
        "",
        "Comma list of authentication providers (Pulsar's class names, e.g. "
        "`org.apache.pulsar.broker.authentication.AuthenticationProviderToken`, or the short `token`, `basic`, `tls`).",
    )
    anonymous_user_role: str = _setting(
        "", "Role of clients presenting no credentials when authentication is on (empty: they are refused)."
    )
    authentication_refresh_check_seconds: int = _setting(
        60,
        "How often a binary connection's credentials are checked; expired ones get an AUTH_CHALLENGE, and a "
        "connection that has not answered it by the next check is closed (0: never checked).",
    )
    authenticate_metrics_endpoint: bool = _setting(
        False, "Whether `/metrics` needs credentials when authentication is on (Pulsar 4.x default: no)."
    )
    token_secret_key: str = _setting(
        "",
        "HMAC key checking tokens (`file:///path`, `data:;base64,...`, `env:VAR`, a path, or base64 of the raw "
        "key, as `magnetar tokens create-secret-key` writes it).",
    )
    token_public_key: str = _setting(
        "", "Public key checking tokens (DER or PEM; same forms as `tokenSecretKey`), when no secret key is set."
    )
    token_public_alg: str = _setting(
        "RS256", "Algorithm family of `tokenPublicKey` (RS256/384/512, PS256/384/512, ES256/384/512)."
    )
    token_auth_claim: str = _setting("sub", "Token claim holding the role (a list gives its first string).")
    token_audience_claim: str = _setting(
        "", "Token claim naming its audiences (e.g. `aud`); set with `tokenAudience` to require this broker's."
    )
    token_audience: str = _setting("", "The audience standing for this broker, required in `tokenAudienceClaim`.")
    broker_client_authentication_plugin: str = _setting(
        "",
        "Credentials this broker presents to other brokers' HTTP API (bundle unloads, load shedding): "
        "`org.apache.pulsar.client.impl.auth.AuthenticationToken` or `...AuthenticationBasic`.",
    )
    broker_client_authentication_parameters: str = _setting(
        "", "Parameters of `brokerClientAuthenticationPlugin` (`token:<jwt>`, `file:///path`, JSON), as Pulsar's."
    )
    basic_auth_conf: str = _setting(
        "",
        "htpasswd file of the `basic` provider (a path, `file:`, `data:;base64,` or `env:`): `user:hash` lines, "
        "hashes apr1 (`htpasswd -m`), crypt (`$1$`, `$5$`, `$6$`, DES) or bcrypt (`htpasswd -B`).",
    )
    # -- authorization
    authorization_enabled: bool = _setting(
        False, "Check every operation against the authenticated role's permissions (needs authentication)."
    )
    super_user_roles: str = _setting("", "Comma list of roles allowed every operation (and to administer tenants).")
    authorization_allow_wildcards_matching: bool = _setting(
        False, "Let a permission granted to `prefix*` or `*suffix` match roles by prefix or suffix."
    )
    #: Settings given that Magnetar does not know, kept verbatim (the admin API's configuration lists them).
    extra: dict[str, str] = field(default_factory=dict, metadata={"internal": True})

    @property
    def max_frame_size(self) -> int:
        return self.max_message_size + 10 * 1024

    def apply(self, values: dict[str, Any]) -> list[str]:
        """Set known settings from ``values`` (either spelling); returns the unknown keys (kept in ``extra``)."""
        unknown = []
        names = _names()
        for key, raw in values.items():
            f = names.get(key) or names.get(snake_case(key))
            if f is None:
                self.extra[key] = str(raw)
                unknown.append(key)
                continue
            setattr(self, f.name, _coerce(f.type, raw, key))
        return unknown

    def to_pulsar_dict(self) -> dict[str, Any]:
        """Settings under Pulsar's camelCase names (for the admin API's configuration endpoints)."""
        out = {pulsar_name(f): getattr(self, f.name) for f in settings()}
        out.update(self.extra)
        return out


def settings() -> list[dataclasses.Field[Any]]:
    """The settings' fields, in declaration order (each with ``metadata["doc"]``)."""
    return [f for f in dataclasses.fields(BrokerConfig) if not f.metadata.get("internal")]


def pulsar_name(f: dataclasses.Field[Any]) -> str:
    """A setting's Pulsar name: camelCase of the field's, unless the field says otherwise."""
    return f.metadata.get("pulsar_name") or camel_case(f.name)


def _names() -> dict[str, dataclasses.Field[Any]]:
    """Every spelling a setting is known by: field name, Pulsar name, and the snake_case of the latter."""
    out: dict[str, dataclasses.Field[Any]] = {}
    for f in settings():
        name = pulsar_name(f)
        out.update({f.name: f, name: f, snake_case(name): f})
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
    optional = isinstance(type_name, str) and type_name.endswith(" | None")
    if optional:
        if raw is None or text == "":
            return None
        type_name = type_name.removesuffix(" | None")
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


#: ``MAGNETAR_*`` variables that configure other parts of the process, not the broker.
_NOT_SETTINGS = re.compile(r"LOG_LEVEL|OPERATOR_.*")


def load_config(
    config_file: str | None,
    overrides: dict[str, Any],
    env: dict[str, str] | None = None,
    defaults: dict[str, Any] | None = None,
) -> BrokerConfig:
    """Build the effective configuration: defaults (``defaults`` over the built-in ones) < file <
    ``MAGNETAR_*`` env < ``overrides``. Unknown names are logged once and otherwise ignored."""
    config = BrokerConfig()
    unknown: list[str] = []
    if defaults:
        unknown += config.apply(defaults)
    if config_file:
        unknown += config.apply(read_properties(Path(config_file)))
    variables = os.environ if env is None else env
    unknown += config.apply(
        {
            k[len("MAGNETAR_") :]: v
            for k, v in variables.items()
            if k.startswith("MAGNETAR_") and not _NOT_SETTINGS.fullmatch(k[len("MAGNETAR_") :])
        }
    )
    unknown += config.apply({k: v for k, v in overrides.items() if v is not None})
    if unknown:
        log.warning("ignoring settings Magnetar does not implement: %s", ", ".join(sorted(set(unknown))))
    return config


# ---------------------------------------------------------------------------------------- documentation
def _markdown_default(value: Any) -> str:
    if value is None:
        return "(unset)"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if value == "":
        return "(empty)"
    return f"`{value}`"


def markdown_table() -> str:
    """The README's settings table: one row per setting, from the fields' defaults and descriptions."""
    rows = ["| setting | default | meaning |", "| --- | --- | --- |"]
    rows += [f"| `{pulsar_name(f)}` | {_markdown_default(f.default)} | {f.metadata['doc']} |" for f in settings()]
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m magnetar.broker.config", description=__doc__)
    parser.add_argument("--markdown", action="store_true", help="print the settings table (Markdown)")
    args = parser.parse_args(argv)
    if args.markdown:
        print(markdown_table(), end="")
    else:
        parser.print_help()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
