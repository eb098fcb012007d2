"""How long this worker's heartbeats can be held up while it is healthy: its garbage collector's pauses.

The heartbeat thread shares only the GIL with the training thread, and Python hands
the GIL over every few milliseconds, except inside one long C call. The common one in
a training process is a full garbage collection, which holds the GIL for the whole
scan: about 0.05-0.2 µs per allocated block on the 2-core benchmark machine (0.08 s for
a bare torch worker, 0.5-1.8 s with 3 million small objects, the longer when loaded).

:class:`GcPauses` tells the driver, with every heartbeat, the longest such pause to
expect (``pause_s``), so that its fast silence rule allows for it (see
``driver/job/liveness.py``). It is the larger of

* the longest full collection measured in this process over the last
  :data:`MEMORY_S` (``gc.callbacks``: two clock reads per collection, none
  allocated);
* a prior from the heap's size (``sys.getallocatedblocks()``, O(1)) at
  :data:`PRIOR_S_PER_BLOCK`, for the first collection of a heap that grew since.
"""

from __future__ import annotations

import gc
import sys
import time
from typing import Any

__all__ = ["GcPauses", "MEMORY_S", "PRIOR_S_PER_BLOCK"]

#: A measured pause is expected again for this long.
MEMORY_S = 600.0
#: Seconds of a full collection per allocated block, at the slow end of what was measured here (loaded).
PRIOR_S_PER_BLOCK = 0.2e-6


class GcPauses:
    """The longest GIL pause to expect from the garbage collector (see module docstring).

    ``start()`` hooks into ``gc.callbacks``, ``close()`` unhooks; :meth:`expected_s` may be
    called from any thread.
    """

    def __init__(self) -> None:
        self._started = 0.0
        self._longest = 0.0
        self._longest_at = float("-inf")

    def start(self) -> None:
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)

    def close(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if info["generation"] != 2:
            return
        now = time.monotonic()
        if phase == "start":
            self._started = now
            return
        took = now - self._started
        if took >= self._longest or now - self._longest_at > MEMORY_S:
            self._longest, self._longest_at = took, now

    def expected_s(self, now: float | None = None) -> float:
        """The longest pause to expect now, in seconds (rounded to the millisecond)."""
        now = time.monotonic() if now is None else now
        measured = self._longest if now - self._longest_at <= MEMORY_S else 0.0
        return round(max(measured, sys.getallocatedblocks() * PRIOR_S_PER_BLOCK), 3)
