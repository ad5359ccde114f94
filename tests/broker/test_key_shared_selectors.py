"""Pure unit tests of the Key_Shared hash and selectors (no broker)."""

from __future__ import annotations

import random
import struct
from dataclasses import dataclass, field

import pytest

from magnetar.broker.errors import BrokerError
from magnetar.broker.key_shared_selectors import (
    RANGE_SIZE,
    ConsistentHashingSelector,
    HashRangeAutoSplitSelector,
    HashRangeExclusiveSelector,
    sticky_key_hash,
)
from magnetar.broker.protocol import pulsar_api_pb2 as pb
from magnetar.broker.protocol.frames import NONE_KEY


@dataclass(eq=False)
class FakeConsumer:
    """The two attributes the selectors read; identity equality like the broker's consumers."""

    name: str
    key_shared_meta: pb.KeySharedMeta | None = field(default=None)


def sticky(name: str, *ranges: tuple[int, int]) -> FakeConsumer:
    meta = pb.KeySharedMeta(keySharedMode=pb.STICKY)
    for start, end in ranges:
        meta.hashRanges.add(start=start, end=end)
    return FakeConsumer(name, meta)


# ---------------------------------------------------------------------------------------------- hash


def _reference_murmur3(data: bytes) -> int:
    """Murmur3 x86 32-bit, seed 0, written from the algorithm's description, then Pulsar's sign mask."""
    mask = 0xFFFFFFFF

    def rotl(x: int, r: int) -> int:
        return ((x << r) | (x >> (32 - r))) & mask

    def mix_k(k: int) -> int:
        return (rotl((k * 0xCC9E2D51) & mask, 15) * 0x1B873593) & mask

    h = 0
    full = len(data) // 4 * 4
    for (k,) in struct.iter_unpack("<I", data[:full]):
        h = (rotl(h ^ mix_k(k), 13) * 5 + 0xE6546B64) & mask
    tail = 0
    for i, b in enumerate(data[full:]):
        tail |= b << (8 * i)  # unsigned bytes
    h ^= mix_k(tail)
    h ^= len(data)
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & mask
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & mask
    h ^= h >> 16
    return h & 0x7FFFFFFF


def test_known_hash_values() -> None:
    # Published Murmur3_x86_32 (seed 0) vectors, with the sign bit cleared as Pulsar's makeHash does.
    assert sticky_key_hash(b"") == 0
    assert sticky_key_hash(b"hello") == 0x248BFA47
    assert sticky_key_hash(b"The quick brown fox jumps over the lazy dog") == 0x2E4FF723
    # NONE_KEY's raw hash 0x9e15bea3 has the sign bit set: it is masked, not negated or reduced mod 2**31.
    assert NONE_KEY == b"NONE_KEY"
    assert sticky_key_hash(NONE_KEY) == 0x1E15BEA3
    assert sticky_key_hash(NONE_KEY) % RANGE_SIZE == 0xBEA3


def test_hash_matches_reference_on_random_keys() -> None:
    rng = random.Random(7)
    for n in range(200):
        data = bytes(rng.randrange(256) for _ in range(n % 23))
        assert sticky_key_hash(data) == _reference_murmur3(data)


# ----------------------------------------------------------------------------------- auto-split ranges


def test_auto_split_halves_largest_range_lower_half_to_newcomer() -> None:
    sel = HashRangeAutoSplitSelector()
    c1, c2, c3, c4 = (FakeConsumer(f"c{i}") for i in range(1, 5))
    sel.add_consumer(c1)
    assert sel.key_hash_ranges() == {c1: [(0, 65536)]}
    sel.add_consumer(c2)  # takes the lower half of c1's range
    assert sel.key_hash_ranges() == {c2: [(0, 32768)], c1: [(32769, 65536)]}
    sel.add_consumer(c3)  # two equal ranges: the lower one is split
    assert sel.key_hash_ranges() == {c3: [(0, 16384)], c2: [(16385, 32768)], c1: [(32769, 65536)]}
    sel.add_consumer(c4)  # c1's is now the largest
    assert sel.key_hash_ranges()[c4] == [(32769, 49152)]
    assert sel.key_hash_ranges()[c1] == [(49153, 65536)]
    assert sel.select(0) is c3 and sel.select(16384) is c3 and sel.select(16385) is c2
    assert sel.select(49152) is c4 and sel.select(49153) is c1 and sel.select(65535) is c1
    # Selection reduces the 31-bit hash modulo the range size.
    assert sel.select(5 * RANGE_SIZE + 40000) is c4


