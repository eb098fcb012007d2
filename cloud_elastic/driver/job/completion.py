"""How a job completes, and the backstop for a round that makes no progress.

:class:`Completion` decides, for the job:

* **completion** (:meth:`~Completion.completed`): it is rank 0's to decide (it
  holds the state). Rank 0 returning from its training function starts the
  job's completion (``done``), and so does any worker returning once that has
  started. Another member returning while rank 0 still trains (in its round, or back at rendezvous after an
  abort) is *parked* (``wait``) until rank 0 returns too, normally milliseconds later. A parked member that
  dies or goes silent at the newest commit fails the job once rank 0 returns there, as a completed one does; one
  found to have returned early (rank 0 trains on) leaves, no failure (:class:`.finishing.ParkedEnds`);
* **early returns** (:meth:`~Completion.check_early_returns`): a parked member
  whose rank 0 has waited :data:`EARLY_RETURN_WAIT_S` in a collective returned
  early (that collective needs it, and it will never join): it is told to leave
  and the round is aborted, so the others roll back and continue. Its slot backs
  off like a failed one (the blacklist's exponential cooldown): a newcomer there
  would run the same short loop, and refilling it at once made a restart loop
  that cost rank 0 two resets per newcomer. The likely cause is explained once
  per job; later early returns get one line each;
* **the end** (:meth:`~Completion.step_finishing`): once every worker has gone
  (the work after the training function takes as long as it takes while its
  worker heartbeats, as under horovodrun; ``--finish-timeout`` bounds it), the
  job succeeds, unless a worker failed, went silent or was stopped after
  completing, or rank 0 could not write its final checkpoint;
* **the finish timeout** counts from the job completing (rank 0's return), never
  from a peer's: the driver cannot tell rank 0's own end-of-function work from
  training that needs no collective, so rank 0 is never stopped while it is still in
  its training function; a peer that returned at the last commit waits for it however
  long (:mod:`.finishing`), bounded only by the no-progress and silence watches;
* **the no-progress watch** (:meth:`~Completion.check_progress`): a round none
  of whose members made progress for ``progress_timeout_s`` is aborted, and a
  member still in an aborted round is given up once it has made no progress
  for one more timeout since the abort, or, progressing all along, once it is
  still out :data:`NOT_BACK_LIMIT` timeouts after it. Either way the members
  concerned are asked for their stacks first, and get :data:`STACKS_WAIT_S` to
  send them. A round that stalls :data:`.repeats.REPEATS` times in a row without
  progress with the same members, every one of them waiting inside a collective
  each time, ends the job, naming each one's collective; a stall with a member busy
  outside any collective (a straggler: slow storage, a long evaluation) never counts.
  A member given up for not coming back still heartbeats: it is marked ``hung`` (with
  its main thread's last frame), and :data:`.repeats.REPEATS` such give-ups in a row
  with no progress of the job end it (:class:`.repeats.Hangs`).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Callable

from cloud_elastic.driver.job.actions import Phase, Stop
from cloud_elastic.driver.job.hosts import Slot, blocked_for
from cloud_elastic.driver.job.exit_status import ExitStatus, signal_name
from cloud_elastic.driver.job.finishing import ParkedEnds, final_state_held, holds_final_state
from cloud_elastic.driver.job.liveness import EXIT_GRACE_S
from cloud_elastic.driver.job.repeats import REPEATS, Streak
from cloud_elastic.driver.job.view import JobView
from cloud_elastic.driver.job.workers import WorkerRecord, WorkerState

__all__ = ["Completion", "EARLY_RETURN_WAIT_S", "NOT_BACK_LIMIT", "STACKS_WAIT_S"]

log = logging.getLogger(__name__)

S = WorkerState
_MEMBER = (S.RUNNING, S.DRAINING)
#: The workers of a finishing job whose work is part of the result: completed, or about to report it.
_FINISHERS = (S.RUNNING, S.DRAINING, S.COMPLETED)

#: Workers of a finishing job that had no part in its result (told to leave) get this long to exit.
LEAVER_GRACE_S = 30.0

#: A member whose training function returned is found to have returned early once rank 0 has waited
#: this long in a collective (that member will never join it).
EARLY_RETURN_WAIT_S = 5.0
#: How long a stuck round's members get to send their stacks before the driver acts without them.
STACKS_WAIT_S = 5.0
#: A member of an aborted round whose progress counter keeps growing is working (a survivor learns of the
#: abort only at its next collective or commit: a local evaluation pass can take minutes), not stuck; but
#: the next round waits for it, so it is given up anyway once it is still out this many --progress-timeouts
#: after the abort. Three: at the default (120 s) that is past the default collective timeout (300 s), which
#: frees a survivor spinning in a collective the abort cannot reach (NCCL's device synchronization).
NOT_BACK_LIMIT = 3


@dataclass
class _Stall:
    """A stuck round found by the no-progress watch, waiting for its members' stacks before the driver acts."""

    # "stalled": nobody made progress; "not_back": members did not come back after an abort and made no progress
    # since for the timeout; "not_back_busy": members progressing but still out NOT_BACK_LIMIT timeouts after it
    kind: str
    round: int
    workers: list[str]
    asked_at: float  # running time
    idle_s: float  # without progress (since the abort at most); for "not_back_busy", since the abort
    out_s: float = 0.0  # since the abort ("not_back" kinds)


