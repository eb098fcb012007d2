"""The driver's own heartbeat: a thread that only reads the job's running clock, so stalls are measured right.

The job judges worker silence over the time the driver itself was running
(:class:`~cloud_elastic.driver.job.liveness.RunningClock`): a gap between two readings of that
clock longer than a second means the driver did not run (a GC pause, a throttled VM, SIGSTOP),
and that time is not held against the workers. The loop thread cannot promise such readings by
itself: it does blocking work of its own (the first discovery, starting the fork server,
launching and stopping workers), and before any worker heartbeats nothing else reads the clock,
so that work would read as stalls. :class:`Pulse` reads it every ``interval_s`` from a thread of
its own: busy threads do not delay it; a paused, starved or swapped process delays it as much as
every other thread, and only then is a stall counted.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

__all__ = ["Pulse"]

log = logging.getLogger(__name__)


class Pulse:
    """Calls ``beat()`` every ``interval_s`` from a thread of its own, between ``start()`` and ``close()``.

    The driver's beat reads its running clock (under the job lock), so that a gap between two
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
