"""Ensemble placement: which bookies a new ledger (or a replacement) goes to."""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping

from .api import NotEnoughBookiesError


class EnsemblePlacement:
    """Least-used first (by open ledgers of this client), random among equals."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()

    def choose(
        self, candidates: Iterable[str], size: int, usage: Mapping[str, int], exclude: Iterable[str] = ()
    ) -> list[str]:
        """``size`` distinct bookies out of ``candidates`` minus ``exclude``."""
        excluded = set(exclude)
        pool = [c for c in dict.fromkeys(candidates) if c not in excluded]
        if len(pool) < size:
            raise NotEnoughBookiesError(f"need {size} writable bookies, have {len(pool)}")
        self._rng.shuffle(pool)
        pool.sort(key=lambda a: usage.get(a, 0))  # stable: shuffled order breaks ties
        return pool[:size]

    def replacement(self, candidates: Iterable[str], ensemble: list[str], usage: Mapping[str, int]) -> str:
        """A bookie to take a failed member's place (for ensemble changes)."""
        return self.choose(candidates, 1, usage, exclude=ensemble)[0]
