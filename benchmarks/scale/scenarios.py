"""The scale measurements against one broker: topics, load/unload, subscriptions, backlog."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pulsar

from benchmarks.bench.brokers import Broker, pulsar_client
from benchmarks.bench.procfs import tree_rss_bytes
from benchmarks.bench.scenarios import run_workers
from benchmarks.bench.workers import producer_worker


@dataclass
class ScaleParams:
    """Knobs of one run, the same for every target."""

    topic_counts: list[int] = field(default_factory=lambda: [1, 100, 1000])
    load_topics: int = 1000
    sub_counts: list[int] = field(default_factory=lambda: [1, 10, 100])
    backlog_levels: list[int] = field(default_factory=lambda: [0, 100_000])
    publish_count: int = 20_000  # non-batched messages per measured publish
    size: int = 100
    max_pending: int = 1000  # outstanding messages of the measuring producer
    create_threads: int = 16  # concurrent producer/consumer creations
    receiver_queue: int = 100  # of the idle consumers
    settle: float = 3.0  # seconds idle before RSS and idle CPU are read
    create_timeout: float = 600.0  # bound on creating one step's topics
    fill_timeout: float = 120.0  # bound on filling one backlog step
    timeout: float = 180.0  # bound on one measured publish
    namespace: str = "public/default"


class Deliveries:
    """Counts messages received by listener consumers (and acknowledges them)."""

    def __init__(self) -> None:
        self.count = 0
        self._lock = threading.Lock()

    def listener(self, consumer: pulsar.Consumer, msg: pulsar.Message) -> None:
        consumer.acknowledge(msg)
        with self._lock:
            self.count += 1

    def wait_for(self, target: int, timeout: float) -> bool:
        """Wait until ``target`` messages arrived in total; False on timeout."""
        deadline = time.monotonic() + timeout
        while self.count < target:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True


def run_bounded(calls: Iterable[Callable[[], Any]], threads: int, timeout: float) -> tuple[list[Any], int]:
    """Run blocking client calls on a thread pool; stop submitting at ``timeout``. (results, failures)."""
    deadline = time.monotonic() + timeout
    out: list[Any] = []
    failed = 0
    with ThreadPoolExecutor(threads) as pool:
        pending = set()
        for call in calls:
            if time.monotonic() > deadline:
                break
            pending.add(pool.submit(call))
            if len(pending) >= 4 * threads:
                done = {f for f in pending if f.done()}
                while not done:
                    time.sleep(0.002)
                    done = {f for f in pending if f.done()}
                pending -= done
                for f in done:
                    if f.exception() is None:
                        out.append(f.result())
                    else:
                        failed += 1
        for f in pending:
            try:
                out.append(f.result(timeout=max(1.0, deadline - time.monotonic())))
            except Exception:
                failed += 1
    return out, failed


class Scale:
    """Runs the measurements against one started broker."""

    def __init__(self, broker: Broker, params: ScaleParams, run_id: str, admin_url: str | None) -> None:
        self.broker = broker
        self.p = params
        self.run_id = run_id
        self.admin_url = admin_url
        self.client = pulsar_client(broker.service_url)
        self.deliveries = Deliveries()

    def close(self) -> None:
        """Close the client holding the idle producers and consumers."""
        self.client.close()

    def topic(self, kind: str, i: int, namespace: str | None = None) -> str:
        return f"persistent://{namespace or self.p.namespace}/scale-{self.run_id}-{kind}-{i}"

    def rss(self, field: str = "VmRSS") -> int | None:
        return tree_rss_bytes(self.broker.pid, field) if self.broker.pid else None

    def cpu(self) -> float | None:
        c = self.broker.cpu_seconds()
        return None if c is None else c.total

    def idle_cores(self) -> float | None:
        """Broker CPU cores used over ``settle`` seconds of nothing being sent."""
        c0 = self.cpu()
        time.sleep(self.p.settle)
        c1 = self.cpu()
        return None if c0 is None or c1 is None else (c1 - c0) / self.p.settle

    def subscribe(self, topic: str, sub: str) -> pulsar.Consumer:
        return self.client.subscribe(
            topic,
            sub,
            receiver_queue_size=self.p.receiver_queue,
            initial_position=pulsar.InitialPosition.Earliest,
            message_listener=self.deliveries.listener,
        )

    def create_pairs(self, topics: list[str]) -> tuple[int, int]:
        """A producer and a subscribed consumer on each topic, concurrently; (created, failed)."""

        def one(topic: str) -> Callable[[], Any]:
            def call() -> Any:
                return self.client.create_producer(topic, batching_enabled=False), self.subscribe(topic, "sub")

            return call

        made, failed = run_bounded((one(t) for t in topics), self.p.create_threads, self.p.create_timeout)
        return len(made), failed

    def _producer_args(self, topic: str, count: int, **extra: Any) -> dict[str, Any]:
        """Arguments of a non-batched :func:`producer_worker` sending ``count`` messages to ``topic``."""
        return dict(
            url=self.broker.service_url,
            topic=topic,
            size=self.p.size,
            batched=False,
            max_pending=self.p.max_pending,
            batch=(1000, 128 * 1024, 10),  # unused: batching is off
            count=count,
            **extra,
        )

    def publish_cost(self, topic: str, count: int, deliveries: int) -> dict[str, Any]:
        """Broker CPU per message of ``count`` non-batched sends from a client process to ``topic``.

        The window closes once the listener consumers got ``deliveries`` more messages, so that
        dispatch is counted too. The worker's connect/lookup/producer creation falls inside it
        (a few ms of broker CPU, small against ``count`` messages).
        """
        kw = self._producer_args(topic, count)
        seen = self.deliveries.count
        c0, t0 = self.cpu(), time.monotonic()
        win = run_workers(self.broker, [(producer_worker, kw)], self.p.timeout)
        delivered = self.deliveries.wait_for(seen + deliveries, self.p.timeout)
        c1, t1 = self.cpu(), time.monotonic()
        acked = win.results[0]["acked"]
        cpu = None if c0 is None or c1 is None else c1 - c0
        return {
            "messages": acked,
            "errors": win.results[0]["errors"] + (0 if delivered else 1),
            "wall_s": t1 - t0,
            "msgs_per_s": acked / (win.t_done - win.t_go) if win.t_done > win.t_go else 0.0,
            "broker_cpu_s": cpu,
            "us_per_msg": cpu / acked * 1e6 if cpu and acked else None,
        }

    # -- the measurements ------------------------------------------------------------------------

    def topics(self, log: Callable[[str], None]) -> list[dict[str, Any]]:
        """Grow to each topic count (idle producer + consumer per topic); RSS, idle CPU, publish cost."""
        rss0 = self.rss()
        points: list[dict[str, Any]] = []
        created = 0
        warmed = False
        for n in sorted(self.p.topic_counts):
            names = [self.topic("t", i) for i in range(created, n)]
            c0, t0 = self.cpu(), time.monotonic()
            made, failed = self.create_pairs(names)
            create_s = time.monotonic() - t0
            c1 = self.cpu()
            created += made
            if not warmed:  # first publishes fill caches and import lazily: keep them out of the lone figure
                self.publish_cost(self.topic("t", 0), self.p.publish_count // 4, self.p.publish_count // 4)
                warmed = True
            idle = self.idle_cores()
            rss, anon = self.rss(), self.rss("RssAnon")
            cost = self.publish_cost(self.topic("t", 0), self.p.publish_count, self.p.publish_count)
            point = {
                "topics": created,
                "create_failed": failed,
                "create_s": create_s,
                "create_cpu_ms_per_topic": None if c0 is None or c1 is None else (c1 - c0) / max(1, made) * 1e3,
                "rss_bytes": rss,
                "rss0_bytes": rss0,
                # Growth since the lone topic (whose figure holds one-off costs: first publish, caches).
                "rss_per_topic_kib": (
                    (rss - points[0]["rss_bytes"]) / (created - points[0]["topics"]) / 1024
                    if rss and points and points[0]["rss_bytes"] and created > points[0]["topics"]
                    else None
                ),
                # The same from anonymous memory only: file-backed pages come and go with the
                # machine's memory pressure (tens of MiB), which VmRSS differences pick up as noise.
                "rss_anon_bytes": anon,
                "anon_per_topic_kib": (
                    (anon - points[0]["rss_anon_bytes"]) / (created - points[0]["topics"]) / 1024
                    if anon and points and points[0]["rss_anon_bytes"] and created > points[0]["topics"]
                    else None
                ),
                "idle_cores": idle,
                **cost,
            }
            points.append(point)
            log(
                f"topics={created} (failed {failed}, {create_s:.1f} s) rss={_mib(rss)} MiB "
                f"per-topic={_f(point['rss_per_topic_kib'])} KiB (anon {_f(point['anon_per_topic_kib'])}) "
                f"idle={_f(idle, '.3f')} cores "
                f"publish={_f(cost['us_per_msg'])} us/msg"
            )
            if failed:
                break
        return points

    def load_unload(self, log: Callable[[str], None]) -> dict[str, Any]:
        """Load ``load_topics`` topics (first producer each), unload their namespace, reload them."""
        n = self.p.load_topics
        namespace = self.p.namespace
        if self.admin_url:
            namespace = f"{self.p.namespace.split('/')[0]}/scale-{self.run_id}"
            _http(f"{self.admin_url}/admin/v2/namespaces/{namespace}", "PUT", {})
        client = pulsar_client(self.broker.service_url)
        try:
            names = [self.topic("load", i, namespace) for i in range(n)]
            c0, t0 = self.cpu(), time.monotonic()
            producers, failed = run_bounded(
                (lambda t=t: client.create_producer(t, batching_enabled=False) for t in names),
                self.p.create_threads,
                self.p.create_timeout,
            )
            load_s, c1 = time.monotonic() - t0, self.cpu()
            out: dict[str, Any] = {
                "topics": len(producers),
                "failed": failed,
                "load_s": load_s,
                "load_cpu_s": None if c0 is None or c1 is None else c1 - c0,
            }
            log(f"load {len(producers)} topics: {load_s:.2f} s (failed {failed})")
            if not self.admin_url:
                return out
            t0 = time.monotonic()
            _http(f"{self.admin_url}/admin/v2/namespaces/{namespace}/unload", "PUT", None)
            out["unload_s"] = time.monotonic() - t0
            c2 = self.cpu()
            out["unload_cpu_s"] = None if c1 is None or c2 is None else c2 - c1
            # The producers reconnect on their own; one send each waits for its topic to be loaded again.
            t0 = time.monotonic()
            acks = threading.Semaphore(0)
            for pr in producers:
                pr.send_async(b"x", lambda _res, _mid: acks.release())
            deadline = t0 + self.p.create_timeout
            got = sum(acks.acquire(timeout=max(0.0, deadline - time.monotonic())) for _ in producers)
            out["reload_s"] = time.monotonic() - t0
            out["reload_acked"] = got
            log(f"unload: {out['unload_s']:.2f} s; reload on reconnect: {out['reload_s']:.2f} s ({got} acked)")
            return out
        finally:
            client.close()

    def subscriptions(self, log: Callable[[str], None]) -> list[dict[str, Any]]:
        """Add subscriptions (one listener consumer each) to one topic; publish cost at each count."""
        topic = self.topic("subs", 0)
        points = []
        subs: list[pulsar.Consumer] = []
        for s in sorted(self.p.sub_counts):
            more, failed = run_bounded(
                (lambda i=i: self.subscribe(topic, f"sub-{i}") for i in range(len(subs), s)),
                self.p.create_threads,
                self.p.create_timeout,
            )
            subs.extend(more)
            # Fewer messages with many subscriptions: the deliveries (and this process's acks) grow with s.
            count = max(2000, self.p.publish_count // len(subs))
            cost = self.publish_cost(topic, count, count * len(subs))
            points.append({"subscriptions": len(subs), "failed": failed, "rss_bytes": self.rss(), **cost})
            log(f"subscriptions={len(subs)} publish={_f(cost['us_per_msg'])} us/msg ({count} msgs)")
        return points

    def backlog(self, log: Callable[[str], None]) -> list[dict[str, Any]]:
        """Grow the backlog of one subscription without consumer; publish cost and RSS at each level."""
        topic = self.topic("backlog", 0)
        self.client.subscribe(topic, "backlog", initial_position=pulsar.InitialPosition.Earliest).close()
        filled = 0
        points = []
        for level in sorted(self.p.backlog_levels):
            if level > filled:
                kw = self._producer_args(topic, (level - filled + 1) // 2, duration=self.p.fill_timeout)
                win = run_workers(self.broker, [(producer_worker, kw)] * 2, self.p.fill_timeout + 60)
                filled += sum(r["acked"] for r in win.results)
            time.sleep(self.p.settle)
            rss = self.rss()
            cost = self.publish_cost(topic, self.p.publish_count, 0)
            points.append({"backlog": filled, "rss_bytes": rss, **cost})
            log(f"backlog={filled} rss={_mib(rss)} MiB publish={_f(cost['us_per_msg'])} us/msg")
            filled += cost["messages"]
        return points


def _http(url: str, method: str, body: Any) -> None:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as resp:
        resp.read()


def _mib(b: int | None) -> str:
    return "?" if b is None else f"{b / 2**20:.1f}"


def _f(x: float | None, spec: str = ".2f") -> str:
    return "?" if x is None else format(x, spec)
