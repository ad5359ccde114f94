"""Prometheus text exposition of broker, topic and subscription metrics with Pulsar's metric names."""

from __future__ import annotations

import gc
import os
import resource
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from magnetar.broker.service import BrokerService

_START = time.time()
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

# name -> (type, help); every series the broker exports, Pulsar's names where Pulsar has one.
_TOPIC_METRICS = {
    "pulsar_subscriptions_count": ("gauge", "Subscriptions of the topic"),
    "pulsar_producers_count": ("gauge", "Connected producers"),
    "pulsar_consumers_count": ("gauge", "Connected consumers"),
    "pulsar_rate_in": ("gauge", "Messages published per second"),
    "pulsar_rate_out": ("gauge", "Messages dispatched per second"),
    "pulsar_throughput_in": ("gauge", "Bytes published per second"),
    "pulsar_throughput_out": ("gauge", "Bytes dispatched per second"),
    "pulsar_storage_size": ("gauge", "Bytes stored for the topic"),
    "pulsar_msg_backlog": ("gauge", "Entries not yet acknowledged, summed over subscriptions"),
    "pulsar_storage_backlog_size": ("gauge", "Estimated bytes of the largest subscription backlog"),
    "pulsar_in_messages_total": ("counter", "Messages published"),
    "pulsar_in_bytes_total": ("counter", "Bytes published"),
    "pulsar_out_messages_total": ("counter", "Messages dispatched"),
    "pulsar_out_bytes_total": ("counter", "Bytes dispatched"),
    "pulsar_storage_entries": ("gauge", "Entries stored for the topic"),
}
_SUBSCRIPTION_METRICS = {
    "pulsar_subscription_back_log": ("gauge", "Entries not yet acknowledged by the subscription"),
    "pulsar_subscription_msg_rate_out": ("gauge", "Messages dispatched per second to the subscription"),
    "pulsar_subscription_msg_throughput_out": ("gauge", "Bytes dispatched per second to the subscription"),
    "pulsar_subscription_msg_rate_redeliver": ("gauge", "Messages redelivered per second"),
    "pulsar_subscription_unacked_messages": ("gauge", "Messages delivered and not acknowledged"),
    "pulsar_subscription_consumers_count": ("gauge", "Consumers of the subscription"),
    "pulsar_subscription_blocked_on_unacked_messages": ("gauge", "1 when a consumer is blocked on unacked messages"),
    "pulsar_subscription_msg_rate_expired": ("gauge", "Messages expired per second"),
    "pulsar_subscription_total_msg_expired": ("counter", "Messages expired by TTL or admin"),
}


def _labels(**labels: str) -> str:
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
    return "{" + inner + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _header(name: str, kind: str, text: str) -> list[str]:
    return [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]


