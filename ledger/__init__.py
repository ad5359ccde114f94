"""Ledger client: BookKeeper-style ledgers striped over bookies, with metadata in the metadata store."""
