"""Per-namespace system topics (Pulsar's ``SystemTopicNames``) and the one this broker writes.

``__change_events`` receives an event for every topic-policy change (``systemTopicEnabled``), keyed
by the topic's name, so a reader (or a compacted reader: one event per topic) can follow them.
Magnetar keeps the policies themselves in the metadata store; the event carries the policies now in
force as JSON (Pulsar writes Avro ``PulsarEvent`` records): ``{"eventType": "TOPIC_POLICY",
"actionType": "UPDATE", "topicPoliciesEvent": {"tenant", "namespace", "topic", "policies"}}``.
Removing a topic's last policy writes a tombstone (empty ``null_value`` message) for its key.

System topics are left out of topic listings unless asked for (``includeSystemTopic``), never
match a subscription pattern, and cannot be created through the admin API (400, as Pulsar).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import TYPE_CHECKING

from magnetar.broker.errors import NotAllowedError
from magnetar.broker.protocol import pulsar_api_pb2 as pb
from magnetar.broker.protocol.frames import build_entry
from magnetar.broker.topic_name import TopicName
from magnetar.common.tasks import TaskSet

if TYPE_CHECKING:
    from magnetar.broker.service import BrokerService

log = logging.getLogger(__name__)

CHANGE_EVENTS = "__change_events"
#: Local names of Pulsar's per-namespace system topics.
SYSTEM_TOPIC_NAMES = frozenset(
    {
        CHANGE_EVENTS,
        "__transaction_buffer_snapshot",
        "__transaction_buffer_snapshot_segments",
        "__transaction_buffer_snapshot_indexes",
    }
)
#: Suffixes of per-topic system topics (transaction pending-ack stores).
_SYSTEM_SUFFIXES = ("-__transaction_pending_ack",)
_PRODUCER = "magnetar-system-topic"


def is_system_topic(topic: str | TopicName) -> bool:
    """Whether ``topic`` (a full name, partitions included) is a system topic."""
    local = str(topic).rsplit("/", 1)[-1]
    base = local.split("-partition-", 1)[0]
    return base in SYSTEM_TOPIC_NAMES or base.endswith(_SYSTEM_SUFFIXES)


def without_system_topics(topics: list[str]) -> list[str]:
    return [t for t in topics if not is_system_topic(t)]


def check_user_creatable(topic: TopicName) -> None:
    """Refuse creating a system topic through the admin API (Pulsar's 400)."""
    if is_system_topic(topic):
        raise NotAllowedError("Cannot create topic in system topic format!", http_status=400)


class ChangeEvents:
    """Writes topic-policy change events to each namespace's ``__change_events`` topic."""

    def __init__(self, service: BrokerService) -> None:
        self.service = service
        self.tasks = TaskSet("change events", logger=log)
        self._sequence = 0
        #: One event at a time, in notification order, so a topic's last event is its current state.
        self._lock = asyncio.Lock()
        if service.config.system_topic_enabled:
            service.policies.add_listener(self._on_policies_changed)

    def _on_policies_changed(self, name: str) -> None:
        if "://" not in name or is_system_topic(name):
            return  # a namespace's policies, or a system topic's own
        self.tasks.spawn(self.publish(TopicName.parse(name)), name=f"change event {name}")

    async def publish(self, topic: TopicName) -> None:
        """Append the current topic policies of ``topic`` (a tombstone when it has none)."""
        async with self._lock:
            await self._publish(topic.partitioned_base)

    async def _publish(self, base: TopicName) -> None:
        policies = await self.service.policies.topic(base)
        system = TopicName.parse(f"persistent://{base.namespace}/{CHANGE_EVENTS}")
        target = await self.service.get_topic(system, create=True, explicit=True)
        self._sequence += 1
        meta = pb.MessageMetadata(
            producer_name=_PRODUCER,
            sequence_id=self._sequence,
            publish_time=int(time.time() * 1000),
            partition_key=str(base),
        )
        if policies is None or policies.is_empty():
            meta.null_value = True
            payload = b""
        else:
            event = {
                "eventType": "TOPIC_POLICY",
                "actionType": "UPDATE",
                "topicPoliciesEvent": {
                    "tenant": base.tenant,
                    "namespace": base.namespace_portion,
                    "topic": base.persistence_name.rsplit("/", 1)[-1],
                    "policies": policies.to_json(),
                },
            }
            payload = json.dumps(event, separators=(",", ":")).encode()
        await target.ledger.add_entry(build_entry(meta, payload))
        for sub in target.subscriptions.values():
            sub.wakeup()

    async def close(self) -> None:
        await self.tasks.close()
