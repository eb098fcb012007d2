"""Durable checkpoints that keep failing: said early, and the job ended when none can be written at all.

Rank 0 reports every checkpoint attempt that failed in a way a later attempt may mend (``not_written``:
storage it cannot read or write, credentials missing, a throttle) and every checkpoint written
(``saved``). :class:`CheckpointWatch` decides, for the job:

* the first failure of a run of failures is logged at WARNING with its reason, repeats at the 2nd, 4th,
  8th ... attempt (or when the reason changes, the checkpoint's own path aside), and the first checkpoint
  written after them at INFO;
* **no checkpoint written yet**: once attempts have failed without a break for
  :func:`give_up_after_s` (``max(3 × --checkpoint-interval, 60 s)``), at least :data:`MIN_ATTEMPTS`
  of them, the job ends (:meth:`CheckpointWatch.not_written` returns why): training on would make
  progress the user asked to keep and that could never be kept;
* **once one was written**, failures only warn: the latest checkpoint stays the one to resume from,
  storage that comes back is used at the next attempt, and a final checkpoint that cannot be written
  still fails the job at its end. One this driver did not see written counts too
  (:meth:`CheckpointWatch.one_exists`: a job resumed from a checkpoint, one rank 0 loaded): ending
  the job would lose everything trained since it.

A throttle that passes within the window ends nothing: one checkpoint written clears the run.
Pure logic: ``now`` is passed in.
"""

from __future__ import annotations

import logging
import re

__all__ = ["CheckpointWatch", "MIN_ATTEMPTS", "give_up_after_s"]

log = logging.getLogger(__name__)

#: Failed attempts in a row, at the least, before the job ends for want of any checkpoint.
MIN_ATTEMPTS = 3


# A quoted name or a path (``/a/b``, ``s3://b/k``, ``C:\\x``): each attempt names its own checkpoint.
_NAMES = re.compile(r"'[^']*'|\"[^\"]*\"|\S*[/\\]\S*")


def _gist(reason: str) -> str:
    """What stays of a failure's reason from one attempt to the next: without the names of the checkpoint."""
    return _NAMES.sub("<path>", reason)


def give_up_after_s(interval_s: float) -> float:
    """How long attempts may fail, with no checkpoint ever written, before the job ends."""
    return max(3 * interval_s, 60.0)


class CheckpointWatch:
    """The job's checkpoint attempts, as rank 0 reports them (see module docstring)."""

    def __init__(self, job_id: str, interval_s: float) -> None:
        self._job_id = job_id
        self._window_s = give_up_after_s(interval_s)
        self.written = 0
        self.exists = False  # a checkpoint of the job exists, written under this driver or before it
        self.failed_in_a_row = 0
        self._since: float | None = None  # the first failure of the current run
        self._reason = ""  # the last failure's _gist

    def saved(self, now: float) -> None:
        """A checkpoint was written: a run of failures ends."""
        self.written += 1
        self.exists = True
        if self.failed_in_a_row:
            log.info("job %s: checkpoint written again after %d failed attempt(s) over %.0fs", self._job_id,
                     self.failed_in_a_row, now - (self._since if self._since is not None else now))
        self.failed_in_a_row, self._since, self._reason = 0, None, ""

    def failing_for(self, now: float) -> float:
        """Seconds since the first failure of the current run (0 with none)."""
        return now - self._since if self._since is not None else 0.0

    def one_exists(self) -> None:
        """A checkpoint of the job exists that this driver did not see written: failures from now on only warn."""
        self.exists = True

    def not_written(self, reason: str, now: float) -> str | None:
        """One attempt failed: why the job must end now, or None while it goes on."""
        if self._since is None:
            self._since = now
        self.failed_in_a_row += 1
        count, lasted = self.failed_in_a_row, now - self._since
        if count == 1:
            then = (f"the job ends unless one is written within {self._window_s:.0f}s" if not self.exists
                    else "training goes on; the latest checkpoint written stays the one to resume from")
            log.warning("job %s: no checkpoint written: %s (%s)", self._job_id, reason, then)
        elif _gist(reason) != self._reason or count & (count - 1) == 0:
            log.warning("job %s: still no checkpoint written: %d attempt(s) in a row failed over %.0fs; last: %s",
                        self._job_id, count, lasted, reason)
        self._reason = _gist(reason)
        if not self.exists and count >= MIN_ATTEMPTS and lasted >= self._window_s:
            return f"{reason} (no checkpoint written in {lasted:.0f}s: {count} attempts failed)"
        return None
