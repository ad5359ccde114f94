"""Key_Shared's Pulsar 4 dispatcher (PIP-379, "draining hashes") through the official client.

A key that moves to a joining consumer while the previous owner still holds unacknowledged messages of
it is *draining*: its new messages wait until the old owner acknowledges them, while every other key --
moved ones included -- keeps flowing. The admin stats show the draining hashes while they block.
"""

from __future__ import annotations

import time
from typing import Any

import pulsar

from magnetar.broker.key_shared_selectors import slot_hash
from magnetar.broker.protocol import pulsar_api_pb2 as pb
from tests.admin.rest import call
from tests.broker.test_key_shared import (
    KEYS,
    _assert_in_order,
    _auto_split,
    _FakeSubscription,
    _got,
    _owner,
    _send,
    _settle,
    _subscribe,
    _wait,
)
from tests.conftest import StandaloneProcess


def _sub_stats(broker: StandaloneProcess, topic: str, sub: str) -> dict[str, Any]:
    path = topic.replace("persistent://", "persistent/")
    return call("GET", f"{broker.http_url}/admin/v2/{path}/stats").json["subscriptions"][sub]  # type: ignore[no-any-return]


def _consumer(stats: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in stats["consumers"] if c["consumerName"] == name)


def test_draining_hash_blocks_only_its_key_until_acked(
    standalone: StandaloneProcess, client: pulsar.Client, topic_name: str
) -> None:
    first = _subscribe(client, topic_name, "ks", "first", ack=False)
    total = _send(client, topic_name, KEYS, 2)
    _wait(lambda: first.count() == total)
    expected = _auto_split(["first", "second"])
    moved = [k for k in KEYS if _owner(expected, k) == "second"]
    held, free = moved[0], set(moved[1:])
    assert free, "the second consumer takes over more than one key"
    # ``first`` acknowledges everything except ``held``'s two messages.
    with first.lock:
        unheld = [m for m in first.messages if m.partition_key() != held]
    for msg in unheld:
        first.consumer.acknowledge(msg)
    _wait(lambda: _consumer(_sub_stats(standalone, topic_name, "ks"), "first")["unackedMessages"] == 2)

    second = _subscribe(client, topic_name, "ks", "second")
    _send(client, topic_name, KEYS, 2, start=2)
    # Moved keys without unacknowledged messages go to the new owner at once; first keeps its own keys.
    _wait(lambda: second.count() == 2 * len(free))
    _wait(lambda: first.count() == total + 2 * (len(KEYS) - len(moved)))
    time.sleep(0.3)
    assert second.key_set() == free, "the draining key waits for the old owner's acknowledgements"

    h = slot_hash(held.encode(), 65536)
    stats = _sub_stats(standalone, topic_name, "ks")
    assert (stats["drainingHashesCount"], stats["drainingHashesUnackedMessages"]) == (1, 2)
    assert stats["keySharedMode"] == "AUTO_SPLIT" and stats["allowOutOfOrderDelivery"] is False
    old = _consumer(stats, "first")
    assert (old["drainingHashesCount"], old["drainingHashesUnackedMessages"], old["drainingHashesClearedTotal"]) == (
        1,
        2,
        0,
    )
    [draining] = old["drainingHashes"]
    assert draining["hash"] == h and draining["unackMsgs"] == 2 and draining["blockedAttempts"] >= 1
    new = _consumer(stats, "second")
    assert new["drainingHashesCount"] == 0 and new["drainingHashes"] == []
    assert new["keyHashRangeArrays"] and all(len(r) == 2 for r in new["keyHashRangeArrays"])
    assert "keyHashRanges" not in new  # the classic implementation's string form

    with first.lock:
        rest = [m for m in first.messages if m.partition_key() == held]
    for msg in rest:
        first.consumer.acknowledge(msg)
    _wait(lambda: second.count() == 2 * len(free) + 2)
    with second.lock:
        assert [seq for key, seq, _ in second.items if key == held] == [2, 3]
    _assert_in_order([first, second])
    stats = _sub_stats(standalone, topic_name, "ks")
    old = _consumer(stats, "first")
    assert (old["drainingHashesCount"], old["drainingHashesClearedTotal"], old["drainingHashes"]) == (0, 1, [])
    assert (stats["drainingHashesCount"], stats["drainingHashesClearedTotal"]) == (0, 1)


# ------------------------------------------------------------------------------------------------------------
# The dispatcher on its own, over the in-memory cursor of test_key_shared.


