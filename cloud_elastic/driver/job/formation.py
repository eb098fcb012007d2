"""When the next round forms, and who is in it: the job's round formation.

:class:`RoundFormation` decides *when*; :func:`~.rounds.plan_round` decides
*who*, in which rank order, and whether the round syncs or loads a checkpoint.

* The first round forms once ``num_proc`` workers wait at rendezvous (or every
  worker launched has arrived or failed, with at least ``min_np``); later
  arrivals join as a scale-up.
* A later round forms when no member of the previous round is still running
  and at least ``min_np`` workers wait.
* A newcomer ready, or a member whose host is leaving, raises the update
  generation once per round: workers agree on it at a commit. With
  ``--whole-hosts`` a newcomer is ready once every slot of its host has one
  waiting, and a round takes whole hosts only (see :func:`~.rounds.plan_round`).
* Forming a round counts a reset (past ``reset_limit`` the job fails), and
  reports the rollback of the round a failure aborted, with the steps its
  survivors lost (they say so at rendezvous).

Cost: an arrival at rendezvous is O(1) amortised, never a scan of every worker.
The bookkeeping behind that (who waits, who is still starting, which members of
the current round may still be in it) is rebuilt exactly by :meth:`index` at
every step of the job; between steps only the job's ``rendezvous`` and
``assignment`` move workers in or out of WAITING, and they keep it up to date
(:meth:`now_waiting`, :meth:`stopped_waiting`).
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Callable, Protocol

from cloud_elastic.driver.job.actions import Phase
from cloud_elastic.driver.job.hosts import Slot
from cloud_elastic.driver.job.next_round import NextRounds, Plan
from cloud_elastic.driver.job.partitions import Partitions, round_hosts
from cloud_elastic.driver.job.ranks import Member, assign_ranks, facts_rows, tells_facts
from cloud_elastic.driver.job.plan import Candidate, RoundPlan, StateLost, plan_round, whole_host_groups
from cloud_elastic.driver.job.spares import (admit, doubtful, has_room, source_rank, spare_key, spare_slots,
                                             spares_now)
from cloud_elastic.driver.job.no_commit import ASK
from cloud_elastic.driver.job.view import JobView
from cloud_elastic.driver.job.workers import WorkerRecord, WorkerState
from cloud_elastic.protocol import Assignment, RankInfo

__all__ = ["RoundFormation", "DrainNews"]

log = logging.getLogger(__name__)

S = WorkerState


class DrainNews(Protocol):
    """What round formation needs to know of leaving hosts (see :mod:`.leaving`)."""

    def members_may_drain(self, round_: int) -> bool:
        """False when no member of round ``round_`` can be draining (spares a scan)."""

    def take_forced_drains(self) -> list[str]:
        """The log lines of hosts drained by force, waiting for the steps their removal lost."""

    def send_away(self, w: WorkerRecord, why: str) -> None:
        """Ask a staying worker to leave (a waiting one gets an exit order)."""

    def final_checkpoint_pending(self) -> bool:
        """The last holders of the state left with no successor, and their rank 0 still checkpoints it."""

    def leave_uncommitted(self, leavers: list[WorkerRecord], round_: int) -> None:
        """Round ``round_`` forms from step 0 without these draining members, who hold no commit heard of: they
        leave now."""


class RoundFormation:
    """The job's rounds: when one forms, its ranks and facts, and the rollback it reports."""

    def __init__(self, job: JobView, drains: DrainNews, on_formed: Callable[[float], None]) -> None:
        """``on_formed(running_now)`` is called when a round forms (the no-progress watch starts over)."""
        self._job = job
        self._drains = drains
        self._on_formed = on_formed
        #: Ranks of the current round's members (None before the first round).
        self.ranks: dict[str, RankInfo] | None = None
        self.needs_sync = True
        self.from_checkpoint = False
        #: The update generation the current round formed at (workers compare theirs to it).
        self.round_update_gen = 0
        self._update_for_round = -1
        #: The aborted round whose rollback is emitted when the next round forms.
        self.pending_rollback: int | None = None
        #: Steps the survivors of the aborted round rolled back (they report it at rendezvous).
        self.steps_lost = 0
        #: (aborted round, why) of a failure that a from-checkpoint round replaced: its rollback is
        #: emitted once rank 0 has said which checkpoint it loaded (``ElasticJob.checkpoint_loaded``).
        self.rollback_at_load: tuple[int, str] | None = None
        self._waiting_ids: set[str] = set()  # alive workers in WAITING
        self._starting_ids: set[str] = set()  # alive workers not yet at rendezvous
        # Members of the current round, checked lazily: a worker that stops being a (running) member of
        # round R never becomes one again (only forming round R+1 makes members), so the fronts are
        # popped once each and "is anyone still running?" costs O(1) amortised.
        self._running_left: deque[WorkerRecord] = deque()
        self._members_left: deque[WorkerRecord] = deque()
        self._news: set[str] = set()  # left WAITING since take_news()
        # --spares (see .spares): the order workers reached rendezvous in, the spares as of the last step,
        # and every worker counted a spare while it waited (a round that takes one reports it).
        self._arrivals: dict[str, int] = {}
        self._arrived = 0
        #: The workers waiting as spares at the last step (for status), in the order they would be taken.
        self.spare_ids: tuple[str, ...] = ()
        self._were_spares: set[str] = set()
        #: The planned next round, formed in the background by its members (see :mod:`.next_round`).
        self.next = NextRounds(job, self.request_update)
        #: The plan the current round was formed from (0: none; its members switch to the group they formed).
        self.planned = 0
        #: Every member of the current round gave its addresses at rendezvous, so reads its peers' in the round's
        #: store (``protocol.Assignment.peers_in_store``): an older worker's group would not form with envelopes.
        self.peers_in_store = False
        #: The current round's hosts, each once, when it has an older worker (one that gave no addresses): told to
        #: those only (``Assignment.hosts``), the hosts it names in its evidence of a partition (see .partitions).
        self.hosts: tuple[str, ...] = ()
        #: Rank 0's facts of the current round's first sync, told in its assignment (``protocol.Assignment.facts``:
        #: the other members are told that they are told), or None: the sync gathers them.
        self.facts: tuple[tuple[int, int, int], ...] | None = None
        #: Rounds that keep failing to form with the same members (see :mod:`.partitions`).
        self.partitions = Partitions(job, lambda w, why: drains.send_away(w, why))

    # ------------------------------------------------------------ bookkeeping
    def now_waiting(self, worker_id: str) -> None:
        """``worker_id`` arrived at rendezvous and waits for a round."""
        self._waiting_ids.add(worker_id)
        if worker_id not in self._arrivals:
            self._arrived += 1
            self._arrivals[worker_id] = self._arrived
        self._starting_ids.discard(worker_id)

    def stopped_waiting(self, worker_id: str) -> None:
        """``worker_id`` left rendezvous without a round (told to exit), or arrived only to leave."""
        self._waiting_ids.discard(worker_id)
        self._starting_ids.discard(worker_id)

    def take_news(self) -> set[str]:
        """Return and forget the workers that stopped waiting since the last call (see the job's
        ``take_rendezvous_news``)."""
        news, self._news = self._news, set()
        return news

    def index(self, alive: list[WorkerRecord]) -> None:
        """Rebuild the incremental bookkeeping from scratch (every full step of the job)."""
        waiting, starting, members, running = set(), set(), deque(), deque()
        r = self._job.round
        for w in alive:  # one pass, identity tests: this runs over every worker each step
            state = w.state
            if state is S.RUNNING:
                if w.round == r and r > 0:
                    members.append(w)
                    running.append(w)
            elif state is S.WAITING:
                waiting.add(w.worker_id)
            elif state is S.DRAINING:
                if w.round == r and r > 0:
                    members.append(w)
            elif state is S.STARTING or state is S.CONNECTED:
                starting.add(w.worker_id)
        self._news |= self._waiting_ids - waiting
        if self._arrivals:
            self._arrivals = {i: n for i, n in self._arrivals.items() if i in waiting}
        self._waiting_ids, self._starting_ids, self._members_left, self._running_left = waiting, starting, members, running

    def member_left(self, *, running_only: bool) -> bool:
        """Whether a member of the current round is still in it (``running_only``: still RUNNING)."""
        left = self._running_left if running_only else self._members_left
        states = (S.RUNNING,) if running_only else (S.RUNNING, S.DRAINING)
        r = self._job.round
        while left:
            w = left[0]
            if w.state in states and w.round == r:
                return True
            left.popleft()
        return False

    # -------------------------------------------------------------- decisions
    def arrived(self, w: WorkerRecord) -> bool:
        """What one arrival at rendezvous can change, without scanning every worker; True when the
        round may form now (the job then runs a full step, so it forms in the call of its last arrival).

        An arrival can only make a newcomer ready (ask the round for an update) or
        complete the round (its last member is back, or enough workers wait to
        start). Everything else is checked by the job's full step on the driver's tick.
        """
        job = self._job
        if self.next.told:
            self.next.came_back(w.worker_id)
        if job.phase is Phase.RUNNING and w.state is S.WAITING and w.rank is None and self._host_ready(w):
            if self._update_for_round != job.round and self.member_left(running_only=False) and self._room():
                self._newcomers_ready(job.members(), self._ready_newcomers())
        if job.policy.spares and w.rank is None:
            self.track_spares()  # a spare shows as one from its arrival, not from the next tick
        return job.phase in (Phase.STARTING, Phase.RUNNING) and self.may_form()

    def may_form(self) -> bool:
        """O(1) (amortised): whether :meth:`maybe_form` could form a round now."""
        if self.member_left(running_only=True):
            return False
        waiting = len(self._waiting_ids)
        job = self._job
        if waiting == 0 or waiting < job.policy.min_np:
            return False
        return not (job.phase is Phase.STARTING and waiting < job.policy.num_proc and self._starting_ids)

    def maybe_request_update(self, now: float | None = None) -> None:
        """A newcomer waits or a member's host is leaving: ask the running round for a change (once a round);
        newcomers alone are first offered a planned next round (see :mod:`.next_round`)."""
        job = self._job
        if now is not None:
            self.next.check(now)
        if job.phase is not Phase.RUNNING or self._update_for_round == job.round:
            return
        members = job.members()
        if not members:
            return
        newcomers = self._ready_newcomers()
        newcomer_ready = self._whole_host_waits(newcomers) and self._room(members)
        member_leaving = False
        if self._drains.members_may_drain(job.round):
            for w in members:
                if w.state is S.DRAINING:
                    member_leaving = True
                    break
        if member_leaving:
            self.next.drop("a host is leaving")
            self.request_update("a host is leaving")
        elif newcomer_ready:
            self._newcomers_ready(members, newcomers)

    def _ready_newcomers(self) -> list[WorkerRecord]:
        # Waiting workers are in _waiting_ids (exact since the last step; none start waiting
        # within a step), so there is no need to scan every worker for them.
        workers = self._job.workers
        return [workers[i] for i in self._waiting_ids
                if i in workers and workers[i].state is S.WAITING and workers[i].rank is None]

    def _newcomers_ready(self, members: list[WorkerRecord], newcomers: list[WorkerRecord]) -> None:
        """Plan the next round in the background, or (when it may not be planned) ask for the update now."""
        if not self.next.offer(members, newcomers):
            self.request_update("new worker ready")

    def _room(self, members: list[WorkerRecord] | None = None) -> bool:
        """Whether the running round has room for a newcomer: always without ``--spares`` (the job then never
        launches beyond ``--max-np``), else below ``--max-np`` staying members (see :mod:`.spares`). The last
        holders of the state training on leaving hosts are not staying: a spare must join to take the state."""
        job = self._job
        if not job.policy.spares:
            return True
        if job.abort_round >= job.round:
            return False  # an aborted round re-forms anyway: its recovery takes the spares, no update needed
        stays = job.hosts.stays
        staying = sum(1 for w in (job.members() if members is None else members)
                      if w.state is S.RUNNING and stays(w.slot) and not w.replaced)
        return has_room(staying, max_np=job.policy.max_np, host_slots=job.policy.whole_host_slots)

    def _spare_key(self, w: WorkerRecord) -> tuple:
        """Which waiting newcomer a round takes first (see :func:`~.spares.spare_key`)."""
        job = self._job
        specs = {s.name: s for s in job.policy.sources}
        ranked = source_rank(specs.get(job.hosts.sources.get(w.slot.host, "")),
                             job.hosts.prices.get(w.slot.host)) if specs else ()
        return spare_key(ranked, self._arrivals.get(w.worker_id, 1 << 62), job.hosts.order_of(w.slot.host),
                         w.slot.index, w.seq, doubtful(job.hosts, w.slot.host))

    def track_spares(self) -> None:
        """Which waiting workers are spares now (every step of a job with ``--spares``): the newcomers beyond the
        running round's room; none once the job no longer runs (it finishes, or a fixed-size job restarts). A
        change of who they are is logged and emitted as a ``spares`` event."""
        job = self._job
        policy = job.policy
        if not policy.spares:
            return
        ids: tuple[str, ...] = ()
        if job.phase is Phase.RUNNING:
            r = job.round
            hosts = job.hosts
            staying, newcomers = 0, []
            for w in job.alive():
                if w.state is S.WAITING and w.round != r:
                    newcomers.append(w)
                elif (w.round == r and (w.state is S.RUNNING or w.state is S.WAITING) and hosts.stays(w.slot)
                      and not w.replaced):
                    staying += 1  # a member, or one back at rendezvous for the next round (not a last holder)
            waiting = spares_now(newcomers, staying=staying, max_np=policy.max_np,
                                 host_slots=policy.whole_host_slots, key=self._spare_key,
                                 where=lambda w: (w.slot.host, w.slot.index))
            # Beyond --spares (a doubtful spare's healthy replacement is ready, or its host's notice lapsed since),
            # the last by the spare order leave: doubtful ones first. One more would cost an instance for nothing.
            for w in waiting[spare_slots(policy.spares, policy.whole_host_slots):]:
                host = w.slot.host
                if host in hosts.missing and host not in hosts.soft and host not in hosts.provider_soft:
                    # Missing from discovery within its grace: kept, as a member's workers are (one answer that
                    # left it out costs no spare). Its replacement started; if the host comes back, the spare
                    # that arrived last is the one beyond --spares; if it is removed, so is this one.
                    continue
                why = "a spare beyond --spares: " + (
                    "its host is doubtful (a soft notice, or missing from discovery) and a healthy spare is ready"
                    if doubtful(hosts, w.slot.host) else "the job has enough ready spares")
                log.info("job %s: worker %s (%s) will leave: %s", job.job_id, w.worker_id, w.label, why)
                self._drains.send_away(w, why)
            spares = [w for w in waiting if not doubtful(hosts, w.slot.host) and w.state is S.WAITING]
            ids = tuple(w.worker_id for w in spares)
            self._were_spares.update(ids)
        if set(ids) != set(self.spare_ids):
            wanted = spare_slots(policy.spares, policy.whole_host_slots)
            log.info("job %s: %d of %d spare(s) ready%s", job.job_id, len(ids), wanted,
                     f": {', '.join(ids)}" if ids else "")
            job.emit("spares", ready=len(ids), wanted=wanted, workers=list(ids))
        self.spare_ids = ids

    def _host_ready(self, w: WorkerRecord) -> bool:
        """Whether newcomer ``w`` may join now (see :meth:`_whole_host_waits`)."""
        if not self._job.policy.whole_host_slots:
            return True
        workers = self._job.workers
        return self._whole_host_waits([workers[i] for i in self._waiting_ids if i in workers
                                       and workers[i].slot.host == w.slot.host and workers[i].rank is None
                                       and workers[i].state is S.WAITING])

    def _whole_host_waits(self, newcomers: list[WorkerRecord]) -> bool:
        """Whether any of these waiting newcomers may join: any at all, except under ``--whole-hosts``, where every
        slot of a host must have one waiting (a round takes whole hosts only; asking for one sooner would cost the
        running round a stop for nothing). One pass over ``newcomers``."""
        slots = self._job.policy.whole_host_slots
        if not slots:
            return bool(newcomers)
        return bool(whole_host_groups(newcomers, slots, lambda w: (w.slot.host, w.slot.index)))

    def request_update(self, why: str) -> None:
        job = self._job
        job.update_gen += 1
        self._update_for_round = job.round
        log.info("job %s: membership change requested (update %d): %s", job.job_id, job.update_gen, why)

    def assignment(self, w: WorkerRecord) -> Assignment | None:
        """``w``'s assignment when it is a running member of the current round, or a newcomer of the planned
        next round (see :mod:`.next_round`), else None. A member drained (a notice for its host) before it took
        its assignment still gets it: its peers wait for it in the round's group, and it leaves at the round's
        first commit, as any drained member."""
        job = self._job
        if w.state is S.WAITING:
            return self.next.assignment_for(w)
        if w.state in (S.RUNNING, S.DRAINING) and w.round == job.round and self.ranks is not None:
            ranks = self.ranks[w.worker_id]
            return Assignment(job.round, ranks, self.needs_sync, self.round_update_gen, self.from_checkpoint,
                              self.planned, self.peers_in_store, self.hosts if w.addresses is None else (),
                              None if self.facts is None else self.facts if ranks.rank == 0 else ())
        return None

    def rank0(self) -> WorkerRecord | None:
        """Rank 0 of the current round while it is still training in it, else None."""
        if self.ranks is None:
            return None
        job = self._job
        for worker_id, ranks in self.ranks.items():
            if ranks.rank == 0:
                w = job.workers.get(worker_id)
                return w if w is not None and w.member_of(job.round) else None
        return None

    def adopt_round(self, ranks: dict[str, RankInfo], update_gen: int, now: float) -> None:
        """A restarted driver goes on in the round its adopted workers were in, with their ranks
        (at ``now``: for the no-progress watch, the round is as good as formed then)."""
        self.ranks = ranks
        self.round_update_gen = update_gen
        self.needs_sync = False
        self.from_checkpoint = False
        self.planned, self.peers_in_store, self.facts = 0, False, None
        self.hosts = round_hosts(self._job.workers[wid] for wid in ranks if wid in self._job.workers)
        self._on_formed(self._job.running(now))

    def maybe_form(self, now: float) -> None:
        """Form the next round if it may form now (see the module rules); then note the spares."""
        self._maybe_form(now)
        self.track_spares()

    def _maybe_form(self, now: float) -> None:
        job = self._job
        # The lazy queue answers "still running" in O(1); only its "no" is confirmed by a scan.
        if self.member_left(running_only=True) or any(w.state is S.RUNNING for w in job.members()):
            return  # the current round is still running (draining members leave at the same commit)
        alive = job.alive()
        waiting = [w for w in alive if w.state is S.WAITING]
        if job.phase is Phase.STARTING:
            still_starting = any(w.state in (S.STARTING, S.CONNECTED) for w in alive)
            # The first round forms once -np workers are ready (under --whole-hosts, on whole hosts: a host
            # still starting is no part of a round yet); later arrivals join as a scale-up.
            slots = job.policy.whole_host_slots
            ready = sum(map(len, whole_host_groups(waiting, slots, lambda w: (w.slot.host, w.slot.index)))) \
                if slots else len(waiting)
            if ready < job.policy.num_proc and still_starting:
                return
        if not waiting or len(waiting) < job.policy.min_np:
            return
        if not self.partitions.check(waiting, now):  # the job ended, or hosts cut off were sent away
            if job.phase is not Phase.DONE:
                self._maybe_form(now)
            return
        if self.partitions.holding(now):  # failed formations in a row back the next one off (a later tick forms it)
            return
        planned = self.next.take(waiting) if job.phase is Phase.RUNNING else None
        if planned is not None:  # the round is the plan's members, nobody else
            waiting = [w for w in waiting if w.worker_id in planned.ranks]
        elif self.next.told:  # newcomers told of a plan wait in its group until they learn it was dropped
            waiting = [w for w in waiting if w.worker_id not in self.next.told]
            if not waiting or len(waiting) < job.policy.min_np:
                return
        candidates = [
            Candidate(w.worker_id, w.slot.host, w.slot.index, w.rank, w.holds_state,
                      (job.hosts.order_of(w.slot.host), w.slot.index, w.seq), w.commit_seq)
            for w in waiting
        ]
        leaving = _last_holders(waiting, job.hosts.stays)
        if job.policy.spares:  # more may wait than a round takes: which of them go first (see .spares)
            workers = job.workers
            candidates = admit(candidates, max_np=job.policy.max_np, host_slots=job.policy.whole_host_slots,
                               key=lambda c: self._spare_key(workers[c.worker_id]), leaving=leaving)
        plan = plan_round(
            candidates,
            max_np=job.policy.max_np + len(leaving),
            # A worker that lost its commit holds a state no one may take, even before the first commit.
            state_committed=job.state_committed or any(w.commit_lost for w in waiting),
            failure_since_last_round=job.failure_since_round,
            checkpointing=job.policy.checkpointing,
            host_slots=job.policy.whole_host_slots,
        )
        if plan is None or (not isinstance(plan, StateLost) and len(plan.members) < job.policy.min_np):
            return  # whole hosts only: not enough of them wait yet
        if self._state_still_leaving(plan):
            return
        if planned is not None and not (isinstance(plan, RoundPlan) and _plan_fits(planned, plan)
                                         and job.update_gen == planned.update_gen):
            # Not the round the rules form now: form that one, without the newcomers told of the plan.
            self.next.drop("the round it planned is not the round the rules form now")
            self._maybe_form(now)
            return
        if isinstance(plan, StateLost):
            job.end(False, f"training state lost: {job.commits_lost_reason() or plan.reason}", 1)
            return
        if job.round > 0:
            # ``resets`` counts the rounds formed after the first (job_finished's field, the resets metric):
            # the one refused here never forms.
            if job.policy.reset_limit is not None and job.resets + 1 > job.policy.reset_limit:
                job.end(False, f"reset limit exceeded: reset {job.resets + 1} would exceed --reset-limit "
                        f"{job.policy.reset_limit}", 1)
                return
            job.resets += 1
        behind = self._uncommitted_left_behind(plan)
        if behind:
            self._drains.leave_uncommitted(behind, job.round + 1)
        job.round += 1
        ordered = [job.workers[c.worker_id] for c in plan.members]
        if planned is not None:
            ordered.sort(key=lambda w: planned.ranks[w.worker_id].rank)
            self.ranks, self.planned, self.peers_in_store = dict(planned.ranks), planned.plan, planned.peers_in_store
            self.next.formed(planned)
        else:
            self.ranks = assign_ranks([Member(w.worker_id, w.slot.host, w.slot.index) for w in ordered])
            self.planned, self.peers_in_store = 0, all(w.addresses is not None for w in ordered)
        self.hosts = () if self.peers_in_store else round_hosts(ordered)
        self.needs_sync = plan.needs_sync
        told = planned.facts if planned is not None else (plan.needs_sync and not plan.from_checkpoint
                                                          and tells_facts(ordered))
        self.facts = facts_rows(sorted(ordered, key=lambda w: self.ranks[w.worker_id].rank)) if told else None
        self.from_checkpoint = plan.from_checkpoint
        self.round_update_gen = job.update_gen
        job.failure_since_round = False
        self._on_formed(job.running(now))
        for w in ordered:
            w.to(S.RUNNING)
            w.round = job.round
            w.rank = self.ranks[w.worker_id].rank
        self.partitions.formed(job.round, ordered)
        if job.phase is Phase.STARTING:
            job.phase = Phase.RUNNING
        log.info(
            "job %s: round %d formed with %d worker(s) (sync=%s%s%s): %s", job.job_id, job.round, len(ordered),
            self.needs_sync, ", from the latest checkpoint" if plan.from_checkpoint else "",
            f", planned: its group formed in the background (plan {self.planned})" if self.planned else "",
            ", ".join(f"{w.rank}={w.worker_id}" for w in ordered),
        )
        commit = max((w.commit_seq for w in ordered), default=0)
        self._report_rollback(commit, plan.from_checkpoint)
        job.abort_reason = ""  # named by that rollback: the new round's own abort sets it again
        taken = sum(1 for w in ordered if w.worker_id in self._were_spares)
        self._were_spares.intersection_update(w.worker_id for w in waiting if w.state is S.WAITING)
        if taken:
            log.info("job %s: round %d took %d spare(s)", job.job_id, job.round, taken)
        job.emit(
            "round_formed", round=job.round, size=len(ordered), synced=self.needs_sync,
            # Before anyone has committed there is no step to continue from, and a round that loads a
            # checkpoint learns its step from rank 0's checkpoint_loaded (null, as documented).
            from_checkpoint=plan.from_checkpoint,
            step=commit if job.state_committed and not plan.from_checkpoint else None,
            ranks=_ranks_by_host(ordered), workers=[w.worker_id for w in sorted(ordered, key=lambda w: w.rank)],
            **({"spares_taken": taken} if taken else {}),
            **({"planned": self.planned} if self.planned else {}),
        )

    def _state_still_leaving(self, plan: RoundPlan | StateLost) -> bool:
        """Whether ``plan`` is a round without the state while a member leaving at its next commit still trains with
        it, or the last holders' rank 0 checkpoints it on its way out: no such round forms yet."""
        job = self._job
        if isinstance(plan, StateLost) or plan.from_checkpoint:
            return self._drains.final_checkpoint_pending() or any(
                w.state is S.DRAINING and w.holds_state for w in job.members())
        return False

    def _uncommitted_left_behind(self, plan: RoundPlan) -> list[WorkerRecord]:
        """Before any commit is heard of, the members draining for a notice that ``plan``, a round of none of the
        current round's members (it starts from step 0), leaves behind. They are no longer kept as the prospective
        holders of the first commit (see :meth:`.leaving.Leavers.mark`: its deadline is too close, the bound without
        one passed, or a loss aborted their round), so no round waits for them: they must leave now rather than
        train on beside it, and a commit they make would not be the new round's."""
        job = self._job
        if job.state_committed or any(job.workers[c.worker_id].round == job.round for c in plan.members):
            return []
        return [w for w in job.members() if w.state is S.DRAINING and not job.hosts.stays(w.slot)]  # or gone

    def _report_rollback(self, commit: int, from_checkpoint: bool) -> None:
        """The round an abort ended rolled back to ``commit``, where this round continues from."""
        job = self._job
        if self.pending_rollback is not None and from_checkpoint:
            # Which commit the round goes back to is known only once rank 0 has loaded the checkpoint.
            self.rollback_at_load = (self.pending_rollback,
                                     job.abort_reason or job.last_failure or "every state holder was lost")
            self.pending_rollback = None
        if self.pending_rollback is not None:
            aborted, self.pending_rollback = self.pending_rollback, None
            # The survivors rolled back to what they reported at rendezvous, the step this round continues
            # from; the commit count seen at the abort comes from older heartbeats and may lag behind.
            job.emit("rollback", round=aborted, commit_step=commit if job.state_committed else None,
                     steps_lost=self.steps_lost, reason=job.abort_reason or job.last_failure or "a collective failed")
            if job.state_committed:
                log.info("job %s: round %d's survivors rolled back %d step(s), to their commit #%d",
                         job.job_id, aborted, self.steps_lost, commit)
            elif self.steps_lost:
                log.warning("job %s: round %d's survivors went back to the initial state, losing %d optimizer step(s): "
                            "no worker has committed (%s)", job.job_id, aborted, self.steps_lost, ASK)
            for what in self._drains.take_forced_drains():
                log.info("%s; the survivors rolled back %d step(s) to their last commit", what, self.steps_lost)
        self.steps_lost = 0


