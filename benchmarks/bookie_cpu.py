"""CPU per entry of a standalone bookie's add path, by thread: event loop, journal writer, journal file
preparation, checkpoint.

    python -m benchmarks.bookie_cpu [--entries 3000] [--size 131072] [--inflight 16]

Adds ``--entries`` entries of ``--size`` bytes (framed as the ledger client frames them) to a fresh bookie
in a temporary directory, ``--inflight`` at a time, then checkpoints, and prints the CPU each thread spent
per entry (``/proc/self/task/*/schedstat``) and the journal files pre-written with zeros and reused.
A measurement, not a test: compare runs made one after another on the same machine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import threading
import time
from pathlib import Path

from magnetar.bookie.bookie import Bookie
from magnetar.bookie.config import BookieConfig
from magnetar.ledger import digest


def thread_cpu_ns() -> dict[str, int]:
    """CPU time so far of this process's live threads, by thread name (numbered pool threads summed)."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, int] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                ns = int(f.read().split()[0])
        except OSError:
            continue
        name = names.get(int(tid), "other").rstrip("0123456789_")
        out[name] = out.get(name, 0) + ns
    return out


async def run(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as d:
        bookie = Bookie(BookieConfig(data_dir=Path(d), min_free_bytes=0))
        await bookie.start()
        key = digest.master_key(b"bench")
        data = os.urandom(args.size)
        slots = asyncio.Semaphore(args.inflight)
        loop = asyncio.get_running_loop()
        await asyncio.sleep(0.5)  # start-up work (the second journal file) out of the window
        before, cpu0, wall0 = thread_cpu_ns(), time.process_time(), time.perf_counter()
        futs: list[asyncio.Future[BaseException | None]] = []
        total = 0
        for eid in range(args.entries):
            await slots.acquire()
            total += len(data)
            fut: asyncio.Future[BaseException | None] = loop.create_future()

            def done(exc: BaseException | None, fut: asyncio.Future[BaseException | None] = fut) -> None:
                slots.release()
                fut.set_result(exc)

            head = digest.frame_header(1, eid, total, data)
            bookie.add_parts_many(1, (eid,), key, eid - 1, (head,), (data,), False, done)
            futs.append(fut)
        errors = [e for e in await asyncio.gather(*futs) if e is not None]
        await bookie.checkpoint()
        after, cpu1, wall1 = thread_cpu_ns(), time.process_time(), time.perf_counter()
        journal = bookie.journal
        zeroed, reused = journal.files_zeroed, journal.files_reused
        await bookie.close()
    n = args.entries
    print(f"{n} adds of {args.size} bytes, {args.inflight} in flight: {wall1 - wall0:.2f} s, errors {len(errors)}")
    print(f"process CPU per entry: {1e6 * (cpu1 - cpu0) / n:.1f} us")
    for name in sorted(after):
        spent = after[name] - before.get(name, 0)
        if spent > 1_000_000:
            print(f"  {name:20s} {spent / 1e3 / n:8.1f} us/entry")
    print(f"journal files pre-written with zeros: {zeroed} (two at start-up), reused: {reused}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--entries", type=int, default=3000)
    ap.add_argument("--size", type=int, default=128 * 1024)
    ap.add_argument("--inflight", type=int, default=16)
    asyncio.run(run(ap.parse_args()))


if __name__ == "__main__":
    main()
