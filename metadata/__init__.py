"""Metadata store: versioned keys with compare-and-swap, children listing, watches and sessions.

Standalone uses the embedded durable store; a cluster uses etcd behind the same interface.
"""
