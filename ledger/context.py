"""What a ledger client and its handles share: settings, metadata access, bookies, placement."""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

from .ledger_manager import LedgerManager
from .placement import EnsemblePlacement
from .registry import BookieRegistry


@dataclass(frozen=True, slots=True)
class LedgerClientConfig:
    """Settings of :class:`~magnetar.ledger.client.BookieLedgerClient`."""

    #: Metadata root (ledger ``n`` lives at ``<root>/L%010d``).
    ledgers_root: str = "/ledgers"
    #: Ledger ids reserved per metadata compare-and-swap.
    id_block_size: int = 1000
    #: An add not acknowledged by an ack quorum within this time fails the write handle.
    add_timeout_s: float = 30.0
    #: Bound of one read request to one bookie.
    read_timeout_s: float = 30.0
    #: Bound of fence / last-add-confirmed / delete requests to one bookie.
    bookie_op_timeout_s: float = 10.0
    #: Entries asked of one bookie in one read request.
    read_batch_entries: int = 256
    #: Entries past the LAC a recovery reads in parallel per round (reads past the end are wasted).
    recovery_read_window: int = 32
    #: Compare-and-swap retries before a metadata update gives up.
    metadata_retries: int = 10


@dataclass(slots=True)
class LedgerContext:
    """What handles share with their client."""

    manager: LedgerManager
    registry: BookieRegistry
    config: LedgerClientConfig
    placement: EnsemblePlacement = field(default_factory=EnsemblePlacement)
    #: Open write handles per bookie address (placement prefers the least used).
    usage: collections.Counter[str] = field(default_factory=collections.Counter)
