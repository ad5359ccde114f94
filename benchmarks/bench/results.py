"""What a run measures: its parameters and the results of each scenario and target."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Params:
    """Knobs shared by every target of one run, so that runs are comparable."""

    duration: float = 8.0  # seconds per publish scenario
    producers: int = 2  # producer processes for throughput scenarios
    max_pending: int = 1000  # outstanding messages per non-batched producer
    max_pending_batched: int = 20_000  # outstanding messages per batched producer
    sizes: list[int] = field(default_factory=lambda: [100, 1024])
    backlog: int = 200_000  # messages pre-filled for the non-batched consume scenario
    # Batched backlogs drain in well under a second; more messages keep broker CPU above /proc's 10 ms ticks.
    backlog_batched: int = 1_000_000
    consume_size: int = 100
    fanout_subscriptions: int = 4  # subscriptions (one consumer process each) of the fan-out scenarios
    fanout_messages: int = 200_000  # messages published in a fan-out scenario (each delivered once per subscription)
    fanout_messages_batched: int = 1_000_000  # the batched one (5x, for the reason of backlog_batched)
    # pulsar-lite 0.2.0 stalls a backlog drain with 20000 (delivers ~9.4k, then nothing): keep 10000.
    receiver_queue: int = 10_000
    rates: list[int] = field(default_factory=lambda: [2000, 20_000])
    latency_duration: float = 10.0
    latency_warmup: float = 1.0  # seconds of latency samples discarded at the start
    latency_size: int = 100
    batch_max_messages: int = 1000
    batch_max_bytes: int = 128 * 1024
    batch_max_delay_ms: int = 10
    namespace: str = "public/default"
    timeout: float = 120.0  # hard limit for one scenario's workers


@dataclass
class ScenarioResult:
    """What one scenario measured against one broker."""

    name: str
    kind: str
    size: int
    batched: bool
    messages: int = 0
    wall_s: float = 0.0
    msgs_per_s: float = 0.0
    mb_per_s: float = 0.0
    broker_cpu_s: float | None = None
    broker_cores: float | None = None
    broker_sys_pct: float | None = None  # share of broker CPU spent in the kernel (syscalls, fsync)
    broker_us_per_msg: float | None = None
    msgs_per_broker_cpu_s: float | None = None
    client_cpu_s: float = 0.0
    client_cores: float = 0.0
    other_cores: float | None = None  # host CPU busy outside broker and clients (noise indicator)
    errors: int = 0
    target_rate: int | None = None
    latency_ms: dict[str, float] | None = None
    #: The same, measured from the time the pacing schedule gave each send (includes a late producer).
    latency_from_schedule_ms: dict[str, float] | None = None
    #: Publish latency at the producer: send -> receipt (after the bookies' fsync), without the consumer.
    publish_latency_ms: dict[str, float] | None = None
    #: Broker process tree VmRSS sampled every ~0.5 s during the row (fill phases included): median and peak MiB.
    rss_median_mib: float | None = None
    rss_peak_mib: float | None = None
    rss_samples: int | None = None
    note: str = ""
    error: str | None = None
    #: The CPUs the broker was moved to for this row (``--latency-broker-cpus``), None when it shared them.
    broker_cpus: str | None = None
    #: Which repetition of the plan this row belongs to (``--repeat``), from 1.
    round: int = 1

    @property
    def label(self) -> str:
        """The scenario's name, with ``#<round>`` from the second round on."""
        return self.name if self.round == 1 else f"{self.name}#{self.round}"


@dataclass
class TargetResult:
    """All scenarios of one broker."""

    target: str
    service_url: str = ""
    pid: int | None = None
    version: str = ""
    listening: list[str] = field(default_factory=list)
    idle_broker_cores: float | None = None
    startup_s: float | None = None
    #: Broker VmRSS right after start-up and the idle CPU measurement, MiB.
    idle_rss_mib: float | None = None
    #: Broker VmRSS over all rows of the run (every sample of every row): median and peak MiB.
    rss_median_mib: float | None = None
    rss_peak_mib: float | None = None
    rss_samples: int | None = None
    scenarios: list[ScenarioResult] = field(default_factory=list)
    error: str | None = None
