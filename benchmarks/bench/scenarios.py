"""Orchestration: running worker processes, measuring a scenario, choosing the scenarios of a run."""

from __future__ import annotations

import array
import multiprocessing as mp
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pulsar

from benchmarks.bench.brokers import Broker, pulsar_client
from benchmarks.bench.procfs import host_busy_seconds
from benchmarks.bench.results import Params, ScenarioResult
from benchmarks.bench.workers import (
    consumer_worker,
    latency_consumer_worker,
    paced_producer_worker,
    producer_worker,
    worker_main,
)

CTX = mp.get_context("spawn")  # never fork a process that may hold C++ client threads


@dataclass
class Window:
    """What the parent saw around one measured run of workers."""

    t_go: float
    t_done: float
    cpu_s: float | None
    sys_s: float | None
    host_busy_s: float
    results: list[dict[str, Any]]


class WorkerError(RuntimeError):
    """A worker failed or timed out."""


def run_workers(
    broker: Broker,
    jobs: list[tuple[Callable[..., dict[str, Any]], dict[str, Any]]],
    timeout: float,
    on_done: Callable[[int, dict[str, Any]], None] | None = None,
) -> Window:
    """Start workers, release them together once all are ready, and measure broker CPU around the run."""
    out = CTX.Queue()
    go = CTX.Event()
    procs = [
        CTX.Process(target=worker_main, args=(body, i, out, go, kw), daemon=True) for i, (body, kw) in enumerate(jobs)
    ]
    for p in procs:
        p.start()
    try:
        results: dict[int, dict[str, Any]] = {}
        deadline = time.monotonic() + 60.0

        def collect(kind: str) -> tuple[int, Any]:
            while True:
                try:
                    wid, got, payload = out.get(timeout=0.5)
                except queue.Empty:
                    if time.monotonic() > deadline:
                        raise WorkerError(f"workers timed out waiting for '{kind}'") from None
                    dead = [p for p in procs if p.exitcode not in (None, 0)]
                    if dead:
                        raise WorkerError(f"worker exited with {dead[0].exitcode}") from None
                    continue
                if got == "error":
                    raise WorkerError(payload)
                if got != kind:
                    raise WorkerError(f"unexpected worker message {got!r} while waiting for {kind!r}")
                return wid, payload

        for _ in procs:
            collect("ready")
        cpu0, host0 = broker.cpu_seconds(), host_busy_seconds()
        t_go = time.monotonic()
        go.set()
        deadline = t_go + timeout
        for _ in procs:
            wid, res = collect("done")
            results[wid] = res
            if on_done:
                on_done(wid, res)
        t_done = time.monotonic()
        cpu1, host1 = broker.cpu_seconds(), host_busy_seconds()
        ordered = [results[i] for i in range(len(procs))]
        if cpu0 is None or cpu1 is None:
            return Window(t_go, t_done, None, None, host1 - host0, ordered)
        cpu_s = cpu1.total - cpu0.total
        # The system share comes in whole ticks: never more than the exact total.
        sys_s = min(cpu1.system - cpu0.system, cpu_s)
        return Window(t_go, t_done, cpu_s, sys_s, host1 - host0, ordered)
    except BaseException:
        for p in procs:  # failure or Ctrl-C: do not wait for workers to finish their run
            p.terminate()
        raise
    finally:
        for p in procs:
            p.join(10.0)
            if p.is_alive():
                p.terminate()
                p.join(5.0)
        out.close()


