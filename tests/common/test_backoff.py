"""Backoff: doubling delays, capped, jittered down by at most 10%, reset on success."""

from __future__ import annotations

import pytest

from magnetar.common.backoff import Backoff


def test_doubles_up_to_the_cap_with_bounded_jitter() -> None:
    b = Backoff(1.0, 8.0)
    nominal = [1, 2, 4, 8, 8, 8]
    for want in nominal:
        got = b.next()
        assert want * 0.9 <= got <= want
        assert got >= 1.0


def test_reset_starts_over() -> None:
    b = Backoff(0.5, 60)
    for _ in range(5):
        b.next()
    b.reset()
    assert 0.5 <= b.next() <= 0.5


def test_never_below_initial() -> None:
    b = Backoff(15.0, 60.0)
    assert all(b.next() >= 15.0 for _ in range(20))


def test_max_below_initial_means_fixed_delay() -> None:
    b = Backoff(2.0, 1.0)
    assert [round(b.next(), 6) for _ in range(3)] == [2.0, 2.0, 2.0]


def test_mandatory_stop_shortens_the_overshooting_delay_once() -> None:
    now = [0.0]
    b = Backoff(1.0, 100.0, mandatory_stop=10.0, clock=lambda: now[0])
    assert b.next() == 1.0  # t=0
    now[0] = 1.0
    assert 1.8 <= b.next() <= 2.0
    now[0] = 3.0
    assert 3.6 <= b.next() <= 4.0
    now[0] = 7.0  # 7 + 8 > 10: wait only until t=10
    assert b.next() == pytest.approx(3.0, rel=0.1)
    now[0] = 10.0
    assert 14.4 <= b.next() <= 16.0  # after the stop, plain doubling again


def test_negative_times_refused() -> None:
    with pytest.raises(ValueError):
        Backoff(-1, 1)
