"""Hostile clients (issue 13): one frame, message or disconnect must not freeze the broker, block a
subscription, or corrupt a topic; every other client keeps working."""

from __future__ import annotations

import time

import pulsar

from magnetar.broker.protocol import pulsar_api_pb2 as pb
from tests.conftest import StandaloneProcess, _quiet_logger
from tests.rawclient import RawClient

T = pb.BaseCommand


def _topics_of_namespace(raw: RawClient, pattern: str, request_id: int = 3) -> T:
    cmd = T(type=T.GET_TOPICS_OF_NAMESPACE)
    r = cmd.getTopicsOfNamespace
    r.request_id, r.namespace, r.topics_pattern = request_id, "public/default", pattern
    raw.send(cmd)
    return raw.recv_until_any({T.GET_TOPICS_OF_NAMESPACE_RESPONSE, T.ERROR})


# ---------------------------------------------------------------- 4: regex denial of service
def test_catastrophic_pattern_does_not_freeze_broker(fresh_standalone: StandaloneProcess) -> None:
    fresh_standalone.start()
    client = pulsar.Client(fresh_standalone.service_url, operation_timeout_seconds=10, logger=_quiet_logger())
    try:
        long_name = "persistent://public/default/" + "a" * 40
        client.create_producer(long_name).close()
    finally:
        client.close()
    evil = RawClient(fresh_standalone.port)
    evil.connect()
    cmd = T(type=T.GET_TOPICS_OF_NAMESPACE)
    r = cmd.getTopicsOfNamespace
    r.request_id, r.namespace, r.topics_pattern = 3, "public/default", "^(.+)+#$"
    evil.send(cmd)
    started = time.monotonic()
    probe = RawClient(fresh_standalone.port, timeout=3)
    try:
        assert probe.connect().type == T.CONNECTED
        assert time.monotonic() - started < 3
        reply = evil.recv_until_any({T.GET_TOPICS_OF_NAMESPACE_RESPONSE, T.ERROR})
        assert reply.type == T.GET_TOPICS_OF_NAMESPACE_RESPONSE
        assert list(reply.getTopicsOfNamespaceResponse.topics) == []
    finally:
        probe.close()
        evil.close()


def test_pattern_with_unsupported_syntax_gets_clear_error(standalone: StandaloneProcess) -> None:
    raw = RawClient(standalone.port)
    try:
        raw.connect()
        reply = _topics_of_namespace(raw, r"public/default/(a)\1")
        assert reply.type == T.ERROR and reply.error.request_id == 3
        assert "RE2" in reply.error.message
        ok = _topics_of_namespace(raw, "public/default/.*", request_id=4)
        assert ok.type == T.GET_TOPICS_OF_NAMESPACE_RESPONSE
    finally:
        raw.close()
