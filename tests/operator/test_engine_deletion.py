"""Deletion and error hardening of the engine against a real ``magnetar standalone`` (Kubernetes faked as in
:mod:`tests.operator.test_engine`): a live topic is not deleted, a rename hands the topic over, deletions
waiting on an unreachable cluster are bounded, credential and authorization problems become status, and
inline admin URLs can be refused."""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import AsyncIterator
from typing import Any

import aiohttp.web
import pytest

from magnetar.operator import reconcile as rc
from magnetar.operator.engine import CredentialsUnreadable, Engine
from tests.conftest import StandaloneProcess, _quiet_logger
from tests.operator.test_engine import FakeEnv, _admin, _name


@pytest.fixture
async def env(standalone: StandaloneProcess) -> AsyncIterator[FakeEnv]:
    fake = FakeEnv(standalone.http_url)
    yield fake
    await fake.close()


async def _topic(env: FakeEnv, engine: Engine, name: str = "t", **spec: Any) -> tuple[Any, str]:
    tenant = _name("ten")
    assert (await engine.reconcile(env.add("Tenant", tenant, {}))).ready
    assert (await engine.reconcile(env.add("TopicNamespace", "ns", {"tenant": tenant, "name": "ns"}))).ready
    res = env.add("Topic", name, {"namespace": f"{tenant}/ns", "name": "orders", **spec})
    outcome = await engine.reconcile(res)
    assert outcome.ready, outcome.message
    res.status = outcome.status
    return res, f"persistent://{tenant}/ns/orders"


def _deleting(res: Any, ago: float = 0.0) -> None:
    import datetime

    when = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=ago)
    res.deleting, res.deleted_at = True, rc.now_iso(when)


async def test_live_topic_is_kept_until_idle_or_forced(env: FakeEnv, standalone: StandaloneProcess) -> None:
    import pulsar

    engine = Engine(env)
    res, topic = await _topic(env, engine)
    _deleting(res)
    client = pulsar.Client(standalone.service_url, operation_timeout_seconds=10, logger=_quiet_logger())
    try:
        producer = client.create_producer(topic)
        outcome = await engine.finalize(res)
        assert (outcome.severity, outcome.reason) == ("transient", rc.TOPIC_IN_USE)
        assert "1 producers" in outcome.message and "force-delete" in outcome.message
        consumer = client.subscribe(topic, "audit")
        for i in range(3):
            producer.send(f"m{i}".encode())
        producer.close()
        consumer.close()
        # No client left, but the subscription has 3 unconsumed messages: still kept.
        outcome = await engine.finalize(res)
        assert outcome.reason == rc.TOPIC_IN_USE and "3 messages of backlog" in outcome.message
        assert topic.split("/")[-1] in str(_admin(standalone, "GET", f"persistent/{topic[13:].rsplit('/', 1)[0]}"))
        # The force annotation deletes it.
        res.annotations["magnetar.io/force-delete"] = "true"
        outcome = await engine.finalize(res)
        assert outcome.ready and outcome.message == f"deleted {topic}"
    finally:
        client.close()
    assert topic not in _admin(standalone, "GET", f"persistent/{topic[13:].rsplit('/', 1)[0]}")


async def test_idle_topic_is_deleted_without_force(env: FakeEnv, standalone: StandaloneProcess) -> None:
    engine = Engine(env)
    res, topic = await _topic(env, engine, partitions=2)
    _deleting(res)
    outcome = await engine.finalize(res)
    assert outcome.ready and outcome.message == f"deleted {topic}"


async def test_rename_hands_the_topic_over_with_its_messages(env: FakeEnv, standalone: StandaloneProcess) -> None:
    import pulsar

    engine = Engine(env)
    old, topic = await _topic(env, engine, name="orders-v1")
    client = pulsar.Client(standalone.service_url, operation_timeout_seconds=10, logger=_quiet_logger())
    try:
        client.subscribe(topic, "keep").close()
        producer = client.create_producer(topic)
        for i in range(5):
            producer.send(f"m{i}".encode())
        producer.close()
        # Git rename: the new object appears (newer: conflict while the old one lives) ...
        new = env.add("Topic", "orders-v2", dict(old.spec), created="2026-06-01T00:00:00Z")
        assert (await engine.reconcile(new)).reason == rc.RESOURCE_CONFLICT
        # ... and the old one is pruned, even with force-delete set: the topic is handed over, not deleted.
        old.annotations["magnetar.io/force-delete"] = "true"
        _deleting(old)
        outcome = await engine.finalize(old)
        assert (outcome.severity, outcome.reason) == ("ok", rc.HANDED_OVER) and "orders-v2" in outcome.message
        env.resources.remove(old)
        assert (await engine.reconcile(new, "timer")).ready
        consumer = client.subscribe(topic, "keep")
        got = [consumer.receive(timeout_millis=5000).data() for _ in range(5)]
        assert got == [f"m{i}".encode() for i in range(5)]
        consumer.close()
    finally:
        client.close()