def _split(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def _error_kinds(results: list[dict[str, Any]]) -> str:
    kinds = sorted({k for r in results for k in r.get("error_kinds", [])})
    return f"; send errors: {', '.join(kinds)}" if kinds else ""


def _fill_cpu(res: ScenarioResult, win: Window, wall: float) -> None:
    """Derive rates and broker CPU figures from a measured window."""
    res.wall_s = wall
    res.msgs_per_s = res.messages / wall if wall > 0 else 0.0
    res.mb_per_s = res.messages * res.size / wall / 1e6 if wall > 0 else 0.0
    res.client_cpu_s = sum(r["cpu"] for r in win.results)
    res.client_cores = res.client_cpu_s / wall if wall > 0 else 0.0
    span = win.t_done - win.t_go
    if span > 0 and win.cpu_s is not None:  # without broker CPU the broker itself would count as "other"
        # Whatever the machine did besides this broker and these clients: other sessions, kernel work.
        other = win.host_busy_s - (win.cpu_s or 0.0) - res.client_cpu_s
        res.other_cores = max(0.0, other / span)
    if win.cpu_s is not None and res.messages:
        res.broker_cpu_s = win.cpu_s
        res.broker_sys_pct = 100.0 * (win.sys_s or 0.0) / win.cpu_s if win.cpu_s > 0 else 0.0
        res.broker_cores = win.cpu_s / (win.t_done - win.t_go)
        # Zero means below the 1/CLK_TCK resolution of /proc: leave both figures unknown, not 0 or inf.
        if win.cpu_s > 0:
            res.broker_us_per_msg = win.cpu_s / res.messages * 1e6
            res.msgs_per_broker_cpu_s = res.messages / win.cpu_s


class Bench:
    """Runs the scenarios of one run against one broker."""

    def __init__(self, broker: Broker, params: Params, run_id: str) -> None:
        self.broker = broker
        self.p = params
        self.run_id = run_id
        #: The repetition running (``--repeat``): later rounds get topics of their own.
        self.round = 1
        self.batch = (params.batch_max_messages, params.batch_max_bytes, params.batch_max_delay_ms)

    def topic(self, name: str, domain: str = "persistent") -> str:
        """A fresh topic per scenario and round so that no scenario sees another's data."""
        suffix = f"-{self.round}" if self.round > 1 else ""
        return f"{domain}://{self.p.namespace}/bench-{name}-{self.run_id}{suffix}"

    def publish(self, name: str, size: int, batched: bool, duration: float) -> ScenarioResult:
        """Publish throughput with ``producers`` processes on one topic."""
        res = ScenarioResult(name, "publish", size, batched)
        pending = self.p.max_pending_batched if batched else self.p.max_pending
        topic = self.topic(name)
        kw = dict(
            url=self.broker.service_url,
            topic=topic,
            size=size,
            batched=batched,
            max_pending=pending,
            batch=self.batch,
            duration=duration,
        )
        win = run_workers(self.broker, [(producer_worker, kw)] * self.p.producers, self.p.timeout)
        res.messages = sum(r["acked"] for r in win.results)
        res.errors = sum(r["errors"] for r in win.results)
        _fill_cpu(res, win, max(r["t1"] for r in win.results) - win.t_go)
        res.note = f"{self.p.producers} producer procs, {pending} outstanding each" + _error_kinds(win.results)
        return res

    def _subscribe(self, topic: str, subscriptions: list[str]) -> None:
        """Create durable subscriptions at the earliest position (unmeasured), so the topic retains what follows."""
        client = pulsar_client(self.broker.service_url)
        try:
            for sub in subscriptions:
                client.subscribe(topic, sub, initial_position=pulsar.InitialPosition.Earliest).close()
        finally:
            client.close()

    def _producers_of(
        self, topic: str, size: int, batched: bool, total: int
    ) -> list[tuple[Callable[..., dict[str, Any]], dict[str, Any]]]:
        """Producer jobs publishing ``total`` messages between them (``producers`` processes)."""
        pending = self.p.max_pending_batched if batched else self.p.max_pending
        kw = dict(
            url=self.broker.service_url, topic=topic, size=size, batched=batched, max_pending=pending, batch=self.batch
        )
        return [(producer_worker, {**kw, "count": n}) for n in _split(total, self.p.producers)]

    def _consumer_of(
        self, topic: str, subscription: str, count: int
    ) -> tuple[Callable[..., dict[str, Any]], dict[str, Any]]:
        """A consumer job receiving and acknowledging ``count`` messages on ``subscription``."""
        kw = dict(
            url=self.broker.service_url,
            topic=topic,
            subscription=subscription,
            count=count,
            receiver_queue=self.p.receiver_queue,
            timeout=self.p.timeout - 10,
        )
        return consumer_worker, kw

    def consume(self, name: str, batched: bool) -> ScenarioResult:
        """Pre-fill a backlog (unmeasured), then drain it with one consumer (measured)."""
        size = self.p.consume_size
        count = self.p.backlog_batched if batched else self.p.backlog
        res = ScenarioResult(name, "consume", size, batched)
        topic = self.topic(name)
        # The durable subscription must exist before the fill so that the backlog is retained.
        self._subscribe(topic, ["bench"])
        fill_jobs = self._producers_of(topic, size, batched, count)
        fill = run_workers(self.broker, fill_jobs, self.p.timeout)
        filled = sum(r["acked"] for r in fill.results)
        fill_wall = max(r["t1"] for r in fill.results) - fill.t_go
        win = run_workers(self.broker, [self._consumer_of(topic, "bench", filled)], self.p.timeout)
        r = win.results[0]
        res.messages = r["received"]
        res.errors = filled - r["received"] + sum(x["errors"] for x in fill.results)
        _fill_cpu(res, win, r["t1"] - win.t_go)
        res.note = (
            f"backlog {filled} filled at {filled / fill_wall:,.0f} msg/s; 1 consumer, queue {self.p.receiver_queue}"
            + _error_kinds(fill.results)
        )
        return res

    def fanout(self, name: str, batched: bool) -> ScenarioResult:
        """Publish while ``fanout_subscriptions`` subscriptions consume live, one consumer process each (measured
        together: the broker's CPU covers the publish and every delivery and ack). ``messages`` counts what was
        published, so the cost per message includes its fan-out; the note gives the cost per delivery."""
        size, subs = self.p.consume_size, self.p.fanout_subscriptions
        total = self.p.fanout_messages_batched if batched else self.p.fanout_messages
        res = ScenarioResult(name, "fanout", size, batched)
        topic = self.topic(name)
        names = [f"fanout-{i}" for i in range(subs)]
        self._subscribe(topic, names)  # before the first message, so each subscription gets all of them
        producers = self._producers_of(topic, size, batched, total)
        consumers = [self._consumer_of(topic, sub, total) for sub in names]
        win = run_workers(self.broker, producers + consumers, self.p.timeout)
        sent, received = win.results[: len(producers)], win.results[len(producers) :]
        res.messages = sum(r["acked"] for r in sent)
        delivered = sum(r["received"] for r in received)
        res.errors = sum(r["errors"] for r in sent) + res.messages * subs - delivered
        _fill_cpu(res, win, max(r["t1"] for r in win.results) - win.t_go)
        per_delivery = f", {win.cpu_s / delivered * 1e6:.2f} us per delivery" if win.cpu_s and delivered else ""
        res.note = (
            f"{subs} subscriptions, 1 consumer each (queue {self.p.receiver_queue}), {len(producers)} producer procs; "
            f"{delivered:,} deliveries{per_delivery}" + _error_kinds(sent)
        )
        return res

    def latency(self, name: str, rate: int, domain: str = "persistent") -> ScenarioResult:
        """Paced producer and a consumer in separate processes; latency = receive time - send time
        (and, in the note, receive time - scheduled send time: what a late producer adds, and the
        producer's publish latency, send -> receipt). On a ``non-persistent`` topic nothing is stored
        and receipts come at once: the control row, what the clients and the machine cost by themselves."""
        size, duration = self.p.latency_size, self.p.latency_duration
        res = ScenarioResult(name, "latency", size, False, target_rate=rate)
        topic = self.topic(name, domain)
        url = self.broker.service_url
        expected = CTX.Value("q", -1)

        def on_done(wid: int, r: dict[str, Any]) -> None:
            if wid == 0:  # the producer: now the consumer knows how many to wait for
                expected.value = r["acked"]

        skip = int(rate * self.p.latency_warmup)
        jobs = [
            (paced_producer_worker, dict(url=url, topic=topic, size=size, rate=rate, duration=duration)),
            (
                latency_consumer_worker,
                dict(
                    url=url,
                    topic=topic,
                    receiver_queue=self.p.receiver_queue,
                    skip=skip,
                    expected=expected,
                    timeout=duration + 60,
                ),
            ),
        ]
        win = run_workers(self.broker, jobs, duration + 90, on_done=on_done)
        prod, cons = win.results
        res.messages = prod["acked"]
        res.errors = prod["errors"] + max(0, prod["acked"] - cons["received"])
        _fill_cpu(res, win, cons["t1"] - win.t_go)
        achieved = prod["sent"] / (prod["t1"] - prod["t0"])
        res.msgs_per_s = achieved  # the meaningful rate here is what the paced producer achieved
        res.mb_per_s = achieved * size / 1e6
        lat = array.array("q")
        lat.frombytes(cons["latencies"])
        res.latency_ms = percentiles(lat)
        lat_sched = array.array("q")
        lat_sched.frombytes(cons["latencies_from_schedule"])
        res.latency_from_schedule_ms = percentiles(lat_sched)
        publish = array.array("q")
        publish.frombytes(prod["publish_latencies"])
        res.publish_latency_ms = percentiles(publish[skip:])
        res.note = f"achieved {achieved:,.0f}/{rate:,} msg/s; first {skip} msgs ({self.p.latency_warmup:g} s) excluded"
        sched = res.latency_from_schedule_ms
        if "p99" in sched:  # counts the producer's own lateness too (no coordinated omission)
            res.note += f"; from the scheduled send time p50/p99 {sched['p50']:.2f}/{sched['p99']:.2f} ms"
        pub = res.publish_latency_ms
        if "p99" in pub:
            res.note += f"; publish (send -> receipt) p50/p99 {pub['p50']:.2f}/{pub['p99']:.2f} ms"
        if achieved < 0.95 * rate:
            res.note += "; PRODUCER COULD NOT KEEP THE RATE"
        res.note += _error_kinds([prod])
        return res

    def idle_cores(self, seconds: float = 2.0) -> float | None:
        """Broker CPU while nothing is sent (background timers, compaction)."""
        c0 = self.broker.cpu_seconds()
        if c0 is None:
            return None
        time.sleep(seconds)
        c1 = self.broker.cpu_seconds()
        return None if c1 is None else (c1.total - c0.total) / seconds


def percentiles(samples_ns: array.array) -> dict[str, float]:
    """p50/p99/p99.9/max in milliseconds (nearest-rank)."""
    if not samples_ns:
        return {"samples": 0}
    s = sorted(samples_ns)
    n = len(s)

    def pct(q: float) -> float:
        return s[min(n - 1, max(0, int(q * n + 0.999999) - 1))] / 1e6

    return {
        "samples": n,
        "p50": pct(0.50),
        "p99": pct(0.99),
        "p99.9": pct(0.999),
        "max": s[-1] / 1e6,
        "mean": sum(s) / n / 1e6,
    }


def _size_label(size: int) -> str:
    return f"{size // 1024}KB" if size % 1024 == 0 else f"{size}B"


def scenario_plan(params: Params, selected: list[str]) -> list[tuple[str, Callable[[Bench], ScenarioResult]]]:
    """Ordered (name, runner) list; ``selected`` holds scenario names or groups."""
    groups: dict[str, list[tuple[str, Callable[[Bench], ScenarioResult]]]] = {
        "publish": [],
        "batched": [],
        "consume": [],
        "fanout": [],
        "latency": [],
        "latency-np": [],
    }
    for size in params.sizes:
        n = f"publish-{_size_label(size)}"
        groups["publish"].append((n, lambda b, n=n, size=size: b.publish(n, size, False, b.p.duration)))
    for size in params.sizes:
        n = f"publish-batched-{_size_label(size)}"
        groups["batched"].append((n, lambda b, n=n, size=size: b.publish(n, size, True, b.p.duration)))
    label = _size_label(params.consume_size)
    groups["consume"] = [
        (f"consume-{label}", lambda b: b.consume(f"consume-{label}", False)),
        (f"consume-batched-{label}", lambda b: b.consume(f"consume-batched-{label}", True)),
    ]
    groups["fanout"] = [
        (f"fanout-{label}", lambda b: b.fanout(f"fanout-{label}", False)),
        (f"fanout-batched-{label}", lambda b: b.fanout(f"fanout-batched-{label}", True)),
    ]
    for rate in params.rates:
        n = f"latency-{rate}"
        groups["latency"].append((n, lambda b, n=n, rate=rate: b.latency(n, rate)))
        n = f"latency-np-{rate}"
        groups["latency-np"].append((n, lambda b, n=n, rate=rate: b.latency(n, rate, "non-persistent")))
    plan: list[tuple[str, Callable[[Bench], ScenarioResult]]] = []
    everything = [item for g in groups.values() for item in g]
    # The non-persistent control rows run only when asked for.
    for want in selected or [g for g in groups if g != "latency-np"]:
        matches = groups.get(want) or [item for item in everything if item[0] == want]
        if not matches:
            names = ", ".join([*groups, *(n for n, _ in everything)])
            raise SystemExit(f"unknown scenario {want!r}; choose from: {names}")
        plan.extend(m for m in matches if m not in plan)
    return plan
