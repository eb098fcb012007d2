"""The stacks a worker prints when the driver asks by signal, gathered from its output for the events file.

A worker given up for silence, or stuck where the control plane cannot reach it
(its interpreter held by native code), cannot send its stacks over a heartbeat.
The driver then signals it (SIGUSR1, over SSH through the remote wrapper) and
``faulthandler`` prints every thread's stack on the worker's stderr, from C,
even with the interpreter stuck. Those lines reach the driver's log like any
output; :class:`SignalStacks` also keeps the ones that are ``faulthandler``'s,
from the signal until the worker, killed a second later, has ended (3 s at most),
so that the driver records them as a ``stacks`` event (``via: "signal"``).
"""

from __future__ import annotations

import re
import threading

__all__ = ["SignalStacks", "MAX_TEXT"]

#: The most of a worker's stacks kept for one event (the end of them, as for stacks sent by heartbeat).
MAX_TEXT = 48 * 1024

#: The lines ``faulthandler.dump_traceback(all_threads=True)`` prints (CPython 3.8-3.13); ``...`` alone ends the
#: list past 100 threads (``stalls.main_frame`` then cannot tell the main thread's block).
_FAULTHANDLER = re.compile(
    r'^(?:(?:Current thread|Thread) 0x[0-9a-f]+ (?:\(most recent call first\))?:?|Stack \(most recent call first\):'
    r'|  File ".*", line \d+ in .*|  <no Python frame>|  \.\.\.|\.\.\.|  <.*>)$'
)


class SignalStacks:
    """Collects, per worker asked by signal, the ``faulthandler`` lines of its output. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[str, list[str]] = {}

    def expect(self, worker_id: str) -> None:
        """The worker was just signalled: its following stack lines are kept."""
        with self._lock:
            self._open[worker_id] = []

    def offer(self, worker_id: str, line: str) -> None:
        """A line of the worker's output (cheap when nothing is expected of it)."""
        if worker_id not in self._open:
            return
        line = line.rstrip("\r\n")
        if _FAULTHANDLER.match(line):
            with self._lock:
                kept = self._open.get(worker_id)
                if kept is not None:
                    kept.append(line)

    def take(self, worker_id: str) -> str:
        """The stacks gathered since :meth:`expect` (the last ``MAX_TEXT`` characters); stops gathering."""
        with self._lock:
            kept = self._open.pop(worker_id, [])
        return "\n".join(kept)[-MAX_TEXT:]
