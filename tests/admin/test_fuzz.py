"""Schemathesis fuzzing of every operation in the broker's ``/admin/v2/openapi.json``.

Runs on a broker of its own (``fresh_standalone``) so the random writes disturb no other test.
Each operation gets a bounded number of generated requests (schema-valid ones, plus schema-invalid
ones where the operation takes a body or query parameters); half of them use path parameters that
name real objects (tenant ``public``, namespace ``default``, seeded topics and subscription) so the
requests get past the 404s. Checks:

* no 5xx and no request left unanswered (timeout / dropped connection);
* a 4xx with a body is Pulsar's ``{"reason": "..."}`` JSON;
* afterwards the broker is alive, healthy, and still serves a produce/consume round trip.

Failures are collected over the whole run and reported together with a ``curl`` reproducer each.
``MAGNETAR_FUZZ_EXAMPLES`` (examples per operation and mode, for every operation, with no time cap)
and ``MAGNETAR_FUZZ_SEED`` (random seed; default: derandomized, so CI runs are repeatable) tune a
run, e.g. ``MAGNETAR_FUZZ_EXAMPLES=200 MAGNETAR_FUZZ_SEED=7 pytest tests/admin/test_fuzz.py -s``.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import urllib.error
import urllib.request
from typing import Any

import pulsar
import pytest

from tests.conftest import StandaloneProcess

schemathesis = pytest.importorskip("schemathesis")
hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies

#: Examples per operation and generation mode, unless MAGNETAR_FUZZ_EXAMPLES says otherwise; lowered
#: when the document grows so the run stays within its time budget on a 2-core machine.
DEFAULT_EXAMPLES = 20
TOTAL_EXAMPLES_BUDGET = 6000
#: Past this many seconds, the remaining operations get MIN_EXAMPLES each (every one is still exercised).
TIME_BUDGET_S = 60.0
MIN_EXAMPLES = 3
REQUEST_TIMEOUT_S = 10.0

#: Values for path parameters (by name) that point at objects which exist on the fuzzed broker.
TOPIC = "fuzz-topic"
PARTITIONED = "fuzz-partitioned"
SUBSCRIPTION = "fuzz-sub"
HEALTH_NAMESPACE = "public/fuzz-health-check"
HEALTH_TOPIC = f"persistent://{HEALTH_NAMESPACE}/round-trip"
KNOWN = {
    "domain": "persistent",
    "tenant": "public",
    "property": "public",
    "namespace": "default",
    "cluster": "standalone",
    "subscription": SUBSCRIPTION,
    "subName": SUBSCRIPTION,
}

#: Operations never sent: they end the broker by design.
EXCLUDED_SUBSTRINGS = ("/shutdown",)

#: Partition counts above this are not generated: the broker does per-partition work for every
#: partition synchronously (growing creates each partition, partitioned-stats and deletion walk
#: them all), so a count like 10**12 keeps it busy for good. Reported; drop once counts are capped.
MAX_FUZZ_PARTITIONS = 64


def _quiet() -> Any:
    return pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)


def _http(method: str, url: str, body: Any = None) -> tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _seed(node: StandaloneProcess) -> None:
    """Objects the known path parameters point at: a topic with messages and a subscription, a partitioned topic."""
    client = pulsar.Client(
        node.service_url, operation_timeout_seconds=10, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
    )
    try:
        topic = f"persistent://public/default/{TOPIC}"
        consumer = client.subscribe(topic, SUBSCRIPTION, initial_position=pulsar.InitialPosition.Earliest)
        producer = client.create_producer(topic)
        for i in range(5):
            producer.send(f"fuzz-{i}".encode(), properties={"i": str(i)})
        producer.close()
        consumer.close()
    finally:
        client.close()
    status, body = _http("PUT", f"{node.http_url}/admin/v2/persistent/public/default/{PARTITIONED}/partitions", 2)
    assert status in (200, 204), body
    # The after-fuzzing check runs in a namespace of its own: the fuzzer may legitimately change
    # public/default's policies (auto-creation off, a publish rate of 0, ...).
    status, body = _http("PUT", f"{node.http_url}/admin/v2/namespaces/{HEALTH_NAMESPACE}")
    assert status in (200, 204), body
    client = pulsar.Client(node.service_url, operation_timeout_seconds=10, logger=_quiet())
    try:
        client.subscribe(HEALTH_TOPIC, "check").close()
    finally:
        client.close()


def _round_trip(node: StandaloneProcess) -> None:
    """Produce and consume on the topic :func:`_seed` prepared outside the fuzzed names."""
    client = pulsar.Client(node.service_url, operation_timeout_seconds=10, logger=_quiet())
    try:
        consumer = client.subscribe(HEALTH_TOPIC, "check")
        client.create_producer(HEALTH_TOPIC).send(b"still alive")
        assert consumer.receive(timeout_millis=10000).data() == b"still alive"
    finally:
        client.close()


def _reason_problem(response: Any) -> str | None:
    """What is wrong with a 4xx response's body, if anything."""
    if not response.content.strip():
        return None
    content_type = ";".join(response.headers.get("content-type", []))
    if "json" not in content_type:
        return f"Content-Type {content_type!r} instead of application/json"
    try:
        data = json.loads(response.content)
    except ValueError:
        return "body is not JSON"
    if not isinstance(data, dict) or not isinstance(data.get("reason"), str):
        return 'body is not {"reason": "..."}'
    return None