def _moved_keys(n: int) -> tuple[list[str], str]:
    """``n`` keys that move from "a" to "b" when "b" joins, and one that stays with "a"."""
    after = _auto_split(["a", "b"])
    keys = [f"k{i}" for i in range(1000)]
    return [k for k in keys if _owner(after, k) == "b"][:n], next(k for k in keys if _owner(after, k) == "a")


async def test_only_the_draining_hash_waits_and_stats_follow_it() -> None:
    sub = _FakeSubscription()
    a = sub.consumer("a")
    (held, free), stay = _moved_keys(2)
    sub.publish(held, 0, 1)
    sub.publish(free, 0)
    sub.publish(stay, 0)
    await _settle()
    sub.ack_all(a, free)
    sub.ack_all(a, stay)
    b = sub.consumer("b")
    sub.publish(held, 2)
    sub.publish(free, 1)
    sub.publish(stay, 1)
    await _settle()
    assert _got(b) == [(free, 1)]  # a moved key a holds nothing of flows at once
    assert _got(a)[-1] == (stay, 1)
    h = slot_hash(held.encode(), 65536)
    stats = sub.dispatcher.draining.consumer_stats(a)
    assert stats["drainingHashesCount"] == 1 and stats["drainingHashesUnackedMessages"] == 2
    assert stats["drainingHashes"][0]["hash"] == h and stats["drainingHashes"][0]["blockedAttempts"] >= 1
    sub.ack_all(a, held)
    await _settle()
    assert _got(b) == [(free, 1), (held, 2)]
    assert sub.dispatcher.draining.consumer_stats(a)["drainingHashesClearedTotal"] == 1
    assert len(sub.dispatcher.draining) == 0
    await sub.dispatcher.close()


async def test_draining_hash_back_with_its_old_owner_stops_draining() -> None:
    sub = _FakeSubscription()
    a = sub.consumer("a")
    (held,), _ = _moved_keys(1)
    sub.publish(held, 0)
    await _settle()
    b = sub.consumer("b")
    sub.publish(held, 1)
    await _settle()
    assert _got(b) == [] and len(sub.dispatcher.draining) == 1
    await sub.remove(b)  # the hash goes back to a, which may go on at once
    await _settle()
    assert _got(a) == [(held, 0), (held, 1)]
    assert len(sub.dispatcher.draining) == 0
    await sub.dispatcher.close()


async def test_departing_draining_consumer_hands_over_in_order() -> None:
    sub = _FakeSubscription()
    a = sub.consumer("a")
    (held,), _ = _moved_keys(1)
    sub.publish(held, 0, 1)
    await _settle()
    b = sub.consumer("b")
    sub.publish(held, 2)
    await _settle()
    assert _got(b) == []
    await sub.remove(a)  # a's unacked 0, 1 go to b ahead of 2
    await _settle()
    assert _got(b) == [(held, 0), (held, 1), (held, 2)]
    assert len(sub.dispatcher.draining) == 0
    await sub.dispatcher.close()


async def test_parked_entries_of_other_keys_are_replayed_past_a_draining_one() -> None:
    sub = _FakeSubscription()
    a = sub.consumer("a")
    (held, free), _ = _moved_keys(2)
    sub.publish(held, 0)
    await _settle()
    b = sub.consumer("b", permits=0)
    sub.publish(held, 1)
    sub.publish(free, 0, 1)  # all parked: b has no permits
    await _settle()
    assert len(sub.dispatcher.redelivery) == 3
    b.flow(10)
    sub.dispatcher.wakeup()
    await _settle()
    assert _got(b) == [(free, 0), (free, 1)]  # the draining hash's entry does not hold them back
    replays = sub.cursor.replays
    for _ in range(10):  # wakeups that unblock nothing replay nothing
        sub.dispatcher.wakeup()
        await _settle()
    assert sub.cursor.replays == replays
    sub.ack_all(a)
    await _settle()
    assert _got(b) == [(free, 0), (free, 1), (held, 1)]
    await sub.dispatcher.close()


async def test_out_of_order_and_sticky_subscriptions_do_not_drain() -> None:
    sub = _FakeSubscription()
    policy = pb.KeySharedMeta(keySharedMode=pb.AUTO_SPLIT, allowOutOfOrderDelivery=True)
    a = sub.consumer("a", meta=policy)
    (held,), _ = _moved_keys(1)
    sub.publish(held, 0)
    await _settle()
    b = sub.consumer("b", meta=policy)
    sub.publish(held, 1)
    await _settle()
    assert _got(a) == [(held, 0)] and _got(b) == [(held, 1)]
    assert len(sub.dispatcher.draining) == 0
    await sub.dispatcher.close()
