"""A job stopped by SIGINT or SIGTERM with ``--checkpoint-dir``: its workers stop at a commit, rank 0 checkpoints
that commit, and the job ends once they have exited or the stop's time is up.

A stop that killed the workers at once threw away every step since the last periodic checkpoint (up to
``--checkpoint-interval`` of work on every worker), although the state was in the workers' memory and a
driver killed outright (its workers checkpoint on their own while it is away) lost nothing.

:class:`GracefulStop` takes the path of the last holders of the state sent away with no successor (see
:mod:`.leaving`): every round member drains (it leaves at the next commit, every member at the same one: no
rollback), every worker holding the state is told to checkpoint the commit it leaves at
(:meth:`~.leaving.Leavers.checkpoint_on_leaving`; one host of them, picked as they leave, is given the time in its
``ExitOrder.checkpoint_s`` and writes it, whatever its last round's rank: a holder waiting after host 0 was lost too),
the others are told to exit, and nothing launches or forms meanwhile. The job ends once no worker is left,
or ``grace_s`` after the signal (the runtime then stops what is left), with a reason that says which step
the newest checkpoint holds, or how many committed steps the next run redoes.

A stop ends the job at once when there is nothing to keep or no commit to wait for: without
``--checkpoint-dir``; before the driver has heard of any commit (a fixed-size script never commits); or
when the members' next commit is not expected in time for rank 0 to checkpoint it (see
:meth:`GracefulStop.no_commit_in_time`: a job that commits once an epoch would otherwise wait out the grace for
nothing), unless a worker at rendezvous holds a commit to checkpoint. Waiting in vain costs at most
``grace_s``; not waiting costs every step since the last checkpoint: so a pace not yet known (fewer than two
commits seen in their round) is waited for. A second signal during the graceful stop ends it at once too.
A stop at once says in its line what it did not save (:meth:`GracefulStop.unsaved`): without ``--checkpoint-dir``,
that no checkpoint holds what the workers trained.

Training that completes during the stop ends the job as any completion does (success, exit 0), within the
stop's time. The end line says a checkpoint holds the last commit only when one reported stored is of the
commit the leaving holders were told to checkpoint (or later), not from the commits heartbeats told of.
"""

from __future__ import annotations

import logging
from typing import Callable

from cloud_elastic.driver.job.actions import Phase
from cloud_elastic.driver.job.formation import RoundFormation
from cloud_elastic.driver.job.leaving import Leavers
from cloud_elastic.driver.job.no_commit import NoCommitWatch
from cloud_elastic.driver.job.view import JobView
from cloud_elastic.driver.job.workers import WorkerRecord, WorkerState

__all__ = ["GracefulStop", "STOP_GRACE_S"]

log = logging.getLogger(__name__)

S = WorkerState

#: How long a graceful stop may take: a first SIGINT or SIGTERM's (the driver's loop passes it to ``ElasticJob.stop``), and
#: a failing job's (``ElasticJob.end``, see :mod:`.ending`). With the TERM-then-KILL of what is left after it
#: (``terminate_grace_s``, 5 s) it fits a Kubernetes pod's default grace (30 s), well within systemd's stop timeout (90 s).
STOP_GRACE_S = 20.0

#: A stop waits for a commit expected at least this long, beyond the exit order's deadline margin
#: (``policy.deadline_margin_s``, which it keeps for the worker to exit), before the stop's time is up: the time
#: rank 0 is left to write the checkpoint. A later commit would leave it less than the 0.8-2.5 s a 1.1 GB-a-host
#: checkpoint took in docs/benchmarks.md, so the wait would most likely be in vain.
WRITE_S = 2.0


