"""The round finishing: rank 0 still in its training function after members returned from theirs.

A member returning at the job's newest commit while rank 0 is still in its function (an evaluation, a final save) holds
the final state. Two rules read that situation, for :class:`~.completion.Completion`:

* :func:`finishing_hold`: the round is finishing. Rank 0's return completes the job however few workers are left, so
  :class:`~.capacity.Capacity` starts no ``--min-np`` wait, and a hand drain's reply says so (:mod:`.health`).
  The hold has no limit of its own, as ``horovodrun`` waits for its processes: the driver cannot tell rank 0's
  end-of-function work (an evaluation, a final save) from rank-0-only work in its loop (a validation pass before
  it trains on, a peer having returned early), so it never stops rank 0 there; ``--finish-timeout`` counts only
  from rank 0's return, and the no-progress and silence watches still apply. An early return (rank 0 found
  waiting in a collective after it) ends the hold;
* :func:`final_state_held`: rank 0 was lost there, and the parked members are the final state's only holders;
* :func:`holds_final_state` and :class:`ParkedEnds`: a parked member that ended (killed, silent) fails the job only
  while it may hold the final state; one found to have returned early (rank 0 trains on) just leaves.
"""

from __future__ import annotations

import logging
from typing import Callable, Mapping

from cloud_elastic.driver.job.actions import Phase
from cloud_elastic.driver.job.hosts import Slot, blocked_s
from cloud_elastic.driver.job.view import JobView
from cloud_elastic.driver.job.workers import WorkerRecord, WorkerState

__all__ = ["ParkedEnds", "final_state_held", "finishing_hold", "holds_final_state"]

log = logging.getLogger(__name__)

S = WorkerState


def finishing_hold(job: JobView) -> tuple[WorkerRecord, WorkerRecord] | None:
    """The round is finishing: ``(rank 0, a member)`` while a member of the current round returned from its training
    function at the job's newest commit (it holds the final state: parked, or gone since, a notice on its host having
    sent it away to write it) and rank 0 is still in its own (an evaluation, a final save), the round not aborted;
    else None. Rank 0's return completes the job then, however few workers are left (:class:`.capacity.Capacity`
    starts no ``--min-np`` wait), however long rank 0 takes (``--finish-timeout`` counts from its return).
    A member found to have returned early (``returned_early``), or one behind a newer commit, holds no final state.
    One that died since (killed, silent) still counts until found to have returned early: rank 0's return
    completes the job then too, failing it naming that member (:meth:`.completion.Completion._ended_while_parked`),
    and rank 0 finishes its final save rather than the job ending at ``--elastic-timeout`` below ``--min-np``."""
    if job.phase is not Phase.RUNNING or job.abort_round >= job.round:
        return None
    rank0, holder = None, None
    for w in job.workers.values():  # a scan of every worker: callers look only when it may apply
        if w.round != job.round:
            continue
        if w.rank == 0 and w.member_of(job.round) and not w.returned:
            rank0 = w
        elif w.returned and not w.returned_early and w.commit_seq >= job.commit_high:
            holder = w
    return (rank0, holder) if rank0 is not None and holder is not None else None


