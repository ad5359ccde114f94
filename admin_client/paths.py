"""Admin REST API v2 paths: ``/admin/v2/...`` with each name URL-encoded as one path segment."""

from __future__ import annotations

from urllib.parse import quote

from magnetar.broker.topic_name import TopicName

API = "/admin/v2"


def segment(value: str) -> str:
    """One URL path segment (``/`` and every other reserved character encoded)."""
    return quote(value, safe="")


def api_path(*segments: str) -> str:
    """``/admin/v2/{a}/{b}...`` with each part encoded as one segment."""
    return "/".join((API, *(segment(s) for s in segments)))


def parse_topic(name: str) -> TopicName:
    """A full or short topic name as Pulsar clients accept it; a bad one raises :class:`ValueError`."""
    try:
        return TopicName.parse(name)
    except Exception as exc:
        from magnetar.broker.errors import InvalidTopicNameError  # only now: it loads the protobuf classes

        if not isinstance(exc, InvalidTopicNameError):
            raise
        raise ValueError(str(exc)) from None


def topic_path(topic: TopicName) -> str:
    """``/admin/v2/{persistent|non-persistent}/{tenant}/{namespace}/{topic}``."""
    return api_path(topic.domain, topic.tenant, topic.namespace_portion, topic.local_name)


def subscription_path(topic: TopicName, subscription: str) -> str:
    return f"{topic_path(topic)}/subscription/{segment(subscription)}"


def namespace_path(tenant: str, namespace: str) -> str:
    """``/admin/v2/namespaces/{tenant}/{namespace}``."""
    return api_path("namespaces", tenant, namespace)
