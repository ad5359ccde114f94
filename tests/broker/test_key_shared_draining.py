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
from tests.admin.rest import call
from tests.broker.test_key_shared import KEYS, _assert_in_order, _auto_split, _owner, _send, _subscribe, _wait
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
