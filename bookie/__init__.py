"""Bookie: durable entry storage (journal with group-committed fdatasync, entry log and index)."""
