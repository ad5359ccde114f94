"""What the source costs Spark's per-query Python planner process to import (no Spark JVM, no broker).

Spark starts a new Python process for every streaming query on a Python source and unpickles the source into
it: everything ``magnetar.spark.datasource`` imports at module level is paid once per query. Planning needs
the admin REST client only, so the source must not pull in the broker's protobuf messages, asyncio (the
broker's TLS helpers) or the pulsar-client C++ library there.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("pyspark")

#: Modules Spark's runner does not import itself and the planner does not need.
NOT_FOR_PLANNING = ("google.protobuf", "magnetar.broker.protocol.pulsar_api_pb2", "asyncio", "pulsar", "_pulsar")

_PROBE = """
import json, sys
import pyspark.sql.streaming.python_streaming_source_runner  # what Spark's planner process imports first
before = set(sys.modules)
import magnetar.spark.datasource
print(json.dumps(sorted(set(sys.modules) - before)))
"""


def test_planner_imports_no_protobuf_asyncio_or_client_library() -> None:
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120, check=True)
    added = json.loads(out.stdout.strip().splitlines()[-1])
    assert "magnetar.spark.datasource" in added
    unwanted = [m for m in added if any(m == n or m.startswith(n + ".") for n in NOT_FOR_PLANNING)]
    assert unwanted == []


def test_bad_topic_names_still_fail_clearly() -> None:
    # The broker's error class is imported only when a name is bad: the errors stay the same.
    from magnetar.admin_client.paths import parse_topic
    from magnetar.broker.errors import InvalidTopicNameError
    from magnetar.broker.topic_name import TopicName

    with pytest.raises(ValueError, match="Invalid topic"):
        parse_topic("persistent://a/b/c/d/e")
    with pytest.raises(InvalidTopicNameError):
        TopicName.parse("bogus://t/ns/x")