def _strategy(operation: Any, mode: Any) -> Any:
    strategy = operation.as_strategy(generation_mode=mode)
    names = {p.name for p in operation.path_parameters}
    fixed = {k: v for k, v in KNOWN.items() if k in names}
    # Deleting the tenant, namespace or cluster everything else lives in would end the interesting part.
    if fixed and (operation.method.upper() != "DELETE" or "topic" in names):
        variants = [strategy]
        for topic in (TOPIC, PARTITIONED) if "topic" in names else (None,):
            params = {**fixed, "topic": topic} if topic else fixed
            variants.append(operation.as_strategy(generation_mode=mode, path_parameters=params))
        strategy = st.one_of(*variants)
    if operation.path.endswith("/partitions"):
        strategy = strategy.filter(lambda case: not (isinstance(case.body, int) and case.body > MAX_FUZZ_PARTITIONS))
    return strategy


def _checker(operation: Any, label: str, base: str, failures: list[str], statuses: dict[int, int]) -> Any:
    """The per-case check: records problems in ``failures`` instead of raising, so one run reports them all."""
    method = operation.method.upper()
    # A documented 501 is a deliberate "not implemented yet", not a server failure.
    allowed_5xx = {501} & {int(c) for c in operation.definition.raw.get("responses", {}) if str(c).isdigit()}

    def check(case: Any) -> None:
        reproduce = f"\n    {case.as_curl_command(base_url=base)}"
        try:
            response = case.call(base_url=base, timeout=REQUEST_TIMEOUT_S)
        except Exception as exc:
            failures.append(f"{label}: no answer ({type(exc).__name__}){reproduce}")
            return
        statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
        if response.status_code >= 500 and response.status_code not in allowed_5xx:
            failures.append(f"{label}: HTTP {response.status_code} {response.content[:200]!r}{reproduce}")
        elif response.status_code >= 400 and method != "HEAD":
            problem = _reason_problem(response)
            if problem:
                failures.append(
                    f"{label}: HTTP {response.status_code} {problem}: {response.content[:200]!r}{reproduce}"
                )

    return check


def test_admin_api_fuzz(fresh_standalone: StandaloneProcess) -> None:
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis.errors import Unsatisfiable
    from schemathesis import GenerationMode

    node = fresh_standalone
    node.start()
    _seed(node)
    base = node.http_url
    schema = schemathesis.openapi.from_url(f"{base}/admin/v2/openapi.json")
    operations = [r.ok() for r in schema.get_all_operations() if not any(x in r.ok().path for x in EXCLUDED_SUBSTRINGS)]
    assert operations, "the OpenAPI document lists no operations"
    # Deletions last, so that what they remove was there for everything else.
    operations.sort(key=lambda op: op.method.upper() == "DELETE")

    explicit = int(os.environ.get("MAGNETAR_FUZZ_EXAMPLES", 0))
    examples = explicit or max(MIN_EXAMPLES, min(DEFAULT_EXAMPLES, TOTAL_EXAMPLES_BUDGET // (2 * len(operations))))
    seed = os.environ.get("MAGNETAR_FUZZ_SEED")
    failures: list[str] = []
    statuses: dict[int, int] = {}
    started = time.monotonic()

    durations: dict[str, float] = {}
    for operation in operations:
        op_started = time.monotonic()
        # An explicit MAGNETAR_FUZZ_EXAMPLES asks for that depth everywhere: no time cap then.
        capped = not explicit and time.monotonic() - started > TIME_BUDGET_S
        budget = MIN_EXAMPLES if capped else examples
        modes = [GenerationMode.POSITIVE]
        if list(operation.body) or list(operation.query):
            # Only bodies and query parameters can be made schema-invalid (path parameters are plain strings).
            modes.append(GenerationMode.NEGATIVE)
        for mode in modes:
            check = _checker(operation, f"{operation.label} [{mode.value}]", base, failures, statuses)
            run = given(case=_strategy(operation, mode))(check)
            run = settings(
                max_examples=budget,
                deadline=None,
                database=None,
                derandomize=seed is None,
                phases=[Phase.explicit, Phase.generate],  # no shrinking: failures are collected, not raised
                suppress_health_check=list(HealthCheck),
            )(run)
            if seed is not None:
                run = hypothesis.seed(int(seed))(run)
            with contextlib.suppress(Unsatisfiable):  # nothing schema-invalid to generate for this operation
                run()
        assert node.proc is not None and node.proc.poll() is None, (
            f"broker died during {operation.label}:\n{node.log()}"
        )
        durations[operation.label] = time.monotonic() - op_started

    elapsed = time.monotonic() - started
    print(f"fuzzed {len(operations)} operations in {elapsed:.1f}s, {examples} examples each; statuses {statuses}")
    slowest = sorted(durations.items(), key=lambda kv: -kv[1])[:5]
    print("slowest: " + ", ".join(f"{label} {seconds:.1f}s" for label, seconds in slowest))

    report = f"{len(failures)} problem(s):\n" + "\n".join(dict.fromkeys(failures))
    status, body = _http("GET", f"{base}/admin/v2/brokers/health")
    assert (status, body) == (200, b"ok"), f"unhealthy after fuzzing: {status} {body!r}\n{report}"
    _round_trip(node)
    assert not failures, report
