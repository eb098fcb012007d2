"""A job that fails while a worker holds a commit newer than the last checkpoint: that commit is checkpointed first.

A failure ending (fewer than ``--min-np`` workers past ``--elastic-timeout``, ``--reset-limit`` exceeded, a round
that keeps failing to form, discovery never answering, any other ``ElasticJob.end`` that is not a success) used to
stop every worker at once: the survivors' commits since the last periodic checkpoint were thrown away, and the
rerun repeated them without a word. :class:`FailingEnd` sends such an ending through the path a SIGINT's graceful
stop takes (:class:`~.stopping.GracefulStop`, with ``failing``): the same writer choice (the holders of the newest
commit, one host of them writing, see :meth:`.leaving.Leavers.left_round`), the same budget
(:data:`~.stopping.STOP_GRACE_S`); the job then ends with the failure's reason and exit code, and its end line says
which checkpoint the same command resumes from.

It does so only with ``--checkpoint-dir``, once a commit was heard of, while the job runs (not while it finishes:
rank 0's training function returned and it writes the final checkpoint itself), and only when a live worker holds
a commit newer than the newest checkpoint reported stored (or loaded by a round resuming from it): a worker
waiting at rendezvous, or a round member (its round is aborted, not drained at its next commit as under a signal:
a failing round may never commit again, a stalled collective; it rolls back to its last commit and leaves from
rendezvous with it, once every member is back or half the stop's time is up: members may come back one commit
apart, see :meth:`.stopping.GracefulStop.release`). A worker holding an older commit than another never writes
(progress is sacred: checkpoints are named in the order they are written, so its checkpoint would pass for the
job's last).
Otherwise the job ends at once, its end line still saying what the same command resumes from. A failure ending
asked again while the job runs and a graceful stop (a failure's or a signal's) is under way is logged and left to
the stop, which ends the job (discovery retried every second would otherwise cut the writer's time to a second).
"""

from __future__ import annotations

import logging

from cloud_elastic.driver.job.actions import Phase
from cloud_elastic.driver.job.leaving import Leavers
from cloud_elastic.driver.job.stopping import STOP_GRACE_S, GracefulStop
from cloud_elastic.driver.job.view import JobView
from cloud_elastic.driver.job.workers import WorkerState

__all__ = ["FailingEnd"]

log = logging.getLogger(__name__)

S = WorkerState


class FailingEnd:
    """How a failure ends one job (see module docstring)."""

    def __init__(self, job: JobView, stopping: GracefulStop, leavers: Leavers) -> None:
        self._job = job
        self._stopping = stopping
        self._leavers = leavers
        self._said: set[str] = set()  # failures logged during the stop (a few: one may repeat every second)

    def route(self, reason: str, exit_code: int, now: float | None) -> str | None:
        """The job fails (``reason``, ``exit_code``) at ``now`` (None: not known, the job ends at once). None when
        the holders of the last commit checkpoint it first (the job ends later, from the graceful stop, whose end
        line says what the next run resumes from), or a graceful stop is under way (a signal's or a failure's: it
        ends the job, once the holders have left or its time is up); else the reason to end with now."""
        job = self._job
        if self._stopping.active and job.phase is Phase.RUNNING:
            # The stop ends the job (its end line says what was kept): a failure seen again during it (discovery
            # retried every second, a check repeated each step) must not cut the holders' checkpoint short.
            if len(self._said) < 8 and reason not in self._said:
                self._said.add(reason)
                log.warning("job %s: %s: the job is already ending: the workers holding its last commit are leaving "
                            "with it", job.job_id, reason)
            return None
        if not job.policy.checkpointing or not job.state_committed or self._stopping.active:
            return reason  # nothing to keep, or training completed during the stop (a failure of it ends it now)
        if now is not None and self._holds_more() and self._stopping.begin(reason, exit_code, now, STOP_GRACE_S,
                                                                             failing=True):
            return None
        return f"{reason}; {self.resumes_from()}"

    def _holds_more(self) -> bool:
        """A live worker at rendezvous or in the round (a parked member drained by a notice too) holds a commit newer
        than the newest checkpoint reported stored (a member's as its heartbeats told it: up to one interval late)."""
        newest = self._leavers.newest_checkpoint
        stored = newest[1] if newest is not None else -1
        return any((w.state is S.WAITING or w.state is S.RUNNING or (w.returned and w.state is S.DRAINING))
                   and w.holds_state and w.commit_seq > stored for w in self._job.alive())

    def resumes_from(self) -> str:
        """What the same command resumes from, for a job ending at once (no worker left holding a newer commit)."""
        newest, last = self._leavers.newest_checkpoint, self._job.commit_high
        if newest is None:
            since = f", and redoes the steps committed after it (the last commit heard of: {last})" if last else ""
            return ("no checkpoint was reported stored by this driver: the same command resumes from the latest "
                    f"checkpoint in --checkpoint-dir, if any{since}")
        step, seq = newest
        if seq >= last:
            return f"the checkpoint of step {step} holds the last commit: the same command resumes from it"
        return (f"the same command resumes from the checkpoint of step {step}, and redoes the {last - seq} committed "
                "step(s) after it")
