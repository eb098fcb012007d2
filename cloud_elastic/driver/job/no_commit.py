"""An elastic job that trains without ever committing: said once, while it trains, and when it stops.

A training function inside ``hvd.elastic.run`` that never calls ``state.commit()`` trains, but nothing it trains
is kept: a failure rolls the survivors back to the initial state, a newcomer is admitted only at a commit (so it
waits for ever), and ``--checkpoint-dir`` has nothing to write. Nothing of that is an error the driver may act on
(a job that commits once an epoch has simply not reached its first commit yet), so :class:`NoCommitWatch` only
says so, in the driver's log:

* **once, while it trains**: when a member inside ``hvd.elastic.run`` has taken optimizer steps for
  :data:`NO_COMMIT_WARN_S`, or for ``--checkpoint-interval`` if shorter (a checkpoint is due, with nothing to
  write), and no worker has committed;
* **when a signal stops it** with ``--checkpoint-dir`` (:meth:`NoCommitWatch.stop_note`): the interrupt line says
  that nothing was checkpointed and the same command trains from the start.

A rollback to the initial state after steps were taken says so in its own line (``RoundFormation``).

Pure logic: no clock, thread or socket; ``now`` is passed in.
"""

from __future__ import annotations

import logging
from typing import Callable

from cloud_elastic.driver.job.view import JobView
from cloud_elastic.driver.job.workers import MEMBER_STATES, WorkerRecord

__all__ = ["NoCommitWatch", "NO_COMMIT_WARN_S", "ASK"]

log = logging.getLogger(__name__)

#: How long members may train inside ``hvd.elastic.run`` without any commit before the driver warns (once).
NO_COMMIT_WARN_S = 300.0

#: The question every line of this module ends with.
ASK = "does the training function call state.commit()?"


class NoCommitWatch:
    """Whether an elastic job has trained without a commit, and for how long (see module docstring)."""

    def __init__(self, job: JobView, elastic: Callable[[], bool], checkpoint_interval_s: float | None = None) -> None:
        self._job = job
        self._elastic = elastic  # a worker said it entered hvd.elastic.run (FixedSize.elastic)
        self._limit = min(NO_COMMIT_WARN_S, checkpoint_interval_s or NO_COMMIT_WARN_S)
        self._since: float | None = None  # when a member inside elastic.run was first heard to have stepped
        self.warned = False

    def heard(self, w: WorkerRecord, now: float) -> None:
        """``w``'s heartbeat (its ``steps`` and the job's commits as it told them): warn once when due."""
        job = self._job
        if self.warned or job.state_committed or w.state not in MEMBER_STATES or w.steps <= 0 or not self._elastic():
            return
        if self._since is None:
            self._since = now
            return
        if now - self._since < self._limit:
            return
        self.warned = True
        due = (f"; a checkpoint is due every {self._limit:g}s (--checkpoint-interval) and there is nothing to write"
               if job.policy.checkpointing and self._limit < NO_COMMIT_WARN_S else "")
        log.warning("job %s: the workers have trained inside hvd.elastic.run for %.0fs (%d optimizer step(s) on %s) "
                    "and none has committed: a failure rolls every survivor back to the initial state, a new "
                    "worker is admitted only at a commit, and nothing can be checkpointed%s (%s)", job.job_id,
                    now - self._since, w.steps, w.label, due, ASK)

    def stop_note(self) -> str:
        """What a stop by signal adds to its line: '' unless the job checkpoints, a worker trained inside
        ``hvd.elastic.run`` and none committed (so the stop saved nothing)."""
        job = self._job
        if not job.policy.checkpointing or job.state_committed or not self._elastic() or self._since is None:
            return ""
        return (f"; no commit was ever made ({ASK}), so nothing was checkpointed: the same command trains from the "
                "start")
