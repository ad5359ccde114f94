"""Ledger ids across brokers: unique (blocks reserved by CAS) and, when asked, above a floor, so a managed
ledger taken over by another broker still gets growing ledger ids."""

from __future__ import annotations

import asyncio
from pathlib import Path

from magnetar.ledger.ledger_manager import LedgerManager
from magnetar.metadata.embedded import EmbeddedMetadataStore


def test_ids_are_unique_across_managers_and_respect_a_floor(tmp_path: Path) -> None:
    async def main() -> None:
        store = EmbeddedMetadataStore(str(tmp_path / "md.db"))
        await store.start()
        try:
            a, b = LedgerManager(store, id_block_size=10), LedgerManager(store, id_block_size=10)
            first_a = await a.new_ledger_id()  # a holds [1, 11)
            ids_b = [await b.new_ledger_id() for _ in range(3)]  # b holds [11, 21)
            assert first_a == 1 and ids_b == [11, 12, 13]
            # A ledger that b wrote last has id 13: a must not hand out 2 for its successor.
            nxt = await a.new_ledger_id(at_least=14)
            assert nxt >= 14 and nxt not in ids_b
            later = await b.new_ledger_id(at_least=nxt + 1)
            assert later > nxt
            assert await a.new_ledger_id() > nxt  # a continues in its new block
        finally:
            await store.close()

    asyncio.run(main())
