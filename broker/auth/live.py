"""Permissions of live producers and consumers follow changes, as Pulsar's ``Producer/Consumer
.checkPermissionsAsync`` on a policies update: when a namespace's permissions or a tenant's admin roles
change (on any broker), every producer and consumer of that scope is checked again, and one whose role
lost the right is disconnected (CLOSE_PRODUCER / CLOSE_CONSUMER). The client then reconnects and is refused
with AuthorizationError, so a revoked producer's next sends fail and a revoked consumer gets no more
messages. Nothing is checked per message.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from magnetar.broker.auth.authorization import TopicOperation
from magnetar.broker.errors import AuthorizationError
from magnetar.broker.topic_name import TopicName

if TYPE_CHECKING:
    from magnetar.broker.service import BrokerService

log = logging.getLogger(__name__)


def _in_scope(topic: TopicName, scope: str) -> bool:
    """``scope`` is a tenant or a ``tenant/namespace``."""
    return scope in (topic.tenant, topic.namespace)


class LivePermissions:
    """Re-checks the service's producers and consumers when the authorization service reports a change."""

    def __init__(self, service: BrokerService) -> None:
        self.service = service
        service.authorization.add_listener(self._changed)

    def _changed(self, scope: str) -> None:
        if any(conn.role is not None for conn in self.service.connections):
            self.service.tasks.spawn(self.recheck(scope), name=f"recheck permissions {scope}")

    async def recheck(self, scope: str) -> None:
        """Disconnect the producers and consumers within ``scope`` whose role may no longer use their topic."""
        authz = self.service.authorization
        for conn in list(self.service.connections):
            role = conn.role
            if conn.closed or role is None:
                continue
            for producer in list(conn.producers.values()):
                topic = producer.topic
                if _in_scope(topic.name, scope) and not await authz.allow_topic(
                    topic.name, role, TopicOperation.PRODUCE
                ):
                    log.info("role %s may no longer produce on %s: disconnecting producer", role, topic.name)
                    producer.disconnect()
                    topic.remove_producer(producer)
            for consumer in list(conn.consumers.values()):
                sub = consumer.subscription
                if not _in_scope(sub.topic.name, scope):
                    continue
                try:
                    allowed = await authz.allow_topic(sub.topic.name, role, TopicOperation.CONSUME, sub.name)
                except AuthorizationError:  # e.g. the namespace turned to the Prefix subscription auth mode
                    allowed = False
                if not allowed:
                    log.info("role %s may no longer consume %s/%s: disconnecting consumer", role, sub.topic.name,
                             sub.name)  # fmt: skip
                    consumer.disconnect()
                    await sub.remove_consumer(consumer)
