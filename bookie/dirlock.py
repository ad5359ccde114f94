"""Exclusive locks on a bookie's directories: two bookies on the same directories would corrupt each other."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterable
from pathlib import Path

from .api import BookieError


class DirLock:
    """``flock`` on ``bookie.lock`` in each directory, held until :meth:`release` (or process exit)."""

    def __init__(self) -> None:
        self._fds: list[int] = []

    def acquire(self, dirs: Iterable[Path]) -> None:
        """Create and lock each directory (blocking; run it off the loop); raises if one is in use."""
        for d in dict.fromkeys(dirs):
            d.mkdir(parents=True, exist_ok=True)
            fd = os.open(d / "bookie.lock", os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                os.close(fd)
                raise BookieError(f"{d} is in use by another bookie") from e
            self._fds.append(fd)

    def release(self) -> None:
        for fd in self._fds:
            with contextlib.suppress(OSError):
                os.close(fd)  # closing drops the flock
        self._fds.clear()
