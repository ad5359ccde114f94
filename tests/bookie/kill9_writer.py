"""Child process of the kill -9 test: adds entries to a bookie and prints each acknowledged one.

    python kill9_writer.py DATA_DIR

Prints ``ACK <ledger> <entry>`` after each add is acknowledged (so after its fdatasync),
``FENCED <ledger>`` once the fence of ledger 3 is durable, and ``REUSED <n>`` whenever the journal has
made a new file by reusing an obsolete one; then keeps writing until killed.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from bookie_helpers import KEY, payload, small_config

from magnetar.bookie.bookie import Bookie


async def main(data_dir: Path) -> None:
    bookie = Bookie(small_config(data_dir, checkpoint_interval_s=0.05, checkpoint_on_journal_rotation=True))
    await bookie.start()
    out = sys.stdout
    await bookie.add_entry(3, 0, KEY, -1, payload(3, 0))
    await bookie.fence(3, KEY)
    out.write("FENCED 3\n")
    out.flush()

    async def writer(ledger_id: int) -> None:
        eid = 0
        while True:
            # A few adds in flight per ledger: acknowledgements arrive in groups.
            futs = [
                bookie.add_entry_nowait(ledger_id, e, KEY, e - 1, payload(ledger_id, e)) for e in range(eid, eid + 8)
            ]
            for e, fut in zip(range(eid, eid + 8), futs, strict=True):
                await fut
                out.write(f"ACK {ledger_id} {e}\n")
            out.write(f"REUSED {bookie.journal.files_reused}\n")
            out.flush()
            eid += 8

    await asyncio.gather(writer(1), writer(2))


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1])))
