"""The planned next round: admitting newcomers without stalling the running round.

When newcomers are ready to join a running round and no member leaves, the job
does not ask the running workers to stop at once. It first *plans* round N+1:
its members (every running member and the newcomers a round would take, by the
rules of :func:`~.plan.plan_round`) and their ranks (:func:`~.ranks.assign_ranks`),
and offers the plan to each of its members in their heartbeat reply
(:class:`~cloud_elastic.protocol.NextRound`). Each member forms the plan's
process group in the background, the running ones while they train on in round
N, and reports it (kind ``next_round``). Once every member has formed it the
plan is *armed*: the update generation is raised, the running members agree on
it at their next commit, rendezvous, and the round forms at once with the
plan's ranks; its assignment names the plan (``Assignment.planned``) and every
member switches to the group it already holds.

A plan is only a proposal until it is armed and the round forms from it. It is
dropped, and the job goes on exactly as without it (its next update is
requested as before, and is never planned again in the same round), when:

* a member could not form the plan's group, or did not within
  :data:`FORM_DEADLINE_S` of the offer;
* a member of the running round fails, the round is aborted, or a member's
  host is noticed leaving;
* a member of the plan is gone (a newcomer lost, a running member no longer
  running in the round the plan was made in);
* a member of the running round returned from its training function (it waits
  for rank 0, or the job is finishing: rank 0 returned): from then on the plan
  is offered to nobody, so every member cancels its formation at its next
  heartbeat, and none starts one again while it exits; no round is planned
  while a member has returned (a plan with such a member left rank 0 forming a
  group with peers that never would, at its exit).

A round formed from the plan needs every member of the plan at rendezvous and
nobody else (newcomers that became ready meanwhile wait for the next update);
whether it syncs or loads a checkpoint is decided then, from what the members
report, by :func:`~.plan.plan_round`; if that does not give the plan's members
with the plan's rank 0 holding the newest commit, the round forms as usual and
no one uses the planned group. Jobs with ``--spares`` or ``--whole-hosts`` are
not planned (their admission order has rules of its own). A restarted driver
knows no plan and numbers its own from 1 again: the workers drop the one they held and forget the dead
driver's plan numbers (see ``worker.rounds.next_group``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable

from cloud_elastic.driver.job.actions import Phase
from cloud_elastic.driver.job.partitions import round_hosts
from cloud_elastic.driver.job.plan import Candidate, RoundPlan, plan_round
from cloud_elastic.driver.job.ranks import Member, assign_ranks, tells_facts
from cloud_elastic.driver.job.view import JobView
from cloud_elastic.driver.job.workers import WorkerRecord, WorkerState
from cloud_elastic.protocol import Assignment, NextRound, RankInfo

__all__ = ["FORM_DEADLINE_S", "NextRounds", "Plan"]

log = logging.getLogger(__name__)

S = WorkerState

#: How long the members of a plan have to form its group, from the offer, before the plan is dropped. A newcomer
#: reports once its script reached its first collective in the plan's round: this covers its set-up too.
FORM_DEADLINE_S = 120.0


@dataclass
class Plan:
    """One planned next round (see the module docstring)."""

    plan: int
    #: The round it becomes: the running round's number plus one.
    round: int
    ranks: dict[str, RankInfo]
    #: Its members that were running in the round it was planned in (the rest are newcomers).
    staying: frozenset[str]
    #: The update generation its round forms at: arming it raises the job's by one.
    update_gen: int = 0
    #: Its members all read their peers' addresses in the round's store (``protocol.Assignment.peers_in_store``).
    peers_in_store: bool = False
    #: Its hosts when it has an older worker, told to those only (``formation.RoundFormation.hosts``).
    hosts: tuple[str, ...] = ()
    #: Its round is told its sync's facts (``protocol.Assignment.facts``): its newcomers learn so before it forms.
    facts: bool = False
    offered_at: float | None = None
    formed: set[str] = field(default_factory=set)
    armed: bool = False

    @property
    def for_round(self) -> int:
        return self.round - 1


class NextRounds:
    """The job's planned next round, at most one at a time (see the module docstring)."""

    def __init__(self, job: JobView, request_update: Callable[[str], None]) -> None:
        self._job = job
        self._request_update = request_update
        self.plan: Plan | None = None
        self._count = 0
        self._no_plan_round = -1  # a plan was dropped in this round: its next update goes the usual way
        #: Changes whenever the offers change (the runtime answers held heartbeats then).
        self.version = 0
        #: Newcomers answered with a plan's round, until they are in a round or back at rendezvous: a round
        #: formed without them must not count them (they wait in the plan's group until they learn it is gone).
        self.told: dict[str, int] = {}

    # ----------------------------------------------------------------- offers
    def offer(self, members: list[WorkerRecord], newcomers: list[WorkerRecord]) -> bool:
        """Newcomers are ready: plan the next round, unless one is planned already. False when this round's
        change must go the usual way (nothing may be planned now), and the caller requests the update."""
        job = self._job
        if self.plan is not None and self.plan.for_round == job.round:
            return True
        if not self._may_plan(members):
            return False
        running = [w for w in members if w.state is S.RUNNING]
        if not running or not newcomers:
            return False
        # Every running member holds the same commit at the commit that switches rounds. What their heartbeats told
        # so far lags by up to a heartbeat: the newest commit may be a step ahead on one of them, or rank 0's first
        # commit not told yet while rank 1's was (seen under load); neither may move rank 0, so the survivors keep
        # their order. The round checks the plan against what they report at rendezvous (``formation._plan_fits``).
        seq = max(w.commit_seq for w in running)
        held = any(w.holds_state for w in running)
        candidates = [Candidate(w.worker_id, w.slot.host, w.slot.index, w.rank, held,
                                (job.hosts.order_of(w.slot.host), w.slot.index, w.seq), seq) for w in running]
        candidates += [Candidate(w.worker_id, w.slot.host, w.slot.index, None, w.holds_state,
                                 (job.hosts.order_of(w.slot.host), w.slot.index, w.seq), w.commit_seq)
                       for w in newcomers]
        planned = plan_round(candidates, max_np=job.policy.max_np, state_committed=job.state_committed,
                             failure_since_last_round=False, checkpointing=job.policy.checkpointing)
        if not isinstance(planned, RoundPlan) or planned.from_checkpoint:
            return False
        ids = {c.worker_id for c in planned.members}
        if not all(w.worker_id in ids for w in running) or len(ids) == len(running):
            return False  # it would leave a running member out, or take no newcomer: not this path
        ordered = [job.workers[c.worker_id] for c in planned.members]
        self._count += 1
        every = all(w.addresses is not None for w in ordered)
        ranks = assign_ranks([Member(w.worker_id, w.slot.host, w.slot.index) for w in ordered])
        staying = frozenset(w.worker_id for w in running)
        told = tells_facts(ordered) and next(i for i, r in ranks.items() if r.rank == 0) in staying
        self.plan = Plan(self._count, job.round + 1, ranks, staying, job.update_gen + 1, every,
                         () if every else round_hosts(ordered), told)
        self.version += 1
        log.info("job %s: round %d planned (plan %d, %d worker(s)); its members form its group in the background: %s",
                 job.job_id, self.plan.round, self.plan.plan, len(ordered),
                 ", ".join(f"{self.plan.ranks[w.worker_id].rank}={w.worker_id}" for w in ordered))
        return True

    def _may_plan(self, members: list[WorkerRecord]) -> bool:
        job = self._job
        policy = job.policy
        return (policy.plan_admissions and job.phase is Phase.RUNNING and job.round > 0 and job.abort_round < job.round
                and self._no_plan_round != job.round and not policy.spares and not policy.whole_host_slots
                and not job.failure_since_round and not any(w.state is S.DRAINING or w.returned for w in members))

    def offer_to(self, worker_id: str) -> NextRound | None:
        """The plan for ``worker_id``'s heartbeat reply, when it is one of its members."""
        plan = self.plan
        if (plan is None or worker_id not in plan.ranks or plan.for_round != self._job.round
                or self._job.phase is not Phase.RUNNING or self._returned(plan)):
            return None
        return NextRound(plan.plan, plan.round, plan.ranks[worker_id], plan.peers_in_store)

    def assignment_for(self, w: WorkerRecord) -> Assignment | None:
        """A newcomer of the plan is answered at rendezvous at once, with the planned round: it forms the
        plan's group, sets up its training and waits in its first sync while the running members train on."""
        plan = self.plan
        if (plan is None or w.worker_id not in plan.ranks or w.worker_id in plan.staying
                or plan.for_round != self._job.round or self._job.phase is not Phase.RUNNING or self._returned(plan)):
            return None
        self.told[w.worker_id] = plan.plan
        return Assignment(plan.round, plan.ranks[w.worker_id], True, plan.update_gen, False, plan.plan,
                          plan.peers_in_store, plan.hosts if w.addresses is None else (), () if plan.facts else None)

    def _returned(self, plan: Plan) -> bool:
        """Whether a running member of ``plan`` returned from its training function (told before the job's next
        step drops the plan): O(its members)."""
        workers = self._job.workers
        return any(w is not None and w.returned for w in map(workers.get, plan.staying))

    def came_back(self, worker_id: str) -> None:
        """A newcomer told of a plan is at rendezvous again (the plan was dropped): it counts for rounds again."""
        if self.plan is None or self.plan.plan != self.told.get(worker_id):
            self.told.pop(worker_id, None)

    def formed(self, plan: Plan) -> None:
        """The round formed from ``plan``: its newcomers are members now."""
        for worker_id in plan.ranks:
            self.told.pop(worker_id, None)

    # ---------------------------------------------------------------- reports
    def report(self, worker_id: str, plan: int, formed: bool, reason: str = "") -> None:
        """A member formed the group of ``plan`` in the background, or could not."""
        p = self.plan
        if p is None or p.plan != plan or worker_id not in p.ranks or p.armed:
            return
        if not formed:
            self.drop(f"worker {worker_id} could not form its group ({reason or 'no reason given'})")
            return
        p.formed.add(worker_id)
        if len(p.formed) == len(p.ranks) and self.check_members():
            p.armed = True
            self._request_update(f"new worker ready; round {p.round} formed in the background (plan {p.plan})")

    # ------------------------------------------------------------------ rules
    def check(self, now: float) -> None:
        """Every step of the job: drop the plan when a rule of the module docstring says so."""
        p = self.plan
        if p is None:
            return
        job = self._job
        if job.round >= p.round:
            self.plan = None  # the round formed (from the plan or not): nothing left to offer
            self.version += 1
            return
        if p.offered_at is None:
            p.offered_at = now
        if not p.armed and now - p.offered_at > FORM_DEADLINE_S:
            self.drop(f"not formed by every member within {FORM_DEADLINE_S:g}s")
            return
        self.check_members()

    def check_members(self) -> bool:
        """Whether the plan still stands (else it is dropped): O(its members)."""
        p = self.plan
        if p is None:
            return False
        job = self._job
        if job.phase is not Phase.RUNNING or job.abort_round >= job.round or job.round != p.for_round:
            self.drop("the job is finishing" if job.phase in (Phase.FINISHING, Phase.DONE) else
                      "the running round was aborted" if job.abort_round >= job.round else "the round changed")
            return False
        for worker_id in p.ranks:
            w = job.workers.get(worker_id)
            if w is None or not w.alive:
                self.drop(f"worker {worker_id} is gone")
                return False
            if w.returned:
                self.drop(f"worker {worker_id} returned from its training function")
                return False
            if worker_id in p.staying:
                ok = w.round == p.for_round and (w.state is S.RUNNING or (p.armed and w.state is S.WAITING))
            else:
                ok = w.state is S.WAITING and w.rank is None
            if not ok:
                self.drop(f"worker {worker_id} is {w.state.value}")
                return False
        if job.failure_since_round:
            self.drop("a worker failed")
            return False
        for w in job.members():
            if w.state is S.DRAINING:
                self.drop(f"the host of worker {w.worker_id} is leaving")
                return False
        return True

    def drop(self, why: str) -> None:
        p = self.plan
        if p is None:
            return
        job = self._job
        self.plan = None
        self.version += 1
        self._no_plan_round = p.for_round
        log.info("job %s: plan %d of round %d dropped (%s); the round changes as usual", job.job_id, p.plan, p.round,
                 why)

    # -------------------------------------------------------------- formation
    def take(self, waiting: list[WorkerRecord]) -> Plan | None:
        """The armed plan, when every one of its members waits at rendezvous (the round forms from it now)."""
        p = self.plan
        if p is None or not p.armed or not self.check_members():
            return None
        ids = {w.worker_id for w in waiting}
        return p if all(i in ids for i in p.ranks) else None