class Completion:
    """Completion and the no-progress watch of one job (see module docstring)."""

    def __init__(self, job: JobView, rank0: Callable[[], WorkerRecord | None],
                 take_host_along: Callable[[WorkerRecord], None] = lambda w: None) -> None:
        """``rank0()`` is rank 0 of the current round while it is still training in it, else None;
        ``take_host_along(w)``: under ``--whole-hosts``, ``w``'s host-mates leave with it (see :mod:`.leaving`)."""
        self._job = job
        self._rank0 = rank0
        self._take_host_along = take_host_along
        #: The latest stacks request (a worker is asked by giving it this number; see worker.link.progress).
        self.stacks_gen = 0
        #: Workers that exited after completing.
        self.exited = 0
        #: When the job completed (rank 0's return): ``--finish-timeout`` counts from it.
        self._finishing_since: float | None = None
        #: Members whose training function returned before rank 0's -> when they did (running time).
        self._parked: dict[str, float] = {}
        #: Why the job cannot succeed although rank 0 completed (a worker failed after completing, the final
        #: checkpoint was not written).
        self._failures: list[str] = []
        self._kept: list[str] = []  # the failures that a later training function does not undo
        self._ends = ParkedEnds(job, self._back_off, take_host_along)  # parked, ended: may hold the final state
        #: Members still in their first function when a peer entered the next one (see entered_again).
        self._behind: set[str] = set()
        self._round_progress_at = 0.0  # running time of the last progress of a member of the current round
        self._abort_seen_at: float | None = None  # running time the abort of the current round was first seen
        self._stall: _Stall | None = None
        self._explained = False  # the likely cause of an early return was logged (once per job)
        self._stalls = Streak()  # (how far trained, members) of the stalls in a row

    # ------------------------------------------------------------- completion
    def completed(self, worker_id: str, now: float, *, commit_seq: int | None = None, steps: int | None = None,
                  error: str | None = None) -> tuple[str, str]:
        """A worker reports that its training function returned; answers ``(decision, reason)``.

        ``error`` (rank 0 could not write the final durable checkpoint) makes the
        job fail once it has completed.
        """
        job = self._job
        w = job.workers.get(worker_id)
        if w is None or not w.alive:
            return "leave", "this worker was already given up"
        w.last_seen = job.running(now)
        job.note_commits(w, None, commit_seq)
        if steps is not None and steps > w.steps:
            w.steps = steps
        if error:
            self._failures.append(f"worker {worker_id} ({w.label}): {error}")
            self._kept.append(self._failures[-1])  # the final checkpoint stays unwritten if training goes on
            log.error("job %s: worker %s (%s): %s", job.job_id, worker_id, w.label, error)
        decision = self.reply(worker_id)
        if decision is not None:
            return decision
        if w.state not in (S.RUNNING, S.DRAINING):
            log.warning("job %s: worker %s reported completion while %s; ignored", job.job_id, worker_id, w.state.value)
            return "done", ""
        if worker_id in self._behind:  # its first function returned after a peer entered the next one
            self._behind.discard(worker_id)
            return "done", ""  # it goes on to the next function too (entered_again), still a member
        rank0 = self._rank0()
        # Rank 0 out of the round without having returned: lost in its training function (its final checkpoint, an
        # evaluation), or back at rendezvous, its round aborted (it trains on). The job is not complete: w is parked,
        # and holds the final state with the others parked if rank 0 was lost at their commit (final_state_held), else
        # it leaves (check_early_returns).
        out = self._rank0_out() if rank0 is None and job.phase is Phase.RUNNING else None
        if out is None and (job.phase in (Phase.FINISHING, Phase.DONE) or rank0 is None or rank0 is w):
            self._complete(w, now)
            return "done", ""
        if not w.returned:
            w.returned = True
            self._parked[worker_id] = w.last_seen
            log.info("job %s: rank %s (%s) returned from its training function at commit %d; %s", job.job_id,
                     w.rank, worker_id, w.commit_seq, "waiting for rank 0 to return too" if out is None else
                     "rank 0 was lost before it returned" if not out.alive else
                     "rank 0 had left the round without returning (the round was aborted)")
        return "wait", ""

    def reply(self, worker_id: str) -> tuple[str, str] | None:
        """What a worker whose training function returned is told now; None while it must wait for rank 0."""
        w = self._job.workers.get(worker_id)
        if w is None or not w.alive:
            return "leave", "this worker was given up" if w is not None else "unknown worker"
        if w.state is S.COMPLETED:
            return "done", ""
        if w.state is S.EXITING:
            return "leave", w.why or "told to exit"
        return None  # still training, or parked until rank 0 returns

    def _complete(self, w: WorkerRecord, now: float) -> None:
        """``w`` finished its training function and the job is completing: so did every parked member."""
        job = self._job
        w.to(S.COMPLETED)
        self._behind.clear()
        if job.phase in (Phase.STARTING, Phase.RUNNING):
            log.info("job %s: rank %s (%s) finished training; round %d is completing", job.job_id, w.rank,
                     w.worker_id, job.round)
            job.phase = Phase.FINISHING
            self._finishing_since = now
        for worker_id in sorted(self._parked):
            parked = job.workers[worker_id]
            if parked.alive and parked.state in _MEMBER:
                parked.to(S.COMPLETED)
        self._parked.clear()
        self.fail_pending(now)
        job.tick(now)

    def entered_again(self, worker_id: str, now: float) -> tuple[str, str]:
        """A worker whose training function returned entered ``hvd.elastic.run`` again (fine-tuning after
        pre-training, as Horovod allows): the job is elastic again. Answers ``done`` (train on) or ``leave``.

        The job goes back to running in the same round: every completed member trains again (each one
        enters the next function too), failures after the completion are a lost member's now (the round is
        aborted if one is gone, and the others roll back and go on), and the no-progress watch starts over.
        A member whose first function has not returned yet is told ``done`` when it does, not parked as an
        early return. A final-checkpoint error still fails the job.
        """
        job = self._job
        w = job.workers.get(worker_id)
        if w is None or not w.alive:
            return "leave", "this worker was already given up"
        w.last_seen = job.running(now)
        if w.state in _MEMBER and job.phase is Phase.RUNNING:
            return "done", ""  # a peer's report already made the job elastic again
        if w.state is not S.COMPLETED or job.phase is not Phase.FINISHING:
            return "leave", w.why or "the job is over"
        job.phase = Phase.RUNNING
        self._finishing_since = None
        self.exited = 0
        self._failures = [f for f in self._failures if f in self._kept]
        for m in job.alive():
            if m.state is S.COMPLETED:
                m.to(S.RUNNING)
                m.returned = False
            elif m.state in _MEMBER and m.round == job.round:
                self._behind.add(m.worker_id)  # still in the first function: not an early return when it ends
        log.info("job %s: rank %s (%s) entered hvd.elastic.run again: round %d is elastic again", job.job_id,
                 w.rank, worker_id, job.round)
        self.round_formed(job.running(now))
        if any(m.round == job.round and not m.alive for m in job.workers.values()):
            job.last_failure = "a member of the round ended after its training function returned"
            job.abort()  # its peers would wait for it in their next collective
        job.tick(now)
        return "done", ""

    def failed_before_returning(self, line: str) -> None:
        """A member still in its training function ended badly while the job finished (``line``): the job fails."""
        self._failures.append(line)

    def exited_after_completing(self, w: WorkerRecord, status: ExitStatus, parked_now: float | None = None) -> None:
        """``w``'s process ended after its training function returned: a failure only if it says so, and, parked
        (``parked_now``: the time; rank 0 still in its function), only while it may hold the final state."""
        job = self._job
        failed = status.code != 0 or not status.known or status.transport_error  # unknown: adopted, said nothing
        # Parked and ended badly, it is no worker of the result: a failure, or an early return ("completed on N").
        self.exited += 1 if parked_now is None or not failed else 0
        if failed:
            fields = {"exit_code": status.code if status.code >= 0 else None,
                      **({"signal": signal_name(-status.code)} if status.code < 0 else {})}
            if parked_now is not None:
                self._ended_while_parked(w, status.describe, fields, parked_now)
            else:
                self._failed_after_returning(w, status.describe, **fields)
        else:
            log.debug("job %s: worker %s exited after completing", job.job_id, w.worker_id)

    def lost_while_parked(self, w: WorkerRecord, what: str, now: float, *, stacks: bool) -> None:
        """Parked ``w`` (its function returned, rank 0's not yet) is given up (``what``: silent, its host lost): it
        is stopped; while it may hold the final state the job fails naming it once rank 0 returns, as after
        completing (:meth:`_ended_while_parked`). No training is lost and its slot is not blamed."""
        job = self._job
        w.to(S.LOST, what)
        job.forget_alive()
        job.act(Stop(w.worker_id, what, immediate=True, stacks=stacks and w.stacks_signal is not False))
        self._ended_while_parked(w, what, {"exit_code": None}, now)

    def _ended_while_parked(self, w: WorkerRecord, what: str, fields: dict[str, object], now: float) -> None:
        """Parked ``w`` ended badly (``what``): see :class:`.finishing.ParkedEnds`. Found to have returned early, it
        leaves, and the round is aborted so that rank 0 stops waiting for it, as the early-return rule does."""
        job = self._job
        parked_at = self._parked.get(w.worker_id, w.last_seen)
        holds = holds_final_state(job, w, parked_at, self._rank0())
        self._ends.ended(w, what, fields, parked_at, holds, now)
        if not holds and job.phase is Phase.RUNNING and job.abort_round < job.round and self._rank0() is not None:
            job.last_failure = "a member that had returned early from its training function ended"
            job.abort()  # rank 0 waits, or will, in a collective that needs it

    def _failed_after_returning(self, w: WorkerRecord, what: str, **fields: object) -> None:
        """``w`` ended badly (``what``) after its training function returned: the job fails naming it and its error."""
        what += " after its training function returned"
        said = f": {w.error}" if w.error and w.error not in what else ""  # its exit report's, as in .failures
        line = f"worker {w.worker_id} ({w.label}) {what} (commit {w.commit_seq}, {w.steps} optimizer step(s)){said}"
        self._failures.append(line)
        log.error("job %s: %s", self._job.job_id, line)
        self._job.emit("worker_failed", worker=w.worker_id, host=w.slot.host, slot=w.slot.index, rank=w.rank,
                       reason=what + said, blacklisted_s=None, **fields)

    def step_finishing(self, now: float) -> None:
        """The job is completing: it ends once every worker has gone (see module docstring).

        The work after the training function (a final save, an evaluation) gets as long as it takes while
        its worker heartbeats, or ``finish_timeout_s`` (``--finish-timeout``): a worker still at it then is
        stopped and the job fails naming it. A completed worker silent past the heartbeat timeout (dead
        process, lost host) is given up, a failure as a non-zero exit is. Leavers, who had no part in the
        result, get :data:`LEAVER_GRACE_S`.
        """
        job = self._job
        running = job.running(now)
        for w in job.alive():
            if w.state is S.STARTING:
                # It never registered, so it had no part in the result and cannot be told to exit:
                # stop it now rather than wait for it.
                w.to(S.EXITING, "the job completed before it joined")
                job.act(Stop(w.worker_id, "the job completed before it joined"))
            elif w.state is S.COMPLETED:
                allowed = job.policy.heartbeat_timeout_s
                if w.exiting_at is not None:
                    allowed = max(allowed, EXIT_GRACE_S)
                if running - w.last_seen > allowed:
                    self._fail_finisher(w, f"stopped answering heartbeats for {running - w.last_seen:.1f}s "
                                           f"after its training function returned (its host lost, or its "
                                           f"process stuck)", now)
        since = now - (self._finishing_since if self._finishing_since is not None else now)
        working = [w for w in job.alive() if w.state in _FINISHERS]
        limit = job.policy.finish_timeout_s
        if working and limit is not None and since > limit:
            for w in working:
                self._fail_finisher(w, f"was still running {since:.0f}s after training completed "
                                       f"(--finish-timeout {limit:g}); stopped", now)
        elif working or (job.alive() and since <= LEAVER_GRACE_S):
            return
        for w in job.alive():
            if w.state is not S.EXITING:
                w.to(S.EXITING, "job completed; worker did not exit in time")
            job.act(Stop(w.worker_id, "job completed; worker did not exit in time"))
        failures = self._failures
        if failures:
            more = f" (and {len(failures) - 1} more failure(s), above)" if len(failures) > 1 else ""
            job.end(False, f"rank 0 finished training, but {failures[0]}{more}", 1)
            return
        job.end(True, f"training completed on {job.completed_workers} worker(s) after {job.resets} reset(s)", 0)

    def _fail_finisher(self, w: WorkerRecord, what: str, now: float) -> None:
        """``w``, one of the workers of the result, is stopped as lost: the job cannot succeed."""
        job = self._job
        line = f"worker {w.worker_id} ({w.label}) {what}"
        self._failures.append(line)
        log.error("job %s: %s", job.job_id, line)
        job.emit("worker_failed", worker=w.worker_id, host=w.slot.host, slot=w.slot.index, rank=w.rank, reason=what,
                 exit_code=None, blacklisted_s=None)
        job.give_up(w, line, now)

    def check_early_returns(self, now: float) -> bool:
        """Parked members whose rank 0 is still training leave the round; their peers go on without them. True when
        the job ended instead: rank 0 was lost and they hold the final state (:func:`.finishing.final_state_held`).
        Rank 0 still in its training function with no collective waiting (its own evaluation, a final save,
        or rank-0-only work before it trains on) is waited for however long: ``--finish-timeout`` counts
        only from its return.

        Rank 0 waiting in a collective for EARLY_RETURN_WAIT_S means it is still
        training: that collective needs the parked members, who will never join it
        (a loop or a sampler sized for another world size, typically). They are
        told to leave, their slots back off (:meth:`_back_off`), and the round is
        aborted, which frees rank 0 from the collective. So does a parked member
        whose rank 0 is back at rendezvous without having returned (its round was
        aborted: it trains on). A parked member whose rank 0 failed cannot rejoin
        either, and leaves too (its slot is not to blame). After an abort that left
        rank 0 in its training function (the no-progress watch's, a third member's
        loss), a parked member holding the newest commit waits for rank 0
        (:func:`.finishing.holds_final_state`); the others leave as after rank 0's failure.
        """
        job = self._job
        if not self._parked or job.phase is not Phase.RUNNING:
            return False
        rank0 = self._rank0()
        if rank0 is not None and job.abort_round < job.round:
            # Only a wait reported after the last member parked counts: an older report may be of a
            # collective that the parked members did join.
            if rank0.waiting_s < EARLY_RETURN_WAIT_S or rank0.waiting_at <= max(self._parked.values()):
                return False
        out = self._rank0_out() if rank0 is None else None  # lost, or back at rendezvous to train on
        if out is not None and not out.alive:
            held = final_state_held(job, self._parked, self._lost_rank0(), lambda: self.fail_pending(now))
            if held is None:
                return False  # a survivor at that commit is still in its training function: they wait for it
            if held:
                return True
        leaving: list[WorkerRecord] = []
        staying: dict[str, float] = {}
        backed_off: dict[Slot, float] = {}  # slots backed off in this call: one host's early returns count once
        for worker_id in sorted(self._parked):
            w = job.workers[worker_id]
            if not w.alive or w.state not in _MEMBER:
                continue
            if job.abort_round >= job.round and holds_final_state(job, w, self._parked[worker_id], rank0):
                staying[worker_id] = self._parked[worker_id]
                continue
            trainer = rank0 if rank0 is not None and job.abort_round < job.round else out if out and out.alive else None
            if trainer is None:
                why = "its round ended before rank 0 finished training; it cannot rejoin after returning"
                log.warning("job %s: worker %s (%s) %s; it leaves the job and the others continue", job.job_id,
                            worker_id, w.label, why)
            else:  # rank 0 waits in a collective that needs it, or is back at rendezvous to train on without it
                why = (f"returned from its training function at commit {w.commit_seq} ({w.steps} optimizer step(s)) "
                       f"while rank 0 ({trainer.worker_id}) was still training (at commit {trainer.commit_seq}, "
                       f"{trainer.steps} step(s))")
                w.returned_early = True  # its worker_left event says so when its process ends
                w.cooldown_s = self._back_off(w, now, backed_off)
                self._explain(w, why)
            w.to(S.EXITING, why)
            leaving.append(w)
        for w in leaving:  # after every parked one had its say: a host-mate taken along exits at once
            self._take_host_along(w)
        self._ends.settle_unless_held(rank0, now, backed_off)  # ended while parked: early returns too, unless held
        self._parked = staying
        job.forget_alive()
        if job.abort_round < job.round:
            job.last_failure = "a member returned from its training function while rank 0 was still training"
            job.abort()
        return False

    def _lost_rank0(self) -> WorkerRecord | None:
        """Rank 0 of the current round if it was lost in its training function (it never returned), else None."""
        w = self._rank0_out()
        return w if w is not None and not w.alive else None

    def _rank0_out(self) -> WorkerRecord | None:
        """Rank 0 of the current round if it left the round without returning from its training function: lost, or
        back at rendezvous after an abort (it trains on in the next round); else None (still training in it,
        returned, leaving the job at a commit, or none known)."""
        job = self._job
        for w in job.workers.values():
            if w.round == job.round and w.rank == 0 and not w.returned and not w.member_of(job.round):
                return w if not w.alive or w.state is S.WAITING else None
        return None

    def fail_pending(self, now: float) -> None:
        """The job completed, or ends (rank 0 lost with the final state parked, a stop): ended holders fail it."""
        for ended, what, fields in self._ends.at_completion(now):  # ended while parked at the newest commit
            self._failed_after_returning(ended, what, **fields)

    def _back_off(self, w: WorkerRecord, now: float, done: dict[Slot, float]) -> float:
        """``w`` returned early: its slot (its host's, under ``--whole-hosts``) cools down as after a failure.

        The blacklist's own back-off, not a second one: the n-th early return (or
        failure) of a slot keeps new workers off it for ``lo * 2**(n-1)`` seconds
        within ``--blacklist-cooldown-range``. Returns that wait. ``done``: the slots already backed
        off at ``now`` and their waits (several host-mates returning early together count once).
        """
        blacklist = self._job.hosts.blacklist
        slots = [w.slot]
        if self._job.policy.whole_host_slots:
            slots = [Slot(w.slot.host, i) for i in range(self._job.policy.whole_host_slots)]
        for slot in slots:
            if slot not in done:
                done[slot] = blacklist.record_failure(slot, now)
        return max(done[slot] for slot in slots)

    def _explain(self, w: WorkerRecord, why: str) -> None:
        """Log ``w``'s early return: the likely cause the first time in the job, one line after that."""
        job = self._job
        where = f"host {w.slot.host}" if job.policy.whole_host_slots else f"slot {w.slot}"
        wait = (f"no new worker starts on {where}: it is blacklisted {blocked_for(w.cooldown_s)}"
                if w.cooldown_s == math.inf else f"a new worker starts on {where} in {w.cooldown_s:.0f}s"
                if w.cooldown_s > 0 else f"a new worker may start on {where} at once (--blacklist-cooldown-range 0 0)")
        if not self._explained:
            self._explained = True
            log.warning("job %s: worker %s (%s) %s; likely cause: a loop or sampler sized for another world size "
                        "(e.g. a DistributedSampler built once at start-up: use hvd.elastic.ElasticSampler or "
                        "rebuild it in a reset callback). It leaves the job and the others continue; %s, and each "
                        "further early return there doubles that wait (--blacklist-cooldown-range)", job.job_id,
                        w.worker_id, w.label, why, wait)
        else:
            log.warning("job %s: worker %s (%s) returned early too (the likely cause is explained above); %s",
                        job.job_id, w.worker_id, w.label, wait)

    # --------------------------------------------------------- no-progress watch
    def round_formed(self, running: float) -> None:
        """A round formed at running time ``running``: the watch starts over."""
        self._round_progress_at, self._abort_seen_at, self._stall = running, None, None

    def progressed(self, running: float) -> None:
        """A member of the current round made progress at running time ``running``."""
        self._round_progress_at = running

    def check_progress(self, now: float) -> None:
        """The backstop for a stuck round (``progress_timeout_s``): stacks first, then abort or give up."""
        job = self._job
        bound = job.policy.progress_timeout_s
        if bound <= 0 or job.phase is not Phase.RUNNING or job.adopting or job.round == 0:
            return
        running = job.running(now)
        if self._stall is not None:
            self._act_on_stall(running, now)
            return
        if job.abort_round >= job.round:
            if self._abort_seen_at is None:
                self._abort_seen_at = running
            else:
                self._check_not_back(running, bound)
        elif running - self._round_progress_at > bound:
            members = [w for w in job.members() if not w.returned]
            if members:
                self._ask_stacks("stalled", members, running, running - self._round_progress_at)

    def _check_not_back(self, running: float, bound: float) -> None:
        """Members still in the aborted round: stuck once idle for ``bound`` since the abort (a blocked
        collective, a deadlock: their counters stand still), or out past :data:`NOT_BACK_LIMIT` bounds."""
        seen = self._abort_seen_at
        assert seen is not None
        out = [w for w in self._job.members() if not w.returned]
        idle = {w.worker_id: running - max(seen, w.progress_at) for w in out}
        stuck = [w for w in out if idle[w.worker_id] > bound]
        if stuck:
            self._ask_stacks("not_back", stuck, running, min(idle[w.worker_id] for w in stuck), running - seen)
        elif out and running - seen > NOT_BACK_LIMIT * bound:
            self._ask_stacks("not_back_busy", out, running, running - seen, running - seen)

    def _ask_stacks(self, kind: str, workers: list[WorkerRecord], running: float, idle_s: float,
                    out_s: float = 0.0) -> None:
        job = self._job
        self.stacks_gen += 1
        for w in workers:
            w.stacks_wanted = self.stacks_gen
        self._stall = _Stall(kind, job.round, [w.worker_id for w in workers], running, idle_s, out_s)
        names = ", ".join(f"{w.worker_id} ({w.label})" for w in workers)
        timeout = job.policy.progress_timeout_s
        if kind == "stalled":
            reason = (f"no member of round {job.round} made progress for {idle_s:.0f}s (--progress-timeout "
                      f"{timeout:g}): no commit, optimizer step or completed collective")
        elif kind == "not_back":
            reason = (f"{len(workers)} member(s) of round {job.round} did not come back to rendezvous within "
                      f"{out_s:.0f}s of its abort, with no progress for the last {idle_s:.0f}s or more "
                      f"(--progress-timeout {timeout:g})")
        else:
            reason = (f"{len(workers)} member(s) of round {job.round} did not come back to rendezvous within "
                      f"{idle_s:.0f}s of its abort although still making progress ({NOT_BACK_LIMIT} x "
                      f"--progress-timeout {timeout:g})")
        log.warning("job %s: %s; asking %s for their stacks", job.job_id, reason, names)
        job.emit("round_stalled", round=job.round, idle_s=round(idle_s, 1), reason=reason,
                 workers=[w.worker_id for w in workers])

    def _stalled_again(self, workers: list[WorkerRecord]) -> bool:
        """The current round stalled (``workers``: its members then): True when it ended the job, the
        :data:`.repeats.REPEATS`-th stall in a row without progress with the same members (an aborted round
        re-forms unchanged and stalls in the same place: a collective that cannot complete, such as an
        allreduce of tensors whose sizes differ across ranks). Only a stall with every member waiting inside a
        collective counts: one member busy outside any (still computing, reading slow storage) is a straggler
        that may well arrive next time, and its stall starts the count again."""
        job = self._job
        silence = getattr(job, "silence", None)  # a piece tested alone may have no silence watch
        ranked = sorted(workers, key=lambda w: (w.rank is None, w.rank))
        flights = [silence.flight(w.worker_id) if silence is not None else None for w in ranked]
        waiting = [f for f in flights if f is not None and f.round == job.round and f.state == "entered"]
        if len(waiting) < len(ranked):
            self._stalls.clear()
            return False
        members = sorted(w.worker_id for w in workers)
        times = self._stalls.note((job.trained.at(job.commit_high), tuple(members)))  # see .repeats.Trained
        if times < REPEATS:
            return False
        flights = [f"{w.label} collective #{f.seq} ({f.op}) waiting in it" for w, f in zip(ranked, waiting)]
        job.end(False, f"round {job.round} stalled {times} times in a row at commit {job.commit_high} with the same "
                       f"{len(members)} worker(s): {'; '.join(flights)} (their stacks are above); the collective "
                       f"cannot complete, e.g. tensors whose shapes differ across ranks, or a collective some ranks "
                       f"skip; last: {job.last_failure}", 1)
        return True

    def _act_on_stall(self, running: float, now: float) -> None:
        job, stall = self._job, self._stall
        assert stall is not None
        workers = [job.workers[i] for i in stall.workers]
        answered = all(w.stacks_sent >= w.stacks_wanted or not w.alive for w in workers)
        if not answered and running - stall.asked_at < STACKS_WAIT_S:
            return
        self._stall = None
        silent = [w.worker_id for w in workers if w.alive and w.stacks_sent < w.stacks_wanted]
        if silent:
            log.warning("job %s: no stacks came from %s within %gs", job.job_id, ", ".join(silent), STACKS_WAIT_S)
        if stall.round != job.round:
            return
        if stall.kind == "stalled":
            if job.abort_round < job.round:
                job.last_failure = (f"round {job.round} made no progress for {stall.idle_s:.0f}s "
                                    f"(--progress-timeout {job.policy.progress_timeout_s:g})")
                if not self._stalled_again(workers):
                    job.abort()
            return
        if stall.kind == "not_back":
            what = (f"did not come back to rendezvous within {stall.out_s:.0f}s of the abort of round {stall.round}, "
                    f"with no progress for the last {stall.idle_s:.0f}s or more (stuck where the abort cannot reach "
                    f"it; its stacks are above)")
        else:
            what = (f"did not come back to rendezvous within {stall.out_s:.0f}s of the abort of round {stall.round}"
                    f", though still making progress: no collective or commit for that long ({NOT_BACK_LIMIT} x "
                    f"--progress-timeout; its stacks are above)")
        for w in workers:
            if w.alive and w.member_of(stall.round) and not w.returned:
                # Still heartbeating, so its process runs: a hang that counts toward the job's end (see .repeats).
                w.hung = f"its main thread at {w.last_frame}" if w.last_frame else "it sent no stacks"
                job.give_up(w, what, now)
