"""driver/launch/drain.py: an exit waits for its output DRAIN_WAIT_S of the time the driver had a CPU, at most
DRAIN_WALL_LIMIT_S of wall time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from cloud_elastic.driver.launch.drain import DRAIN_WAIT_S, DRAIN_WALL_LIMIT_S, DrainClock, cpu_waits


class Clocks:
    """A wall clock and the threads' CPU waits (nanoseconds by thread id), both moved by the test."""

    def __init__(self) -> None:
        self.now = 100.0
        self.waits: dict[int, int] = {1: 5_000_000_000, 2: 7_000_000_000}

    def pass_time(self, seconds: float, waiting: dict[int, float] | None = None) -> None:
        self.now += seconds
        for tid, share in (waiting or {}).items():
            self.waits[tid] = self.waits.get(tid, 0) + int(seconds * share * 1e9)

    def clock(self) -> DrainClock:
        return DrainClock(lambda: self.now, lambda: dict(self.waits))


def test_a_stalled_output_with_the_driver_idle_holds_the_exit_for_the_bound_only():
    # The reader sleeps in a write to a stopped terminal: no thread waits for a CPU.
    c = Clocks()
    drain = c.clock()
    assert not drain.up()
    c.pass_time(DRAIN_WAIT_S - 0.1)
    assert not drain.up()
    c.pass_time(0.1)
    assert drain.up()


def test_a_starved_driver_gets_the_bound_in_time_it_had_a_cpu():
    # Its threads waited for a CPU 80 % of the time: 2 s of wall was 0.4 s of running.
    c = Clocks()
    drain = c.clock()
    assert not drain.up()
    c.pass_time(DRAIN_WAIT_S, {1: 0.8})
    assert not drain.up()
    c.pass_time(DRAIN_WAIT_S * 4 - 0.5, {1: 0.8})
    assert not drain.up()
    c.pass_time(0.5, {1: 0.8})
    assert drain.up()


def test_the_longest_wait_of_any_thread_counts_not_the_readers_own():
    # The reader waits for the GIL (asleep); the thread holding it waits for a CPU. A thread born in the wait
    # counts all of its waits.
    c = Clocks()
    drain = c.clock()
    drain.up()
    c.pass_time(DRAIN_WAIT_S, {2: 0.1, 3: 0.9})
    assert not drain.up()
    c.pass_time(DRAIN_WAIT_S * 10, {3: 0.9})
    assert drain.up()


def test_however_starved_the_exit_is_told_after_the_wall_limit():
    c = Clocks()
    drain = c.clock()
    drain.up()
    c.pass_time(DRAIN_WALL_LIMIT_S - 0.1, {1: 1.0})
    assert not drain.up()
    c.pass_time(0.1, {1: 1.0})
    assert drain.up()


def test_output_that_moves_on_starts_a_new_wait_within_the_same_wall_limit():
    c = Clocks()
    drain = c.clock()
    exited = c.now
    assert not drain.up(exited)
    c.pass_time(1.5)
    read_at = c.now  # a line forwarded
    c.pass_time(1.0)
    assert not drain.up(read_at)  # 1 s since the line, though 2.5 s since the exit
    c.pass_time(1.0)
    assert drain.up(read_at)
    # Lines keep coming, each within the bound: the wall limit still ends the wait.
    later = c.clock()
    start = c.now
    later.up(start)
    while c.now - start < DRAIN_WALL_LIMIT_S - 1:
        c.pass_time(1.0)
        assert not later.up(c.now - 0.5)
    c.pass_time(1.0)
    assert later.up(c.now - 0.5)


def test_a_wait_first_seen_late_counts_the_wall_time_before_it():
    # poll() first saw the exit 3 s after the output's last line: nothing to say those 3 s were starved.
    c = Clocks()
    drain = c.clock()
    assert drain.up(c.now - DRAIN_WAIT_S - 1.0)


def test_without_the_kernels_figures_the_bound_is_wall_time():
    c = Clocks()
    drain = DrainClock(lambda: c.now, dict)
    drain.up()
    c.pass_time(DRAIN_WAIT_S)
    assert drain.up()


_COMPETE = r"""
import json, os, sys, threading, time
sys.path.insert(0, sys.argv[1])
from cloud_elastic.driver.launch.drain import cpu_waits
os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
hog = None
if sys.argv[2] == "hog":
    import subprocess
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])  # same CPU: the affinity is inherited
    time.sleep(0.3)
me = threading.get_native_id()
before = cpu_waits()[me]
end = time.monotonic() + 1.0
if sys.argv[2] == "hog":
    while time.monotonic() < end:  # wants the CPU all the time, as a starved reader does
        pass
else:
    time.sleep(1.0)
waited = (cpu_waits()[me] - before) / 1e9
if hog is not None:
    hog.kill()
print(json.dumps({"waited": waited}))
"""


@pytest.mark.timeout(60)
@pytest.mark.skipif(not os.path.exists(f"/proc/self/task/{threading.get_native_id()}/schedstat"),
                    reason="this kernel keeps no schedstat: the bound is wall time there (the test above)")
def test_the_kernel_counts_a_threads_wait_for_a_cpu_it_shares_with_a_hog_and_none_for_a_sleeping_one():
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    results = {}
    for how in ("sleep", "hog"):
        out = subprocess.run([sys.executable, "-c", _COMPETE, repo, how], capture_output=True, text=True, timeout=50)
        assert out.returncode == 0, out.stderr
        results[how] = json.loads(out.stdout)["waited"]
    assert results["sleep"] < 0.1
    assert results["hog"] > 0.25  # about half of the second, sharing one CPU with a busy loop
    assert cpu_waits()  # this process's threads, read the same way
