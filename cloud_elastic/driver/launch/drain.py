"""How long a worker's exit may wait for its output: :data:`DRAIN_WAIT_S`, counted in time the driver had a CPU.

A worker's exit is told once the output it printed before it has been forwarded: its last lines are often why it
ended, and the job's end line names them. So that a stalled reader of the driver's own output (a pager, a stopped
terminal) cannot hold a job's recovery up, the wait has a bound. Counted on the wall clock, that bound also ran out
on a driver starved of CPU, whose reader thread waited for a processor rather than for the output: a clean clone's
test suite on two cores, at a load of 15, told an exit with 499 of its worker's 500 lines forwarded, the last one
after it; on an overloaded driver VM, a job's end line would lack the error a worker printed last.

Each launcher counts from its own start: the local one from the exit first seen (a backlog that keeps moving to a
slow terminal must not hold a recovery up), the SSH one from the later of the exit's marker and the last line
forwarded (ssh holds up to its channel's window of output that the driver has not read yet).
:class:`DrainClock` counts the wall time less the time this process's threads spent waiting for a CPU in it (the
kernel's ``/proc/self/task/*/schedstat``, whose second field is that wait), their waits added up: threads that hand
the GIL to one another split a starved process's wait between them, so that the longest wait of any one thread
undercounts it; the sum may overcount, and an exit on an overloaded driver then waits longer than it needs, never
less. A reader stalled on the driver's stdout sleeps in its write: on an idle driver the bound is
:data:`DRAIN_WAIT_S` of wall time, on a busy one a little more (its other threads queue for a CPU too), and whatever
the load at most :data:`DRAIN_WALL_LIMIT_S` of wall time. On a kernel that does not say, it is wall time.
The threads' waits are read at most every :data:`SAMPLE_EVERY_S` for all clocks together (a directory listing and a
file per thread), however many exits wait at once.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Callable

__all__ = ["DRAIN_WAIT_S", "DRAIN_WALL_LIMIT_S", "SAMPLE_EVERY_S", "DrainClock", "cpu_waits", "recent_cpu_waits"]

#: How long an exit waits for the output before it, in time the driver's threads had a CPU.
DRAIN_WAIT_S = 2.0
#: The longest an exit waits for its output in wall time, however starved the driver is.
DRAIN_WALL_LIMIT_S = 30.0
#: The threads' CPU waits are read anew at most this often (:func:`recent_cpu_waits`).
SAMPLE_EVERY_S = 0.1


def cpu_waits() -> dict[int, int]:
    """Nanoseconds each thread of this process has waited for a CPU so far, by thread id; empty where the kernel
    does not say (no ``schedstat``)."""
    waits: dict[int, int] = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return waits
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/schedstat", "rb") as f:
                waits[int(tid)] = int(f.read().split()[1])
        except (OSError, ValueError, IndexError):  # the thread ended meanwhile, or no schedstat
            continue
    return waits


_sample: tuple[float, dict[int, int]] = (-SAMPLE_EVERY_S, {})
_sample_lock = threading.Lock()


def recent_cpu_waits() -> dict[int, int]:
    """:func:`cpu_waits` as read at most :data:`SAMPLE_EVERY_S` ago, by any caller."""
    global _sample
    with _sample_lock:
        now = time.monotonic()
        if now - _sample[0] >= SAMPLE_EVERY_S:
            _sample = (now, cpu_waits())
        return _sample[1]


class DrainClock:
    """The bound on one exit's wait for its output. :meth:`up` starts it at its first call.

    ``clock`` (seconds) and ``waits`` (:func:`recent_cpu_waits`) are the real ones except in tests.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 waits: Callable[[], dict[int, int]] = recent_cpu_waits) -> None:
        self._clock, self._waits = clock, waits
        self._first: float | None = None  # the first call: the wall-time limit counts from here
        self._since = 0.0  # the start of the current wait (the exit seen, or the output's last progress)
        self._base: dict[int, int] = {}
        self._last: dict[int, int] = {}  # the waits at the previous call

    def up(self, since: float | None = None) -> bool:
        """Whether the exit has waited long enough: :data:`DRAIN_WAIT_S` of its wall time since ``since`` (the
        exit, or the output's last progress; None: now, at the first call) beyond what the threads waited for a CPU
        meanwhile, counted from the call before the one that first saw ``since`` (a poll that comes late on a
        starved driver still counts the waits before it); or :data:`DRAIN_WALL_LIMIT_S` since the first call."""
        now, waits = self._clock(), self._waits()
        if self._first is None:
            self._first = now
            self._since, self._base = (now if since is None else since), waits
        elif since is not None and since > self._since:  # the output moved on: a new wait from there, its waits
            self._since, self._base = since, self._last  # counted from the call before (it may be seen late)
        self._last = waits
        if now - self._first >= DRAIN_WALL_LIMIT_S:
            return True
        starved = sum(max(n - self._base.get(tid, 0), 0) for tid, n in waits.items()) / 1e9
        return now - self._since - starved >= DRAIN_WAIT_S
