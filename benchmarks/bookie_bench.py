"""Micro-benchmark of the bookie add path (journal group commit with fdatasync on).

    python benchmarks/bookie_bench.py [--seconds 5] [--inflight 1024] [--size 100] [--ledgers 8]
                                      [--uvloop] [--ledger-client [--bookies 3 --quorum 3,2,2]]

Keeps ``--inflight`` adds outstanding spread over ``--ledgers`` ledgers (like many producers)
and reports adds/s and add latency percentiles. ``--ledger-client`` goes through the ledger
client on top of LocalBookieClients (``--bookies`` in-process bookies, ``--quorum E,Qw,Qa``,
default one bookie and 1,1,1) instead of calling the bookie directly.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from magnetar.bookie.bookie import Bookie
from magnetar.bookie.config import BookieConfig
from magnetar.bookie.local import LocalBookieClient


async def bench_bookie(args: argparse.Namespace, data_dir: Path) -> None:
    bookie = Bookie(BookieConfig(data_dir=data_dir, min_free_bytes=0))
    await bookie.start()
    client = LocalBookieClient(bookie)
    payload = b"x" * args.size
    key = b"k" * 20
    latencies: list[float] = []
    deadline = time.perf_counter() + args.seconds
    per_ledger = max(1, args.inflight // args.ledgers)
    counters = [0] * args.ledgers

    async def writer(ledger: int) -> None:
        perf = time.perf_counter
        add = client.add_entry
        while True:
            t0 = perf()
            if t0 >= deadline:
                return
            eid = counters[ledger]
            counters[ledger] = eid + 1
            await add(ledger + 1, eid, key, eid - 1, payload)
            latencies.append(perf() - t0)

    start = time.perf_counter()
    await asyncio.gather(*(writer(i % args.ledgers) for i in range(per_ledger * args.ledgers)))
    elapsed = time.perf_counter() - start
    await bookie.close()
    report("bookie.add_entry", latencies, elapsed, bookie.journal.bytes_written)


async def bench_ledger(args: argparse.Namespace, data_dir: Path) -> None:
    from magnetar.ledger.api import LedgerConfig
    from magnetar.ledger.client import BookieLedgerClient
    from magnetar.ledger.registry import StaticBookieRegistry

    try:
        from magnetar.metadata.embedded import EmbeddedMetadataStore  # type: ignore[import-not-found]

        store = EmbeddedMetadataStore(str(data_dir / "metadata.db"))
    except ImportError:  # pragma: no cover - the store is another module's work
        raise SystemExit("--ledger-client needs magnetar.metadata.embedded") from None
    bookies = [
        Bookie(BookieConfig(data_dir=data_dir / f"bookie-{i}", address=f"bookie-{i}", min_free_bytes=0))
        for i in range(args.bookies)
    ]
    for b in bookies:
        await b.start()
    lc = BookieLedgerClient(store, StaticBookieRegistry([LocalBookieClient(b) for b in bookies]))
    e, qw, qa = (int(x) for x in args.quorum.split(","))
    config = LedgerConfig(ensemble_size=e, write_quorum=qw, ack_quorum=qa)
    handles = [await lc.create_ledger(config) for _ in range(args.ledgers)]
    payload = b"x" * args.size
    latencies: list[float] = []
    deadline = time.perf_counter() + args.seconds

    async def writer(h) -> None:  # type: ignore[no-untyped-def]
        perf = time.perf_counter
        while True:
            t0 = perf()
            if t0 >= deadline:
                return
            await h.append(payload)
            latencies.append(perf() - t0)

    per_ledger = max(1, args.inflight // args.ledgers)
    start = time.perf_counter()
    await asyncio.gather(*(writer(handles[i % len(handles)]) for i in range(per_ledger * len(handles))))
    elapsed = time.perf_counter() - start
    for h in handles:
        await h.close()
    await lc.close()
    for b in bookies:
        await b.close()
    await store.close()
    journal = sum(b.journal.bytes_written for b in bookies)
    report(f"ledger append ({args.bookies} bookies, E,Qw,Qa={args.quorum})", latencies, elapsed, journal)


def report(name: str, latencies: list[float], elapsed: float, journal_bytes: int) -> None:
    latencies.sort()
    n = len(latencies)

    def pct(p: float) -> float:
        return latencies[min(n - 1, int(p * n))] * 1000 if n else float("nan")

    print(
        f"{name}: {n} adds in {elapsed:.2f}s = {n / elapsed:,.0f} adds/s; latency p50 {pct(0.5):.2f} ms, "
        f"p99 {pct(0.99):.2f} ms, max {latencies[-1] * 1000 if n else 0:.1f} ms; "
        f"journal {journal_bytes / elapsed / 1e6:.1f} MB/s"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--inflight", type=int, default=1024)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--ledgers", type=int, default=8)
    ap.add_argument("--uvloop", action="store_true")
    ap.add_argument("--ledger-client", action="store_true")
    ap.add_argument("--bookies", type=int, default=1)
    ap.add_argument("--quorum", default="1,1,1", help="E,Qw,Qa for --ledger-client")
    ap.add_argument("--dir", type=Path, default=None, help="data directory (default: a temp dir)")
    args = ap.parse_args()
    runner = None
    if args.uvloop:
        import uvloop

        runner = uvloop.run
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        coro = bench_ledger(args, Path(d)) if args.ledger_client else bench_bookie(args, Path(d))
        if runner is not None:
            runner(coro)
        else:
            asyncio.run(coro)


if __name__ == "__main__":
    main()
