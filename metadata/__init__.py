"""Metadata store: versioned keys with compare-and-swap, children listing, watches and sessions.

Standalone uses the embedded durable store; a cluster uses etcd behind the same interface.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote, urlparse

from magnetar.metadata.api import MetadataStore


def open_metadata_store(url: str, **kwargs: Any) -> MetadataStore:
    """Build a metadata store from a URL.

    ``embedded:///abs/path/metadata.db`` opens (creating) a durable embedded store;
    ``memory:`` an in-memory one (tests); ``etcd://host:port[,host:port...][?prefix=/root&timeout=5]``
    an etcd-backed one (paths stored under ``prefix``, default ``/magnetar``; ``timeout`` bounds each
    call, in seconds; ``tls=true`` and ``tlsTrustCertsFilePath``/``tlsCertificateFilePath``/``tlsKeyFilePath``
    connect with TLS, see metadata/etcd_transport.py). Extra keyword arguments go to the store's constructor.
    The store opens its database on its own worker thread; ``await store.start()`` surfaces errors early.
    """
    from magnetar.metadata.embedded import EmbeddedMetadataStore

    if url in ("memory:", "memory://", ":memory:"):
        return EmbeddedMetadataStore(":memory:", **kwargs)
    parsed = urlparse(url)
    if parsed.scheme == "embedded":
        if parsed.netloc not in ("", "localhost"):
            raise ValueError(f"embedded metadata URL must be embedded:///absolute/path, got {url!r}")
        path = unquote(parsed.path)
        if not path.startswith("/"):
            raise ValueError(f"embedded metadata URL needs an absolute path, got {url!r}")
        return EmbeddedMetadataStore(path, **kwargs)
    if parsed.scheme == "etcd":
        from magnetar.metadata.etcd import EtcdMetadataStore, parse_etcd_url

        spec = parse_etcd_url(url)
        options: dict[str, Any] = {"prefix": spec.prefix}
        if spec.timeout is not None:
            options["op_timeout_seconds"] = spec.timeout
        if spec.tls is not None:
            options["tls"] = spec.tls
        options.update(kwargs)
        return EtcdMetadataStore(list(spec.endpoints), **options)
    raise ValueError(f"unsupported metadata store URL {url!r}")


__all__ = ["MetadataStore", "open_metadata_store"]
