"""Client CPU per entry of a ledger written E=3/Qw=2/Qa=2 to three ``magnetar bookie`` processes.

``python -m tests.bookie_network.bench_remote_ledger [--entries 100000] [--inflight 1000] [--size 100]``
(not a pytest test). Starts a real etcd (bookie registration) and three bookies on loopback, then
keeps ``--inflight`` appends outstanding on one write handle and prints appends/s and the writer
process's CPU per entry: the cluster write path without the broker around it.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from magnetar.bookie.remote import RemoteBookieClient
from magnetar.ledger.api import LedgerConfig
from magnetar.ledger.client import BookieLedgerClient
from magnetar.ledger.registry import StaticBookieRegistry
from magnetar.metadata.embedded import EmbeddedMetadataStore
from tests.bookie_network.conftest import BookieProcess
from tests.etcd_server import EtcdServer


async def drive(addresses: list[str], db: str, entries: int, inflight: int, size: int) -> tuple[float, float]:
    store = EmbeddedMetadataStore(db)
    await store.start()
    client = BookieLedgerClient(store, StaticBookieRegistry([RemoteBookieClient(a) for a in addresses]))
    writer = await client.create_ledger(LedgerConfig(ensemble_size=3, write_quorum=2, ack_quorum=2))
    data = b"x" * size
    room = asyncio.Event()
    outstanding = done = 0

    def on_done(fut: asyncio.Future[int]) -> None:
        nonlocal outstanding, done
        fut.result()
        outstanding -= 1
        done += 1
        if outstanding <= inflight // 2:
            room.set()

    await writer.append(data)  # connects
    t0, c0 = time.perf_counter(), time.process_time()
    sent = 0
    while sent < entries:
        while outstanding < inflight and sent < entries:
            writer.append_nowait(data).add_done_callback(on_done)
            outstanding += 1
            sent += 1
        room.clear()
        await asyncio.wait_for(room.wait(), 30)
    for _ in range(3000):
        if done >= entries:
            break
        await asyncio.sleep(0.01)
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    await writer.close()
    await client.close()
    await store.close()
    return entries / elapsed, cpu / entries * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--entries", type=int, default=100_000)
    ap.add_argument("--inflight", type=int, default=1000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        etcd = EtcdServer(Path(tmp) / "etcd")
        etcd.start()
        procs = [
            BookieProcess(Path(tmp) / f"bookie{i}", etcd.url, extra_args=["--min-free-bytes", "0"]) for i in range(3)
        ]
        try:
            for b in procs:
                b.start()
            try:
                import uvloop

                runner = uvloop.run
            except ImportError:
                runner = asyncio.run
            for i in range(a.runs):
                rate, us = runner(drive([b.address for b in procs], f"{tmp}/md{i}.db", a.entries, a.inflight, a.size))
                print(f"run {i}: {rate:,.0f} appends/s ({a.size} B, {a.inflight} in flight), writer {us:.2f} us/entry")
        finally:
            for b in procs:
                b.stop()
            etcd.stop()


if __name__ == "__main__":
    main()
