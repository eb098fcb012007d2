"""driver/launch/drain.py: an exit waits for its output DRAIN_WAIT_S of the time the driver had a CPU, at most
DRAIN_WALL_LIMIT_S of wall time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest

from cloud_elastic.driver.launch.drain import DRAIN_WAIT_S, DRAIN_WALL_LIMIT_S, DrainClock, cpu_waits, recent_cpu_waits


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


def test_threads_that_take_turns_with_the_gil_add_up_their_waits():
    # The reader waits for the GIL (asleep) while the thread holding it waits for a CPU, then the other way round:
    # each shows under half of what the process waited. A thread born in the wait counts all of its waits.
    c = Clocks()
    drain = c.clock()
    drain.up()
    c.pass_time(DRAIN_WAIT_S * 5, {1: 0.45, 3: 0.45})
    assert not drain.up()  # 10 s of wall, 9 of them waited: 1 s had, where the longest single wait left 5.5
    c.pass_time(DRAIN_WAIT_S * 5, {1: 0.45, 3: 0.45})
    assert drain.up()


def test_a_new_wait_first_seen_late_counts_the_waits_since_the_call_before():
    # A line forwarded at 101; the starved driver's next poll comes 2.5 s later, its threads waiting 90 % of it.
    c = Clocks()
    drain = c.clock()
    drain.up(c.now)
    c.pass_time(1.0)
    line = c.now
    c.pass_time(2.5, {1: 0.9})
    assert not drain.up(line)  # 0.25 s of CPU since the line: its waits counted from the previous poll, not this one
    c.pass_time(20.0, {1: 0.9})
    assert drain.up(line)


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
    # Lines keep coming, each within the bound: the wall limit still ends the wait (a worker's child that prints on).
    later = c.clock()
    start = c.now
    later.up(start)
    while c.now - start < DRAIN_WALL_LIMIT_S - 1:
        c.pass_time(1.0)
        assert not later.up(c.now - 0.5)
    c.pass_time(1.0)
    assert later.up(c.now - 0.5)


def test_without_the_kernels_figures_the_bound_is_wall_time():
    c = Clocks()
    drain = DrainClock(lambda: c.now, dict)
    drain.up()
    c.pass_time(DRAIN_WAIT_S)
    assert drain.up()


_COMPETE = r"""
import json, os, sys, threading, time
sys.path.insert(0, sys.argv[1])
from cloud_elastic.driver.launch.drain import DRAIN_WAIT_S, DrainClock, cpu_waits
os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
hog = None
if sys.argv[2] == "hog":
    import subprocess
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])  # same CPU: the affinity is inherited
    time.sleep(0.3)
me = threading.get_native_id()
before = cpu_waits()[me]
drain = DrainClock()
drain.up()  # an exit seen, its output still to forward
end = time.monotonic() + DRAIN_WAIT_S + 0.5
if sys.argv[2] == "hog":
    while time.monotonic() < end:  # wants the CPU all the time, as a starved reader does
        pass
else:
    time.sleep(DRAIN_WAIT_S + 0.5)  # as a reader stalled in a write to the driver's stdout
up = drain.up()
waited = (cpu_waits()[me] - before) / 1e9
if hog is not None:
    hog.kill()
print(json.dumps({"waited": waited, "up": up}))
"""


@pytest.mark.timeout(60)
def _kernel_counts_waits() -> bool:
    """Whether this kernel keeps each thread's scheduling figures (its time on a CPU, never 0 for this thread)."""
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/schedstat") as f:
            return int(f.read().split()[0]) > 0
    except (OSError, ValueError, IndexError):
        return False


@pytest.mark.skipif(not _kernel_counts_waits(),
                    reason="this kernel keeps no schedstat: the bound is wall time there (the test above)")
def test_a_process_that_shares_its_cpu_with_a_busy_loop_gets_the_bound_later_and_a_sleeping_one_on_time():
    """Real processes and the kernel's own figures: 2.5 s of wall time are past the bound for a process whose
    thread slept, and not for one whose thread spun on a CPU it shared with a busy loop (half the time waiting)."""
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    results = {}
    for how in ("sleep", "hog"):
        out = subprocess.run([sys.executable, "-c", _COMPETE, repo, how], capture_output=True, text=True, timeout=50)
        assert out.returncode == 0, out.stderr
        results[how] = json.loads(out.stdout)
    assert results["sleep"]["waited"] < 0.2 and results["sleep"]["up"], results
    assert results["hog"]["waited"] > 0.5 and not results["hog"]["up"], results
    assert cpu_waits()  # this process's threads, read the same way