def test_auto_split_removal_merges_into_right_neighbour_top_into_left() -> None:
    sel = HashRangeAutoSplitSelector()
    c1, c2, c3 = FakeConsumer("c1"), FakeConsumer("c2"), FakeConsumer("c3")
    for c in (c1, c2, c3):
        sel.add_consumer(c)
    # c3 [0, 16384], c2 (16384, 32768], c1 (32768, 65536]
    sel.remove_consumer(c3)  # its slots go to the next bound up: c2
    assert sel.key_hash_ranges() == {c2: [(0, 32768)], c1: [(32769, 65536)]}
    sel.add_consumer(c3)
    assert sel.key_hash_ranges() == {c3: [(0, 16384)], c2: [(16385, 32768)], c1: [(32769, 65536)]}
    sel.remove_consumer(c1)  # the top range: the left neighbour extends up to 65536
    assert sel.key_hash_ranges() == {c3: [(0, 16384)], c2: [(16385, 65536)]}
    sel.remove_consumer(c1)  # unknown: no-op
    sel.remove_consumer(c2)
    sel.remove_consumer(c3)
    assert sel.select(123) is None
    assert sel.key_hash_ranges() == {}


def test_auto_split_removing_a_middle_range_extends_the_next_one_down() -> None:
    sel = HashRangeAutoSplitSelector()
    c1, c2, c3, c4 = (FakeConsumer(f"c{i}") for i in range(1, 5))
    for c in (c1, c2, c3, c4):
        sel.add_consumer(c)
    # c3 [0, 16384], c2 (16384, 32768], c4 (32768, 49152], c1 (49152, 65536]
    sel.remove_consumer(c2)
    assert sel.key_hash_ranges() == {c3: [(0, 16384)], c4: [(16385, 49152)], c1: [(49153, 65536)]}
    sel.remove_consumer(c4)
    assert sel.key_hash_ranges() == {c3: [(0, 16384)], c1: [(16385, 65536)]}


def test_auto_split_refuses_when_no_range_can_be_split() -> None:
    sel = HashRangeAutoSplitSelector(4)
    consumers = [FakeConsumer(f"c{i}") for i in range(4)]
    for c in consumers[:3]:
        sel.add_consumer(c)
    assert sorted(b for rs in sel.key_hash_ranges().values() for _, b in rs) == [1, 2, 4]
    sel.add_consumer(consumers[3])
    with pytest.raises(BrokerError) as err:
        sel.add_consumer(FakeConsumer("extra"))
    assert err.value.code == pb.ConsumerAssignError
    assert "No more range can assigned to new consumer, assigned consumers 4" in str(err.value)


# ------------------------------------------------------------------------------------ consistent ring


def test_consistent_ring_points_and_lookup() -> None:
    sel = ConsistentHashingSelector(points=100)
    a, b = FakeConsumer("alpha"), FakeConsumer("beta")
    sel.add_consumer(a)
    sel.add_consumer(b)
    # Point i of a consumer is the hash of "name\0<name index>\0i".
    ring = {sticky_key_hash(f"alpha\x000\x00{i}".encode()): a for i in range(100)}
    ring.update({sticky_key_hash(f"beta\x000\x00{i}".encode()): b for i in range(100)})
    points = sorted(ring)
    assert points == sel._keys
    for p in points[:10]:
        assert sel.select(p) is ring[p]  # a point belongs to its consumer
        assert sel.select(p - 1) is ring[p]  # the first point at or after the hash
    assert sel.select(points[-1] + 1) is ring[points[0]]  # wraps around
    rng = random.Random(3)
    owners = [sel.select(sticky_key_hash(f"k{rng.random()}".encode())) for _ in range(2000)]
    assert 600 < owners.count(a) < 1400  # both own a fair share


def test_consistent_ring_same_name_gets_next_free_index_and_removal_restores() -> None:
    sel = ConsistentHashingSelector(points=10)
    a1, a2, b = FakeConsumer("same"), FakeConsumer("same"), FakeConsumer("other")
    sel.add_consumer(a1)
    sel.add_consumer(b)
    before = {h: sel.select(h) for h in range(0, 2**31, 2**24)}
    sel.add_consumer(a2)  # same name, distinct points (index 1)
    assert sticky_key_hash(b"same\x001\x003") in sel._ring
    assert sel._ring[sticky_key_hash(b"same\x001\x003")] is a2
    sel.remove_consumer(a2)
    assert {h: sel.select(h) for h in range(0, 2**31, 2**24)} == before
    sel.remove_consumer(a1)
    a3 = FakeConsumer("same")
    sel.add_consumer(a3)  # index 0 is free again
    assert sel._ring[sticky_key_hash(b"same\x000\x000")] is a3
    sel.remove_consumer(a3)
    sel.remove_consumer(b)
    assert sel.select(42) is None and not sel._members and not sel._used_indexes


