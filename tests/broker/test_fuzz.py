"""Structure-aware protocol fuzzing of a real ``magnetar standalone`` (loopback only, bounded, seeded).

Each fuzz connection sends commands generated from the protocol's descriptors with odd values
(tests/fuzzframes.py), checks every request is answered, then often sends mutated or garbage frames
and disconnects, sometimes with a reset. Meanwhile the official client keeps producing and consuming.
After the run: the broker is alive, no producer or consumer is left behind, data written before the
run reads back whole, and the broker's log holds no traceback and no destroyed pending task.

Knobs (docs/fuzzing.md): ``FUZZ_SECONDS`` (default 20), ``FUZZ_CONNECTIONS``
(default 100000), ``FUZZ_SEED`` (default: random, printed on failure).
"""

from __future__ import annotations

import json
import os
import random
import socket
import struct
import time
import urllib.error
import urllib.parse
import urllib.request

import pulsar

from magnetar.broker.protocol import pulsar_api_pb2 as pb
from tests.conftest import StandaloneProcess, _quiet_logger
from tests.fuzzframes import VALID_TOPICS, FrameGenerator, answered_request
from tests.rawclient import RawClient

T = pb.BaseCommand
PRELOADED = 200
LIVENESS_EVERY = 20
#: Log lines that mean an exception nobody handled.
UNHANDLED = ("Traceback", "Task was destroyed but it is pending", "exception was never retrieved")


def _admin_json(url: str) -> dict | None:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        if e.code in (404, 412):
            return None
        raise


def _run_connection(port: int, gen: FrameGenerator, rng: random.Random) -> str | None:
    """One fuzz connection; returns a description of a failure, or None."""
    raw = RawClient(port, timeout=5)
    try:
        if raw.connect().type != T.CONNECTED:
            return "no CONNECTED"
        awaiting: dict[int, int] = {}
        try:
            for _ in range(rng.randint(1, 12)):
                frame = gen.structured()
                raw.send_raw(frame.data)
                if frame.awaits is not None:
                    awaiting[frame.awaits] = frame.kind
            raw.send(T(type=T.PING, ping=pb.CommandPing()))
        except OSError:
            return None  # the broker closed it (e.g. SEND for an unknown producer): nothing is owed
        ponged = False
        deadline = time.monotonic() + 10
        raw.sock.settimeout(0.5)
        while (awaiting or not ponged) and time.monotonic() < deadline:
            try:
                cmd, _ = raw.recv_command()
            except TimeoutError:
                continue
            except (ConnectionError, OSError):
                return None  # the broker closed it (e.g. SEND for an unknown producer): nothing is owed
            if cmd.type == T.PONG:
                ponged = True
            elif cmd.type == T.PING:
                raw.send(T(type=T.PONG, pong=pb.CommandPong()))
            request_id = answered_request(cmd)
            if request_id is not None:
                awaiting.pop(request_id, None)
        if awaiting:
            names = sorted({T.Type.Name(k) for k in awaiting.values()})
            return f"unanswered requests {sorted(awaiting)} ({', '.join(names)})"
        if not ponged:
            return "no PONG: the connection hangs"
        if rng.random() < 0.5:
            for _ in range(rng.randint(1, 3)):
                roll = rng.random()
                frame = gen.garbage() if roll < 0.2 else gen.mutated(gen.structured())
                try:
                    raw.send_raw(frame.data)
                except OSError:
                    break
        return None
    finally:
        if rng.random() < 0.25:
            raw.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        raw.close()


def _leaked_clients(http_url: str) -> list[str]:
    leaks = []
    for topic in VALID_TOPICS:
        path = urllib.parse.quote(topic.replace("://", "/"), safe="/")
        stats = _admin_json(f"{http_url}/admin/v2/{path}/stats")
        if stats is None:
            continue
        if stats.get("publishers"):
            leaks.append(f"{topic}: publishers {[p.get('producerName') for p in stats['publishers']]}")
        for sub, s in stats.get("subscriptions", {}).items():
            if s.get("consumers"):
                leaks.append(f"{topic}/{sub}: {len(s['consumers'])} consumers")
    return leaks


def test_protocol_fuzz(fresh_standalone: StandaloneProcess) -> None:
    seed = int(os.environ.get("FUZZ_SEED") or random.randrange(2**32))
    seconds = float(os.environ.get("FUZZ_SECONDS", "20"))
    max_connections = int(os.environ.get("FUZZ_CONNECTIONS", "100000"))
    replay = f"(replay: FUZZ_SEED={seed})"
    broker = fresh_standalone
    broker.start()
    client = pulsar.Client(broker.service_url, operation_timeout_seconds=10, logger=_quiet_logger())
    try:
        preload_topic = "persistent://public/default/fz-preloaded"
        keeper = client.subscribe(preload_topic, "keep", initial_position=pulsar.InitialPosition.Earliest)
        producer = client.create_producer(preload_topic, batching_enabled=True)
        for i in range(PRELOADED):
            producer.send_async(f"pre-{i}".encode(), None)
        producer.flush()
        producer.close()
        keeper.close()

        live_topic = "persistent://public/default/fz-liveness"
        live_producer = client.create_producer(live_topic, batching_enabled=False)
        live_consumer = client.subscribe(live_topic, "live")

        failures: list[str] = []
        connections = 0
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and connections < max_connections and len(failures) < 5:
            rng = random.Random(f"{seed}:{connections}")
            failure = _run_connection(broker.port, FrameGenerator(rng), rng)
            if failure is not None:
                failures.append(f"connection {connections}: {failure}")
            connections += 1
            if connections % LIVENESS_EVERY == 0:
                assert broker.proc is not None and broker.proc.poll() is None, f"broker died {replay}"
                body = f"live-{connections}".encode()
                live_producer.send(body)
                assert live_consumer.receive(timeout_millis=10_000).data() == body, f"liveness lost {replay}"
        assert not failures, f"{replay} after {connections} connections:\n" + "\n".join(failures)

        # No producer or consumer outlives its connection (closing is asynchronous: allow a moment).
        until = time.monotonic() + 10
        while (leaks := _leaked_clients(broker.http_url)) and time.monotonic() < until:
            time.sleep(0.2)
        assert not leaks, f"{replay} leaked: {leaks}"

        reader = client.create_reader(preload_topic, pulsar.MessageId.earliest)
        got = [reader.read_next(timeout_millis=10_000).data() for _ in range(PRELOADED)]
        assert got == [f"pre-{i}".encode() for i in range(PRELOADED)], replay
        reader.close()
        live_producer.close()
        live_consumer.close()
    finally:
        client.close()
    assert broker.proc is not None and broker.proc.poll() is None, f"broker died {replay}"
    log = broker.log_path.read_text(errors="replace")
    unhandled = [line for line in log.splitlines() if any(u in line for u in UNHANDLED)]
    assert not unhandled, f"{replay} unhandled server exceptions:\n" + "\n".join(unhandled[:20]) + "\n" + log[-6000:]
    print(f"fuzzed {connections} connections, seed {seed}")
