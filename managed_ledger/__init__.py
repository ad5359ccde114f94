"""Managed ledger: a topic's ordered list of ledgers, with cursors, rollover, trimming and an entry cache.

Standalone builds one :class:`~magnetar.managed_ledger.factory.ManagedLedgerFactoryImpl` from the
metadata store and the ledger client; the broker only uses the interfaces in ``api``.
"""