def final_state_held(job: JobView, parked_at: Mapping[str, float], rank0: WorkerRecord | None,
                     before_end: Callable[[], None] = lambda: None) -> bool | None:
    """Rank 0 was lost while parked members, back from their training function at the newest commit, are the
    only ones left holding it: they hold the final state, and are not sent away as early returns. True when
    the job ended for it (with ``--checkpoint-dir``, through :class:`~.ending.FailingEnd`: a returned member
    writes that commit first, so the same command resumes there); None while a survivor at that commit is
    still in its training function (it may return too, and hold it with them: they wait); False when they
    leave as early returns: someone at rendezvous holds that commit too (it goes on with newcomers), or rank 0
    was still in its loop (it reported waiting in a collective, a commit's among them, or a newer commit,
    after the last of them returned: the early-return rule's signal, ``Completion.check_early_returns``).
    ``parked_at``: the parked members -> when they returned (running time); ``rank0``: rank 0 of the round, lost in its
    training function; ``before_end()``: called just before the job ends for it (the members that died while parked
    at that commit are named then, a ``worker_failed`` event each: review s59 rvO's suspicion, they had none)."""
    parked = [job.workers[i] for i in sorted(parked_at)]
    # One drained by a notice on its host holds it too until its host's leave-by time (then it was sent away
    # to write it: Leavers.enforce_deadlines); one taken along with a lost host-mate (--whole-hosts) lacks
    # the mate's shards, and leaves.
    mates_lost = {w.slot.host for w in job.workers.values()
                  if job.policy.whole_host_slots and w.round == job.round and not w.alive and not w.returned}
    holders = [w for w in parked if w.alive and w.holds_state and (
        w.state is S.RUNNING or (w.state is S.DRAINING and w.slot.host not in mates_lost))]
    if not holders:
        return False
    newest = max(w.commit_seq for w in holders)
    if rank0 is not None and (rank0.commit_seq > newest or (
            rank0.waiting_s > 0 and rank0.waiting_at > max(parked_at.values()))):
        return False
    survivors = [w for w in job.alive() if not w.returned and w.holds_state and w.commit_seq >= newest]
    if any(w.state is S.WAITING for w in survivors):
        return False
    if any(w.state is S.RUNNING and w.round == job.round for w in survivors):
        return None
    for w in parked:
        if w.alive and w.state is S.DRAINING and w not in holders:
            w.to(S.EXITING, w.why)  # told to leave in its completion reply, without writing
    lost = sorted(w.rank for w in job.workers.values()
                  if w.round == job.round and w.rank is not None and not w.alive and not w.returned)
    who = f"rank {lost[0]} was" if len(lost) == 1 else f"ranks {', '.join(map(str, lost))} were"
    at = f" (#{newest})" if newest else ""  # a commit seen only counted (no sequence number): none to name
    line = f"{who} lost after the training loop's last commit{at} while others had returned"
    if not job.policy.checkpointing:
        ranks = ", ".join(str(w.rank) for w in holders if w.commit_seq >= newest)
        line += (f"; the final state was held by rank(s) {ranks} but there is no --checkpoint-dir to write it to; "
                 "it ends with them (with --checkpoint-dir the same command would resume there)")
    before_end()
    job.end(False, line, 1)
    return True


def holds_final_state(job: JobView, w: WorkerRecord, parked_at: float, rank0: WorkerRecord | None) -> bool:
    """Parked ``w``, returned at running time ``parked_at``, may hold the final state while ``rank0`` (rank 0 of its
    round still in its training function; None: out of it) is in its function: ``w`` returned at the job's newest
    commit, and rank 0 reported neither a newer commit nor a wait in a collective since (it was still in its loop:
    that collective needs ``w``, which returned early)."""
    return (rank0 is not None and rank0.round == w.round and w.holds_state
            and w.commit_seq >= max(job.commit_high, rank0.commit_seq)
            and not (rank0.waiting_s > 0 and rank0.waiting_at > parked_at))


