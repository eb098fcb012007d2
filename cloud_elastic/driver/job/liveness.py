"""Judging worker silence only over time the driver itself was running.

A driver that stalls (a long GC pause, a swapped or throttled VM, SIGSTOP)
hears nothing from its workers while it stalls, through no fault of theirs.
Measured on the wall clock, every worker would look silent afterwards and be
given up at once. :class:`RunningClock` subtracts such stalls: the driver
calls it at least every few tens of milliseconds (its loop ticks every 50 ms),
so a gap between two calls longer than ``max_gap_s`` can only mean that the
driver was not running, and the excess is not counted.

The driver's loop thread cannot promise such calls by itself: it does blocking
work of its own (the first discovery, which may run a script or import a cloud
SDK; starting the fork server and launching workers; stopping them). Before
any worker heartbeats, nothing else calls the clock either, so that work read
as stalls: every job printed lines of "the driver did not run for 1.0s" before
its first round, on an idle machine, and the busy time was excused for workers.
:class:`Pulse` is the driver's own heartbeat: a thread that does nothing but
call the clock every ``interval_s``. Busy threads do not delay it; a paused,
starved or swapped process delays it as much as every other thread, and only
then is a stall counted.

:class:`SilenceWatch` finds the workers to give up: registered ones silent past
the heartbeat timeout (in running time; past :data:`EXIT_GRACE_S` once a worker
said it is past its exit hooks), and ones that never registered within the
start timeout. It is called every step with every live worker, so it skips
the scan exactly when nobody can have become overdue since the last one.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable, Iterable

from cloud_elastic.driver.job.workers import WorkerRecord, WorkerState

__all__ = ["EXIT_GRACE_S", "Pulse", "RunningClock", "SilenceWatch"]

#: How long a worker that said it is past its exit hooks (``exiting``) may stay silent before its process has
#: ended (the heartbeat timeout, if longer): the interpreter's teardown (freeing CUDA, joining native threads)
#: can take seconds on a loaded host, and a worker on its way out is not a silent one.
EXIT_GRACE_S = 60.0

log = logging.getLogger(__name__)


class RunningClock:
    """Maps monotonic time to the driver's running time (monotonic minus its own stalls)."""

    def __init__(self, max_gap_s: float = 1.0) -> None:
        self.max_gap_s = max_gap_s
        self.stalled_s = 0.0
        self._last: float | None = None

    def __call__(self, now: float) -> float:
        """Running time at ``now``; a call after a stall adds the stall to :attr:`stalled_s`."""
        if self._last is not None:
            gap = now - self._last
            if gap > self.max_gap_s:
                self.stalled_s += gap - self.max_gap_s
                log.warning(
                    "the driver did not run for %.1fs (paused, starved or swapped); "
                    "worker silence during that time is not held against the workers", gap,
                )
        if self._last is None or now > self._last:
            self._last = now
        return now - self.stalled_s


class Pulse:
    """Calls ``beat()`` every ``interval_s`` from a thread of its own, between ``start()`` and ``close()``.

    The driver's beat reads its :class:`RunningClock` (under the job lock), so that a gap between two
    readings means the whole process did not run, never that one of its threads was busy. ``beat`` must
    not raise; an exception is logged and the pulse goes on.
    """

    def __init__(self, beat: Callable[[], None], interval_s: float = 0.1) -> None:
        self._beat = beat
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="driver-pulse", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the thread and wait for it (at most one beat)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self._beat()
            except Exception:  # the pulse must outlive a bug in one beat; the job's own checks go on
                log.exception("the driver's pulse failed")


class SilenceWatch:
    """Which live workers are overdue: silent past ``heartbeat_timeout_s`` or unregistered past ``start_timeout_s``.

    ``last_seen`` only grows and ``launched_at`` never changes, so after a scan
    nobody can become overdue before the earliest due time it saw unless a
    worker is born; :meth:`overdue` skips the scan until then. Workers that
    completed their training function are never overdue (they are exiting).
    """

    def __init__(self, heartbeat_timeout_s: float, start_timeout_s: float) -> None:
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.start_timeout_s = start_timeout_s
        self._silence_due = float("-inf")  # running time before which no registered worker can be overdue
        self._start_due = float("-inf")  # time before which no unregistered worker can be overdue
        self._born = -1  # workers ever recorded, as of the last scan

    def overdue(self, alive: Iterable[WorkerRecord], born: int, now: float,
                running_now: float) -> list[tuple[WorkerRecord, str]]:
        """The workers of ``alive`` to give up, each with what it did wrong.

        ``born`` counts the job's workers ever recorded (a birth invalidates the
        shortcut); ``now`` is the monotonic time and ``running_now`` the
        driver's running time at ``now`` (see :class:`RunningClock`).
        """
        if born == self._born and running_now <= self._silence_due and now <= self._start_due:
            return []
        timeout, start_timeout = self.heartbeat_timeout_s, self.start_timeout_s
        # A worker that registers after this scan has last_seen >= running_now: no bound beyond now + timeout.
        silence_due, start_due = running_now + timeout, float("inf")
        found = []
        for w in alive:
            if w.state is WorkerState.COMPLETED:
                continue
            if w.state is not WorkerState.STARTING:  # registered
                silent = running_now - w.last_seen
                allowed = timeout if w.exiting_at is None else max(timeout, EXIT_GRACE_S)
                if silent > allowed:
                    found.append((w, f"stopped answering heartbeats for {silent:.1f}s" if w.exiting_at is None
                                  else f"has been exiting for {silent:.1f}s and its process has not ended"))
                elif w.last_seen + allowed < silence_due:
                    silence_due = w.last_seen + allowed
            elif now - w.launched_at > start_timeout:
                found.append((w, f"did not reach rendezvous within {start_timeout:g}s"))
            elif w.launched_at + start_timeout < start_due:
                start_due = w.launched_at + start_timeout
        self._silence_due, self._start_due, self._born = silence_due, start_due, born
        return found
