"""``benchmarks.bench`` fan-out scenarios: every published message reaches every subscription, and the
row counts published messages (the broker's CPU per message covers its deliveries)."""

from __future__ import annotations

import pytest

from benchmarks.bench.brokers import ExternalBroker
from benchmarks.bench.main import build_params, parse_args
from benchmarks.bench.results import Params
from benchmarks.bench.scenarios import Bench, scenario_plan
from tests.conftest import StandaloneProcess


@pytest.mark.parametrize("batched", [False, True])
def test_fanout_delivers_every_message_to_every_subscription(standalone: StandaloneProcess, batched: bool) -> None:
    params = Params(
        producers=1, fanout_subscriptions=3, fanout_messages=1_500, fanout_messages_batched=6_000, receiver_queue=1000
    )
    bench = Bench(ExternalBroker(standalone.service_url, None), params, f"t-fanout-{batched}")
    name = "fanout-batched-100B" if batched else "fanout-100B"
    res = bench.fanout(name, batched)
    published = 6_000 if batched else 1_500
    assert res.error is None and res.errors == 0, res.note
    assert res.kind == "fanout" and res.batched is batched and res.messages == published
    assert f"3 subscriptions, 1 consumer each (queue 1000), 1 producer procs; {3 * published:,} deliveries" in res.note
    assert res.wall_s > 0 and res.msgs_per_s > 0


def test_fanout_group_and_options() -> None:
    params = build_params(parse_args(["--fanout-subscriptions", "6", "--fanout-messages", "1000"]))
    assert (params.fanout_subscriptions, params.fanout_messages, params.fanout_messages_batched) == (6, 1000, 5000)
    assert [name for name, _ in scenario_plan(params, ["fanout"])] == ["fanout-100B", "fanout-batched-100B"]
    assert [name for name, _ in scenario_plan(Params(), [])][-4:-2] == ["fanout-100B", "fanout-batched-100B"]
