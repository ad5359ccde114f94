"""Key_Shared subscriptions through the official client: key routing per selector, ordering, churn, errors.

Expected owners are computed with the broker's selectors from the consumers' join order and names, so
these tests pin the exact key-to-consumer mapping Pulsar would produce, not just "some spread". The tests
run against both implementations: Pulsar 4's default (PIP-379) and the classic one
(``subscriptionKeySharedUseClassicPersistentImplementation=true``).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace

import pulsar
import pytest

from magnetar.broker.config import BrokerConfig
from magnetar.broker.consumer import Consumer, SubType
from magnetar.broker.key_shared import KeySharedDispatcher
from magnetar.broker.key_shared_classic import ClassicKeySharedDispatcher
from magnetar.broker.key_shared_selectors import (
    ConsistentHashingSelector,
    HashRangeAutoSplitSelector,
    StickyKeyConsumerSelector,
    sticky_key_hash,
)
from magnetar.broker.protocol import pulsar_api_pb2 as pb
from magnetar.broker.protocol.frames import NONE_KEY, build_entry, parse_metadata
from magnetar.broker.stats import Meter
from magnetar.broker.topic_name import TopicName
from magnetar.managed_ledger.api import Entry, Position
from tests.conftest import StandaloneProcess, _quiet_logger

KS = pulsar.ConsumerType.KeyShared
E = pulsar.InitialPosition.Earliest
CLASSIC = "subscriptionKeySharedUseClassicPersistentImplementation"


@pytest.fixture(scope="module", params=["pip379", "classic"])
def ks_broker(
    request: pytest.FixtureRequest, standalone: StandaloneProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[StandaloneProcess]:
    """The shared broker (Pulsar 4's default implementation), then one running the classic implementation."""
    if request.param == "pip379":
        yield standalone
        return
    node = StandaloneProcess(tmp_path_factory.mktemp("classic") / "data", {CLASSIC: "true"})
    node.start()
    try:
        yield node
    finally:
        node.stop()


@pytest.fixture
def client(ks_broker: StandaloneProcess) -> Iterator[pulsar.Client]:
    c = pulsar.Client(ks_broker.service_url, operation_timeout_seconds=10, logger=_quiet_logger())
    yield c
    c.close()


@dataclass(eq=False)
class _Named:
    name: str


@dataclass
class Received:
    """Messages one consumer got, as (key, sequence, redelivery count), in arrival order."""

    ack: bool = True
    consumer: pulsar.Consumer = None  # set once subscribed (messages may arrive before that)
    items: list[tuple[str, int, int]] = field(default_factory=list)
    messages: list[pulsar.Message] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def listener(self, consumer: pulsar.Consumer, msg: pulsar.Message) -> None:
        key = msg.ordering_key() or msg.partition_key()
        with self.lock:
            self.items.append((key, int(msg.data()), msg.redelivery_count()))
            self.messages.append(msg)
        if self.ack:
            consumer.acknowledge(msg)

    def key_set(self) -> set[str]:
        with self.lock:
            return {k for k, _, _ in self.items}

    def count(self) -> int:
        with self.lock:
            return len(self.items)


def _subscribe(
    client: pulsar.Client,
    topic: str,
    sub: str,
    name: str,
    policy: pulsar.ConsumerKeySharedPolicy | None = None,
    ack: bool = True,
    queue: int = 1000,
) -> Received:
    received = Received(ack)
    received.consumer = client.subscribe(
        topic,
        sub,
        consumer_type=KS,
        consumer_name=name,
        initial_position=E,
        receiver_queue_size=queue,
        key_shared_policy=policy,
        message_listener=received.listener,
    )
    return received


def _wait(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def _send(
    client: pulsar.Client,
    topic: str,
    keys: Iterable[str | None],
    per_key: int,
    start: int = 0,
    batching: bool = False,
) -> int:
    """Send ``per_key`` messages for each key (round-robin over keys); payload = sequence per key."""
    producer = client.create_producer(
        topic,
        batching_enabled=batching,
        batching_type=pulsar.BatchingType.KeyBased if batching else pulsar.BatchingType.Default,
        batching_max_publish_delay_ms=50,
    )
    keys = list(keys)
    errors: list[object] = []
    for seq in range(start, start + per_key):
        for key in keys:
            kwargs = {}
            if key is not None:
                kwargs["partition_key"] = key
            if batching:
                producer.send_async(
                    str(seq).encode(), lambda res, _id: res == pulsar.Result.Ok or errors.append(res), **kwargs
                )
            else:
                producer.send(str(seq).encode(), **kwargs)
    producer.flush()
    producer.close()
    assert not errors
    return per_key * len(keys)


def _owner(selector: StickyKeyConsumerSelector, key: str | None) -> str:
    owner = selector.select(sticky_key_hash(NONE_KEY if key is None else key.encode()))
    assert owner is not None
    return owner.name


def _auto_split(names: list[str]) -> HashRangeAutoSplitSelector:
    sel = HashRangeAutoSplitSelector()
    for n in names:
        sel.add_consumer(_Named(n))  # type: ignore[arg-type]
    return sel


def _assert_in_order(received: Iterable[Received]) -> None:
    """Per consumer and key, first deliveries arrive in publish order (redeliveries may repeat older ones)."""
    for r in received:
        last: dict[str, int] = {}
        for key, seq, redeliveries in r.items:
            if redeliveries == 0:
                assert seq > last.get(key, -1), f"{r.consumer.consumer_name()}: key {key} got {seq} after {last[key]}"
                last[key] = seq


KEYS = [f"key-{i}" for i in range(24)]


def test_auto_split_routes_each_key_to_its_range_owner(client: pulsar.Client, topic_name: str) -> None:
    names = ["c1", "c2", "c3"]
    consumers = [_subscribe(client, topic_name, "ks", n) for n in names]
    total = _send(client, topic_name, KEYS, 5)
    _wait(lambda: sum(r.count() for r in consumers) == total)
    expected = _auto_split(names)
    for r in consumers:
        name = r.consumer.consumer_name()
        assert r.key_set(), f"{name} got no key"
        assert all(_owner(expected, k) == name for k in r.key_set())
    assert set().union(*(r.key_set() for r in consumers)) == set(KEYS)
    _assert_in_order(consumers)
    for r in consumers:
        seqs = defaultdict(list)
        for key, seq, _ in r.items:
            seqs[key].append(seq)
        assert all(v == list(range(5)) for v in seqs.values())


def test_keyless_messages_are_one_key_and_ordering_key_wins(client: pulsar.Client, topic_name: str) -> None:
    names = ["a", "b", "c", "d"]
    consumers = [_subscribe(client, topic_name, "ks", n) for n in names]
    expected = _auto_split(names)
    total = _send(client, topic_name, [None], 20)
    _wait(lambda: sum(r.count() for r in consumers) == total)
    [only] = [r for r in consumers if r.count()]
    assert only.consumer.consumer_name() == _owner(expected, None)
    assert [seq for _, seq, _ in only.items] == list(range(20))
    # The ordering key takes precedence over the partition key.
    producer = client.create_producer(topic_name, batching_enabled=False)
    for i in range(10):
        producer.send(b"100", partition_key="same-partition-key", ordering_key=f"ok-{i}")
    producer.close()
    _wait(lambda: sum(r.count() for r in consumers) == total + 10)
    seen = 0
    for r in consumers:
        with r.lock:
            got = [m.ordering_key() for m in r.messages if m.ordering_key()]
        assert all(_owner(expected, k) == r.consumer.consumer_name() for k in got), got
        seen += len(got)
    assert seen == 10


def test_key_based_batches_are_routed_by_key(client: pulsar.Client, topic_name: str) -> None:
    names = ["b1", "b2"]
    consumers = [_subscribe(client, topic_name, "ks", n) for n in names]
    total = _send(client, topic_name, KEYS, 10, batching=True)
    _wait(lambda: sum(r.count() for r in consumers) == total)
    expected = _auto_split(names)
    for r in consumers:
        assert r.key_set() and all(_owner(expected, k) == r.consumer.consumer_name() for k in r.key_set())
        with r.lock:
            assert any(m.message_id().batch_index() > 0 for m in r.messages), "messages arrived in batches"
    _assert_in_order(consumers)


def test_sticky_ranges_route_and_conflicts_are_refused(client: pulsar.Client, topic_name: str) -> None:
    def policy(*ranges: tuple[int, int], out_of_order: bool = False) -> pulsar.ConsumerKeySharedPolicy:
        return pulsar.ConsumerKeySharedPolicy(
            key_shared_mode=pulsar.KeySharedMode.Sticky,
            sticky_ranges=list(ranges),
            allow_out_of_order_delivery=out_of_order,
        )

    low = _subscribe(client, topic_name, "ks", "low", policy((0, 32767)))
    high = _subscribe(client, topic_name, "ks", "high", policy((32768, 65535)))
    with pytest.raises(pulsar.ConsumerAssignError):
        client.subscribe(topic_name, "ks", consumer_type=KS, key_shared_policy=policy((100, 200)))
    with pytest.raises(pulsar.ConsumerAssignError):
        client.subscribe(topic_name, "ks", consumer_type=KS, key_shared_policy=policy((40000, 40000)))
    with pytest.raises(pulsar.ConsumerAssignError):  # start > end (the client lets it through)
        client.subscribe(topic_name, "ks", consumer_type=KS, key_shared_policy=policy((10, 5)))
    # Another mode, or another out-of-order setting, than the subscription's: ConsumerBusy as in Pulsar.
    with pytest.raises(pulsar.ConsumerBusy):
        client.subscribe(topic_name, "ks", consumer_type=KS)
    with pytest.raises(pulsar.ConsumerBusy):
        client.subscribe(topic_name, "ks", consumer_type=KS, key_shared_policy=policy((1, 2), out_of_order=True))
    total = _send(client, topic_name, KEYS, 3)
    _wait(lambda: low.count() + high.count() == total)
    for r, (lo, hi) in ((low, (0, 32767)), (high, (32768, 65535))):
        assert r.key_set()
        assert all(lo <= sticky_key_hash(k.encode()) % 65536 <= hi for k in r.key_set())
    _assert_in_order([low, high])


def test_sticky_uncovered_keys_wait_for_a_consumer(client: pulsar.Client, topic_name: str) -> None:
    half = pulsar.ConsumerKeySharedPolicy(key_shared_mode=pulsar.KeySharedMode.Sticky, sticky_ranges=[(0, 32767)])
    low = _subscribe(client, topic_name, "ks", "low", half)
    total = _send(client, topic_name, KEYS, 3)
    uncovered = {k for k in KEYS if sticky_key_hash(k.encode()) % 65536 > 32767}
    _wait(lambda: low.count() == total - 3 * len(uncovered))
    rest = pulsar.ConsumerKeySharedPolicy(key_shared_mode=pulsar.KeySharedMode.Sticky, sticky_ranges=[(32768, 65535)])
    high = _subscribe(client, topic_name, "ks", "high", rest)
    _wait(lambda: high.count() == 3 * len(uncovered))
    assert high.key_set() == uncovered
    _assert_in_order([low, high])


def test_leaving_consumer_hands_its_keys_over(client: pulsar.Client, topic_name: str) -> None:
    keeper = _subscribe(client, topic_name, "ks", "keeper")
    leaver = _subscribe(client, topic_name, "ks", "leaver", ack=False)
    total = _send(client, topic_name, KEYS, 5)
    _wait(lambda: keeper.count() + leaver.count() == total)
    moved = leaver.key_set()
    assert moved and moved.isdisjoint(keeper.key_set())
    leaver.consumer.close()  # nothing acked: all of it goes to the keeper, which now owns every key
    _send(client, topic_name, KEYS, 5, start=5)
    _wait(lambda: keeper.count() == 2 * total)
    assert keeper.key_set() == set(KEYS)
    per_key: dict[str, list[int]] = defaultdict(list)
    for key, seq, redeliveries in keeper.items:
        per_key[key].append(seq)
        if key in moved and seq < 5:
            assert redeliveries == 1
    # Each moved key arrives whole and in order: its redelivered messages before the new ones.
    assert all(seqs == list(range(10)) for seqs in per_key.values())


def test_new_consumer_waits_until_older_messages_are_acked(client: pulsar.Client, topic_name: str) -> None:
    first = _subscribe(client, topic_name, "ks", "first", ack=False)
    total = _send(client, topic_name, KEYS, 3)
    _wait(lambda: first.count() == total)
    second = _subscribe(client, topic_name, "ks", "second")  # takes the lower half of the hash range
    _send(client, topic_name, KEYS, 3, start=3)
    expected = _auto_split(["first", "second"])
    its_keys = {k for k in KEYS if _owner(expected, k) == "second"}
    _wait(lambda: first.count() == total + 3 * (len(KEYS) - len(its_keys)))
    time.sleep(0.5)
    assert second.count() == 0, "held until the messages published before it joined are acknowledged"
    with first.lock:
        pending = list(first.messages)
    for msg in pending:
        first.consumer.acknowledge(msg)
    _wait(lambda: second.count() == 3 * len(its_keys))
    assert second.key_set() == its_keys
    _assert_in_order([first, second])


def test_out_of_order_delivery_lets_new_consumer_start_at_once(client: pulsar.Client, topic_name: str) -> None:
    policy = pulsar.ConsumerKeySharedPolicy(allow_out_of_order_delivery=True)
    first = _subscribe(client, topic_name, "ks", "first", policy, ack=False)
    total = _send(client, topic_name, KEYS, 3)
    _wait(lambda: first.count() == total)
    second = _subscribe(client, topic_name, "ks", "second", policy)
    _send(client, topic_name, KEYS, 3, start=3)
    expected = _auto_split(["first", "second"])
    its_keys = {k for k in KEYS if _owner(expected, k) == "second"}
    _wait(lambda: second.count() == 3 * len(its_keys))  # no wait for first's acks


def test_ordering_under_consumer_churn(client: pulsar.Client, topic_name: str) -> None:
    keys = [f"churn-{i}" for i in range(16)]
    per_key = 40
    receivers = [_subscribe(client, topic_name, "ks", "c0", queue=20)]
    expected = HashRangeAutoSplitSelector()
    members = {"c0": _Named("c0")}
    expected.add_consumer(members["c0"])  # type: ignore[arg-type]

    def produce() -> None:
        producer = client.create_producer(topic_name, batching_enabled=False)
        for seq in range(per_key):
            for key in keys:
                producer.send(str(seq).encode(), partition_key=key)
            time.sleep(0.02)
        producer.close()

    thread = threading.Thread(target=produce)
    thread.start()
    try:
        for i in range(1, 6):  # consumers join while messages flow; every second one, the previous leaves
            time.sleep(0.15)
            receivers.append(_subscribe(client, topic_name, "ks", f"c{i}", queue=20))
            members[f"c{i}"] = _Named(f"c{i}")
            expected.add_consumer(members[f"c{i}"])  # type: ignore[arg-type]
            if i % 2 == 0:  # it leaves with whatever it has not acknowledged yet
                receivers[i - 1].consumer.close()
                expected.remove_consumer(members[f"c{i - 1}"])  # type: ignore[arg-type]
    finally:
        thread.join()
    # A last round with stable membership: each key goes to the owner the selector predicts.
    total = per_key * len(keys) + _send(client, topic_name, keys, 3, start=per_key)
    got: dict[tuple[str, int], int] = {}

    def all_received() -> bool:
        got.clear()
        for r in receivers:
            with r.lock:
                for key, seq, _ in r.items:
                    got[key, seq] = got.get((key, seq), 0) + 1
        return len(got) == total

    _wait(all_received, timeout=20)
    _assert_in_order(receivers)
    for r in receivers:
        with r.lock:
            last = {key for key, seq, _ in r.items if seq >= per_key}
        assert all(_owner(expected, k) == r.consumer.consumer_name() for k in last)


def test_consistent_hashing_routes_by_ring(fresh_standalone: StandaloneProcess) -> None:
    fresh_standalone.extra_config["subscriptionKeySharedUseConsistentHashing"] = "true"
    fresh_standalone.start()
    client = pulsar.Client(fresh_standalone.service_url, operation_timeout_seconds=10, logger=_quiet_logger())
    try:
        topic = "persistent://public/default/ks-consistent"
        names = ["ring-a", "ring-b", "ring-c"]
        consumers = [_subscribe(client, topic, "ks", n) for n in names]
        keys = [f"k{i}" for i in range(40)]
        total = _send(client, topic, keys, 3)
        _wait(lambda: sum(r.count() for r in consumers) == total)
        ring = ConsistentHashingSelector(100)
        members = {n: _Named(n) for n in names}
        for member in members.values():
            ring.add_consumer(member)  # type: ignore[arg-type]
        for r in consumers:
            assert r.key_set(), "every consumer owns part of the ring"
            assert all(_owner(ring, k) == r.consumer.consumer_name() for k in r.key_set())
        # A departing consumer's keys move to the remaining ring owners; nobody else's keys move.
        consumers[1].consumer.close()
        ring.remove_consumer(members["ring-b"])  # type: ignore[arg-type]
        before = {r.consumer.consumer_name(): r.count() for r in consumers}
        _send(client, topic, keys, 2, start=3)
        _wait(lambda: sum(r.count() for r in consumers) == total + 2 * len(keys))
        for r in (consumers[0], consumers[2]):
            with r.lock:
                new = {k for k, _, _ in r.items[before[r.consumer.consumer_name()] :]}
            assert all(_owner(ring, k) == r.consumer.consumer_name() for k in new)
        _assert_in_order(consumers)
    finally:
        client.close()


# ------------------------------------------------------------------------------------------------------------
# The dispatcher on its own, over an in-memory cursor: races and bounds the client cannot provoke at will.


class _FakeLedger:
    def __init__(self) -> None:
        self.entries: list[bytes] = []

    def next_position(self, position: Position) -> Position:
        return Position(0, position.entry_id + 1)


class _FakeCursor:
    """Entries ``(0, i)``; ``gate`` holds the next read in flight until set."""

    def __init__(self, ledger: _FakeLedger) -> None:
        self.ledger = ledger
        self.read = 0
        self.md = -1
        self.acked: set[int] = set()
        self.gate: asyncio.Event | None = None
        self.reads = 0
        self.replays = 0
        self.replayed: list[list[Position]] = []

    @property
    def read_position(self) -> Position:
        return Position(0, self.read)

    @property
    def mark_delete_position(self) -> Position:
        return Position(0, self.md)

    def has_more_entries(self) -> bool:
        return self.read < len(self.ledger.entries)

    async def read_entries(self, n: int) -> list[Entry]:
        self.reads += 1
        start, self.read = self.read, min(len(self.ledger.entries), self.read + n)
        if self.gate is not None:
            await self.gate.wait()
        return [Entry(Position(0, i), self.ledger.entries[i]) for i in range(start, self.read) if i not in self.acked]

    async def replay_entries(self, positions: Iterable[Position]) -> list[Entry]:
        self.replays += 1
        self.replayed.append(sorted(positions))
        return [Entry(p, self.ledger.entries[p.entry_id]) for p in sorted(positions) if p.entry_id not in self.acked]

    def delete(self, positions: Iterable[Position]) -> None:
        self.acked.update(p.entry_id for p in positions)
        while self.md + 1 in self.acked:
            self.md += 1


class _FakeConnection:
    writable = True  # its socket always takes more

    def __init__(self) -> None:
        self.got: list[tuple[str, int]] = []

    def write(self, header: bytes, data: bytes | None = None) -> None:
        if data is not None:
            key, seq = parse_metadata(data)[1].tobytes().decode().split(":")
            self.got.append((key, int(seq)))


class _FakeSubscription:
    """What the dispatcher and consumers use of a subscription, with acks as Subscription does them."""

    name = "ks"
    batch_index_acks = False

    def __init__(self, classic: bool = False, **settings: str) -> None:
        config = BrokerConfig()
        config.apply(settings)
        config.subscription_key_shared_use_classic_persistent_implementation = classic
        self.ledger = _FakeLedger()
        self.cursor = _FakeCursor(self.ledger)
        self.topic = SimpleNamespace(
            name=TopicName.parse("persistent://public/default/ks"),
            service=SimpleNamespace(config=config),
            ledger=self.ledger,
            terminated=False,
        )
        self.redelivery_counts: dict[Position, int] = {}
        self.meter_out = Meter()
        kind = ClassicKeySharedDispatcher if classic else KeySharedDispatcher
        self.dispatcher = kind(self, 100)  # type: ignore[arg-type]

    def count_redelivery(self, position: Position) -> None:
        self.redelivery_counts[position] = self.redelivery_counts.get(position, 0) + 1

    def publish(self, key: str, *seqs: int) -> None:
        for seq in seqs:
            metadata = pb.MessageMetadata(producer_name="p", sequence_id=seq, publish_time=1, partition_key=key)
            self.ledger.entries.append(build_entry(metadata, f"{key}:{seq}".encode()))
        self.dispatcher.wakeup()

    def key_at(self, position: Position) -> str:
        return parse_metadata(self.ledger.entries[position.entry_id])[0].partition_key

    def consumer(self, name: str, permits: int = 1000, meta: pb.KeySharedMeta | None = None) -> Consumer:
        c = Consumer(self, _FakeConnection(), len(name), name, SubType.Key_Shared, 0, 0, {})  # type: ignore[arg-type]
        c.key_shared_meta = meta
        c.flow(permits)
        self.dispatcher.add_consumer(c)
        return c

    def ack_all(self, consumer: Consumer, key: str | None = None) -> None:
        """Acknowledge ``consumer``'s unacked entries (only those of ``key`` if given)."""
        positions = [p for p in consumer.pending_acks if key is None or self.key_at(p) == key]
        for p in positions:
            consumer.acked(p)
        self.cursor.delete(positions)
        self.dispatcher.redelivery.difference_update(positions)
        self.dispatcher.wakeup()

    async def remove(self, consumer: Consumer) -> None:
        consumer.closed = True
        await self.dispatcher.remove_consumer(consumer)


@pytest.fixture(params=[False, True], ids=["pip379", "classic"])
def classic(request: pytest.FixtureRequest) -> bool:
    """Run a dispatcher test on both Key_Shared implementations."""
    return request.param  # type: ignore[no-any-return]


def _got(c: Consumer) -> list[tuple[str, int]]:
    return c.connection.got  # type: ignore[attr-defined,no-any-return]


async def _settle() -> None:
    for _ in range(50):
        await asyncio.sleep(0)


def _key_of(selector: StickyKeyConsumerSelector, name: str) -> str:
    return next(k for k in (f"k{i}" for i in range(1000)) if _owner(selector, k) == name)


async def test_parked_entries_of_a_departed_consumer_go_before_a_read_in_flight(classic: bool) -> None:
    sub = _FakeSubscription(classic)
    a, b = sub.consumer("a"), sub.consumer("b")
    key = _key_of(_auto_split(["a", "b"]), "a")
    sub.publish(key, 0, 1, 2)
    await _settle()
    assert _got(a) == [(key, 0), (key, 1), (key, 2)]
    sub.cursor.gate = asyncio.Event()
    sub.publish(key, 3, 4, 5)
    reads = sub.cursor.reads
    await _settle()
    assert sub.cursor.reads == reads + 1  # that read is in flight
    await sub.remove(a)  # its unacked 0..2 are parked for the key's new owner, b
    sub.cursor.gate.set()
    await _settle()
    assert _got(b) == [(key, i) for i in range(6)]  # not 3, 4, 5 ahead of 0, 1, 2
    assert [sub.redelivery_counts.get(Position(0, i), 0) for i in range(6)] == [1, 1, 1, 0, 0, 0]
    await sub.dispatcher.close()


async def test_busy_key_does_not_block_others_nor_spin(classic: bool) -> None:
    sub = _FakeSubscription(classic)
    a, b = sub.consumer("a", permits=0), sub.consumer("b")
    selector = _auto_split(["a", "b"])
    busy, free = _key_of(selector, "a"), _key_of(selector, "b")
    for i in range(30):
        sub.publish(busy, i)
        sub.publish(free, i)
    await _settle()
    assert _got(b) == [(free, i) for i in range(30)]  # b's key flows past a's parked entries
    assert len(sub.dispatcher.redelivery) == 30
    reads, replays = sub.cursor.reads, sub.cursor.replays
    selector = sub.dispatcher.selector
    lookups = 0
    select = selector.select

    def counting_select(key_hash: int) -> Consumer | None:
        nonlocal lookups
        lookups += 1
        return select(key_hash)

    selector.select = counting_select  # type: ignore[method-assign]
    for _ in range(20):  # wakeups that change nothing for a (acks, flows of others): no rescans, no reads
        sub.dispatcher.wakeup()
        await _settle()
    assert (sub.cursor.reads, sub.cursor.replays, lookups) == (reads, replays, 0)
    a.flow(10)
    sub.dispatcher.wakeup()
    await _settle()
    assert _got(a) == [(busy, i) for i in range(10)]
    a.flow(100)
    sub.publish(busy, 30)
    await _settle()
    assert _got(a) == [(busy, i) for i in range(31)]
    await sub.dispatcher.close()


async def test_replays_are_shared_fairly_between_consumers(classic: bool) -> None:
    sub = _FakeSubscription(classic)
    a, b = sub.consumer("a", permits=0), sub.consumer("b", permits=0)
    c = sub.consumer("c")  # keeps reads going while a and b are busy
    selector = _auto_split(["a", "b", "c"])
    ka, kb, kc = (_key_of(selector, n) for n in ("a", "b", "c"))
    sub.publish(ka, *range(300))
    sub.publish(kb, *range(300))
    sub.publish(kc, 0)
    await _settle()
    assert _got(c) == [(kc, 0)] and len(sub.dispatcher.redelivery) == 600
    replays = sub.cursor.replays
    a.flow(1000)
    b.flow(1000)
    sub.dispatcher.wakeup()
    await _settle()
    # The first replay served both (up to the read batch each), though all of a's entries come first.
    first = sub.cursor.replayed[replays]
    assert first == [Position(0, i) for i in range(100)] + [Position(0, 300 + i) for i in range(100)]
    assert _got(a) == [(ka, i) for i in range(300)] and _got(b) == [(kb, i) for i in range(300)]
    await sub.dispatcher.close()


async def test_look_ahead_is_bounded(classic: bool) -> None:
    sub = _FakeSubscription(classic, keySharedLookAheadMsgInReplayThresholdPerSubscription="10")
    sub.consumer("a", permits=0)
    b = sub.consumer("b")
    selector = _auto_split(["a", "b"])
    busy, free = _key_of(selector, "a"), _key_of(selector, "b")
    sub.publish(busy, *range(300))
    sub.publish(free, 0)
    await _settle()
    assert 10 <= len(sub.dispatcher.redelivery) < 10 + 100  # stops reading once 10 are parked
    assert _got(b) == []  # b's entry is behind the bound: it waits for a to drain
    await sub.dispatcher.close()


async def test_recently_joined_consumer_gets_only_older_entries_until_acked() -> None:
    sub = _FakeSubscription(classic=True)
    c = sub.consumer("c")
    a = sub.consumer("a", permits=3)
    before, after = _auto_split(["c", "a"]), _auto_split(["c", "a", "b"])
    moved = next(k for k in (f"k{i}" for i in range(1000)) if _owner(before, k) == "a" and _owner(after, k) == "b")
    sub.publish(moved, 0, 1, 2, 3, 4)  # 0..2 go to a, 3..4 are parked (a is out of permits)
    await _settle()
    assert _got(a) == [(moved, 0), (moved, 1), (moved, 2)]
    b = sub.consumer("b")  # joins at read position 5 and takes the key over
    sub.publish(moved, 5, 6)
    await _settle()
    assert _got(b) == [(moved, 3), (moved, 4)]  # published before it joined: sent at once (as in Pulsar)
    sub.ack_all(b)
    await _settle()
    assert _got(b) == [(moved, 3), (moved, 4)]  # 5, 6 wait until everything before 5 is acknowledged
    sub.ack_all(a)
    await _settle()
    assert _got(b) == [(moved, i) for i in range(3, 7)]
    assert _got(c) == []
    await sub.dispatcher.close()


async def test_replayed_entries_respect_the_earliest_join() -> None:
    sub = _FakeSubscription(classic=True)
    x = sub.consumer("x")
    owners = [_auto_split(["x"]), _auto_split(["x", "b1"]), _auto_split(["x", "b1", "b2"])]
    key = next(k for k in (f"k{i}" for i in range(1000)) if [_owner(s, k) for s in owners] == ["x", "b1", "b2"])
    sub.publish(key, 0)
    await _settle()
    b1 = sub.consumer("b1")  # joins at 1 and takes the key: 1 is parked for it
    sub.publish(key, 1)
    await _settle()
    b2 = sub.consumer("b2")  # joins at 2 and takes the key from b1
    await _settle()
    # 1 is older than b2's join, but not older than b1's: it must wait for x's 0 to be acknowledged.
    assert _got(b1) == [] and _got(b2) == []
    sub.ack_all(x)
    await _settle()
    assert _got(b2) == [(key, 1)]
    await sub.dispatcher.close()


async def test_redelivered_entries_of_unknown_key_are_read_before_new_entries(classic: bool) -> None:
    sub = _FakeSubscription(classic)
    a = sub.consumer("a")
    sub.publish("x", 0, 1)
    await _settle()
    taken = a.take_pending()
    sub.dispatcher._hashes.clear()  # as if forgotten: the dispatcher must read them to learn their key
    sub.dispatcher.redeliver(taken)
    sub.publish("x", 2)
    await _settle()
    assert _got(a) == [("x", 0), ("x", 1), ("x", 0), ("x", 1), ("x", 2)]
    await sub.dispatcher.close()


def test_stats_show_key_hash_ranges(ks_broker: StandaloneProcess, client: pulsar.Client, topic_name: str) -> None:
    from tests.admin.rest import call

    for name in ("a", "b"):
        client.subscribe(topic_name, "ks-stats", consumer_type=pulsar.ConsumerType.KeyShared, consumer_name=name)
    path = topic_name.replace("persistent://", "persistent/")
    stats = call("GET", f"{ks_broker.http_url}/admin/v2/{path}/stats").json["subscriptions"]["ks-stats"]
    assert stats["keySharedMode"] == "AUTO_SPLIT" and stats["drainingHashesCount"] == 0
    expected = _auto_split(["a", "b"]).key_hash_ranges()
    names = {c.name: c for c in expected}
    for c in stats["consumers"]:
        ranges = expected[names[c["consumerName"]]]
        if ks_broker.extra_config.get(CLASSIC) == "true":  # Pulsar 4 keeps the 3.x string form for classic
            assert c["keyHashRanges"] == [f"[{s}, {e}]" for s, e in ranges] and "keyHashRangeArrays" not in c
        else:
            assert c["keyHashRangeArrays"] == [[s, e] for s, e in ranges] and "keyHashRanges" not in c
    assert len(stats["consumers"]) == 2
