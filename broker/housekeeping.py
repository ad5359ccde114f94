"""Periodic policy enforcement: message TTL, backlog quotas, subscription expiration, inactive topics,
and unloading idle topics (their in-memory state) so memory follows the topics in use.

Each check walks the loaded topics and applies their effective policies (topic > namespace >
broker settings). Intervals are Pulsar's settings; every check is bounded and logs, never raises.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from magnetar.broker.compactor import COMPACTION_SUBSCRIPTION
from magnetar.broker.policies import BacklogQuota, EffectivePolicies
from magnetar.common.tasks import TaskSet

if TYPE_CHECKING:
    from magnetar.broker.service import BrokerService
    from magnetar.broker.topic import PersistentTopic

log = logging.getLogger(__name__)

#: consumer_backlog_eviction trims a backlog down to this share of its quota, as Pulsar does.
EVICTION_TARGET = 0.9


class Housekeeper:
    """Runs the periodic checks of one broker."""

    def __init__(self, service: BrokerService) -> None:
        self.service = service
        self.tasks = TaskSet("housekeeping")

    def start(self) -> None:
        c = self.service.config
        jobs: list[tuple[str, float, Callable[[], Awaitable[None]]]] = [
            ("message-ttl", c.message_expiry_check_interval_in_minutes * 60, self.expire_messages),
            ("subscription-expiry", c.subscription_expiry_check_interval_in_minutes * 60, self.expire_subscriptions),
        ]
        jobs.append(("dedup-purge", 60.0, self.purge_inactive_producers))
        if c.broker_service_compaction_monitor_interval_in_seconds > 0:
            every = c.broker_service_compaction_monitor_interval_in_seconds
            jobs.append(("compaction-threshold", every, self.service.compaction.check_thresholds))
        if c.backlog_quota_check_enabled:
            jobs.append(("backlog-quota", c.backlog_quota_check_interval_in_seconds, self.check_backlog_quotas))
        if c.broker_delete_inactive_topics_enabled:
            jobs.append(
                ("inactive-topics", c.broker_delete_inactive_topics_frequency_seconds, self.delete_inactive_topics)
            )
        if c.broker_unload_inactive_topics_seconds > 0:
            jobs.append(("idle-topics", c.broker_delete_inactive_topics_frequency_seconds, self.unload_idle_topics))
        for name, interval, job in jobs:
            self.tasks.spawn(self._every(name, max(interval, 0.1), job), name=name)

    async def close(self) -> None:
        await self.tasks.close()

    async def _every(self, name: str, interval: float, job: Callable[[], Awaitable[None]]) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                # asyncio.timeout, not wait_for: 3.11's wait_for loses a cancellation that meets the check's end.
                async with asyncio.timeout(max(interval, 30)):
                    await job()
            except Exception:
                log.exception("%s check failed", name)

    async def _topics_with_policies(self) -> list[tuple[PersistentTopic, EffectivePolicies]]:
        out = []
        for topic in self.service.loaded_topics():
            if not topic.closed:
                out.append((topic, await self.service.policies.effective(topic.name)))
        return out

    # ------------------------------------------------------------------ message TTL
    async def expire_messages(self) -> None:
        for topic, eff in await self._topics_with_policies():
            if eff.message_ttl_seconds > 0:
                for name, sub in list(topic.subscriptions.items()):
                    if name != COMPACTION_SUBSCRIPTION:  # as Pulsar: TTL never moves compaction's cursor
                        await sub.expire_older_than(eff.message_ttl_seconds)

    # ------------------------------------------------------------------ backlog quotas
    async def check_backlog_quotas(self) -> None:
        for topic, eff in await self._topics_with_policies():
            await enforce_backlog_quota(topic, eff)

    # ------------------------------------------------------------------ subscription expiration
    async def expire_subscriptions(self) -> None:
        now_ms = time.time() * 1000
        for topic, eff in await self._topics_with_policies():
            minutes = eff.subscription_expiration_minutes
            if minutes <= 0:
                continue
            for name, sub in list(topic.subscriptions.items()):
                idle_since = getattr(sub.cursor, "last_active_ms", now_ms)
                if name == COMPACTION_SUBSCRIPTION:
                    continue  # holds the compacted ledger, not a client's subscription
                if sub.durable and not sub.consumers and now_ms - idle_since > minutes * 60_000:
                    log.info("deleting subscription %s of %s: inactive for over %s minutes", name, topic.name, minutes)
                    await sub.unsubscribe(None, force=True)

    # ------------------------------------------------------------------ deduplication state
    async def purge_inactive_producers(self) -> None:
        """Forget the deduplication state of producers gone longer than the inactivity timeout."""
        for topic in self.service.loaded_topics():
            if topic.dedup.enabled:
                topic.dedup.purge_inactive()

    # ------------------------------------------------------------------ inactive topics
    async def delete_inactive_topics(self) -> None:
        now = time.monotonic()
        for topic, eff in await self._topics_with_policies():
            mode = eff.inactive_topic_delete_mode
            if mode is None or not eff.inactive_topic_delete_while_inactive:
                continue
            if topic.name.partition_index >= 0:
                continue  # partitions live and die with their partitioned topic
            if topic.has_connected_clients() or now - topic.last_active < eff.inactive_topic_max_seconds:
                continue
            if mode == "delete_when_no_subscriptions" and any(s.durable for s in topic.subscriptions.values()):
                continue
            if mode == "delete_when_subscriptions_caught_up" and any(s.backlog() for s in topic.subscriptions.values()):
                continue
            log.info("deleting inactive topic %s (%s)", topic.name, mode)
            try:
                await self.service.delete_topic(topic.name, force=False)
            except Exception as exc:  # a client may have connected meanwhile
                log.info("inactive topic %s not deleted: %s", topic.name, exc)

    # ------------------------------------------------------------------ idle topics
    async def unload_idle_topics(self) -> None:
        """Unload topics with no producer or consumer, idle for ``brokerUnloadInactiveTopicsSeconds``.

        Nothing stored is touched: the next producer, consumer or admin call loads the topic again.
        """
        limit = self.service.config.broker_unload_inactive_topics_seconds
        now = time.monotonic()
        for topic in self.service.loaded_topics():
            if topic.closed or topic.has_connected_clients() or now - topic.last_active < limit:
                continue
            log.debug("unloading idle topic %s", topic.name)
            # Shielded: the check's own time limit must not cut a topic's close short.
            await asyncio.shield(self.service.unload_topic(topic))


async def backlog_age_seconds(topic: PersistentTopic) -> float:
    """Age of the oldest unacknowledged entry over all durable subscriptions (0 when there is none)."""
    ages = [await sub.oldest_unacked_age() for sub in topic.subscriptions.values() if sub.durable]
    return max(ages, default=0.0)


async def quota_exceeded(topic: PersistentTopic, eff: EffectivePolicies) -> BacklogQuota | None:
    """The backlog quota a topic is over, if any (size checked first)."""
    size_quota, time_quota = eff.backlog_quota_size, eff.backlog_quota_time
    if size_quota is not None and (size_quota.limitSize or 0) >= 0:
        backlog = max((s.backlog_size() for s in topic.subscriptions.values() if s.durable), default=0)
        if backlog > (size_quota.limitSize or 0) and (size_quota.limitSize or 0) > 0:
            return size_quota
    if (
        time_quota is not None
        and (time_quota.limitTime or 0) > 0
        and await backlog_age_seconds(topic) > (time_quota.limitTime or 0)
    ):
        return time_quota
    return None


async def enforce_backlog_quota(topic: PersistentTopic, eff: EffectivePolicies) -> None:
    """Apply the topic's backlog quotas: evict old backlog, or hold/refuse producers as configured."""
    quota = await quota_exceeded(topic, eff)
    if quota is None:
        topic.quota_blocked = None
        return
    if quota.policy == "consumer_backlog_eviction":
        topic.quota_blocked = None
        if quota is eff.backlog_quota_time:
            for sub in list(topic.subscriptions.values()):
                await sub.expire_older_than(int(quota.limitTime or 0))
        else:
            target = int((quota.limitSize or 0) * EVICTION_TARGET)
            for sub in list(topic.subscriptions.values()):
                sub.evict_backlog_to(target)
        return
    if topic.quota_blocked != quota.policy:
        log.info("%s is over its backlog quota (%s): producers blocked", topic.name, quota.policy)
        topic.quota_blocked = quota.policy
        topic.disconnect_producers()