def render(service: BrokerService) -> str:
    """The whole exposition document."""
    cluster = service.config.cluster_name
    topic_rows: dict[str, list[str]] = {name: [] for name in _TOPIC_METRICS}
    sub_rows: dict[str, list[str]] = {name: [] for name in _SUBSCRIPTION_METRICS}
    topics_per_ns: dict[str, int] = {}
    for topic in service.loaded_topics():
        ns = topic.name.namespace
        topics_per_ns[ns] = topics_per_ns.get(ns, 0) + 1
        lbl = _labels(cluster=cluster, namespace=ns, topic=str(topic.name))
        subs = topic.subscriptions.values()
        values = {
            "pulsar_subscriptions_count": len(topic.subscriptions),
            "pulsar_producers_count": len(topic.producers),
            "pulsar_consumers_count": sum(len(s.consumers) for s in subs),
            "pulsar_rate_in": topic.meter_in.msg_rate,
            "pulsar_rate_out": sum(s.meter_out.msg_rate for s in subs),
            "pulsar_throughput_in": topic.meter_in.byte_rate,
            "pulsar_throughput_out": sum(s.meter_out.byte_rate for s in subs),
            "pulsar_storage_size": topic.ledger.total_size,
            "pulsar_msg_backlog": sum(s.backlog() for s in subs),
            "pulsar_storage_backlog_size": max((s.backlog_size() for s in subs), default=0),
            "pulsar_in_messages_total": topic.meter_in.msgs,
            "pulsar_in_bytes_total": topic.meter_in.bytes,
            "pulsar_out_messages_total": sum(s.meter_out.msgs for s in subs),
            "pulsar_out_bytes_total": sum(s.meter_out.bytes for s in subs),
            "pulsar_storage_entries": topic.ledger.number_of_entries,
        }
        for name, value in values.items():
            topic_rows[name].append(f"{name}{lbl} {value}")
        for sub in subs:
            slbl = _labels(cluster=cluster, namespace=ns, topic=str(topic.name), subscription=sub.name)
            svalues = {
                "pulsar_subscription_back_log": sub.backlog(),
                "pulsar_subscription_msg_rate_out": sum(c.meter.msg_rate for c in sub.consumers),
                "pulsar_subscription_msg_throughput_out": sum(c.meter.byte_rate for c in sub.consumers),
                "pulsar_subscription_msg_rate_redeliver": sum(c.meter_redeliver.msg_rate for c in sub.consumers),
                "pulsar_subscription_unacked_messages": sum(c.unacked_messages for c in sub.consumers),
                "pulsar_subscription_consumers_count": len(sub.consumers),
                "pulsar_subscription_blocked_on_unacked_messages": int(any(c.blocked for c in sub.consumers)),
                "pulsar_subscription_msg_rate_expired": sub.meter_expired.msg_rate,
                "pulsar_subscription_total_msg_expired": sub.meter_expired.msgs,
            }
            for name, value in svalues.items():
                sub_rows[name].append(f"{name}{slbl} {value}")
    lines: list[str] = []
    for name, (kind, text) in _TOPIC_METRICS.items():
        lines += _header(name, kind, text) + topic_rows[name]
    for name, (kind, text) in _SUBSCRIPTION_METRICS.items():
        lines += _header(name, kind, text) + sub_rows[name]
    lines += _header("pulsar_topics_count", "gauge", "Topics loaded on this broker, per namespace")
    lines += [
        f"pulsar_topics_count{_labels(cluster=cluster, namespace=ns)} {n}" for ns, n in sorted(topics_per_ns.items())
    ]
    lines += _header("pulsar_broker_connections", "gauge", "Open client connections on the binary port")
    lines.append(f"pulsar_broker_connections{_labels(cluster=cluster)} {len(service.connections)}")
    lines += _header("magnetar_topic_list_watchers", "gauge", "Open topic-list watchers (WATCH_TOPIC_LIST)")
    lines.append(f"magnetar_topic_list_watchers{_labels(cluster=cluster)} {service.topic_lists.watcher_count()}")
    cache = getattr(service.ledgers, "cache", None)
    if cache is not None:
        lines += _header("pulsar_ml_cache_used_size", "gauge", "Bytes held by the managed-ledger entry cache")
        lines.append(f"pulsar_ml_cache_used_size{_labels(cluster=cluster)} {cache.size}")
        lines += _header("pulsar_ml_cache_evictions", "counter", "Entry-cache eviction runs")
        lines.append(f"pulsar_ml_cache_evictions{_labels(cluster=cluster)} {cache.evictions}")
    recovery = getattr(service, "auto_recovery", None)
    if recovery is not None:
        stats = recovery.stats
        for name, kind, text, value in (
            (
                "magnetar_autorecovery_under_replicated_ledgers",
                "gauge",
                "Ledgers marked under-replicated",
                stats.under_replicated,
            ),
            ("magnetar_autorecovery_lost_bookies", "gauge", "Bookies lost from ensembles", len(stats.lost_bookies)),
            (
                "magnetar_autorecovery_ledgers_recovered_total",
                "counter",
                "Ledgers re-replicated",
                stats.ledgers_recovered,
            ),
            ("magnetar_autorecovery_entries_copied_total", "counter", "Entries copied", stats.entries_copied),
            ("magnetar_autorecovery_failures_total", "counter", "Failed recovery attempts", stats.failures),
        ):
            lines += _header(name, kind, text)
            lines.append(f"{name}{_labels(cluster=cluster)} {value}")
    if service.loop_probe is not None:
        lines += service.loop_probe.metric_lines(_labels(cluster=cluster)[1:-1])
    lines += list(_process_metrics())
    return "\n".join(lines) + "\n"


def _process_metrics() -> Iterable[str]:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    yield from _header("process_cpu_seconds_total", "counter", "User and system CPU time of the broker process")
    yield f"process_cpu_seconds_total {usage.ru_utime + usage.ru_stime}"
    rss = usage.ru_maxrss * 1024
    try:
        with open("/proc/self/statm") as f:
            rss = int(f.read().split()[1]) * _PAGE
    except OSError:
        pass
    yield from _header("process_resident_memory_bytes", "gauge", "Resident memory of the broker process")
    yield f"process_resident_memory_bytes {rss}"
    try:
        fds = len(os.listdir("/proc/self/fd"))
    except OSError:
        fds = -1
    yield from _header("process_open_fds", "gauge", "Open file descriptors")
    yield f"process_open_fds {fds}"
    yield from _header("process_start_time_seconds", "gauge", "Start time of the process since the epoch")
    yield f"process_start_time_seconds {_START}"
    yield from _gc_metrics()


def _gc_metrics() -> Iterable[str]:
    """The cyclic GC's counters under the names of Prometheus' Python client, and the objects frozen
    after start-up (never walked by a collection)."""
    stats = gc.get_stats()
    for name, key, text in (
        ("python_gc_objects_collected_total", "collected", "Objects collected during gc"),
        ("python_gc_objects_uncollectable_total", "uncollectable", "Uncollectable objects found during GC"),
        ("python_gc_collections_total", "collections", "Number of times this generation was collected"),
    ):
        yield from _header(name, "counter", text)
        for gen, st in enumerate(stats):
            yield f'{name}{{generation="{gen}"}} {st[key]}'
    yield from _header("magnetar_gc_frozen_objects", "gauge", "Objects alive after start-up, left out of collections")
    yield f"magnetar_gc_frozen_objects {gc.get_freeze_count()}"
