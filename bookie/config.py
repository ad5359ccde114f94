"""Configuration of one bookie."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

KiB = 1024
MiB = 1024 * KiB


@dataclass(slots=True)
class BookieConfig:
    """Settings of a :class:`~magnetar.bookie.bookie.Bookie`.

    Only ``data_dir`` is required; the defaults suit a standalone broker. Tests shrink the file
    sizes so rotation, checkpoints and garbage collection happen with little data.
    """

    data_dir: Path
    #: Identity the ledger metadata records for this bookie (host:port once it is networked).
    address: str = "127.0.0.1:3181"
    #: Journal directory (defaults to ``data_dir/journal``); ideally a separate device.
    journal_dir: Path | None = None
    #: Entry log + index directory (defaults to ``data_dir/ledgers``).
    ledger_dir: Path | None = None

    #: Size of a journal file; rotated when full. All of a file is allocated before records go in.
    journal_file_size: int = 64 * MiB
    #: Journal files the checkpoint has made obsolete that are kept (``<seq>.free``) and reused as the
    #: next files (BookKeeper: ``journalReuseFiles``) instead of pre-writing new ones with zeros, which
    #: writes as many bytes as the records do. 0: delete them and always pre-write (the old behaviour).
    journal_reuse_files: int = 4
    #: A group commit takes at most about this many bytes (one write + one fdatasync).
    journal_group_max_bytes: int = 512 * KiB
    #: How long an add that finds the journal writer idle waits for more adds to join its group commit
    #: (BookKeeper: ``journalMaxGroupWaitMSec``, 1 ms in Pulsar's bookkeeper.conf). 0: natural batching
    #: only, the next group starts as soon as the previous fdatasync returns.
    journal_max_wait_s: float = 0.001
    #: Wait only while waits gather more adds (adds arriving a few hundred µs apart), and not for a lone
    #: producer that waits for each receipt before its next send (BookKeeper always waits: False).
    journal_adaptive_wait: bool = True
    #: Adds whose journal write has not completed after this long fail with BookieUnavailableError.
    add_timeout_s: float = 30.0

    #: Entry log files are rotated at this size (must stay below 4 GiB: offsets are 32-bit).
    entry_log_size: int = 128 * MiB
    #: Write entry logs with ``O_DIRECT`` (through a 4 MiB staging buffer) where the filesystem takes
    #: it, else through the page cache. Cached, the written pages grow the page cache by everything
    #: written, and a new page costs the kernel far more than a reused one (~8 µs vs ~1 µs per 4 KiB in
    #: a VM). Recent entries are served from the write cache and the broker's entry cache; older ones
    #: are then read from the disk.
    entry_log_direct_io: bool = True
    #: Checkpoint at least this often: flush the write cache to the entry log, persist the index,
    #: delete journals wholly before the checkpoint.
    checkpoint_interval_s: float = 5.0
    #: Also checkpoint as soon as the journal has started a new file: the previous file is then freed
    #: in time for the next one to reuse it (see ``journal_reuse_files``) instead of writing zeros.
    checkpoint_on_journal_rotation: bool = True
    #: ... and also as soon as the write cache holds this many bytes of memory (BookKeeper:
    #: ``dbStorage_writeCacheMaxSizeMb``): entries' bytes plus ``storage.CACHED_ENTRY_OVERHEAD`` each. A
    #: full cache holds new adds back until the checkpoint swaps it out; with the cache being flushed,
    #: memory stays below about twice this.
    write_cache_max_bytes: int = 64 * MiB
    #: How long an add waits for room in a full write cache before it is rejected with
    #: TOO_MANY_REQUESTS (the client moves to another bookie). BookKeeper: ``dbStorage_maxThrottleTimeMs``.
    max_throttle_time_s: float = 10.0
    #: Share of a checkpoint's flush spent working: after each slice of entries the flush thread
    #: pauses so that the event loop, which shares the GIL with it, keeps most of its speed (1.0 = no
    #: pauses). A flush that adds wait for (full write cache) never pauses.
    checkpoint_flush_duty: float = 0.33
    #: Upper bound of one checkpoint (a slow disk fails it; the journal still has the data).
    checkpoint_timeout_s: float = 120.0
    #: Rewrite the index log in one piece when it grows past this size and twice its live size.
    index_compact_bytes: int = 16 * MiB

    #: Threads doing disk reads (os.pread) for read_entries.
    read_threads: int = 2
    read_timeout_s: float = 30.0
    #: Become read-only when the ledger or journal filesystem has less free space than this.
    min_free_bytes: int = 256 * MiB

    #: Entry-log compaction (BookKeeper names and defaults): a log whose live bytes are below
    #: this fraction of its size has its live entries copied to the current log and is deleted,
    #: so one long-lived ledger does not pin every log it touched. 0 disables minor compaction.
    minor_compaction_threshold: float = 0.2
    #: Seconds between minor compactions (``minorCompactionInterval``).
    minor_compaction_interval_s: float = 3600.0
    #: Same for the rarer, more thorough major compaction (``majorCompactionThreshold``, 0 = off).
    major_compaction_threshold: float = 0.8
    #: Seconds between major compactions (``majorCompactionInterval``).
    major_compaction_interval_s: float = 86400.0
    #: Upper bound of one compaction.
    compaction_timeout_s: float = 600.0

    #: Seconds between scans comparing local ledgers with the metadata store (ledgers deleted
    #: while this bookie was away are reclaimed). BookKeeper: ``gcWaitTime`` (900000 ms in Pulsar).
    gc_wait_time_s: float = 900.0
    #: Upper bound of one such scan.
    gc_timeout_s: float = 120.0
    #: Where ledger metadata lives in the metadata store (the ledger client's ``ledgers_root``).
    metadata_ledgers_root: str = "/ledgers"

    def __post_init__(self) -> None:
        self.data_dir = Path(self.data_dir)
        if self.journal_dir is None:
            self.journal_dir = self.data_dir / "journal"
        if self.ledger_dir is None:
            self.ledger_dir = self.data_dir / "ledgers"
        self.journal_dir = Path(self.journal_dir)
        self.ledger_dir = Path(self.ledger_dir)
        if not 0 < self.entry_log_size < 4 * 1024 * MiB:
            raise ValueError("entry_log_size must be between 1 byte and 4 GiB")
        if self.journal_file_size < 4 * KiB:
            raise ValueError("journal_file_size must be at least 4 KiB")
        if self.journal_reuse_files < 0:
            raise ValueError("journal_reuse_files must be >= 0")
        for name in ("minor_compaction_threshold", "major_compaction_threshold"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1)")
