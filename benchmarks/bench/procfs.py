"""/proc helpers: CPU accounting and listening sockets of the broker's process tree."""

from __future__ import annotations

import contextlib
import os
import socket
import time
from pathlib import Path
from typing import NamedTuple

CLK_TCK = os.sysconf("SC_CLK_TCK")
#: Linux's CPU clock id kind for the scheduler's runtime (CPUCLOCK_SCHED in the kernel's posix-timers).
_CPUCLOCK_SCHED = 2


def _read_stat(pid: int) -> tuple[int, list[str]] | None:
    """Return (ppid, fields after the command name) of /proc/PID/stat, or None if the process is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may contain spaces and parentheses: split after the last ')'.
    rest = raw[raw.rindex(")") + 2 :].split()
    return int(rest[1]), rest


def process_tree(root: int) -> list[int]:
    """PIDs of ``root`` and all its live descendants."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _read_stat(int(entry))
            if st is not None:
                children.setdefault(st[0], []).append(int(entry))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, []))
    return tree


def set_tree_affinity(root: int, cpus: frozenset[int] | set[int]) -> None:
    """Move every thread of ``root``'s process tree onto ``cpus`` (threads they start later inherit it).
    Processes or threads that end meanwhile are skipped."""
    for pid in process_tree(root):
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(int(tid), cpus)


class CpuTimes(NamedTuple):
    """Cumulative CPU seconds of a process tree."""

    #: User + system, from the kernel's per-process CPU clocks (nanosecond resolution).
    total: float
    #: The user and system split, from /proc/PID/stat (clock ticks, 10 ms each: for shares only).
    user: float
    system: float


def process_cpu_clock(pid: int) -> float | None:
    """CPU seconds of a live process, all its threads (ended ones too), or None if it is gone.

    Reads the kernel's CPU clock of another process (``clock_gettime`` on the clock id that
    ``clock_getcpuclockid(3)`` would return): the scheduler's exact runtime. /proc/PID/stat counts whole
    clock ticks, and a row whose broker spends 0.1 s would be judged on ten of them."""
    try:
        return time.clock_gettime((~pid << 3) | _CPUCLOCK_SCHED)
    except OSError:
        return None


def tree_cpu_seconds(root: int) -> CpuTimes:
    """CPU seconds of the process tree rooted at ``root``.

    Live processes contribute their own times; reaped children are included through their parent's
    cutime/cstime (in ticks), so a helper process that exits mid-run is still counted.
    """
    total = 0.0
    user = system = 0
    for pid in process_tree(root):
        st = _read_stat(pid)
        if st is None:
            continue
        f = st[1]
        own_user, own_system, reaped = int(f[11]), int(f[12]), int(f[13]) + int(f[14])
        user += own_user + int(f[13])
        system += own_system + int(f[14])
        clock = process_cpu_clock(pid)
        total += (clock if clock is not None else (own_user + own_system) / CLK_TCK) + reaped / CLK_TCK
    return CpuTimes(total, user / CLK_TCK, system / CLK_TCK)


def host_busy_seconds() -> float:
    """CPU seconds all processes on the machine spent busy (from /proc/stat), to spot foreign load."""
    vals = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)  # idle + iowait
    return (sum(vals[:8]) - idle) / CLK_TCK


def _decode_addr(hexaddr: str) -> str:
    """Decode an address:port column of /proc/net/tcp{,6}."""
    host, port = hexaddr.split(":")
    raw = bytes.fromhex(host)
    if len(raw) == 4:
        ip = socket.inet_ntop(socket.AF_INET, raw[::-1])
    else:
        # IPv6 is stored as four little-endian 32-bit words.
        words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
        ip = "[" + socket.inet_ntop(socket.AF_INET6, words) + "]"
    return f"{ip}:{int(port, 16)}"


def listening_addresses(root: int) -> list[str]:
    """TCP addresses on which the process tree listens (to check it stays on loopback)."""
    inodes: set[str] = set()
    for pid in process_tree(root):
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if link.startswith("socket:["):
                        inodes.add(link[8:-1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                cols = line.split()
                if cols[3] == "0A" and cols[9] in inodes:  # 0A = LISTEN
                    found.append(_decode_addr(cols[1]))
    return sorted(set(found))


def is_loopback(addr: str) -> bool:
    """True for 127.0.0.0/8, ::1 and IPv4-mapped loopback listen addresses."""
    host = addr.rsplit(":", 1)[0].strip("[]")
    return host.startswith("127.") or host in ("::1", "localhost") or host.startswith("::ffff:127.")


def free_port() -> int:
    """A currently unused loopback TCP port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tree_rss_bytes(root: int, field: str = "VmRSS") -> int:
    """Resident set size (VmRSS) summed over the process tree rooted at ``root``, in bytes.

    ``field="RssAnon"``: its anonymous part only (heap, stacks), without the file-backed pages
    (libraries, mapped files) that the kernel drops and faults back in under memory pressure.
    """
    total = 0
    prefix = field + ":"
    for pid in process_tree(root):
        with contextlib.suppress(OSError, ValueError, IndexError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith(prefix):
                    total += int(line.split()[1]) * 1024
                    break
    return total
