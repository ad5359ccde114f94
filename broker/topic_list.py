"""Topic lists for pattern subscriptions: matching, hashing, and watchers (PIP-145).

Every place that matches a client's topics pattern goes through :func:`compile_topics_pattern` and
:meth:`TopicsPattern.matches`, so the regex engine is chosen in one place. As in Pulsar's ``TopicList``,
the pattern is matched (whole-string) against the topic's name without its domain scheme and without a
``-partition-N`` suffix, and a list's hash is CRC32C of the sorted names joined by ``,``.

Patterns are compiled with RE2 (``google-re2``), whose matching time is linear in the subject's length:
a client's pattern such as ``^(.+)+#$`` cannot make the event loop backtrack for hours. Pulsar takes Java
regex syntax; RE2 accepts most of it but not backreferences, lookaround, possessive quantifiers or atomic
groups. Such a pattern is refused with a clear error rather than evaluated by a backtracking engine.

A :class:`TopicListWatcher` (WATCH_TOPIC_LIST) keeps the matching persistent topics of one namespace
and sends WATCH_TOPIC_UPDATE when a matching topic is created or deleted. :class:`TopicListService`
(one per broker) feeds watchers from the metadata store: one watch per namespace that has watchers, on
the managed-ledger records, so topics created or deleted by any broker of the cluster are seen.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from urllib.parse import unquote

import re2
from crc32c import crc32c

from magnetar.broker.errors import BrokerError
from magnetar.broker.protocol import pulsar_api_pb2 as pb
from magnetar.broker.system_topics import is_system_topic
from magnetar.broker.topic_name import TopicName
from magnetar.metadata.api import MetadataStore, Notification, NotificationType

log = logging.getLogger(__name__)

_MANAGED_LEDGERS = "/managed-ledgers"
_SCHEME = "://"
#: What a WATCH_TOPIC_LIST without a pattern watches (Pulsar's ``TopicList.ALL_TOPICS_PATTERN``).
ALL_TOPICS_PATTERN = ".*"
#: Memory RE2 may use for one compiled pattern (its DFA cache): bounds what one client's pattern costs.
_RE2_MAX_MEM = 1 << 20


def _re2_options() -> re2.Options:
    options = re2.Options()
    options.max_mem = _RE2_MAX_MEM
    options.log_errors = False  # a client's bad pattern is answered, not logged by the C++ library
    return options


_OPTIONS = _re2_options()


class TopicsPattern:
    """A client's topics pattern, compiled once."""

    __slots__ = ("_regex", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        try:
            self._regex = re2.compile(_remove_domain_scheme(text), _OPTIONS)
        except re2.error as exc:
            reason = exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) else exc
            raise BrokerError(
                f"Invalid topics pattern {text!r} (RE2 syntax: no backreferences or lookaround): {reason}",
                pb.UnknownError,
            ) from exc
        except ValueError as exc:
            raise BrokerError(f"Invalid topics pattern {text!r}: {exc}", pb.UnknownError) from exc

    def matches(self, topic: str) -> bool:
        """Whether the full topic name ``topic`` (a partition counts as its partitioned topic) matches."""
        base = _partitioned_name(topic)
        if is_system_topic(base):
            return False  # as Pulsar: system topics never match a subscription pattern
        _, sep, rest = base.partition(_SCHEME)
        return self._regex.fullmatch(rest if sep else base) is not None


def compile_topics_pattern(text: str) -> TopicsPattern:
    """Compile a client's topics pattern (``BrokerError`` if it is not a valid regex)."""
    return TopicsPattern(text)


def filter_topics(topics: Iterable[str], pattern: TopicsPattern) -> list[str]:
    """The topics of ``topics`` that ``pattern`` matches, in their order."""
    return [t for t in topics if pattern.matches(t)]


def topics_hash(topics: Iterable[str]) -> str:
    """Pulsar's ``TopicList.calculateHash``: CRC32C of the sorted names joined by ``,``, as Guava prints it
    (the four little-endian bytes in hex)."""
    value = crc32c(",".join(sorted(topics)).encode())
    return value.to_bytes(4, "little").hex()


