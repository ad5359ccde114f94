"""Namespace bundles: slices of a namespace's topic-name hash range, the unit of broker ownership.

As Pulsar's ``NamespaceBundleFactory``: a topic's hash is the CRC-32 of its full name
(``persistent://tenant/ns/topic[-partition-N]``, UTF-8) as an unsigned 32-bit number; a
namespace's ``bundles.boundaries`` policy (``0x00000000`` ... ``0xffffffff``) cuts the range into
bundles named ``0x00000000_0x40000000``; every bundle is ``[lower, upper)`` except the last, which
includes ``0xffffffff``.
"""

from __future__ import annotations

import itertools
import zlib
from dataclasses import dataclass

FIRST_BOUNDARY = 0x00000000
LAST_BOUNDARY = 0xFFFFFFFF


def topic_hash(topic: str) -> int:
    """Pulsar's bundle hash of a full topic name (Guava ``crc32().hashString(name, UTF_8).padToLong()``)."""
    return zlib.crc32(topic.encode()) & 0xFFFFFFFF


@dataclass(frozen=True, slots=True)
class Bundle:
    """One hash range of a namespace."""

    namespace: str
    lower: int
    upper: int

    @property
    def range(self) -> str:
        """Pulsar's bundle name, ``0x00000000_0x40000000``."""
        return f"0x{self.lower:08x}_0x{self.upper:08x}"

    @property
    def key(self) -> str:
        """``tenant/ns/0x..._0x...`` (Pulsar's ``NamespaceBundle.toString``)."""
        return f"{self.namespace}/{self.range}"

    def contains(self, hash_value: int) -> bool:
        if self.upper == LAST_BOUNDARY:
            return self.lower <= hash_value <= self.upper
        return self.lower <= hash_value < self.upper

    @classmethod
    def parse(cls, namespace: str, bundle_range: str) -> Bundle:
        """``0x00000000_0x40000000`` -> bundle; ``ValueError`` when malformed."""
        lower_text, sep, upper_text = bundle_range.partition("_")
        if not sep:
            raise ValueError(f"Invalid bundle range: {bundle_range}")
        lower, upper = int(lower_text, 16), int(upper_text, 16)
        if not FIRST_BOUNDARY <= lower < upper <= LAST_BOUNDARY:
            raise ValueError(f"Invalid bundle range: {bundle_range}")
        return cls(namespace, lower, upper)


def bundles_of(namespace: str, boundaries: list[str] | None) -> list[Bundle]:
    """The bundles a ``bundles.boundaries`` policy describes (no policy: one full bundle)."""
    points = sorted(int(b, 16) for b in boundaries) if boundaries else [FIRST_BOUNDARY, LAST_BOUNDARY]
    return [Bundle(namespace, lo, hi) for lo, hi in itertools.pairwise(points)]


def find_bundle(bundles: list[Bundle], topic: str) -> Bundle:
    """The bundle serving ``topic`` (full name)."""
    h = topic_hash(topic)
    for bundle in bundles:
        if bundle.contains(h):
            return bundle
    raise ValueError(f"no bundle of {bundles[0].namespace if bundles else '?'} covers hash {h:#x}")


def split_boundaries(boundaries: list[str] | None, bundle: Bundle, pieces: int = 2, at: int | None = None) -> list[str]:
    """Boundaries after splitting ``bundle`` into ``pieces`` equal ranges (or two at ``at``), as Pulsar's
    ``range_equally_divide`` / ``specified_positions_divide`` algorithms."""
    points = sorted(int(b, 16) for b in boundaries) if boundaries else [FIRST_BOUNDARY, LAST_BOUNDARY]
    if bundle.lower not in points or bundle.upper not in points:
        raise ValueError(f"bundle {bundle.range} is not a bundle of {bundle.namespace}")
    if bundle.upper - bundle.lower <= 1:
        raise ValueError(f"{bundle.key} bundle can't be split further")
    if at is not None:
        if not bundle.lower < at < bundle.upper:
            raise ValueError(f"The given fixed key must between the key range of the {bundle.key} bundle")
        new = [at]
    else:
        size = (bundle.upper - bundle.lower) // pieces
        new = [bundle.lower + size * i for i in range(1, pieces)]
    return [f"0x{p:08x}" for p in sorted({*points, *new})]
