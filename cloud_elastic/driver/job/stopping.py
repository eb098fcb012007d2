"""A job stopped by SIGINT or SIGTERM with ``--checkpoint-dir``: its workers stop at a commit, rank 0 checkpoints
that commit, and the job ends once they have exited or the stop's time is up.

A stop that killed the workers at once threw away every step since the last periodic checkpoint (up to
``--checkpoint-interval`` of work on every worker), although the state was in the workers' memory and a
driver killed outright (its workers checkpoint on their own while it is away) lost nothing.

:class:`GracefulStop` takes the path of the last holders of the state sent away with no successor (see
:mod:`.leaving`): every round member drains (it leaves at the next commit, every member at the same one: no
rollback), every worker holding the state is told to checkpoint the commit it leaves at
(:meth:`~.leaving.Leavers.checkpoint_on_leaving`, read into its ``ExitOrder.checkpoint_s``; rank 0 writes it),
the others are told to exit, and nothing launches or forms meanwhile. The job ends once no worker is left,
or ``grace_s`` after the signal (the runtime then stops what is left), with a reason that says which step
the newest checkpoint holds, or how many committed steps the next run redoes.

Without ``--checkpoint-dir``, or with no round running and no worker holding any state (nothing to keep), a
stop ends the job at once, as does a second signal during the graceful one.
"""

from __future__ import annotations

import logging
from cloud_elastic.driver.job.actions import Phase
from cloud_elastic.driver.job.formation import RoundFormation
from cloud_elastic.driver.job.leaving import Leavers
from cloud_elastic.driver.job.view import JobView
from cloud_elastic.driver.job.workers import WorkerState

__all__ = ["GracefulStop"]

log = logging.getLogger(__name__)

S = WorkerState


class GracefulStop:
    """The graceful stop of one job (see module docstring)."""

    def __init__(self, job: JobView, leavers: Leavers, rounds: RoundFormation) -> None:
        self._job = job
        self._leavers = leavers
        self._rounds = rounds
        self._ending: tuple[str, int, float] | None = None  # (reason, exit code, when it ends at the latest)

    @property
    def active(self) -> bool:
        """The job is stopping gracefully: nothing launches or forms, and :meth:`step` decides when it ends."""
        return self._ending is not None

    def begin(self, reason: str, exit_code: int, now: float, grace_s: float) -> bool:
        """A signal asks the job to end (``reason``, ``exit_code``), giving it ``grace_s`` to keep its state.

        Returns True when the job stops gracefully (it ends later, from :meth:`step`), False when it must end now.
        """
        job = self._job
        # The members (their heartbeats may not have told of their commits yet: they stop at one all the same), and
        # workers at rendezvous with a commit (a round being formed, after a failure).
        holders = job.members() + [w for w in job.alive() if w.state is S.WAITING and w.holds_state]
        if grace_s <= 0 or not job.policy.checkpointing or job.phase is not Phase.RUNNING or not holders:
            return False
        self._ending = (reason, exit_code, now + grace_s)
        why = f"the job is stopping: {reason}"
        for w in holders:
            self._leavers.checkpoint_on_leaving(w, now + job.wall_offset + grace_s)
        for w in job.active():
            self._leavers.send_away(w, why)  # a member drains; one at rendezvous gets its exit order; others stop
        for w in holders:
            if w.state is S.EXITING:  # it was waiting at rendezvous: its exit order says to checkpoint first
                self._leavers.left_round(w, now)
        job.forget_alive()
        log.warning("job %s: %s: the workers stop at their next commit and rank 0 checkpoints it (up to %gs); "
                    "a second signal stops them at once", job.job_id, reason, grace_s)
        if job.members():
            self._rounds.next.drop(why)  # a next round planned for newcomers: they are leaving too
            self._rounds.request_update(why)  # every member leaves at its next commit
        return True

    def step(self, now: float) -> None:
        """End the job once no worker is left, or when its time is up."""
        job = self._job
        assert self._ending is not None
        reason, exit_code, until = self._ending
        if job.alive() and now < until:
            return
        late = f"{len(job.alive())} worker(s) had not exited in time; " if job.alive() else ""
        job.end(False, f"{reason}; {late}{self.kept()}", exit_code)

    def kept(self) -> str:
        """What the next run of the same command resumes from, against the job's last commit."""
        job = self._job
        last = job.commit_high
        newest = self._leavers.newest_checkpoint
        if newest is None:
            return (f"no checkpoint was reported written by this driver; the job's last commit was {last}: the same "
                    "command resumes from the latest checkpoint, if any, and redoes the steps since it")
        step, seq = newest
        if seq >= last:
            return f"checkpoint of step {step} written; the same command resumes from it"
        return (f"the last checkpoint is of step {step}, the last commit {last}: the same command resumes from that "
                f"checkpoint, and {last - seq} committed step(s) will be redone")

    def now_instead(self, reason: str, exit_code: int) -> None:
        """A second signal: end the job at once (the workers are stopped), saying what the next run redoes."""
        self._job.end(False, f"{reason} during the graceful stop: stopped at once; {self.kept()}", exit_code)
