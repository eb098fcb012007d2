"""What the driver's no-progress watch sees of a worker, and the stacks it asks for when a round is stuck.

A round can stop making progress while every member still heartbeats: members
in different collectives, a training thread blocked in native code. The driver
finds that from one number per worker, :attr:`Progress.count`, sent with every
heartbeat. It grows when the worker

* commits, takes an optimizer step, or completes a collective;
* or, sampled by the heartbeat thread, its training thread has moved on since
  the last sample while it was not waiting in a collective: it used CPU time,
  or its innermost Python frame or instruction changed (long forward passes,
  evaluation, ``torch.compile``: computing is progress).

A training thread blocked in one native call (a destructor joining a thread, a
store wait, a deadlock) uses no CPU and keeps the same innermost frame and
instruction, and a thread waiting in a collective is not counted: such a
round's counters all stand still, and the driver aborts it after
``--progress-timeout``, first asking every member for its stacks
(:func:`format_stacks`).

It also measures the worker's own *compute time* per optimizer step: the time
between two steps minus the time spent waiting on peers in collectives (the
gradient allreduce included). A slow worker has a long compute time and short
waits; its peers, the opposite. The median of the last :data:`RECENT_STEPS`
steps of the round goes to the driver with each heartbeat (see the driver's
straggler rule), and so does the median of their *communication time*, the
waits themselves: a slow network shows there, on every rank alike (see the
driver's slow-network rule, ``driver.job.links``).
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
from collections import deque
from contextlib import contextmanager
from typing import Iterator

from cloud_elastic.protocol_reports import StacksReport

__all__ = ["Progress", "format_stacks", "RECENT_STEPS"]

#: Steps the rolling compute time is the median of.
RECENT_STEPS = 16


class Progress:
    """One worker's progress counter (thread-safe enough: increments from the training thread and, for a digest
    pass, a checkpoint writer's; reads from another. A lost increment or one read out of order only changes the
    count, and the driver asks only whether it changed)."""

    def __init__(self) -> None:
        self.count = 0
        self.steps = 0
        self._waiting_since: float | None = None
        self._thread: int | None = None
        self._native: int | None = None
        self._last_seen: tuple[int, int, int] | None = None
        self._step_started: float | None = None
        self._waited = 0.0  # in collectives since the last step
        self._recent: deque[float] = deque(maxlen=RECENT_STEPS)
        self._recent_comm: deque[float] = deque(maxlen=RECENT_STEPS)

    def mark(self) -> None:
        """Something completed (a commit, a collective, a sync)."""
        self.count += 1

    def step(self, now: float | None = None) -> None:
        """An optimizer step completed: the time since the previous one, less its waits, was computing;
        the waits were communication."""
        self.steps += 1
        self.count += 1
        now = time.monotonic() if now is None else now
        if self._step_started is not None:
            self._recent.append(max(0.0, now - self._step_started - self._waited))
            self._recent_comm.append(self._waited)
        self._step_started, self._waited = now, 0.0

    def new_round(self) -> None:
        """A round formed: its first step (warm-up, a state sync before it) is not a step of the loop."""
        self._step_started, self._waited = None, 0.0
        self._recent.clear()
        self._recent_comm.clear()

    def compute_s(self) -> float | None:
        """The median compute time of the recent steps of this round; None before three of them."""
        recent = list(self._recent)
        return statistics.median(recent) if len(recent) >= 3 else None

    def comm_s(self) -> float | None:
        """The median time in collectives of the recent steps of this round; None before three of them."""
        recent = list(self._recent_comm)
        return statistics.median(recent) if len(recent) >= 3 else None

    def watch_thread(self) -> None:
        """Sample the calling thread as the training thread."""
        self._thread, self._native = threading.get_ident(), threading.get_native_id()

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
                self._waited += time.monotonic() - self._waiting_since
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
        seen = None if frame is None else (id(frame), frame.f_lasti, _cpu_ticks(self._native))
        if seen is not None and seen != self._last_seen:
            self.count += 1
        self._last_seen = seen
        return self.count


def _cpu_ticks(native_id: int | None) -> int:
    """CPU time a thread of this process has used, in clock ticks (0 where /proc cannot tell)."""
    try:
        with open(f"/proc/self/task/{native_id}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime + stime (fields 14 and 15 of stat)
    except (OSError, IndexError, ValueError):
        return 0


#: At most this many threads' stacks, and this many frames of each (``faulthandler``'s own limits).
MAX_THREADS = 100
MAX_FRAMES = 100


def format_stacks() -> str:
    """Every thread's Python stack in ``faulthandler``'s text (one block per thread, most recent call first,
    blocks apart by a blank line), the main thread's block last and marked (``StacksReport.MAIN_THREAD``) (works while other threads are stuck).

    Not ``faulthandler.dump_traceback`` itself: it writes the newest threads first and stops at
    :data:`MAX_THREADS`, so in a worker with more threads (a loader's pool, a client library's) the training
    thread, the oldest, was left out of the stacks of a stuck round; and the report keeps the text's end
    (``StacksReport``), so the main thread goes last. It needs no file either (a full disk)."""
    frames = sys._current_frames()
    main, current = threading.main_thread().ident, threading.get_ident()
    others = [ident for ident in frames if ident != main]
    shown = others[:MAX_THREADS - 1] + ([main] if main in frames else [])  # the newest first, as faulthandler
    hidden = len(frames) - len(shown)
    blocks = [f"... {hidden} more thread(s) not shown"] if hidden else []
    for ident in shown:
        label = f"{'Current thread' if ident == current else 'Thread'} 0x{ident:016x}"
        lines = [f"{label} ({StacksReport.MAIN_THREAD + '; ' if ident == main else ''}most recent call first):"]
        frame = frames[ident]
        while frame is not None and len(lines) <= MAX_FRAMES:
            lines.append(f'  File "{frame.f_code.co_filename}", line {frame.f_lineno} in {frame.f_code.co_name}')
            frame = frame.f_back
        if frame is not None:
            lines.append("  ...")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"
