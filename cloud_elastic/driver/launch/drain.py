"""How long a worker's exit may wait for its output: :data:`DRAIN_WAIT_S`, counted in time the driver had a CPU.

A worker's exit is told once the output it printed before it has been forwarded: its last lines are often why it
ended, and the job's end line names them. So that a stalled reader of the driver's own output (a pager, a stopped
terminal) cannot hold a job's recovery up, the wait has a bound. Counted on the wall clock, that bound also ran out
on a driver starved of CPU, whose reader thread waited for a processor rather than for the output: a clean clone's
test suite on two cores, at a load of 15, told an exit with 499 of its worker's 500 lines forwarded, the last one
after it; on an overloaded driver VM, a job's end line would lack the error a worker printed last.

:class:`DrainClock` counts the wall time less the longest time any one of this process's threads spent waiting
for a CPU in it (the kernel's ``/proc/self/task/*/schedstat``, whose second field is that wait): the reader of a
stalled terminal sleeps in its write and the bound is :data:`DRAIN_WAIT_S` as before, a starved one runs late and
the bound stretches with it, up to :data:`DRAIN_WALL_LIMIT_S` of wall time whatever the load. A thread waiting for
the GIL sleeps, but the thread that holds the GIL then waits for a CPU if the process is starved: hence the
longest wait of any thread, not the reader's own. On a kernel that does not say, the bound is wall time.
"""

from __future__ import annotations

import os
import time
from typing import Callable

__all__ = ["DRAIN_WAIT_S", "DRAIN_WALL_LIMIT_S", "DrainClock", "cpu_waits"]

#: How long an exit waits for the output before it, in time the driver's threads had a CPU.
DRAIN_WAIT_S = 2.0
#: The longest an exit waits for its output in wall time, however starved the driver is.
DRAIN_WALL_LIMIT_S = 30.0


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


class DrainClock:
    """The bound on one exit's wait for its output. :meth:`up` starts it at its first call.

    ``clock`` (seconds) and ``waits`` (:func:`cpu_waits`) are the real ones except in tests.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 waits: Callable[[], dict[int, int]] = cpu_waits) -> None:
        self._clock, self._waits = clock, waits
        self._first: float | None = None  # the first call: the wall-time limit counts from here
        self._since = 0.0  # the start of the current wait (the exit seen, or the output's last progress)
        self._base: dict[int, int] = {}

    def up(self, since: float | None = None) -> bool:
        """Whether the exit has waited long enough: :data:`DRAIN_WAIT_S` of its wall time since ``since`` (the
        output's last progress; None: the first call) beyond the longest CPU wait of any thread, measured from
        the call that first saw ``since``; or :data:`DRAIN_WALL_LIMIT_S` since the first call."""
        now = self._clock()
        if self._first is None:
            self._first = now
            self._since, self._base = (now if since is None else since), self._waits()
        elif since is not None and since > self._since:  # the output moved on: a new wait from there
            self._since, self._base = since, self._waits()
        if now - self._first >= DRAIN_WALL_LIMIT_S:
            return True
        waited = now - self._since
        if waited < DRAIN_WAIT_S:
            return False
        waits = self._waits()
        starved = max((n - self._base.get(tid, 0) for tid, n in waits.items()), default=0) / 1e9
        return waited - min(starved, waited) >= DRAIN_WAIT_S