class ParkedEnds:
    """Parked members that ended badly (killed, silent) while they may hold the final state: a failure of the job
    once rank 0 returns at their commit (rvH kill_parked.sh: killed while rank 0 evaluates), nothing if they prove
    early returns (review s58 rvN finding 1: an early returner on uneven data OOM-killed while parked failed the
    healthy job after rank 0 trained to its end). ``back_off(w, now, done)``: the early-return slot back-off;
    ``take_host_along(w)``: under ``--whole-hosts``, ``w``'s host-mates leave with it (:mod:`.leaving`)."""

    def __init__(self, job: JobView, back_off: Callable[[WorkerRecord, float, dict[Slot, float]], float],
                 take_host_along: Callable[[WorkerRecord], None] = lambda w: None) -> None:
        self._job = job
        self._back_off = back_off
        self._take_host_along = take_host_along
        #: worker id -> (when it returned, what ended it, the fields of its ``worker_failed`` event)
        self.pending: dict[str, tuple[float, str, dict[str, object]]] = {}

    def ended(self, w: WorkerRecord, what: str, fields: dict[str, object], parked_at: float, holds: bool,
              now: float) -> None:
        """Parked ``w`` ended (``what``); ``holds``: it may hold the final state (:func:`holds_final_state`), so
        it is pending, else it returned early and leaves now (:meth:`settle_early`)."""
        self.pending[w.worker_id] = (parked_at, what, fields)
        if holds:
            log.warning("job %s: worker %s (%s) %s after its training function returned at commit %d, rank 0 still "
                        "in its own: the job fails naming it if rank 0 returns at that commit; if rank 0 trains on, "
                        "it had returned early and its end loses nothing", self._job.job_id, w.worker_id, w.label,
                        what, w.commit_seq)
        else:
            self.settle_early(w.worker_id, now, {})

    def at_completion(self, now: float) -> list[tuple[WorkerRecord, str, dict[str, object]]]:
        """The job completed (rank 0 returned), or ends for rank 0's loss (:func:`final_state_held`): the pending
        members at its newest commit, which fail it; the others (rank 0 committed past them) returned early."""
        job, failed = self._job, []
        for worker_id in sorted(self.pending):
            w = job.workers[worker_id]
            if w.holds_state and w.commit_seq >= job.commit_high:
                _, what, fields = self.pending.pop(worker_id)
                failed.append((w, what, fields))
            else:
                self.settle_early(worker_id, now, {}, along=False)  # the job is over: its host-mates stay
        return failed

    def settle_unless_held(self, rank0: WorkerRecord | None, now: float, backed_off: dict[Slot, float]) -> None:
        """The early-return rule ran (rank 0 trains on, or the round was aborted): each pending member returned early
        too, unless the round was aborted with rank 0 still in its function (``rank0``; None: out of it) and the member
        may hold the final state. Judged on its own return time, never on the parked set, which a dead member leaves at
        that abort (review s59 rvO finding 1: a killed holder then settled as an early return at the next tick after
        a third member's loss, and the job succeeded)."""
        job = self._job
        for worker_id, (parked_at, _, _) in sorted(self.pending.items()):
            if not (job.abort_round >= job.round and holds_final_state(job, job.workers[worker_id], parked_at, rank0)):
                self.settle_early(worker_id, now, backed_off)

    def settle_early(self, worker_id: str, now: float, backed_off: dict[Slot, float], *, along: bool = True) -> None:
        """``worker_id`` returned early: no failure; it leaves, its slot backed off as an early return's, and under
        ``--whole-hosts`` (``along``: the job goes on) its host-mates leave with it, as a live early return's do
        (review s59 rvO finding 2: a SIGKILLed one's mate idled at rendezvous, its host neither whole nor free)."""
        job = self._job
        _, what, _ = self.pending.pop(worker_id)
        w = job.workers[worker_id]
        w.returned_early = True
        w.why = f"{what} after returning early"  # what its host-mates are told
        w.cooldown_s = self._back_off(w, now, backed_off)
        log.warning("job %s: worker %s (%s) %s after returning early from its training function (commit %d, %d "
                    "optimizer step(s)), rank 0 still training: it leaves the job, no failure; the others continue",
                    job.job_id, worker_id, w.label, what, w.commit_seq, w.steps)
        job.emit("worker_left", worker=worker_id, host=w.slot.host, slot=w.slot.index, reason=w.why,
                 **({"round": w.round} if w.round else {}), early_return=True, commit_step=w.commit_seq,
                 steps=w.steps, **blocked_s(w.cooldown_s))
        if along:
            self._take_host_along(w)
