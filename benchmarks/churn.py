"""Memory under connection and topic churn: many short connections, each on new, odd topics.

Starts a ``magnetar standalone`` on free loopback ports (or uses ``--port/--http-port``), then for
``--seconds`` (bounded also by ``--connections``) opens raw connections that each create a producer
and a consumer on a new topic, send a message, and close (some with a reset). The broker's RSS is
sampled from ``/proc`` every ``--sample`` seconds and printed with the number of loaded topics.

    python benchmarks/churn.py --seconds 120
    MAGNETAR_brokerDeleteInactiveTopicsFrequencySeconds=10 python benchmarks/churn.py --seconds 120
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import struct
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from magnetar.broker.protocol import pulsar_api_pb2 as pb
from tests.conftest import StandaloneProcess
from tests.rawclient import RawClient

T = pb.BaseCommand


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def loaded_topics(http_url: str) -> int:
    with urllib.request.urlopen(f"{http_url}/metrics", timeout=10) as r:
        text = r.read().decode()
    lines = [line for line in text.splitlines() if line.startswith("pulsar_topics_count")]
    return sum(int(float(line.rsplit(" ", 1)[1])) for line in lines)


def one_connection(port: int, rng: random.Random, n: int, subscribe: bool) -> None:
    raw = RawClient(port, timeout=5)
    try:
        raw.connect()
        odd = rng.choice(["", "-\u2603", "-" + "x" * 200, "-partition-x", "=:."])
        topic = f"persistent://public/default/churn-{n}{odd}"
        raw.create_producer(topic)
        raw.send_message(1, 0, b"x" * rng.randint(0, 2048))
        if subscribe:
            raw.subscribe(topic, f"sub-{n % 7}", consumer_id=1, request_id=2)
            raw.flow(1, 10)
    finally:
        if rng.random() < 0.3:
            raw.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        raw.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--connections", type=int, default=100_000)
    ap.add_argument("--sample", type=float, default=10)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-subscribe", action="store_true", help="producers only (topics become deletable)")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        broker = StandaloneProcess(Path(tmp) / "data")
        broker.start()
        assert broker.proc is not None
        pid = broker.proc.pid
        try:
            start = time.monotonic()
            next_sample = start
            samples = []
            n = 0
            while time.monotonic() - start < args.seconds and n < args.connections:
                if time.monotonic() >= next_sample:
                    sample = {
                        "t": round(time.monotonic() - start),
                        "connections": n,
                        "rss_mib": round(rss_mib(pid), 1),
                        "topics": loaded_topics(broker.http_url),
                    }
                    samples.append(sample)
                    print(json.dumps(sample), flush=True)
                    next_sample += args.sample
                one_connection(broker.port, rng, n, not args.no_subscribe)
                n += 1
            time.sleep(2)
            print(
                json.dumps(
                    {
                        "t": round(time.monotonic() - start),
                        "connections": n,
                        "rss_mib": round(rss_mib(pid), 1),
                        "topics": loaded_topics(broker.http_url),
                    }
                )
            )
        finally:
            broker.stop()


if __name__ == "__main__":
    main()
