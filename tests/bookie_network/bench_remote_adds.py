"""Adds/s through one RemoteBookieClient to one ``magnetar bookie`` process (not a pytest test).

``python -m tests.bookie_network.bench_remote_adds [--entries 200000] [--inflight 2000] [--size 100]``
starts a real etcd and one bookie on loopback, keeps ``--inflight`` adds outstanding on one
ledger and prints adds/s and the client's CPU share.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path

from magnetar.bookie.remote import RemoteBookieClient
from tests.bookie_network.conftest import BookieProcess
from tests.etcd_server import EtcdServer


async def drive(address: str, entries: int, inflight: int, size: int, ledgers: int) -> tuple[float, float]:
    client = RemoteBookieClient(address)
    data = b"x" * size
    sem_free = asyncio.Event()
    outstanding = 0
    done = 0

    def on_done(fut: asyncio.Future[None]) -> None:
        nonlocal outstanding, done
        fut.result()
        outstanding -= 1
        done += 1
        if outstanding <= inflight // 2:
            sem_free.set()

    await client.add_entry(0, 0, b"k", -1, data)  # connect
    t0, c0 = time.perf_counter(), time.process_time()
    next_eid = [1] * ledgers
    sent = 0
    while sent < entries:
        while outstanding < inflight and sent < entries:
            lid = sent % ledgers
            eid = next_eid[lid]
            next_eid[lid] = eid + 1
            client.add_entry_nowait(lid, eid, b"k", eid - 1, data).add_done_callback(on_done)
            outstanding += 1
            sent += 1
        sem_free.clear()
        await asyncio.wait_for(sem_free.wait(), 30)
    for _ in range(3000):
        if done >= entries:
            break
        await asyncio.sleep(0.01)
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    await client.close()
    return entries / elapsed, cpu / elapsed


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, all threads (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--entries", type=int, default=200_000)
    ap.add_argument("--inflight", type=int, default=2000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--ledgers", type=int, default=1)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        etcd = EtcdServer(Path(tmp) / "etcd")
        etcd.start()
        bookie = BookieProcess(Path(tmp) / "bookie", etcd.url, extra_args=["--min-free-bytes", "0"])
        try:
            bookie.start()
            try:
                import uvloop

                runner = uvloop.run
            except ImportError:
                runner = asyncio.run
            assert bookie.proc is not None
            for i in range(a.runs):
                s0 = _cpu_seconds(bookie.proc.pid)
                rate, cpu = runner(drive(bookie.address, a.entries, a.inflight, a.size, a.ledgers))
                server_us = (_cpu_seconds(bookie.proc.pid) - s0) / a.entries * 1e6
                print(
                    f"run {i}: {rate:,.0f} adds/s ({a.size} B, {a.inflight} in flight), client CPU {cpu:.0%}, "
                    f"bookie process CPU {server_us:.1f} us/add (all threads)"
                )
        finally:
            bookie.stop()
            etcd.stop()


if __name__ == "__main__":
    main()
