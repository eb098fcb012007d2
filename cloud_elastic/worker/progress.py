"""What the driver's no-progress watch sees of a worker, and the stacks it asks for when a round is stuck.

A round can stop making progress while every member still heartbeats: members
in different collectives, a training thread blocked in native code. The driver
finds that from one number per worker, :attr:`Progress.count`, sent with every
heartbeat. It grows when the worker

* commits, takes an optimizer step, or completes a collective;
* or, sampled by the heartbeat thread, its training thread has moved on since
  the last sample while it was not waiting in a collective (long forward
  passes, evaluation, ``torch.compile``: Python code running is progress).

A training thread blocked in one native call (a destructor joining a thread, a
store wait, a deadlock) keeps the same innermost frame and instruction, and a
thread waiting in a collective is not counted: such a round's counters all
stand still, and the driver aborts it after ``--progress-timeout``, first
asking every member for its stacks (:func:`format_stacks`).
"""

from __future__ import annotations

import faulthandler
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from typing import Iterator

__all__ = ["Progress", "format_stacks"]


class Progress:
    """One worker's progress counter (thread-safe enough: increments from one thread, reads from another)."""

    def __init__(self) -> None:
        self.count = 0
        self.steps = 0
        self._waiting_since: float | None = None
        self._thread: int | None = None
        self._last_seen: tuple[int, int] | None = None

    def mark(self) -> None:
        """Something completed (a commit, a collective, a sync)."""
        self.count += 1

    def step(self) -> None:
        """An optimizer step completed."""
        self.steps += 1
        self.count += 1

    def watch_thread(self, ident: int | None = None) -> None:
        """Sample this thread (default: the caller's) as the training thread."""
        self._thread = threading.get_ident() if ident is None else ident

    @contextmanager
    def waiting(self) -> Iterator[None]:
        """The training thread waits on its peers here: time spent inside is not progress."""
        outer = self._waiting_since
        if outer is None:
            self._waiting_since = time.monotonic()
        try:
            yield
        finally:
            if outer is None:
                self._waiting_since = None

    def waiting_s(self, now: float | None = None) -> float:
        """How long the current wait has lasted (0.0 when not waiting)."""
        since = self._waiting_since
        return 0.0 if since is None else max(0.0, (time.monotonic() if now is None else now) - since)

    def sample(self) -> int:
        """Called by the heartbeat thread before each heartbeat: the counter, bumped if the thread moved on."""
        if self._thread is None or self._waiting_since is not None:
            self._last_seen = None
            return self.count
        frame = sys._current_frames().get(self._thread)
        seen = None if frame is None else (id(frame), frame.f_lasti)
        if seen is not None and seen != self._last_seen:
            self.count += 1
        self._last_seen = seen
        return self.count


def format_stacks() -> str:
    """Every thread's Python stack, as ``faulthandler`` writes it (works while other threads are stuck)."""
    with tempfile.TemporaryFile("w+") as f:
        faulthandler.dump_traceback(file=f, all_threads=True)
        f.seek(0)
        return f.read()
