"""A standalone broker imports the heavy libraries of features nobody uses only when they are used: the
authentication providers' (jwt, cryptography, passlib, bcrypt) when one is configured, fastavro when an
Avro/JSON schema is checked, the compression codecs (lz4, snappy over cramjam, zstandard) when the broker
must look inside a compressed message (compaction, peeking). Each costs megabytes of RSS (issue 19).

The broker runs with ``PYTHONPROFILEIMPORTTIME=1``: the interpreter writes a line to stderr (the broker's
log) for every module it imports, at start-up and later, so the log says what the process has loaded.
"""

from __future__ import annotations

import re
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pulsar
import pytest
from pulsar.schema import AvroSchema, Integer, Record, String

from tests.conftest import StandaloneProcess

HEAVY = ("jwt", "cryptography", "passlib", "bcrypt", "fastavro", "lz4", "snappy", "cramjam", "zstandard")
_IMPORT_LINE = re.compile(r"^import time:\s+\d+ \|\s+\d+ \|\s*([\w.]+)\s*$", re.MULTILINE)


class _User(Record):
    name = String()
    age = Integer()


def imported(node: StandaloneProcess) -> set[str]:
    """Top-level modules the broker process has imported so far (from its -X importtime log lines)."""
    text = node.log_path.read_text(errors="replace")
    return {m.split(".")[0] for m in _IMPORT_LINE.findall(text)}


@pytest.fixture
def traced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[StandaloneProcess]:
    monkeypatch.setenv("PYTHONPROFILEIMPORTTIME", "1")
    node = StandaloneProcess(tmp_path / "data")
    node.start()
    try:
        yield node
    finally:
        node.stop()


def test_an_idle_broker_has_not_imported_auth_or_avro_libraries(traced: StandaloneProcess) -> None:
    # Some traffic and admin calls first: publish, consume, a lookup over HTTP.
    client = pulsar.Client(traced.service_url, operation_timeout_seconds=10)
    try:
        topic = "persistent://public/default/idle-imports"
        consumer = client.subscribe(topic, "s")
        producer = client.create_producer(topic)
        producer.send(b"x")
        consumer.acknowledge(consumer.receive(timeout_millis=10_000))
    finally:
        client.close()
    with urllib.request.urlopen(f"{traced.http_url}/admin/v2/persistent/public/default", timeout=10) as r:
        assert r.status == 200
    mods = imported(traced)
    assert "aiohttp" in mods and "magnetar" in mods  # the trace works
    assert sorted(mods & set(HEAVY)) == []


def test_an_avro_schema_brings_fastavro_in(traced: StandaloneProcess) -> None:
    client = pulsar.Client(traced.service_url, operation_timeout_seconds=10)
    try:
        client.create_producer("persistent://public/default/idle-imports-avro", schema=AvroSchema(_User)).close()
    finally:
        client.close()
    deadline = time.monotonic() + 5.0
    while "fastavro" not in imported(traced) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "fastavro" in imported(traced)