def test_consistent_ring_moves_few_keys_when_consumer_joins() -> None:
    sel = ConsistentHashingSelector(points=100)
    consumers = [FakeConsumer(f"consumer-{i}") for i in range(4)]
    for c in consumers:
        sel.add_consumer(c)
    keys = [sticky_key_hash(f"key-{i}".encode()) for i in range(4000)]
    before = [sel.select(h) for h in keys]
    sel.add_consumer(FakeConsumer("consumer-new"))
    after = [sel.select(h) for h in keys]
    moved = [(x, y) for x, y in zip(before, after, strict=True) if x is not y]
    assert all(y.name == "consumer-new" for _, y in moved)  # keys only move to the newcomer
    assert 400 < len(moved) < 1400  # about a fifth of them


# ---------------------------------------------------------------------------------------- sticky ranges


def test_sticky_ranges_lookup() -> None:
    sel = HashRangeExclusiveSelector()
    a = sticky("a", (0, 99), (200, 299))
    b = sticky("b", (100, 149), (1000, 65535))
    sel.add_consumer(a)
    sel.add_consumer(b)
    assert sel.select(0) is a and sel.select(99) is a and sel.select(250) is a
    assert sel.select(100) is b and sel.select(149) is b and sel.select(65535) is b
    assert sel.select(150) is None  # between b's 149 and a's 200: nobody
    assert sel.select(500) is None
    assert sel.select(RANGE_SIZE + 120) is b  # hash modulo 65536
    sel.remove_consumer(b)
    assert sel.select(120) is a  # now a gap between two of a's ranges
    assert sel.select(1000) is None and sel.select(65535) is None
    assert sel.key_hash_ranges() == {a: [(0, 99), (200, 299)]}


def test_sticky_gap_between_ranges_of_one_consumer_goes_to_it_as_in_pulsar() -> None:
    sel = HashRangeExclusiveSelector()
    a = sticky("a", (0, 10), (20, 30))
    sel.add_consumer(a)
    assert sel.select(15) is a


@pytest.mark.parametrize(
    ("ranges", "message"),
    [
        ((), "Ranges for KeyShared policy must not be empty."),
        (((10, 5),), "Fixed hash range start > end"),
        (((-1, 5),), "Ranges must be [0, 65535]"),
        (((0, 70000),), "Ranges must be [0, 65535]"),
        (((200, 210), (205, 220)), "overlap"),
        (((50, 60),), "Range conflict with consumer first"),
        (((0, 0),), "Range conflict with consumer first"),
        (((500, 600),), "Range conflict with consumer first"),  # covers first's whole range
    ],
)
def test_sticky_refuses_invalid_or_conflicting_ranges(ranges: tuple[tuple[int, int], ...], message: str) -> None:
    sel = HashRangeExclusiveSelector()
    first = sticky("first", (0, 100), (510, 520))
    sel.add_consumer(first)
    newcomer = sticky("new", *ranges)
    with pytest.raises(BrokerError) as err:
        sel.add_consumer(newcomer)
    assert err.value.code == pb.ConsumerAssignError
    assert message in str(err.value)
    assert sel.select(1000) is None  # nothing of the refused consumer was registered
    sel.add_consumer(sticky("ok", (101, 509)))  # adjacent ranges are fine


def test_sticky_requires_meta() -> None:
    with pytest.raises(BrokerError, match="Must specify key shared meta"):
        HashRangeExclusiveSelector().add_consumer(FakeConsumer("x"))


def test_key_hash_is_pulsar_4_slot_never_zero() -> None:
    """Range selectors route and report a key by its slot (``hash % 65536``), 0 taken as 1 (Pulsar 4)."""
    zero = next(k for k in (f"z{i}".encode() for i in range(1_000_000)) if sticky_key_hash(k) % RANGE_SIZE == 0)
    for selector in (HashRangeAutoSplitSelector(), HashRangeExclusiveSelector()):
        assert selector.key_hash(zero) == 1
        assert selector.key_hash(b"key-1") == sticky_key_hash(b"key-1") % RANGE_SIZE
    ring = ConsistentHashingSelector(10)
    assert ring.key_hash(b"key-1") == sticky_key_hash(b"key-1")  # 3.x ring: the whole 31-bit hash
