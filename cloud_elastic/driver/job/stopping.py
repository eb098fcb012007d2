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

A stop ends the job at once when there is nothing to keep or no commit to wait for: without
``--checkpoint-dir``; before the driver has heard of any commit (a fixed-size script never commits); or
when no commit is expected within half of ``grace_s`` (see :meth:`GracefulStop.commit_expected`: a job that
commits once an epoch would otherwise wait out the grace for nothing), unless a worker at rendezvous holds a
commit to checkpoint. A second signal during the graceful stop ends it at once too.

Training that completes during the stop ends the job as any completion does (success, exit 0), within the
stop's time. The end line says a checkpoint holds the last commit only when one reported stored is of the
commit the leaving holders were told to checkpoint (or later), not from the commits heartbeats told of.
"""

from __future__ import annotations

import logging
from cloud_elastic.driver.job.actions import Phase
from cloud_elastic.driver.job.formation import RoundFormation
from cloud_elastic.driver.job.leaving import Leavers
from cloud_elastic.driver.job.view import JobView
from cloud_elastic.driver.job.workers import WorkerRecord, WorkerState

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
        self._holders: list[str] = []  # the workers told to checkpoint the commit they leave at
        # Worker -> (its commits, when its heartbeats last showed them grow (or first came), the time between that and
        # the time before, None until they first grew): see heard.
        self._pace: dict[str, tuple[int, float, float | None]] = {}

    @property
    def active(self) -> bool:
        """The job is stopping gracefully: nothing launches or forms, and :meth:`step` decides when it ends."""
        return self._ending is not None

    def heard(self, w: WorkerRecord, now: float) -> None:
        """``w``'s heartbeat told of its commits (``w.commits``): when they grow, and how often. Its first heartbeat
        starts the clock: the time to its first commit counts as a gap (an upper bound: it includes its start)."""
        seen = self._pace.get(w.worker_id)
        if seen is None:
            self._pace[w.worker_id] = (w.commits, now, None)
        elif w.commits > seen[0]:
            self._pace[w.worker_id] = (w.commits, now, now - seen[1])

    def commit_expected(self, members: list[WorkerRecord], now: float, within: float) -> bool:
        """Whether a member is expected to commit within ``within`` seconds of ``now``: its heartbeats showed its
        commits grow at most ``within`` after its first heartbeat or their previous rise, the last time at most
        ``within`` ago (a stall that long, an evaluation or a re-formation, is not waited out). Heartbeats show
        commits late (by up to their interval), so a job committing every step shows one rise per heartbeat."""
        for w in members:
            _, at, gap = self._pace.get(w.worker_id, (0, 0.0, None))
            if gap is not None and gap <= within and now - at <= within:
                return True
        return False

    def begin(self, reason: str, exit_code: int, now: float, grace_s: float) -> bool:
        """A signal asks the job to end (``reason``, ``exit_code``), giving it ``grace_s`` to keep its state.

        Returns True when the job stops gracefully (it ends later, from :meth:`step`), False when it must end now.
        """
        job = self._job
        if grace_s <= 0 or not job.policy.checkpointing or job.phase is not Phase.RUNNING or not job.state_committed:
            return False  # nothing to keep: no checkpoints, or nothing committed yet (a fixed-size script never is)
        # Workers at rendezvous with a commit (a round being formed, after a failure) checkpoint it on their way out.
        waiting = [w for w in job.alive() if w.state is S.WAITING and w.holds_state]
        # The members stop at their next commit (their heartbeats may not have told of their last one yet), if one
        # is expected in time: half the grace, leaving the other half to write the checkpoint and exit.
        members = job.members()
        if not waiting and not self.commit_expected(members, now, grace_s / 2):
            log.warning("job %s: %s: stopping at once: no commit is expected within %gs (the workers' heartbeats "
                        "have not shown one that often lately); the same command resumes from the latest checkpoint",
                        job.job_id, reason, grace_s / 2)
            return False
        holders = members + waiting
        self._ending = (reason, exit_code, now + grace_s)
        self._holders = [w.worker_id for w in holders]
        why = f"the job is stopping: {reason}"
        for w in holders:
            self._leavers.checkpoint_on_leaving(w, now + job.wall_offset + grace_s)
        for w in job.active():
            if w.state is S.DRAINING or w.state is S.EXITING:
                continue  # sent away with a host-mate already (--whole-hosts): a member drains with it, not stopped
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

    def overdue(self, now: float) -> bool:
        """The stop's time is up (training completing during it ends then too: see ``ElasticJob._step_all``)."""
        return self._ending is not None and now >= self._ending[2]

    def kept(self) -> str:
        """What the next run of the same command resumes from, against the commit the holders left at."""
        job = self._job
        left_at = [self._leavers.left_at[i] for i in self._holders if i in self._leavers.left_at]
        held = max(left_at) if left_at else None  # the commit their exit orders told them to checkpoint
        last = job.commit_high if held is None else held
        newest = self._leavers.newest_checkpoint
        if newest is None:
            return (f"no checkpoint was reported written by this driver; the job's last commit was {last}: the same "
                    "command resumes from the latest checkpoint, if any, and redoes the steps since it")
        step, seq = newest
        if held is not None and seq >= held:
            return f"checkpoint of step {step} written; the same command resumes from it"
        if seq < last:
            return (f"the last checkpoint is of step {step}, the last commit {last}: the same command resumes from "
                    f"that checkpoint, and {last - seq} committed step(s) will be redone")
        # No holder reached a commit to checkpoint, and the heartbeats told of none after this checkpoint (they
        # tell late): commits made since it may be lost.
        return (f"the workers stopped before reaching a commit to checkpoint: the same command resumes from the last "
                f"checkpoint, of step {step}, and redoes any step committed after it")

    def now_instead(self, reason: str, exit_code: int) -> None:
        """A second signal: end the job at once (the workers are stopped), saying what the next run redoes."""
        self._job.end(False, f"{reason} during the graceful stop: stopped at once; {self.kept()}", exit_code)