def _remove_domain_scheme(pattern: str) -> str:
    """``persistent://t/ns/x.*`` -> ``t/ns/x.*`` (Pulsar's ``TopicList.removeTopicDomainScheme``)."""
    prefix, sep, rest = pattern.partition(_SCHEME)
    if not sep:
        return pattern
    for domain in ("non-persistent", "persistent"):
        if prefix.endswith(domain):
            return prefix[: -len(domain)] + rest
    raise ValueError(f"Does not support topic domain: {prefix}")


def _partitioned_name(topic: str) -> str:
    base, sep, index = topic.rpartition("-partition-")
    return base if sep and index.isdigit() else topic


class TopicListWatcher:
    """One client's watch of a namespace's persistent topics matching a pattern."""

    def __init__(
        self,
        watcher_id: int,
        namespace: str,
        pattern: TopicsPattern,
        send_update: Callable[[int, list[str], list[str], str], None],
    ) -> None:
        self.watcher_id = watcher_id
        self.namespace = namespace
        self.pattern = pattern
        self._send_update = send_update
        self.matching: set[str] = set()
        self._pending: list[tuple[str, bool]] | None = []  # changes seen before the initial listing
        self.closed = False

    @property
    def started(self) -> bool:
        """Whether the initial list is in (WATCH_TOPIC_LIST_SUCCESS sent)."""
        return self._pending is None

    def start(self, topics: Iterable[str]) -> None:
        """Set the initial list; changes seen while it was read are applied (and reported) after it."""
        self.matching = set(filter_topics(topics, self.pattern))
        pending, self._pending = self._pending or [], None
        for topic, created in pending:
            self.on_topic_change(topic, created)

    def on_topic_change(self, topic: str, created: bool) -> None:
        """A persistent topic of the namespace was created (or deleted): tell the client if it matches."""
        if self.closed or not self.pattern.matches(topic):
            return
        if self._pending is not None:
            self._pending.append((topic, created))
            return
        if created == (topic in self.matching):
            return  # already known (e.g. listed and notified both)
        if created:
            self.matching.add(topic)
        else:
            self.matching.discard(topic)
        new, deleted = ([topic], []) if created else ([], [topic])
        self._send_update(self.watcher_id, new, deleted, topics_hash(self.matching))


class TopicListService:
    """Routes topic creations and deletions, as the metadata store reports them, to the watchers of
    their namespace. One store watch per namespace, held while that namespace has watchers."""

    def __init__(self, store: MetadataStore) -> None:
        self._store = store
        self._watchers: dict[str, set[TopicListWatcher]] = {}
        self._unwatch: dict[str, Callable[[], None]] = {}

    def add(self, watcher: TopicListWatcher) -> None:
        """Start delivering changes to ``watcher`` (before its initial listing, so none is missed)."""
        ns = watcher.namespace
        if ns not in self._watchers:
            prefix = f"{_MANAGED_LEDGERS}/{ns}/persistent/"
            self._unwatch[ns] = self._store.watch(prefix, lambda note: self._on_change(ns, prefix, note))
            self._watchers[ns] = set()
        self._watchers[ns].add(watcher)

    def remove(self, watcher: TopicListWatcher) -> None:
        """Stop delivering to ``watcher``; the namespace's store watch ends with its last watcher."""
        watcher.closed = True
        ns = watcher.namespace
        group = self._watchers.get(ns)
        if group is None:
            return
        group.discard(watcher)
        if not group:
            del self._watchers[ns]
            self._unwatch.pop(ns)()

    def watcher_count(self) -> int:
        return sum(len(g) for g in self._watchers.values())

    def close(self) -> None:
        for unwatch in self._unwatch.values():
            unwatch()
        self._unwatch.clear()
        self._watchers.clear()

    def _on_change(self, namespace: str, prefix: str, note: Notification) -> None:
        if note.type is NotificationType.MODIFIED:
            return
        local = note.path[len(prefix) :]
        if not local or "/" in local:
            return  # a cursor of the topic, not the topic
        topic = str(TopicName.parse(f"persistent://{namespace}/{unquote(local)}"))
        created = note.type is NotificationType.CREATED
        for watcher in list(self._watchers.get(namespace, ())):
            try:
                watcher.on_topic_change(topic, created)
            except Exception:
                log.exception("topic list watcher %d failed on %s", watcher.watcher_id, topic)