class GracefulStop:
    """The graceful stop of one job (see module docstring)."""

    def __init__(self, job: JobView, leavers: Leavers, rounds: RoundFormation,
                 finish: Callable[[bool, str, int], None], elastic: Callable[[], bool] = lambda: True) -> None:
        self._job = job
        #: Training without a commit: warned of once, and named by a stop that saved nothing (``elastic``: a worker
        #: entered hvd.elastic.run).
        self.no_commit = NoCommitWatch(job, elastic, job.policy.checkpoint_interval_s)
        # Ends the job now, not through ``job.end`` (whose failures, during the stop, are left to it: see .ending).
        self._finish = finish
        self._leavers = leavers
        self._rounds = rounds
        self._ending: tuple[str, int, float] | None = None  # (reason, exit code, when it ends at the latest)
        self._holders: list[str] = []  # the workers told to checkpoint the commit they leave at
        self._release_by: float | None = None  # a failing job's aborted round: its holders leave by then (release)
        self._kept_back: list[WorkerRecord] = []  # non-holders on a held-back holder's host (--whole-hosts): release
        self._why = ""
        # Worker -> (its round, its commits, when its heartbeats last showed them grow in that round (None: not yet),
        # the time per commit over that last rise (None until they grew twice in it)): see heard.
        self._pace: dict[str, tuple[int, int, float | None, float | None]] = {}

    @property
    def active(self) -> bool:
        """The job is stopping gracefully: nothing launches or forms, and :meth:`step` decides when it ends."""
        return self._ending is not None

    def heard(self, w: WorkerRecord, now: float) -> None:
        """``w``'s heartbeat told of its commits (``w.commits``): when they grow, and how often. The time from its
        first heartbeat in a round to its first rise is no gap between commits (it includes its start-up, the
        round's formation, a sync or a load): the pace is known from its second rise in the round on, as the time
        per commit between the last two. It also tells :attr:`no_commit` (a job that never commits)."""
        self.no_commit.heard(w, now)
        seen = self._pace.get(w.worker_id)
        if seen is None or seen[0] != w.round:
            self._pace[w.worker_id] = (w.round, w.commits, None, None)
        elif w.commits > seen[1]:
            rose = seen[2]
            gap = None if rose is None else (now - rose) / (w.commits - seen[1])
            self._pace[w.worker_id] = (w.round, w.commits, now, gap)

    def no_commit_in_time(self, members: list[WorkerRecord], now: float, by: float) -> str | None:
        """Why the members are not expected to commit by ``by``; None when they are, or may be (their pace in
        their round is not known yet). Members commit together: those whose pace is known speak for all. The next commit is expected
        one gap after the last rise seen; one overdue is still expected while the last rise is at most two gaps
        ago (a slow step, a periodic checkpoint) or within the wait's window; a stall longer than both (an
        evaluation, a hung peer) is not waited out. Heartbeats show a commit late by up to their interval, so
        the expected time is off by up to that (0.5 s by default)."""
        why = None
        for w in members:
            in_round, _, at, gap = self._pace.get(w.worker_id, (w.round, 0, None, None))
            if in_round != w.round or at is None or gap is None:
                continue
            if now - at > max(2 * gap, by - now):
                why = f"no commit for {now - at:.3g}s, against one every {gap:.3g}s before"
            elif at + gap > by:
                why = f"the next commit is expected in {at + gap - now:.3g}s (one every {gap:.3g}s)"
            else:
                return None
        return why

    def begin(self, reason: str, exit_code: int, now: float, grace_s: float, *, failing: bool = False) -> bool:
        """A signal asks the job to end (``reason``, ``exit_code``), giving it ``grace_s`` to keep its state;
        ``failing``: the job fails instead (see :mod:`.ending`), and says so.

        Returns True when the job stops gracefully (it ends later, from :meth:`step`), False when it must end now.
        """
        job = self._job
        if grace_s <= 0 or not job.policy.checkpointing or job.phase is not Phase.RUNNING or not job.state_committed:
            return False  # nothing to keep: no checkpoints, or nothing committed yet (a fixed-size script never is)
        # Workers at rendezvous with a commit (a round being formed, after a failure) checkpoint it on their way out,
        # only those holding the newest commit known: an older one's checkpoint would pass for the job's last.
        waiting = [w for w in job.alive() if w.state is S.WAITING and w.holds_state]
        members = job.members()
        # A failing job's round is aborted instead of drained (it may never commit again: a stalled collective): its
        # members roll back to their last commit, which may differ by one (a commit the abort overtook), and that is
        # known only once they are back. They and the holders waiting stay until every member is back or gone (or
        # half the stop's time is up: see release), then those holding the newest commit leave first and write it.
        held_back = failing and bool(members)
        newest = max((w.commit_seq for w in waiting + members), default=0)
        if not held_back:
            waiting = [w for w in waiting if w.commit_seq >= newest]
        # The members stop at their next commit (their heartbeats may not have told of their last one yet), if it
        # is expected in time for rank 0 to write it before its exit order's deadline margin.
        by = now + grace_s - job.policy.deadline_margin_s - WRITE_S
        late = None if waiting or failing else self.no_commit_in_time(members, now, by)
        if late is not None:
            log.warning("job %s: %s: stopping at once: no commit is expected within %gs, in time to checkpoint it "
                        "(%s); the same command resumes from the latest checkpoint", job.job_id, reason,
                        max(0.0, by - now), late)
            return False
        # A member parked after its training function returned commits no more: a holder only of the newest commit.
        holders = [w for w in members if held_back or not w.returned or w.commit_seq >= newest] + waiting
        self._ending = (reason, exit_code, now + grace_s)
        self._holders = [w.worker_id for w in holders]
        self._release_by = now + grace_s / 2 if held_back else None
        why = self._why = f"the job {'is failing' if failing else 'is stopping'}: {reason}"
        for w in holders if not held_back else ():
            self._leavers.checkpoint_on_leaving(w, now + job.wall_offset + grace_s)
        # With --whole-hosts, a worker sent away takes its host-mates along: one on a held-back holder's host (a
        # mate back without its commit, a newcomer) leaves after the holders, or it would drain them untold.
        kept_hosts = {w.slot.host for w in holders} if held_back and job.policy.whole_host_slots else set()
        self._kept_back = []
        for w in job.active():
            if w.state is S.DRAINING or w.state is S.EXITING:
                continue  # sent away with a host-mate already (--whole-hosts): a member drains with it, not stopped
            if held_back and w.worker_id in self._holders:
                continue  # let go once every member is back (see release)
            if w.slot.host in kept_hosts:
                self._kept_back.append(w)
                continue
            self._leavers.send_away(w, why)  # a member drains; one at rendezvous gets its exit order; others stop
        for w in holders:
            if w.state is S.EXITING:  # it was waiting at rendezvous: its exit order says to checkpoint first
                self._leavers.left_round(w, now)
        job.forget_alive()
        if failing:
            log.warning("job %s: %s: before the job ends, the workers holding its last commit leave with it and the first "
                        "to leave checkpoints it (up to %gs; a signal twice stops them at once)", job.job_id, reason,
                        grace_s)
        else:
            log.warning("job %s: %s: the workers stop at their next commit and the first holder to leave checkpoints it "
                        "(up to %gs); a second signal stops them at once", job.job_id, reason, grace_s)
        if job.members():
            self._rounds.next.drop(why)  # a next round planned for newcomers: they are leaving too
            if failing:
                job.abort()  # every member rolls back to its last commit and comes back to rendezvous with it
            else:
                self._rounds.request_update(why)  # every member leaves at its next commit
        return True

    def release(self, now: float) -> None:
        """A failing job's aborted round (see :meth:`begin`): once no member is still in it (or half the stop's time
        is up), the holders back at rendezvous leave, those holding the newest commit first (their host writes it:
        see :meth:`.leaving.Leavers.left_round`); an older commit's holder leaves without writing (its checkpoint,
        named later, would pass for the job's last). A member not back yet drains, and writes only a newer commit.
        With ``--whole-hosts`` a host-mate taken along writes its shards with the writer, and the non-holders kept
        on a holder's host (see :meth:`begin`) leave last."""
        job = self._job
        if self._release_by is None:
            return
        ours = [w for w in job.alive() if w.worker_id in self._holders]
        # A member whose training function returned (parked) is back already: it holds the commit it returned at.
        out = [w for w in ours if w.state is S.RUNNING and not w.returned]
        if out and now < self._release_by:
            return
        self._release_by = None
        back = sorted((w for w in ours if w.state is S.WAITING or (w.returned and w.state in (S.RUNNING, S.DRAINING))),
                      key=lambda w: -w.commit_seq)
        newest = max((w.commit_seq for w in back), default=0)
        deadline = self._ending[2] + job.wall_offset if self._ending is not None else None
        for w in back + out:
            if w.commit_seq >= newest or w in out:
                self._leavers.checkpoint_on_leaving(w, deadline)
        # Told first, then sent away: with --whole-hosts, sending one away takes its host-mates along (a mate at
        # rendezvous gets its exit order, and writes its shards with it); one taken along is not sent away again
        # (it would be stopped, and the writer's save needs its shards).
        for w in back + out:
            if w.state is S.WAITING or w.state is S.RUNNING or (w.returned and w.state is S.DRAINING):
                # One at rendezvous gets its exit order; one still out drains; one parked (returned: a host-mate
                # taken along drains) leaves now.
                self._leavers.send_away(w, self._why, returned_leaves=True)
            if w.state is S.EXITING:
                self._leavers.left_round(w, now)
        for w in self._kept_back:  # not taken along with a holder: one at rendezvous gets its exit order, others stop
            if w.state in (S.STARTING, S.CONNECTED, S.WAITING, S.RUNNING):
                self._leavers.send_away(w, self._why)
        self._kept_back = []
        job.forget_alive()

    def step(self, now: float) -> None:
        """End the job once no worker is left, or when its time is up."""
        job = self._job
        assert self._ending is not None
        self.release(now)
        reason, exit_code, until = self._ending
        if job.alive() and now < until:
            return
        late = f"{len(job.alive())} worker(s) had not exited in time; " if job.alive() else ""
        self._finish(False, f"{reason}; {late}{self.kept()}", exit_code)

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
            if any(i in job.workers and job.workers[i].returned for i in self._holders):
                return (f"the final state is in the checkpoint (step {step}): the same command resumes there and runs "
                        "the end of the training function again")
            return f"checkpoint of step {step} written; the same command resumes from it"
        if seq < last:
            return (f"the last checkpoint is of step {step}, the last commit {last}: the same command resumes from "
                    f"that checkpoint, and {last - seq} committed step(s) will be redone")
        # No holder reached a commit to checkpoint, and the heartbeats told of none after this checkpoint (they
        # tell late): commits made since it may be lost.
        return (f"the workers stopped before reaching a commit to checkpoint: the same command resumes from the last "
                f"checkpoint, of step {step}, and redoes any step committed after it")

    def unsaved(self) -> str:
        """What a stop that ends the job at once adds to its line: without ``--checkpoint-dir``, once a round has
        formed (workers may have trained), that no checkpoint holds what they trained (a torchrun user expects one
        of the script's own); with it, :meth:`.NoCommitWatch.stop_note`. A round, not a commit or a worker's entry
        into ``hvd.elastic.run``: the driver hears of those with a heartbeat's delay, and a script that never
        enters it trains in memory too."""
        job = self._job
        if job.policy.checkpointing:
            return self.no_commit.stop_note()
        if job.round <= 0 and not job.state_committed:
            return ""
        return ("; no --checkpoint-dir: cloud-elastic wrote no checkpoint, so the state the workers trained in "
                "memory is lost unless the script saved its own")

    def now_instead(self, reason: str, exit_code: int) -> None:
        """A second signal: end the job at once (the workers are stopped), saying what the next run redoes."""
        self._finish(False, f"{reason} during the graceful stop: stopped at once; {self.kept()}", exit_code)