def _last_holders(waiting: list[WorkerRecord], stays: Callable[[Slot], bool]) -> set[str]:
    """The waiting workers kept as the last holders of the state (see :meth:`.leaving.Leavers.mark`,
    :mod:`.discovery_edge`): every waiting holder is on a leaving host (draining, or missing and kept). They take
    no place of ``--max-np`` in the next round: a newcomer joins next to them and receives the state, and they
    leave at that round's first commit."""
    holders = [w for w in waiting if w.holds_state]
    going = {w.worker_id for w in holders if not stays(w.slot) or w.replaced}  # or replaced: see .sourcing
    return going if len(going) == len(holders) else set()


def _plan_fits(planned: Plan, plan: RoundPlan) -> bool:
    """Whether the round planned in the background is the round the rules form now: the same members, and
    the plan's rank 0 holds the newest commit the rules would sync from (else it forms as usual)."""
    if plan.from_checkpoint or {c.worker_id for c in plan.members} != set(planned.ranks):
        return False
    first = plan.members[0]
    root = next(c for c in plan.members if planned.ranks[c.worker_id].rank == 0)
    return root.holds_state == first.holds_state and root.commit_seq == first.commit_seq


def _ranks_by_host(ordered: list[WorkerRecord]) -> dict[str, list[int]]:
    by_host: dict[str, list[int]] = {}
    for w in ordered:
        if w.rank is not None:
            by_host.setdefault(w.slot.host, []).append(w.rank)
    return by_host
