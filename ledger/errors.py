"""Ledger-client errors beyond those of :mod:`magnetar.ledger.api`."""

from __future__ import annotations

from .api import LedgerError


class LedgerUnauthorizedError(LedgerError):
    """The password given does not match the ledger's."""


class MetadataVersionConflictError(LedgerError):
    """A compare-and-swap of ledger metadata lost against a concurrent update."""


class DigestError(LedgerError):
    """An entry read back from a bookie does not match its checksum (or is another entry)."""
