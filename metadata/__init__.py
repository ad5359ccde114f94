"""Metadata store: versioned keys with compare-and-swap, children listing, watches and sessions.

Standalone uses the embedded durable store; a cluster uses etcd behind the same interface.
"""

from __future__ import annotations

from urllib.parse import unquote, urlparse

from magnetar.metadata.api import MetadataStore


def open_metadata_store(url: str, **kwargs: object) -> MetadataStore:
    """Build a metadata store from a URL.

    ``embedded:///abs/path/metadata.db`` opens (creating) a durable embedded store;
    ``memory:`` an in-memory one (tests). Extra keyword arguments go to the store's constructor.
    The store opens its database on its own worker thread; ``await store.start()`` surfaces errors early.
    """
    from magnetar.metadata.embedded import EmbeddedMetadataStore

    if url in ("memory:", "memory://", ":memory:"):
        return EmbeddedMetadataStore(":memory:", **kwargs)  # type: ignore[arg-type]
    parsed = urlparse(url)
    if parsed.scheme == "embedded":
        if parsed.netloc not in ("", "localhost"):
            raise ValueError(f"embedded metadata URL must be embedded:///absolute/path, got {url!r}")
        path = unquote(parsed.path)
        if not path.startswith("/"):
            raise ValueError(f"embedded metadata URL needs an absolute path, got {url!r}")
        return EmbeddedMetadataStore(path, **kwargs)  # type: ignore[arg-type]
    raise ValueError(f"unsupported metadata store URL {url!r}")


__all__ = ["MetadataStore", "open_metadata_store"]
