"""Ledger metadata encoding, write sets, fencing quorum arithmetic, entry framing, placement."""

from __future__ import annotations

import random

import pytest

from magnetar.ledger import digest
from magnetar.ledger.api import NotEnoughBookiesError
from magnetar.ledger.errors import DigestError
from magnetar.ledger.metadata import LedgerMetadata, LedgerState
from magnetar.ledger.placement import EnsemblePlacement
from magnetar.ledger.recovery import fenced_enough


def test_metadata_json_round_trip() -> None:
    md = LedgerMetadata(
        ensemble_size=3,
        write_quorum=2,
        ack_quorum=2,
        ensembles=[(0, ["a", "b", "c"]), (100, ["a", "d", "c"])],
        state=LedgerState.CLOSED,
        last_entry_id=150,
        length=12345,
        password=b"\x00secret",
        custom_metadata={"application": b"pulsar", "bin": b"\xff\x00"},
        ctime_ms=1700000000000,
    )
    assert LedgerMetadata.from_bytes(md.to_bytes()) == md
    assert b'"state":"CLOSED"' in md.to_bytes()


def test_write_sets_follow_fragments() -> None:
    md = LedgerMetadata(3, 2, 2, [(0, ["a", "b", "c"]), (10, ["a", "d", "c"])])
    assert md.write_set(0) == ["a", "b"]
    assert md.write_set(2) == ["c", "a"]
    assert md.write_set(9) == ["a", "b"]
    assert md.write_set(10) == ["d", "c"]
    assert md.all_bookies() == {"a", "b", "c", "d"}


def test_invalid_quorums_rejected() -> None:
    with pytest.raises(ValueError):
        LedgerMetadata(2, 3, 1, [(0, ["a", "b"])])
    with pytest.raises(ValueError):
        LedgerMetadata(3, 2, 2, [(0, ["a", "b"])])


def test_fenced_enough() -> None:
    # E=3, Qw=2, Qa=2: one fenced bookie per write set is enough -> any two bookies.
    assert fenced_enough(3, 2, 2, {0, 1})
    assert not fenced_enough(3, 2, 2, {0})
    # E=3, Qw=3, Qa=2: need two fenced members in the (single) write set.
    assert fenced_enough(3, 3, 2, {0, 2})
    assert not fenced_enough(3, 3, 2, {1})
    # E=5, Qw=3, Qa=2: every window of 3 needs two fenced members.
    assert fenced_enough(5, 3, 2, {0, 1, 2, 3}) and not fenced_enough(5, 3, 2, {0, 3})


def test_digest_detects_damage_and_misplacement() -> None:
    stored = digest.frame(7, 3, 100, b"hello")
    assert digest.unframe(7, 3, stored) == (b"hello", 100)
    with pytest.raises(DigestError):
        digest.unframe(7, 4, stored)  # served for the wrong entry
    with pytest.raises(DigestError):
        digest.unframe(7, 3, stored[:-1] + b"X")
    with pytest.raises(DigestError):
        digest.unframe(7, 3, b"short")
    assert digest.master_key(b"a") != digest.master_key(b"b")


def test_placement_least_used_random_ties() -> None:
    p = EnsemblePlacement(random.Random(1))
    assert sorted(p.choose(["a", "b", "c", "d"], 2, {"a": 3, "b": 0, "c": 0, "d": 5})) == ["b", "c"]
    picks = {tuple(p.choose(["a", "b", "c"], 1, {})) for _ in range(50)}
    assert len(picks) == 3
    with pytest.raises(NotEnoughBookiesError):
        p.choose(["a", "b"], 3, {})
    assert p.replacement(["a", "b", "c"], ["a", "b"], {}) == "c"
