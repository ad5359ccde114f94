"""Child process of the kill -9 test: adds entries to a bookie and prints each acknowledged one (ledger 1 one
add at a time, ledger 2 in runs of 8 adds in one call, which the journal writes as one record).

    python kill9_writer.py DATA_DIR

Prints ``ACK <ledger> <entry>`` after each add is acknowledged (so after its fdatasync),
``FENCED <ledger>`` once the fence of ledger 3 is durable, and ``REUSED <n>`` whenever the journal has
made a new file by reusing an obsolete one; then keeps writing until killed.
"""

from __future__ import annotations

import asyncio
import sys
from functools import partial
from pathlib import Path

from bookie_helpers import KEY, payload, small_config

from magnetar.bookie.api import settle
from magnetar.bookie.bookie import Bookie


async def main(data_dir: Path) -> None:
    bookie = Bookie(small_config(data_dir, checkpoint_interval_s=0.05, checkpoint_on_journal_rotation=True))
    await bookie.start()
    out = sys.stdout
    await bookie.add_entry(3, 0, KEY, -1, payload(3, 0))
    await bookie.fence(3, KEY)
    out.write("FENCED 3\n")
    out.flush()

    loop = asyncio.get_running_loop()

    async def writer(ledger_id: int) -> None:
        eid = 0
        while True:
            # A few adds in flight per ledger: acknowledgements arrive in groups.
            ids = range(eid, eid + 8)
            if ledger_id == 1:
                futs = [bookie.add_entry_nowait(ledger_id, e, KEY, e - 1, payload(ledger_id, e)) for e in ids]
            else:  # as a publish adds a socket read's sends: all in one call, one journal record for the run
                run: asyncio.Future[None] = loop.create_future()
                datas = [payload(ledger_id, e) for e in ids]
                bookie.add_parts_many(ledger_id, ids, KEY, eid - 1, [b""] * 8, datas, False, partial(settle, run))
                futs = [run] * 8
            for e, fut in zip(ids, futs, strict=True):
                await fut
                out.write(f"ACK {ledger_id} {e}\n")
            out.write(f"REUSED {bookie.journal.files_reused}\n")
            out.flush()
            eid += 8

    await asyncio.gather(writer(1), writer(2))


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1])))
