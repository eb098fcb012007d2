"""Judging worker silence only over time the driver itself was running.

A driver that stalls (a long GC pause, a swapped or throttled VM, SIGSTOP)
hears nothing from its workers while it stalls, through no fault of theirs.
Measured on the wall clock, every worker would look silent afterwards and be
given up at once. :class:`RunningClock` subtracts such stalls: the driver
calls it at least every few tens of milliseconds (its loop ticks every 50 ms),
so a gap between two calls longer than ``max_gap_s`` can only mean that the
driver was not running, and the excess is not counted.
"""

from __future__ import annotations

import logging

__all__ = ["RunningClock"]

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
