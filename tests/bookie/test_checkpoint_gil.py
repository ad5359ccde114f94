"""A checkpoint flush shares the GIL with the event loop: it must never hold it for long at a time.

The flush's per-entry work runs in C (``map``, ``accumulate``, ``array.extend``); a C-level loop is
one bytecode, so the interpreter cannot switch threads inside it. Over a whole 5-second write cache
(~100,000 entries at 20,000 msg/s) each such call held the GIL for 10-25 ms, and the event loop
(receipts, dispatch) stood still that long, several times per checkpoint."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

from bookie_helpers import cached

from magnetar.bookie.index import LedgerState
from magnetar.bookie.journal_format import JournalPosition
from magnetar.bookie.storage import GIL_SLICE, LedgerStorage, WriteCache

N = 200_000


def _snapshot(base: int) -> WriteCache:
    """One contiguous ledger and one striped one (every other entry id, as with E > Qw)."""
    return {
        # Stored as the write cache keeps an add: (digest header, data), written as two parts.
        1: cached({e: (b"%08d" % e, b"%08d" % e * 19) for e in range(base, base + N)}),
        2: cached({e: (b"%08d" % e, b"%08d" % e * 19) for e in range(base, base + N, 2)}),
    }


def _longest_gil_wait(storage: LedgerStorage, snapshot: WriteCache, seq: int) -> float:
    """Flush on a thread while this one (the "event loop") asks for the GIL every 0.2 ms."""
    last = max(snapshot[1])
    states = {1: LedgerState(b"k", lac=last, last_entry=last), 2: LedgerState(b"k", lac=last - 1, last_entry=last - 1)}
    done = threading.Event()
    errors: list[BaseException] = []

    def flush() -> None:
        try:
            storage.flush(snapshot, states, [], JournalPosition(1, seq))
        except BaseException as e:
            errors.append(e)
        finally:
            done.set()

    waits = [0.0]
    thread = threading.Thread(target=flush)
    thread.start()
    deadline = time.monotonic() + 60
    while not done.is_set() and time.monotonic() < deadline:
        t = time.perf_counter()
        time.sleep(0.0002)
        waits.append(time.perf_counter() - t - 0.0002)
    thread.join(10)
    assert not errors and done.is_set()
    return max(waits)


def test_flushing_many_entries_lets_other_threads_run(tmp_path: Path) -> None:
    storage = LedgerStorage(tmp_path, entry_log_size=1 << 30, index_compact_bytes=1 << 30)
    storage.load()
    before = sys.getswitchinterval()
    sys.setswitchinterval(0.0005)  # as the server processes run (magnetar.cli.process)
    longest: list[float] = []
    try:
        # Best of three: on a busy machine the OS may not run this thread for a while either; the
        # C-level passes of an unsliced flush hold the GIL 10+ ms in every round.
        for round_ in range(3):
            longest.append(_longest_gil_wait(storage, _snapshot(round_ * N), 100 + round_))
            if longest[-1] < 0.010:
                break
        assert min(longest) < 0.010, f"the flush held the GIL for {[round(w * 1e3, 1) for w in longest]} ms"
        # Everything is stored where the index says.
        for lid, eid in ((1, 0), (1, N // 2 + 1), (1, N - 1), (2, 0), (2, N // 2), (2, N - 2)):
            where = storage.index.lookup(lid, eid)
            assert where is not None, (lid, eid)
            assert storage.read_many([where])[0] == b"%08d" % eid * 20
        assert storage.index.lookup(2, 1) is None
    finally:
        sys.setswitchinterval(before)
        storage.close()


def test_flush_passes_at_most_a_slice_of_entries_at_a_time(tmp_path: Path) -> None:
    storage = LedgerStorage(tmp_path, entry_log_size=1 << 30, index_compact_bytes=1 << 30)
    storage.load()
    sizes: list[int] = []
    add_many = storage.writer.add_many

    def spy(ledger_id: int, entry_ids: list[int], datas: list[bytes], *rest: object) -> object:
        sizes.append(len(entry_ids))
        return add_many(ledger_id, entry_ids, datas, *rest)  # type: ignore[arg-type]

    storage.writer.add_many = spy  # type: ignore[method-assign]
    n = 3 * GIL_SLICE + 5
    try:
        storage.flush(
            {1: cached({e: (b"", b"x") for e in range(n)})}, {1: LedgerState(b"k")}, [], JournalPosition(1, 1)
        )
        assert sizes == [GIL_SLICE, GIL_SLICE, GIL_SLICE, 5]
        assert storage.index.lookup(1, n - 1) is not None
    finally:
        storage.close()


def test_entry_ids_come_sorted_whatever_order_they_were_added_in() -> None:
    in_order = cached({e: (b"", b"x") for e in range(5 * GIL_SLICE)})
    assert in_order.sorted_ids() == list(range(5 * GIL_SLICE))
    # Out of order inside a slice, and across a slice boundary (each slice ascending on its own).
    shuffled = [*range(GIL_SLICE, 2 * GIL_SLICE), *range(GIL_SLICE), 2 * GIL_SLICE + 1, 2 * GIL_SLICE]
    out_of_order = cached({e: (b"", b"x") for e in shuffled})
    assert out_of_order.sorted_ids() == sorted(shuffled)
    assert cached({}).sorted_ids() == []


def test_a_large_checkpoint_chunk_is_written_in_bounded_pieces(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The index chunk of a 200,000-entry checkpoint is megabytes: joined in one piece, its copy held
    the GIL for milliseconds (17 ms on a slow CI machine). Written in pieces, it loads back whole."""
    from magnetar.bookie import index as index_module

    writes: list[int] = []
    real = index_module._write

    def spy(fd: int, data: memoryview) -> int:
        writes.append(len(data))
        return real(fd, data)

    storage = LedgerStorage(tmp_path, entry_log_size=1 << 30, index_compact_bytes=1 << 30)
    storage.load()
    monkeypatch.setattr(index_module, "_write", spy)
    snapshot = _snapshot(0)
    last = max(snapshot[1])
    states = {1: LedgerState(b"k", lac=last, last_entry=last), 2: LedgerState(b"k", lac=last - 1, last_entry=last - 1)}
    storage.flush(snapshot, states, [], JournalPosition(1, 7))
    storage.close()
    assert sum(writes) > 4 << 20 and len(writes) > 10
    assert max(writes) <= index_module._PIECE_BYTES + 64 << 10
    reloaded = LedgerStorage(tmp_path, entry_log_size=1 << 30, index_compact_bytes=1 << 30)
    try:
        loaded, mark = reloaded.load()
        assert mark == JournalPosition(1, 7) and loaded[1].lac == last
        for lid, eid in ((1, 0), (1, N - 1), (2, N - 2)):
            where = reloaded.index.lookup(lid, eid)
            assert where is not None and reloaded.read_many([where])[0] == b"%08d" % eid * 20
    finally:
        reloaded.close()


