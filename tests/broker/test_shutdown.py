"""Shutdown with live clients: every background task is cancelled and awaited, none left pending."""

from __future__ import annotations

import threading
import time

import pulsar

from tests.conftest import StandaloneProcess

E = pulsar.InitialPosition.Earliest
#: What asyncio logs when a task it still ran is garbage collected, or its failure was never looked at.
_LEAKS = (
    "Task was destroyed but it is pending",
    "exception was never retrieved",
    "coroutine was never awaited",
    "during asyncio.run() shutdown",
    "logger=asyncio",
    "still pending after shutdown",
)


def test_sigterm_with_live_producers_and_consumers_leaves_no_pending_tasks(
    fresh_standalone: StandaloneProcess,
) -> None:
    node = fresh_standalone
    node.start()
    client = pulsar.Client(
        node.service_url, operation_timeout_seconds=10, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
    )
    stop = threading.Event()
    try:
        consumers = []
        for i, kind in enumerate(
            (pulsar.ConsumerType.Shared, pulsar.ConsumerType.Exclusive, pulsar.ConsumerType.Failover)
        ):
            topic = f"persistent://public/default/shutdown-{i}"
            consumers.append(client.subscribe(topic, f"sub-{i}", consumer_type=kind, initial_position=E))
            # A second consumer on the Failover one, so an election has happened.
            if kind == pulsar.ConsumerType.Failover:
                consumers.append(client.subscribe(topic, f"sub-{i}", consumer_type=kind, initial_position=E))
        producers = [
            client.create_producer(
                f"persistent://public/default/shutdown-{i}",
                batching_enabled=False,
                send_timeout_millis=0,
                block_if_queue_full=True,
                max_pending_messages=200,
            )
            for i in range(3)
        ]
        for p in producers:
            for j in range(50):
                p.send(f"warm-{j}".encode())

        def keep_sending() -> None:
            n = 0
            deadline = time.monotonic() + 30
            while not stop.is_set() and time.monotonic() < deadline:
                for p in producers:
                    try:
                        p.send_async(f"m-{n}".encode(), lambda *_: None)
                    except Exception:
                        return
                n += 1

        sender = threading.Thread(target=keep_sending, daemon=True)
        sender.start()
        time.sleep(1.0)  # publishes and dispatches in flight when the broker is told to stop
        code = node.stop()
    finally:
        stop.set()
        client.close()
    assert code == 0, node.log()
    log = node.log_path.read_text(errors="replace")
    leaks = [line for line in log.splitlines() if any(s in line for s in _LEAKS)]
    assert not leaks, "\n".join(leaks[:20])