async def test_deletion_on_an_unreachable_cluster_is_bounded_then_orphaned(env: FakeEnv) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    env.config = dataclasses.replace(env.config, delete_timeout=120)
    res = env.add("Topic", "t", {"namespace": "a/b"})
    res.spec = {"connection": {"adminUrl": dead}, "namespace": "a/b"}
    res.status["applied"] = {}
    _deleting(res, ago=5)
    outcome = await Engine(env).finalize(res)
    assert (outcome.severity, outcome.reason) == ("transient", rc.CLUSTER_UNREACHABLE)
    assert "released (object orphaned) 120s after" in outcome.message
    _deleting(res, ago=121)
    outcome = await Engine(env).finalize(res)
    assert (outcome.severity, outcome.reason) == ("ok", rc.ORPHANED)
    assert "orphaned" in outcome.message and rc.CLUSTER_UNREACHABLE in outcome.message


async def test_unreadable_secret_becomes_status(env: FakeEnv, standalone: StandaloneProcess) -> None:
    env.secrets[("default", "tok", "token")] = CredentialsUnreadable("Secret default/tok cannot be read: HTTP 403")
    res = env.add("Tenant", _name("ten"), {})
    res.spec = {"connection": {"adminUrl": standalone.http_url, "credentialsSecretRef": {"name": "tok"}}}
    outcome = await Engine(env).reconcile(res)
    assert (outcome.severity, outcome.reason) == ("transient", rc.CREDENTIALS_UNREADABLE)
    assert "403" in outcome.message


@pytest.fixture
async def refusing_admin() -> AsyncIterator[str]:
    """An admin endpoint that refuses every token (401), as a broker with authentication would."""

    async def refuse(_: aiohttp.web.Request) -> aiohttp.web.Response:
        return aiohttp.web.json_response({"reason": "Authentication required"}, status=401)

    app = aiohttp.web.Application()
    app.router.add_route("*", "/{tail:.*}", refuse)
    runner = aiohttp.web.AppRunner(app)
    await runner.setup()
    site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()


async def test_broker_401_is_retried_status(env: FakeEnv, refusing_admin: str) -> None:
    res = env.add("Tenant", _name("ten"), {})
    res.spec = {"connection": {"adminUrl": refusing_admin}}
    outcome = await Engine(env).reconcile(res)
    assert (outcome.severity, outcome.reason) == ("transient", rc.UNAUTHORIZED)
    assert "Authentication required" in outcome.message


async def test_inline_admin_url_can_be_disabled_or_allow_listed(env: FakeEnv, standalone: StandaloneProcess) -> None:
    res = env.add("Tenant", _name("ten"), {})
    res.spec = {"connection": {"adminUrl": "http://169.254.169.254/latest"}}
    env.config = dataclasses.replace(env.config, allow_inline_admin_url=False)
    outcome = await Engine(env).reconcile(res)
    assert (outcome.severity, outcome.reason) == ("permanent", rc.CONNECTION_NOT_ALLOWED)
    assert "use clusterRef" in outcome.message
    env.config = dataclasses.replace(
        env.config, allow_inline_admin_url=True, admin_url_allowlist=("http://127.0.0.1:",)
    )
    outcome = await Engine(env).reconcile(res)
    assert outcome.reason == rc.CONNECTION_NOT_ALLOWED and "allow-list" in outcome.message
    _deleting(res)
    assert (await Engine(env).finalize(res)).ready  # nothing called on a refused URL
    res.spec = {"connection": {"adminUrl": standalone.http_url}}
    res.deleting = False
    assert (await Engine(env).reconcile(res)).ready