def _paused_flush(tmp_path: Path, monkeypatch, duty: float, urgent=None) -> list[float]:  # type: ignore[no-untyped-def]
    from magnetar.bookie import storage as storage_module

    pauses: list[float] = []
    monkeypatch.setattr(storage_module.time, "sleep", pauses.append)
    storage = LedgerStorage(tmp_path, entry_log_size=1 << 30, index_compact_bytes=1 << 30)
    storage.load()
    try:
        n = 4 * GIL_SLICE
        entries = cached({e: (b"", b"%08d" % e * 12) for e in range(n)})
        storage.flush({1: entries}, {1: LedgerState(b"k")}, [], JournalPosition(1, 1), duty=duty, urgent=urgent)
        assert storage.index.lookup(1, n - 1) is not None
    finally:
        storage.close()
    return pauses


def test_a_flush_pauses_after_each_slice_for_the_event_loop(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A CPU-bound flush thread took the GIL back at every system call of the event loop (the loop ran
    at ~13% of its speed during a flush, measured); with duty 0.5 it pauses as long as it worked."""
    pauses = _paused_flush(tmp_path / "a", monkeypatch, 0.5)
    assert len(pauses) == 4 and all(p >= 0 for p in pauses) and sum(pauses) > 0
    third = _paused_flush(tmp_path / "b", monkeypatch, 0.25)
    assert len(third) == 4 and sum(third) > 0
    assert _paused_flush(tmp_path / "c", monkeypatch, 1.0) == []


def test_a_flush_that_adds_wait_for_does_not_pause(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    asked: list[bool] = []

    def urgent() -> bool:
        asked.append(True)
        return len(asked) > 1  # the write cache filled up during the flush

    pauses = _paused_flush(tmp_path, monkeypatch, 0.5, urgent)
    assert len(asked) == 4 and len(pauses) == 1
