"""The benchmark's broker CPU accounting: exact, not in whole clock ticks.

A batched row costs the broker ~0.1 CPU-s; counted in /proc/PID/stat's 10 ms ticks its per-message cost
moved by 10-20% from the rounding alone. The stand-in broker here is a child interpreter that burns
CPU in a thread (ended before it is read) and in a short-lived grandchild it reaps.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from benchmarks.bench.procfs import CLK_TCK, process_cpu_clock, tree_cpu_seconds

_CHILD = r"""
import subprocess, sys, threading, time

def burn(seconds):
    t = time.thread_time()
    while time.thread_time() - t < seconds:
        pass

for line in sys.stdin:
    kind, seconds = line.split()
    if kind == "thread":
        th = threading.Thread(target=burn, args=(float(seconds),))
        th.start()
        th.join()
    else:
        code = "import time\nt = time.process_time()\nwhile time.process_time() - t < %s: pass" % seconds
        subprocess.run([sys.executable, "-c", code], check=True)
    print("done", flush=True)
"""


def test_tree_cpu_counts_ended_threads_and_reaped_children_exactly() -> None:
    child = subprocess.Popen([sys.executable, "-c", _CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdin is not None and child.stdout is not None

        def step(kind: str, seconds: float) -> float:
            before = tree_cpu_seconds(child.pid)
            child.stdin.write(f"{kind} {seconds}\n")  # type: ignore[union-attr]
            child.stdin.flush()  # type: ignore[union-attr]
            assert child.stdout.readline() == "done\n"  # type: ignore[union-attr]
            after = tree_cpu_seconds(child.pid)
            assert after.user + after.system >= before.user + before.system
            return after.total - before.total

        # A thread that has ended: its CPU stays in the process clock.
        burned = step("thread", 0.123)
        assert 0.123 <= burned < 0.123 + 0.05
        # Not a whole number of ticks: the clock is read, not /proc/PID/stat's tick counts.
        assert abs(burned * CLK_TCK - round(burned * CLK_TCK)) > 1e-6
        # A grandchild started and reaped in between: counted through cutime/cstime (whole ticks).
        reaped = step("child", 0.2)
        assert 0.2 - 1 / CLK_TCK <= reaped < 0.2 + 0.3  # + the grandchild interpreter's start
    finally:
        if child.stdin is not None:
            child.stdin.close()
        child.wait(10)


def test_the_clock_of_a_process_that_is_gone_is_none() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(10)
    time.sleep(0.05)
    assert process_cpu_clock(proc.pid) is None
    assert process_cpu_clock(99_999_999) is None


def test_the_clock_of_this_process_matches_its_own_view() -> None:
    mine = process_cpu_clock(os.getpid())
    assert mine is not None
    assert abs(mine - time.process_time()) < 0.05
