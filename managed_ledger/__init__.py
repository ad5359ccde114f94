"""Managed ledger: a topic's ordered list of ledgers, with cursors, rollover, trimming and an entry cache."""
