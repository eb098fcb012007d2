"""The elastic job as a state machine: the driver's every decision, no I/O.

:class:`ElasticJob` is fed events (discovery snapshots, notices, worker
messages, process exits, clock ticks) with the current time, and answers with
replies and queued :data:`Action` objects that the runtime (:mod:`.driver`)
carries out. It starts no thread, opens no socket and reads no clock of its
own, so every rule is tested alone with scripted timelines.

It is assembled from small pieces, each tested on its own:

* :mod:`.workers` — one worker's life as an explicit state machine;
* :mod:`.rounds` — who forms the next round, in which rank order, and whether
  it syncs or must load a checkpoint (a pure function);
* :mod:`.liveness` — worker silence measured only over time the driver ran, and which
  workers are overdue;
* :mod:`.hosts` — host order, the per-slot blacklist, hosts missing from
  discovery for less than the grace, draining hosts and their deadlines.

What this module adds is *when*: a round forms when every live member of the
previous round is back at rendezvous and at least ``min_np`` workers wait (at
start-up: ``num_proc``, or everyone launched); a graceful change (newcomer
ready, host leaving) raises the update generation, which workers agree on at a
commit; a failure of a member aborts the round so that its peers abandon their
collectives and roll back.

Progress is never silently lost: the driver knows which workers hold committed
state (they report their commits), rank 0 is always one of them, and when none
is left the job resumes from a durable checkpoint or fails with a clear error.
"""

from __future__ import annotations

import enum
import logging
import signal
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Union

from cloud_elastic.driver.hosts import HostManager, Slot
from cloud_elastic.driver.launch import ExitStatus
from cloud_elastic.driver.liveness import RunningClock, SilenceWatch
from cloud_elastic.driver.planner import Member, assign_ranks
from cloud_elastic.driver.rounds import Candidate, StateLost, plan_round
from cloud_elastic.driver.workers import WorkerRecord, WorkerState
from cloud_elastic.protocol import AdoptRequest, Assignment, ExitOrder, PollReply, RankInfo
from cloud_elastic.providers.api import DiscoveredHosts, Drain

__all__ = [
    "Policy",
    "Phase",
    "WorkerState",
    "WorkerRecord",
    "Launch",
    "Stop",
    "Release",
    "Finish",
    "Action",
    "Assignment",
    "ExitOrder",
    "PollReply",
    "ElasticJob",
]

log = logging.getLogger(__name__)

S = WorkerState

#: How often a long wait (slots for -np, below --min-np) prints a progress line.
PROGRESS_EVERY_S = 15.0


@dataclass(frozen=True)
class Policy:
    """The numbers that steer the job (from :class:`~cloud_elastic.config.JobConfig`)."""

    num_proc: int
    min_np: int
    max_np: int
    reset_limit: int | None = None
    elastic_timeout_s: float = 600.0
    start_timeout_s: float = 600.0
    heartbeat_timeout_s: float = 5.0
    completion_grace_s: float = 30.0
    #: A durable checkpoint can bring the state back when no worker holds it.
    checkpointing: bool = False
    #: A draining host's workers still in their round this long before its deadline are removed by force.
    deadline_margin_s: float = 5.0
    #: A round in which no member makes progress this long is aborted (``--progress-timeout``; 0: never).
    progress_timeout_s: float = 120.0


#: A member whose training function returned is found to have returned early once rank 0 has waited
#: this long in a collective (that member will never join it).
EARLY_RETURN_WAIT_S = 5.0
#: How long a stuck round's members get to send their stacks before the driver acts without them.
STACKS_WAIT_S = 5.0


@dataclass
class _Stall:
    """A stuck round found by the no-progress watch, waiting for its members' stacks before the driver acts."""

    kind: str  # "stalled": nobody made progress; "not_back": members did not come back after an abort
    round: int
    workers: list[str]
    asked_at: float  # running time
    idle_s: float


class Phase(enum.Enum):
    STARTING = "starting"  # waiting for -np slots / the first round
    RUNNING = "running"
    FINISHING = "finishing"  # a worker's training function returned
    DONE = "done"


@dataclass(frozen=True)
class Launch:
    """Start a worker with this id on this slot."""

    slot: Slot
    worker_id: str


@dataclass(frozen=True)
class Stop:
    """Stop a worker's process group (``immediate`` = KILL at once)."""

    worker_id: str
    reason: str
    immediate: bool = False


@dataclass(frozen=True)
class Release:
    """The job no longer needs draining ``host``: let the cloud take it (``HostDiscovery.release``)."""

    host: str
    instance: str | None


@dataclass(frozen=True)
class Finish:
    """The job is over: stop everything and exit with ``exit_code``."""

    success: bool
    reason: str
    exit_code: int


Action = Union[Launch, Stop, Release, Finish]


@dataclass
class ElasticJob:
    """Pure state machine of one elastic job (see module docstring)."""

    policy: Policy
    hosts: HostManager
    job_id: str = "job"
    phase: Phase = Phase.STARTING
    round: int = 0
    resets: int = 0
    update_gen: int = 0
    abort_round: int = 0
    workers: dict[str, WorkerRecord] = field(default_factory=dict)
    outcome: Finish | None = None
    #: Some worker has committed: from now on, the state must never be lost.
    state_committed: bool = False
    #: A restarted driver resuming the job from its durable checkpoints: the state exists
    #: before any worker runs, so the first round loads the latest checkpoint.
    resumed: bool = False
    #: Host -> where its latest notice came from (for status).
    notice_sources: dict[str, str] = field(default_factory=dict)
    _actions: list[Action] = field(default_factory=list)
    _events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    _clock: RunningClock = field(default_factory=RunningClock)
    _wall_offset: float = 0.0
    _seq: int = 0
    _started_at: float | None = None
    _discovered_once: bool = False
    _discovery_failing_since: float | None = None
    _below_min_since: float | None = None
    _failure_since_round: bool = False
    _update_for_round: int = -1
    _finishing_since: float | None = None
    _last_failure: str = ""
    _ranks: dict[str, RankInfo] | None = None  # of the current round
    _needs_sync: bool = True
    _from_checkpoint: bool = False
    _round_update_gen: int = 0
    _released: set[str] = field(default_factory=set)
    _forced: set[str] = field(default_factory=set)  # draining hosts whose workers were removed by force
    _forced_drains: list[str] = field(default_factory=list)  # their log lines, until the steps lost are known
    _state_lost_logged: bool = False
    _completed: int = 0  # workers that exited after completing
    _last_discovery_error: str = ""
    _pending_rollback: int | None = None  # the aborted round; its rollback is emitted when the next round forms
    _steps_lost: int = 0  # steps the survivors of the aborted round rolled back (they report it)
    _commit_high: int = 0  # the highest commit any worker reported since the last checkpoint load
    #: (aborted round, why) of a failure that a from-checkpoint round replaced: its rollback is
    #: emitted once rank 0 has said which checkpoint it loaded (checkpoint_loaded).
    _rollback_at_load: tuple[int, str] | None = None
    _waits: dict[str, tuple[float, float]] = field(default_factory=dict)  # progress lines: key -> (since, last)
    #: A restarted driver takes over the running workers of its predecessor (see :meth:`adopt`).
    adopting: bool = False
    _adopted: dict[int, dict[str, tuple[RankInfo, int]]] = field(default_factory=dict)  # round -> id -> (ranks, gen)
    # Incremental bookkeeping so that a rendezvous arrival costs O(1), not a scan of every worker
    # (see _round_may_form). Rebuilt exactly by every _step; between steps only rendezvous() and
    # assignment() move workers in or out of WAITING, and they keep these up to date.
    _waiting_ids: set[str] = field(default_factory=set)  # alive workers in WAITING
    _starting_ids: set[str] = field(default_factory=set)  # alive workers not yet at rendezvous
    # Members of the current round, checked lazily: a worker that stops being a (running) member of
    # round R never becomes one again (only forming round R+1 makes members), so the fronts are
    # popped once each and "is anyone still running?" costs O(1) amortised.
    _running_left: deque[WorkerRecord] = field(default_factory=deque)
    _members_left: deque[WorkerRecord] = field(default_factory=deque)
    _rendezvous_news: set[str] = field(default_factory=set)  # left WAITING since take_rendezvous_news()
    _alive_memo: list[WorkerRecord] | None = None  # _alive() during one _step; reset on every birth or death
    # Exact shortcuts for the scans of a step in which nothing they look at changed (the liveness
    # scan keeps its own, see SilenceWatch): no worker's host changed usability while hosts.version
    # is _leavers_checked; no member was marked draining in a round other than _draining_round.
    # Both are recomputed when a worker is born (the count of workers changes).
    _silence: SilenceWatch = field(init=False)
    _leavers_checked: tuple[int, int] = (-1, -1)
    _draining_round: int = -1
    _alive_count: int = 0  # as of the last step
    #: The latest stacks request (a worker is asked by giving it this number; see worker.progress).
    stacks_gen: int = 0
    _round_progress_at: float = 0.0  # running time of the last progress of a member of the current round
    _abort_seen_at: float | None = None  # running time the abort of the current round was first seen by a step
    _stall: _Stall | None = None
    #: Members whose training function returned before rank 0's -> when they did (running time).
    _parked: dict[str, float] = field(default_factory=dict)
    #: Why the job cannot succeed although rank 0 completed (a worker failed after completing, the final
    #: checkpoint was not written).
    _completion_failures: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._silence = SilenceWatch(self.policy.heartbeat_timeout_s, self.policy.start_timeout_s)
        if self.resumed:
            if not self.policy.checkpointing:
                raise ValueError("a resumed job needs checkpointing (it starts from a durable checkpoint)")
            self.state_committed = True

    # ------------------------------------------------------------------ events
    def start(self, now: float, wall_now: float | None = None) -> None:
        """The driver is up; start timers. ``wall_now`` (Unix time) relates drain deadlines to ``now``."""
        self._started_at = now
        self._wall_offset = (wall_now if wall_now is not None else now) - now
        self._clock(now)

    def discovered(self, snapshot: DiscoveredHosts, now: float) -> None:
        """A discovery snapshot arrived."""
        self._discovered_once = True
        self._discovery_failing_since = None
        was_missing = set(self.hosts.missing)
        changes = self.hosts.update(snapshot, now)
        if changes:
            log.info(
                "job %s: hosts changed: added=%s removed=%s draining=%s resized=%s missing=%s (ready slots: %d)",
                self.job_id, list(changes.added), list(changes.removed), list(changes.draining),
                list(changes.resized), list(changes.missing), sum(self.hosts.ready.values()),
            )
            self._emit(
                "hosts_changed",
                added=[{"host": h, "slots": self.hosts.ready[h]} for h in changes.added],
                removed=[{"host": h, "reason": self._missing_reason() if h in was_missing else "gone from discovery"}
                         for h in changes.removed],
                draining=[{"host": h, "reason": self.hosts.draining[h].reason, "deadline": self.hosts.draining[h].deadline}
                          for h in changes.draining],
                missing=list(changes.missing),
                **({"resized": [{"host": h, "slots": self.hosts.ready[h]} for h in changes.resized]}
                   if changes.resized else {}),
            )
        for host in changes.lapsed:
            self.notice_sources.pop(host, None)
            log.info("job %s: the notice for host %s lapsed (the group still reports it ready); new workers may be "
                     "placed there again", self.job_id, host)
        for host in changes.missing:
            log.warning(
                "job %s: host %s is missing from discovery; its workers keep running for up to %gs "
                "unless it comes back or is reported draining", self.job_id, host, self.hosts.missing_grace_s,
            )
        self._step(now)

    def notice(self, host: str, drain: Drain, now: float, *, source: str, soft: bool = False) -> None:
        """A notice for ``host`` from ``source`` (a metadata watcher, a notice queue).

        A hard notice drains the host: its workers leave at their next commit, or
        are removed by force just before ``drain.deadline``. A soft one (rebalance
        recommendation, maintenance event) only keeps new workers off the host,
        unless ``hosts.drain_soft`` (``--drain-on-rebalance``) makes it drain too.
        Each notice is logged once; it lapses as :class:`~.hosts.HostManager` says.
        """
        soft = soft and not self.hosts.drain_soft  # --drain-on-rebalance
        if soft:
            news = self.hosts.soft_notice(host, drain.reason, now)
        else:
            news = self.hosts.notice(host, drain, now, now + self._wall_offset)
        if not news:
            return
        self.notice_sources[host] = source
        left = ""
        if drain.deadline is not None:
            left = f", {drain.deadline - (now + self._wall_offset):.0f}s before its deadline"
        if soft:
            log.info("job %s: notice from %s for host %s: %s; no new worker will be placed there",
                     self.job_id, source, host, drain.reason)
        else:
            log.warning("job %s: notice from %s for host %s: %s%s; its workers leave at their next commit",
                        self.job_id, source, host, drain.reason, left)
        self._emit("notice", source=source, host=host, reason=drain.reason, deadline=drain.deadline, soft=soft,
                   action="no new workers" if soft else "drain")
        self._step(now)

    def discovery_failed(self, message: str, *, fatal: bool, now: float) -> None:
        """A discovery call failed. Fatal failures end the job; others are retried within the timeouts."""
        if fatal:
            self._finish(False, f"host discovery failed: {message}", 1)
            return
        self._last_discovery_error = message
        if self._discovery_failing_since is None:
            self._discovery_failing_since = now
        limit = self.policy.elastic_timeout_s if self._discovered_once else self.policy.start_timeout_s
        if now - self._discovery_failing_since > limit:
            which = "--elastic-timeout" if self._discovered_once else "--start-timeout"
            self._finish(False, f"host discovery kept failing for {limit:g}s ({which}): {message}", 1)

    def registered(self, worker_id: str, now: float) -> bool:
        """A worker process connected. False if the driver does not know it."""
        w = self.workers.get(worker_id)
        if w is None or not w.alive:
            return False
        if w.state is S.STARTING:
            w.to(S.CONNECTED)
        w.last_seen = self._clock(now)
        return True

    def rendezvous(self, worker_id: str, last_round: int, reason: str, now: float, commits: int | None = None,
                   rolled_back: int = 0, commit_seq: int | None = None, holds_commit: bool = True) -> None:
        """A worker arrived at rendezvous, having left ``last_round`` with ``commits`` commits made
        (and, after a failure, ``rolled_back`` steps undone), holding the commit ``commit_seq``
        unless ``holds_commit`` is False (it could not restore it: see ``worker.window``)."""
        w = self.workers.get(worker_id)
        if w is None or not w.alive:
            return
        w.last_seen = self._clock(now)
        self._note_commits(w, commits, commit_seq)
        if w.commit_lost != (not holds_commit):
            w.commit_lost = not holds_commit
            if w.commit_lost:
                log.warning("job %s: worker %s (%s) could not restore its last commit exactly; the next round takes "
                            "the state from another worker", self.job_id, worker_id, w.label)
        if reason == "failure" and rolled_back > self._steps_lost:
            self._steps_lost = rolled_back
        if w.state is S.STARTING:
            w.to(S.CONNECTED)
        # A repeated long-poll for the same round changes nothing; once the
        # worker has been assigned a newer round, it waits for that reply.
        if w.round <= last_round and w.state in (S.CONNECTED, S.RUNNING, S.DRAINING):
            was_member = w.member_of(self.round)
            w.rdzv_reason = reason
            if w.state is S.DRAINING or self.phase in (Phase.FINISHING, Phase.DONE):
                w.to(S.EXITING, w.why or "the job is finishing")
            else:
                if w.state is S.CONNECTED:
                    self._emit("worker_ready", worker=worker_id, host=w.slot.host, slot=w.slot.index)
                w.to(S.WAITING)
                self._waiting_ids.add(worker_id)
            self._starting_ids.discard(worker_id)
            if reason == "failure":
                self._failure_since_round = True
                if was_member:
                    # Its collective failed without anyone dying (a broken link, a group
                    # that could not form): its peers may still be blocked on it, and its
                    # old group is kept open, so only an abort releases them.
                    self._abort_round()
        self._arrived(w, now)

    def _arrived(self, w: WorkerRecord, now: float) -> None:
        """What one arrival at rendezvous can change, without scanning every worker.

        An arrival can only make a newcomer ready (ask the round for an update) or
        complete the round (its last member is back, or enough workers wait to
        start). Everything else (silence, leaving hosts, launches, capacity) is
        checked by the full :meth:`_step` on the driver's tick; it also runs here
        when the round may form, so a round forms in the call of its last arrival.
        """
        if self.phase is Phase.RUNNING and w.state is S.WAITING and w.rank is None:
            if self._update_for_round != self.round and self._member_left(running_only=False):
                self._request_update("new worker ready")
        if self.phase in (Phase.STARTING, Phase.RUNNING) and self._round_may_form():
            self._step(now)

    def _round_may_form(self) -> bool:
        """O(1) (amortised): whether :meth:`_maybe_form_round` could form a round now."""
        if self._member_left(running_only=True):
            return False
        waiting = len(self._waiting_ids)
        if waiting == 0 or waiting < self.policy.min_np:
            return False
        return not (self.phase is Phase.STARTING and waiting < self.policy.num_proc and self._starting_ids)

    def _member_left(self, *, running_only: bool) -> bool:
        """Whether a member of the current round is still in it (``running_only``: still RUNNING)."""
        left = self._running_left if running_only else self._members_left
        states = (S.RUNNING,) if running_only else (S.RUNNING, S.DRAINING)
        while left:
            w = left[0]
            if w.state in states and w.round == self.round:
                return True
            left.popleft()
        return False

    def _index(self, alive: list[WorkerRecord]) -> None:
        """Rebuild the incremental bookkeeping from scratch (every full step)."""
        waiting, starting, members, running = set(), set(), deque(), deque()
        r = self.round
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
        self._rendezvous_news |= self._waiting_ids - waiting
        self._alive_count = len(alive)
        self._waiting_ids, self._starting_ids, self._members_left, self._running_left = waiting, starting, members, running

    def assignment(self, worker_id: str) -> Assignment | ExitOrder | None:
        """The reply for a worker waiting at rendezvous, or None while it must keep waiting."""
        w = self.workers.get(worker_id)
        if w is None or not w.alive:
            return ExitOrder("unknown or failed worker")
        if self.phase in (Phase.FINISHING, Phase.DONE) and w.state in (S.CONNECTED, S.WAITING):
            w.to(S.EXITING, "the job is finishing")
            self._waiting_ids.discard(worker_id)
            self._starting_ids.discard(worker_id)
        if w.state is S.EXITING:
            return ExitOrder(w.why or "told to exit")
        if w.state is S.RUNNING and w.round == self.round and self._ranks is not None:
            return Assignment(
                self.round, self._ranks[worker_id], self._needs_sync, self._round_update_gen, self._from_checkpoint
            )
        return None

    def heartbeat(self, worker_id: str, now: float, commits: int | None = None,
                  commit_seq: int | None = None, progress: int | None = None, steps: int | None = None,
                  waiting_s: float | None = None) -> PollReply | None:
        """A worker's heartbeat; None if the worker is unknown or already given up.

        ``progress`` is the worker's progress counter (see ``worker.progress``):
        a round none of whose members' counters grows for ``progress_timeout_s``
        is stuck. ``waiting_s`` is how long it has been waiting in one collective.
        """
        w = self.workers.get(worker_id)
        if w is None or not w.alive:
            return None
        running = w.last_seen = self._clock(now)
        self._note_commits(w, commits, commit_seq)
        if progress is not None and progress != w.progress:
            w.progress, w.progress_at = progress, running
            if w.round == self.round and w.state in _MEMBER:
                self._round_progress_at = running
        if steps is not None and steps > w.steps:
            w.steps = steps
        if waiting_s is not None:
            w.waiting_s, w.waiting_at = waiting_s, running
        return PollReply(self.round, self.update_gen, self.abort_round, self.phase is Phase.DONE,
                         stacks=w.stacks_wanted)

    def stacks_received(self, worker_id: str, request: int) -> WorkerRecord | None:
        """A worker sent the stacks it was asked for; returns its record (None if unknown)."""
        w = self.workers.get(worker_id)
        if w is not None and request > w.stacks_sent:
            w.stacks_sent = request
        return w

    def completed(self, worker_id: str, now: float, *, commit_seq: int | None = None, steps: int | None = None,
                  error: str | None = None) -> tuple[str, str]:
        """A worker reports that its training function returned; answers ``(decision, reason)``.

        Completion is rank 0's to decide: it holds the state. Rank 0 returning
        starts the job's completion (``done``), and so does any worker returning
        once that has started. Another member returning while rank 0 still trains
        is *parked* (``wait``) until rank 0 returns too, normally milliseconds
        later; if rank 0 is instead found waiting in a collective, the member
        returned early and is sent away (``leave``, see :meth:`_check_early_returns`).
        ``error`` (rank 0 could not write the final durable checkpoint) makes the
        job fail once it has completed.
        """
        w = self.workers.get(worker_id)
        if w is None or not w.alive:
            return "leave", "this worker was already given up"
        w.last_seen = self._clock(now)
        self._note_commits(w, None, commit_seq)
        if steps is not None and steps > w.steps:
            w.steps = steps
        if error:
            self._completion_failures.append(f"worker {worker_id} ({w.label}): {error}")
            log.error("job %s: worker %s (%s): %s", self.job_id, worker_id, w.label, error)
        decision = self.completion_reply(worker_id)
        if decision is not None:
            return decision
        if w.state not in (S.RUNNING, S.DRAINING):
            log.warning("job %s: worker %s reported completion while %s; ignored", self.job_id, worker_id, w.state.value)
            return "done", ""
        rank0 = self._rank0()
        if self.phase in (Phase.FINISHING, Phase.DONE) or rank0 is None or rank0 is w:
            self._complete(w, now)
            return "done", ""
        if not w.returned:
            w.returned = True
            self._parked[worker_id] = w.last_seen
            log.info("job %s: rank %s (%s) returned from its training function at commit %d; waiting for rank 0 "
                     "to return too", self.job_id, w.rank, worker_id, w.commit_seq)
        return "wait", ""

    def completion_reply(self, worker_id: str) -> tuple[str, str] | None:
        """What a worker whose training function returned is told now; None while it must wait for rank 0."""
        w = self.workers.get(worker_id)
        if w is None or not w.alive:
            return "leave", "this worker was given up" if w is not None else "unknown worker"
        if w.state is S.COMPLETED:
            return "done", ""
        if w.state is S.EXITING:
            return "leave", w.why or "told to exit"
        return None  # still training, or parked until rank 0 returns

    def _rank0(self) -> WorkerRecord | None:
        """Rank 0 of the current round while it is still training in it, else None."""
        if self._ranks is None:
            return None
        for worker_id, ranks in self._ranks.items():
            if ranks.rank == 0:
                w = self.workers.get(worker_id)
                return w if w is not None and w.member_of(self.round) else None
        return None

    def _complete(self, w: WorkerRecord, now: float) -> None:
        """``w`` finished its training function and the job is completing: so did every parked member."""
        w.to(S.COMPLETED)
        if self.phase in (Phase.STARTING, Phase.RUNNING):
            log.info("job %s: rank %s (%s) finished training; round %d is completing", self.job_id, w.rank,
                     w.worker_id, self.round)
            self.phase = Phase.FINISHING
            self._finishing_since = now
        for worker_id in sorted(self._parked):
            parked = self.workers[worker_id]
            if parked.alive and parked.state in _MEMBER:
                parked.to(S.COMPLETED)
        self._parked.clear()
        self._step(now)

    def exited(self, worker_id: str, status: ExitStatus, now: float) -> None:
        """A worker process ended."""
        w = self.workers.get(worker_id)
        if w is None or w.state is S.EXITED:
            return
        before = w.state
        was_member = w.member_of(self.round)
        w.to(S.EXITED)
        if before is S.COMPLETED:
            self._completed += 1
            if status.code != 0 and status.known or status.transport_error:
                what = (f"worker {worker_id} ({w.label}) {status.describe} after its training function returned "
                        f"(commit {w.commit_seq}, {w.steps} optimizer step(s))")
                self._completion_failures.append(what)
                log.error("job %s: %s", self.job_id, what)
                self._emit("worker_failed", worker=worker_id, host=w.slot.host, slot=w.slot.index, rank=w.rank,
                           reason=f"{status.describe} after its training function returned",
                           exit_code=status.code if status.code >= 0 else None, blacklisted_s=None,
                           **({"signal": _signal_name(-status.code)} if status.code < 0 else {}))
            elif not status.known:
                log.warning("job %s: worker %s (adopted) ended after completing; its exit code is unknown to this "
                            "driver", self.job_id, worker_id)
            else:
                log.debug("job %s: worker %s exited after completing", self.job_id, worker_id)
        elif before in (S.EXITING, S.DRAINING):
            log.info("job %s: worker %s left (%s)", self.job_id, worker_id, w.why or "told to exit")
            early = {"early_return": True, "commit_step": w.commit_seq, "steps": w.steps} if w.returned_early else {}
            self._emit("worker_left", worker=worker_id, host=w.slot.host, slot=w.slot.index, reason=w.why or "told to exit",
                       **({"round": w.round} if w.round else {}), **early)
            if was_member:
                # It vanished before leaving its round: peers may be blocked in a
                # collective with it, and only an abort releases them.
                self._abort_round()
        elif before is S.LOST:
            pass  # already accounted for when it was given up
        elif self.phase in (Phase.FINISHING, Phase.DONE):
            log.info("job %s: worker %s %s while the job was finishing", self.job_id, worker_id, status.describe)
        else:
            what = status.describe if status.code != 0 or status.transport_error else (
                "exited with code 0 before its training function returned"
            )
            self._fail_worker(w, what, now, was_member=was_member, transport=status.transport_error is not None,
                              exit_code=status.code if status.known else None)
        self._step(now)

    def checkpoint_loaded(self, step: int, commit_seq: int | None, path: str) -> int | None:
        """Rank 0 of a from-checkpoint round loaded the checkpoint of ``step``, commit ``commit_seq`` of the job.

        Returns the steps lost, counted in commits like ``round_formed.step``: the highest
        commit the driver heard of since the previous load (from the workers that were lost)
        minus the checkpoint's. None when that cannot be known: a restarted driver that never
        heard from the lost workers, or a report without the checkpoint's commit. Logs one
        line, emits ``checkpoint_loaded`` and, when the load replaced a failed round, its
        ``rollback`` with the same count.
        """
        heard = self._commit_high > 0 or not self.resumed
        lost = max(0, self._commit_high - commit_seq) if commit_seq is not None and heard else None
        if commit_seq is not None:
            self._commit_high = commit_seq  # the job's history goes on from the checkpoint
        how_many = f"{lost} committed step(s)" if lost is not None else "steps (how many, this driver did not see)"
        log.warning("job %s: resumed from the checkpoint of step %d (%s); %s after it were lost", self.job_id, step,
                    path, how_many)
        self._emit("checkpoint_loaded", step=step, path=path, steps_lost=lost)
        replaced, self._rollback_at_load = self._rollback_at_load, None
        if replaced is not None and lost is not None:
            self._emit("rollback", round=replaced[0], commit_step=commit_seq, steps_lost=lost, reason=replaced[1])
        return lost

    def tick(self, now: float) -> None:
        """Periodic check: heartbeats, timeouts, deadlines, launches, rounds."""
        self._step(now)

    def stop(self, reason: str, exit_code: int) -> None:
        """End the job from outside (a signal): every worker is to be stopped."""
        self._finish(False, reason, exit_code)

    # --------------------------------------------------------------- queries
    def take_actions(self) -> list[Action]:
        """Return and forget the queued actions."""
        actions, self._actions = self._actions, []
        return actions

    def take_events(self) -> list[tuple[str, dict[str, Any]]]:
        """Return and forget the queued events (kind, fields) for the events file."""
        events, self._events = self._events, []
        return events

    def take_rendezvous_news(self) -> set[str]:
        """Return and forget the workers that stopped waiting at rendezvous since the last call.

        Their :meth:`assignment` may have changed (a round formed with them, they
        were told to exit, they are gone), so a request waiting for it should look
        again; no other waiting worker's answer changed, except on a change of
        ``round`` or ``phase``, which concerns them all. A worker's own
        :meth:`rendezvous` and :meth:`assignment` calls are not reported: the
        caller already has the answer.
        """
        news, self._rendezvous_news = self._rendezvous_news, set()
        return news

    @property
    def alive_count(self) -> int:
        """How many workers were alive at the last step (a cheap size of the group)."""
        return self._alive_count

    def rank_of(self, worker_id: str) -> int | None:
        w = self.workers.get(worker_id)
        return w.rank if w is not None else None

    @property
    def completed_workers(self) -> int:
        """Workers whose training function returned (exited since, or not yet)."""
        return self._completed + sum(1 for w in self.workers.values() if w.state is S.COMPLETED)

    # ---------------------------------------------------------------- internals
    def _emit(self, kind: str, **fields: Any) -> None:
        self._events.append((kind, fields))

    def _alive(self) -> list[WorkerRecord]:
        # A step asks this many times over thousands of workers: one scan per step (kept in
        # _alive_memo until a worker is born or dies), identity tests instead of WorkerRecord.alive.
        if self._alive_memo is not None:
            return self._alive_memo
        return [w for w in self.workers.values() if w.state is not S.LOST and w.state is not S.EXITED]

    def _active(self) -> list[WorkerRecord]:
        """Alive workers that are staying (not draining, exiting or done)."""
        return [w for w in self._alive() if w.state in _ACTIVE]

    def _members(self) -> list[WorkerRecord]:
        r = self.round  # WorkerRecord.member_of, inlined for the same reason as in _alive
        return [w for w in self._alive() if w.round == r and w.state in _MEMBER] if r > 0 else []

    def _note_commits(self, w: WorkerRecord, commits: int | None, commit_seq: int | None = None) -> None:
        # Both only grow on a worker; a heartbeat may carry an older value than a rendezvous sent after it.
        if isinstance(commit_seq, int) and commit_seq > w.commit_seq:
            w.commit_seq = commit_seq
            if commit_seq > self._commit_high:
                self._commit_high = commit_seq
        if isinstance(commits, int) and commits > w.commits:
            w.commits = commits
        if w.holds_state:
            if not self.state_committed:
                self.state_committed = True
                log.debug("job %s: first commit seen (worker %s)", self.job_id, w.worker_id)

    def _finish(self, success: bool, reason: str, exit_code: int) -> None:
        if self.outcome is not None:
            return
        self.phase = Phase.DONE
        self.outcome = Finish(success, reason, exit_code)
        (log.info if success else log.error)("job %s: %s", self.job_id, reason)
        for w in self._alive():
            if w.state is not S.EXITING:
                w.to(S.EXITING, "the job is over")
        self._actions.append(self.outcome)

    def _fail_worker(self, w: WorkerRecord, what: str, now: float, *, was_member: bool, transport: bool,
                     exit_code: int | None = None) -> None:
        reason = f"worker {w.worker_id} ({w.label}) {what}"
        self._last_failure = reason
        if transport:
            host_slots = self.hosts.ready.get(w.slot.host, w.slot.index + 1)
            # One outage is one failure of each slot, however many of the host's workers report it.
            slots = [Slot(w.slot.host, i) for i in range(host_slots)]
            delays = [
                self.hosts.blacklist.record_failure(s, now) for s in slots if not self.hosts.blacklist.blocked(s, now)
            ]
            delay = max(delays, default=0.0)
            log.warning("job %s: %s; host %s blacklisted for %.0fs", self.job_id, reason, w.slot.host, delay)
        else:
            delay = self.hosts.blacklist.record_failure(w.slot, now)
            log.warning("job %s: %s; slot %s blacklisted for %.0fs", self.job_id, reason, w.slot, delay)
        # A negative code is a signal (Popen's convention): the schema has exit_code null and the signal's name.
        killed_by = _signal_name(-exit_code) if exit_code is not None and exit_code < 0 else None
        self._emit(
            "worker_failed", worker=w.worker_id, host=w.slot.host, slot=w.slot.index, rank=w.rank, reason=what,
            exit_code=None if killed_by else exit_code, blacklisted_s=round(delay, 1), whole_host=transport,
            **({"round": w.round} if w.round else {}), **({"signal": killed_by} if killed_by else {}),
        )
        self._failure_since_round = True
        if was_member:
            self._abort_round()
        if not self._alive() and self.completed_workers == 0:
            if self.state_committed and self.policy.checkpointing:
                log.warning(
                    "job %s: lost every worker; waiting up to %gs (--elastic-timeout) for --min-np %d slot(s), "
                    "then resuming from the latest checkpoint", self.job_id, self.policy.elastic_timeout_s,
                    self.policy.min_np,
                )
            else:
                lost = "; the training state was lost with them (no --checkpoint-dir)" if self.state_committed else ""
                self._finish(False, f"all workers failed; last: {reason}{lost}", 1)

    def _abort_round(self) -> None:
        self._failure_since_round = True
        if self.phase is Phase.RUNNING and self.abort_round < self.round:
            self.abort_round = self.round
            self._alive_memo = None
            left = [w for w in self._members() if not w.returned]
            if not left:
                what = "no member is left in it"
            elif not self.state_committed:
                what = "no worker has committed yet, so the survivors start over from the initial state"
            else:
                what = "survivors roll back to their last commit"
            log.info("job %s: round %d aborted; %s", self.job_id, self.round, what)
            self._pending_rollback = self.round

    def _step(self, now: float) -> None:
        if self.phase is Phase.DONE:
            return
        self._alive_memo = None
        self._alive_memo = self._alive()
        try:
            self._step_all(now)
            self._index(self._alive())
        finally:
            self._alive_memo = None

    def _step_all(self, now: float) -> None:
        expired = self.hosts.expire(now)
        for host in expired:
            log.info("job %s: host %s stayed missing from discovery for %gs; removed", self.job_id, host,
                     self.hosts.missing_grace_s)
        if expired:
            why = self._missing_reason()
            self._emit("hosts_changed", added=[], removed=[{"host": h, "reason": why} for h in expired], draining=[])
        self._check_liveness(now)
        self._check_early_returns()
        self._check_progress(now)
        self._mark_leavers()
        self._enforce_deadlines(now)
        self._release_drained(now)
        if self.phase is Phase.FINISHING:
            self._step_finishing(now)
            return
        self._plan_launches(now)
        self._check_capacity(now)
        if self.phase is not Phase.DONE:
            self._check_state_kept()
        if self.phase is not Phase.DONE:
            self._maybe_request_update()
            self._maybe_form_round(now)

    def _missing_reason(self) -> str:
        return f"missing from discovery for {self.hosts.missing_grace_s:g}s (--host-missing-grace)"

    def _progress(self, now: float, key: str, what: str) -> None:
        """A progress line for a long wait, every PROGRESS_EVERY_S, saying how long it has lasted."""
        since, last = self._waits.get(key, (now, now))
        if key not in self._waits:
            self._waits[key] = (now, now)
        elif now - last >= PROGRESS_EVERY_S:
            self._waits[key] = (since, now)
            log.info("job %s: %s (waiting for %.0fs)", self.job_id, what, now - since)

    # ----------------------------------------------------------- liveness
    def _check_liveness(self, now: float) -> None:
        for w, what in self._silence.overdue(self._alive(), len(self.workers), now, self._clock(now)):
            self._give_up(w, what, now)

    def _give_up(self, w: WorkerRecord, what: str, now: float) -> None:
        was_member = w.member_of(self.round)
        before, why_leaving = w.state, w.why
        leaving = before in (S.DRAINING, S.EXITING)
        w.to(S.LOST, what)
        self._alive_memo = None
        self._actions.append(Stop(w.worker_id, what, immediate=True))
        if not leaving and self.phase is not Phase.FINISHING:
            self._fail_worker(w, what, now, was_member=was_member, transport=False)
            return
        if before is S.EXITING:
            # It had already left its round; only its process was slow to go.
            self._emit("worker_left", worker=w.worker_id, host=w.slot.host, slot=w.slot.index,
                       reason=f"{why_leaving or 'told to exit'}; its process then {what} and was stopped",
                       **({"round": w.round} if w.round else {}))
        elif before is S.DRAINING:
            self._lost_leaver(w, what)
        if was_member:
            self._abort_round()

    # ------------------------------------------------ early returns, stuck rounds
    def _check_early_returns(self) -> None:
        """Parked members whose rank 0 is still training leave the round; their peers go on without them.

        A member whose training function returned is parked until rank 0's returns
        too. Rank 0 waiting in a collective for EARLY_RETURN_WAIT_S means it is
        still training: that collective needs the parked members, who will never
        join it (a loop or a sampler sized for another world size, typically). They
        are told to leave, and the round is aborted, which frees rank 0 from the
        collective: the others roll back to their last commit and continue. A
        parked member whose rank 0 failed cannot rejoin either, and leaves too.
        """
        if not self._parked or self.phase is not Phase.RUNNING:
            return
        rank0 = self._rank0()
        if rank0 is not None and self.abort_round < self.round:
            # Only a wait reported after the last member parked counts: an older report may be of a
            # collective that the parked members did join.
            if rank0.waiting_s < EARLY_RETURN_WAIT_S or rank0.waiting_at <= max(self._parked.values()):
                return
        for worker_id in sorted(self._parked):
            w = self.workers[worker_id]
            if not w.alive or w.state not in _MEMBER:
                continue
            if rank0 is None or self.abort_round >= self.round:
                why = "its round ended before rank 0 finished training; it cannot rejoin after returning"
            else:
                why = (f"returned from its training function at commit {w.commit_seq} ({w.steps} optimizer step(s)) "
                       f"while rank 0 ({rank0.worker_id}) was still training (at commit {rank0.commit_seq}, "
                       f"{rank0.steps} step(s)); likely cause: a loop or sampler sized for another world size "
                       f"(e.g. a DistributedSampler built once at start-up: use hvd.elastic.ElasticSampler or "
                       f"rebuild it in a reset callback)")
            log.warning("job %s: worker %s (%s) %s; it leaves the job and the others continue", self.job_id,
                        worker_id, w.label, why)
            w.to(S.EXITING, why)
            w.returned_early = True  # its worker_left event says so when its process ends
        self._parked.clear()
        self._alive_memo = None
        if self.abort_round < self.round:
            self._last_failure = "a member returned from its training function while rank 0 was still training"
            self._abort_round()

    def _check_progress(self, now: float) -> None:
        """The backstop for a stuck round (``progress_timeout_s``): stacks first, then abort or give up.

        A round none of whose members made progress (a commit, a step, a completed
        collective, or its training thread moving on; see ``worker.progress``) for
        the timeout is aborted. A member still in an aborted round one more
        timeout later (stuck where the abort cannot reach it) is given up and
        stopped. Either way every member concerned is asked for its stacks first,
        which go to the log and the events file (see the driver's ``stacks``).
        """
        bound = self.policy.progress_timeout_s
        if bound <= 0 or self.phase is not Phase.RUNNING or self.adopting or self.round == 0:
            return
        running = self._clock(now)
        if self._stall is not None:
            self._act_on_stall(running, now)
            return
        if self.abort_round >= self.round:
            if self._abort_seen_at is None:
                self._abort_seen_at = running
            elif running - self._abort_seen_at > bound:
                stuck = [w for w in self._members() if not w.returned]
                if stuck:
                    self._ask_stacks("not_back", stuck, running, running - self._abort_seen_at)
        elif running - self._round_progress_at > bound:
            members = [w for w in self._members() if not w.returned]
            if members:
                self._ask_stacks("stalled", members, running, running - self._round_progress_at)

    def _ask_stacks(self, kind: str, workers: list[WorkerRecord], running: float, idle_s: float) -> None:
        self.stacks_gen += 1
        for w in workers:
            w.stacks_wanted = self.stacks_gen
        self._stall = _Stall(kind, self.round, [w.worker_id for w in workers], running, idle_s)
        names = ", ".join(f"{w.worker_id} ({w.label})" for w in workers)
        if kind == "stalled":
            reason = (f"no member of round {self.round} made progress for {idle_s:.0f}s (--progress-timeout "
                      f"{self.policy.progress_timeout_s:g}): no commit, optimizer step or completed collective")
        else:
            reason = (f"{len(workers)} member(s) of round {self.round} did not come back to rendezvous within "
                      f"{idle_s:.0f}s of its abort (--progress-timeout {self.policy.progress_timeout_s:g})")
        log.warning("job %s: %s; asking %s for their stacks", self.job_id, reason, names)
        self._emit("round_stalled", round=self.round, idle_s=round(idle_s, 1), reason=reason,
                   workers=[w.worker_id for w in workers])

    def _act_on_stall(self, running: float, now: float) -> None:
        stall = self._stall
        assert stall is not None
        workers = [self.workers[i] for i in stall.workers]
        answered = all(w.stacks_sent >= w.stacks_wanted or not w.alive for w in workers)
        if not answered and running - stall.asked_at < STACKS_WAIT_S:
            return
        self._stall = None
        silent = [w.worker_id for w in workers if w.alive and w.stacks_sent < w.stacks_wanted]
        if silent:
            log.warning("job %s: no stacks came from %s within %gs", self.job_id, ", ".join(silent), STACKS_WAIT_S)
        if stall.round != self.round:
            return
        if stall.kind == "stalled":
            if self.abort_round < self.round:
                self._last_failure = (f"round {self.round} made no progress for {stall.idle_s:.0f}s "
                                      f"(--progress-timeout {self.policy.progress_timeout_s:g})")
                self._abort_round()
            return
        what = (f"did not come back to rendezvous within {stall.idle_s:.0f}s of the abort of round {stall.round} "
                f"(stuck where the abort cannot reach it; its stacks are above)")
        for w in workers:
            if w.alive and w.member_of(stall.round) and not w.returned:
                self._give_up(w, what, now)

    # --------------------------------------------------- leaving hosts
    def _mark_leavers(self) -> None:
        """Workers whose host is draining or gone (past the missing grace) are asked to leave."""
        checked = (self.hosts.version, len(self.workers))
        if checked == self._leavers_checked:
            return  # no host changed and no worker was born since every worker's host was checked
        self._leavers_checked = checked
        ready, missing = self.hosts.ready, self.hosts.missing
        for w in self._alive():
            if w.state not in _ACTIVE:
                continue
            # HostManager.is_usable, inlined: this runs over every worker each step.
            host, index = w.slot.host, w.slot.index
            if index < (missing[host][0] if host in missing else ready.get(host, 0)):
                continue
            drain = self.hosts.draining.get(w.slot.host)
            why = f"host {w.slot.host} is draining ({drain.reason})" if drain else f"host {w.slot.host} left the group"
            log.info("job %s: worker %s (%s) will leave: %s", self.job_id, w.worker_id, w.label, why)
            if w.state is S.RUNNING:
                w.to(S.DRAINING, why)  # leaves at its next commit
                self._draining_round = self.round
            else:
                w.to(S.EXITING, why)
                if w.state is not S.WAITING:
                    # Not at rendezvous yet, so no exit order would reach it soon.
                    self._actions.append(Stop(w.worker_id, why))

    def _enforce_deadlines(self, now: float) -> None:
        """A draining host whose workers are still in their round close to its deadline is removed by force."""
        if not self.hosts.draining:
            return  # no deadline to enforce; spares a scan of every worker each step
        wall = now + self._wall_offset
        for w in self._alive():
            if w.state is not S.DRAINING:
                continue
            drain = self.hosts.draining.get(w.slot.host)
            if drain is None or drain.deadline is None or wall < drain.deadline - self.policy.deadline_margin_s:
                continue
            what = (f"had not left by {self.policy.deadline_margin_s:g}s before its host's deadline "
                    f"({drain.reason}); removed by force")
            log.warning("job %s: worker %s (%s) %s", self.job_id, w.worker_id, w.label, what)
            w.to(S.LOST, what)
            self._alive_memo = None
            self._forced.add(w.slot.host)
            self._actions.append(Stop(w.worker_id, what, immediate=True))
            self._lost_leaver(w, what)
            self._abort_round()

    def _lost_leaver(self, w: WorkerRecord, what: str) -> None:
        """A draining worker lost inside its round: its peers roll back, but its slot is not blacklisted."""
        self._last_failure = f"worker {w.worker_id} ({w.label}) {what}"
        self._emit("worker_failed", worker=w.worker_id, host=w.slot.host, slot=w.slot.index, rank=w.rank,
                   reason=what, exit_code=None, blacklisted_s=None, **({"round": w.round} if w.round else {}))

    def _release_drained(self, now: float) -> None:
        """Once no worker is left on a draining host, the cloud may take it (once per host)."""
        busy = {w.slot.host for w in self._alive()} if self.hosts.draining else set()
        for host, drain in self.hosts.draining.items():
            if host not in busy and host not in self._released:
                self._released.add(host)
                self._actions.append(Release(host, self.hosts.instances.get(host)))
                had_workers = any(w.slot.host == host for w in self.workers.values())
                if had_workers:
                    left = "" if drain.deadline is None else (
                        f", {drain.deadline - (now + self._wall_offset):.1f}s before its deadline")
                    what = (f"job {self.job_id}: host {host} drained ({drain.reason}, notice from "
                            f"{self.notice_sources.get(host, 'the provider')}){left}: ")
                    if host not in self._forced:
                        log.info("%sits workers left at a commit; 0 steps lost", what)
                    elif self._pending_rollback is not None:
                        self._forced_drains.append(what)  # the survivors report the steps lost when they re-form
                    else:
                        log.info("%sremoved by force before its deadline", what)
        self._released &= set(self.hosts.draining)
        self._forced &= set(self.hosts.draining)

    # ------------------------------------------------------------ finishing
    def _step_finishing(self, now: float) -> None:
        for w in self._alive():
            if w.state is S.STARTING:
                # It never registered, so it had no part in the result and cannot be told to exit:
                # stop it now rather than wait out the completion grace for it.
                w.to(S.EXITING, "the job completed before it joined")
                self._actions.append(Stop(w.worker_id, "the job completed before it joined"))
        if self._alive() and (self._finishing_since is None
                              or now - self._finishing_since <= self.policy.completion_grace_s):
            return
        for w in self._alive():
            if w.state is not S.EXITING:
                w.to(S.EXITING, "job completed; worker did not exit in time")
            self._actions.append(Stop(w.worker_id, "job completed; worker did not exit in time"))
        failures = self._completion_failures
        if failures:
            more = f" (and {len(failures) - 1} more failure(s), above)" if len(failures) > 1 else ""
            self._finish(False, f"rank 0 finished training, but {failures[0]}{more}", 1)
            return
        self._finish(True, f"training completed on {self.completed_workers} worker(s) after {self.resets} reset(s)", 0)

    # ------------------------------------------------------------ capacity
    def _plan_launches(self, now: float) -> None:
        starting = self.phase is Phase.STARTING and not self.workers
        room = self.policy.max_np - len(self._active())
        if room <= 0 and not starting:
            return  # a full job need not look for free slots (a scan of every slot of the group)
        # A worker given up (LOST) may still be running on its GPU until its process is gone.
        occupied = {(w.slot.host, w.slot.index) for w in self.workers.values() if w.state is not S.EXITED}
        free = [s for s in self.hosts.available_slots(now) if (s.host, s.index) not in occupied]
        if starting:
            if len(free) < self.policy.num_proc:
                self._progress(now, "start", f"waiting for -np {self.policy.num_proc} slot(s): {len(free)} available")
                if self._started_at is not None and now - self._started_at > self.policy.start_timeout_s:
                    if not self._discovered_once and self._last_discovery_error:
                        why = f"host discovery kept failing for {self.policy.start_timeout_s:g}s (--start-timeout): "
                        self._finish(False, why + self._last_discovery_error, 1)
                        return
                    self._finish(
                        False,
                        f"only {len(free)} slot(s) available after {self.policy.start_timeout_s:g}s; "
                        f"-np {self.policy.num_proc} needed to start",
                        1,
                    )
                return
        for slot in free[: max(room, 0)]:
            self._seq += 1
            worker_id = f"{slot.host}[{slot.index}]#{self._seq}"
            self.workers[worker_id] = WorkerRecord(worker_id, slot, self._seq, launched_at=now,
                                                   last_seen=self._clock(now))
            self._alive_memo = None
            self._actions.append(Launch(slot, worker_id))
            self._emit("worker_started", worker=worker_id, host=slot.host, slot=slot.index)

    def _check_capacity(self, now: float) -> None:
        if self.phase is Phase.STARTING and self.round == 0 and not self.workers:
            return
        # Outside start-up a worker counts once it reaches rendezvous: a slot that
        # crashes on every launch must not restart the elastic timeout each time.
        if self.phase is Phase.STARTING:
            counted = len(self._active())
        else:
            counted = 0
            for w in self._alive():  # a count, not a list: this runs over every worker each step
                if w.state is S.WAITING or w.state is S.RUNNING:
                    counted += 1
        if counted >= self.policy.min_np:
            self._below_min_since = None
            self._waits.pop("min_np", None)
            return
        if self._below_min_since is None:
            self._below_min_since = now
            log.warning(
                "job %s: %d worker(s) available, below --min-np %d; waiting up to %gs for more",
                self.job_id, len(self._active()), self.policy.min_np, self.policy.elastic_timeout_s,
            )
        else:
            self._progress(now, "min_np", f"below --min-np {self.policy.min_np}: {counted} worker(s) ready, "
                                          f"{len(self._active()) - counted} starting")
        if now - self._below_min_since > self.policy.elastic_timeout_s:
            last = f"; last failure: {self._last_failure}" if self._last_failure else ""
            self._finish(
                False,
                f"fewer than --min-np {self.policy.min_np} worker(s) for {self.policy.elastic_timeout_s:g}s "
                f"(elastic timeout){last}",
                1,
            )

    def _check_state_kept(self) -> None:
        """Fail at once when the committed state is gone and nothing can bring it back."""
        if not self.state_committed or self.phase is not Phase.RUNNING:
            return
        if any(w.holds_state for w in self._alive() if w.state is not S.EXITING):
            return
        if self._members():
            return  # members still on their way back will report their commits at rendezvous
        if self.policy.checkpointing:
            if not self._state_lost_logged:
                self._state_lost_logged = True
                log.warning(
                    "job %s: every worker that held the training state is gone; the next round resumes "
                    "from the latest checkpoint once --min-np %d worker(s) are ready",
                    self.job_id, self.policy.min_np,
                )
            return
        last = f" (last failure: {self._last_failure})" if self._last_failure else ""
        reason = self._commits_lost_reason() or ("every worker that held committed state is gone, and without "
                                                 "--checkpoint-dir nothing can bring it back")
        self._finish(False, f"training state lost: {reason}{last}", 1)

    def _commits_lost_reason(self) -> str:
        """Why the state is lost when workers survive that could not restore their commit ('' if none did)."""
        if not any(w.commit_lost for w in self._alive()):
            return ""
        return ("no survivor could restore the last commit exactly (a peer failed in a collective between an "
                "in-place optimizer update and the next commit; CLOUD_ELASTIC_COMMIT_MODE=snapshot keeps that "
                "window restorable), and without --checkpoint-dir nothing can bring it back")

    # --------------------------------------------------------------- rounds
    def _maybe_request_update(self) -> None:
        if self.phase is not Phase.RUNNING or self._update_for_round == self.round:
            return
        members = self._members()
        if not members:
            return
        # Waiting workers are in _waiting_ids (exact since the last step; none start waiting
        # within a step), so there is no need to scan every worker for them.
        workers = self.workers
        newcomer_ready = any(workers[i].state is S.WAITING and workers[i].rank is None
                             for i in self._waiting_ids if i in workers)
        member_leaving = False
        if self._draining_round == self.round:  # only _mark_leavers makes members drain
            for w in members:
                if w.state is S.DRAINING:
                    member_leaving = True
                    break
        if newcomer_ready or member_leaving:
            self._request_update("new worker ready" if newcomer_ready else "a host is leaving")

    def _request_update(self, why: str) -> None:
        self.update_gen += 1
        self._update_for_round = self.round
        log.info("job %s: membership change requested (update %d): %s", self.job_id, self.update_gen, why)

    def _maybe_form_round(self, now: float) -> None:
        # The lazy queue answers "still running" in O(1); only its "no" is confirmed by a scan.
        if self._member_left(running_only=True) or any(w.state is S.RUNNING for w in self._members()):
            return  # the current round is still running (draining members leave at the same commit)
        alive = self._alive()
        waiting = [w for w in alive if w.state is S.WAITING]
        if self.phase is Phase.STARTING:
            still_starting = any(w.state in (S.STARTING, S.CONNECTED) for w in alive)
            # The first round forms once -np workers are ready; later arrivals join as a scale-up.
            if len(waiting) < self.policy.num_proc and still_starting:
                return
        if not waiting or len(waiting) < self.policy.min_np:
            return
        plan = plan_round(
            [
                Candidate(w.worker_id, w.slot.host, w.slot.index, w.rank, w.holds_state,
                          (self.hosts.order_of(w.slot.host), w.slot.index, w.seq), w.commit_seq)
                for w in waiting
            ],
            max_np=self.policy.max_np,
            # A worker that lost its commit holds a state no one may take, even before the first commit.
            state_committed=self.state_committed or any(w.commit_lost for w in waiting),
            failure_since_last_round=self._failure_since_round,
            checkpointing=self.policy.checkpointing,
        )
        if isinstance(plan, StateLost):
            self._finish(False, f"training state lost: {self._commits_lost_reason() or plan.reason}", 1)
            return
        if self.round > 0:
            self.resets += 1
            if self.policy.reset_limit is not None and self.resets > self.policy.reset_limit:
                self._finish(False, f"reset limit exceeded: {self.resets} resets > --reset-limit {self.policy.reset_limit}", 1)
                return
        self.round += 1
        ordered = [self.workers[c.worker_id] for c in plan.members]
        self._ranks = assign_ranks([Member(w.worker_id, w.slot.host, w.slot.index) for w in ordered])
        self._needs_sync = plan.needs_sync
        self._from_checkpoint = plan.from_checkpoint
        self._round_update_gen = self.update_gen
        self._failure_since_round = False
        self._round_progress_at, self._abort_seen_at, self._stall = self._clock(now), None, None
        for w in ordered:
            w.to(S.RUNNING)
            w.round = self.round
            w.rank = self._ranks[w.worker_id].rank
        if self.phase is Phase.STARTING:
            self.phase = Phase.RUNNING
        log.info(
            "job %s: round %d formed with %d worker(s) (sync=%s%s): %s", self.job_id, self.round, len(ordered),
            self._needs_sync, ", from the latest checkpoint" if plan.from_checkpoint else "",
            ", ".join(f"{w.rank}={w.worker_id}" for w in ordered),
        )
        commit = max((w.commit_seq for w in ordered), default=0)
        if self._pending_rollback is not None and plan.from_checkpoint:
            # Which commit the round goes back to is known only once rank 0 has loaded the checkpoint.
            self._rollback_at_load = (self._pending_rollback, self._last_failure or "every state holder was lost")
            self._pending_rollback = None
        if self._pending_rollback is not None:
            aborted, self._pending_rollback = self._pending_rollback, None
            # The survivors rolled back to what they reported at rendezvous, the step this round continues
            # from; the commit count seen at the abort comes from older heartbeats and may lag behind.
            self._emit("rollback", round=aborted, commit_step=commit if self.state_committed else None,
                       steps_lost=self._steps_lost,
                       reason=self._last_failure or "a collective failed")
            for what in self._forced_drains:
                log.info("%sremoved by force before its deadline; the survivors rolled back %d step(s) to their last "
                         "commit", what, self._steps_lost)
            self._forced_drains.clear()
        self._steps_lost = 0
        self._emit(
            "round_formed", round=self.round, size=len(ordered), synced=self._needs_sync,
            # Before anyone has committed there is no step to continue from, and a round that loads a
            # checkpoint learns its step from rank 0's checkpoint_loaded (null, as documented).
            from_checkpoint=plan.from_checkpoint,
            step=commit if self.state_committed and not plan.from_checkpoint else None,
            ranks=_ranks_by_host(ordered),
        )


    # ------------------------------------------------------------ adoption
    def begin_adoption(self, last_seq: int) -> None:
        """A restarted driver is up at its predecessor's address: workers may re-register (:meth:`adopt`).

        ``last_seq`` is the highest worker sequence number the predecessor used, so
        that the ids of workers launched from now on never repeat an adopted one.
        """
        self.adopting = True
        self._seq = max(self._seq, last_seq)

    def adopt(self, worker_id: str, slot: Slot, seq: int, request: AdoptRequest, now: float) -> str | None:
        """Take over a running worker of the predecessor where it stands; None when adopted, else why not.

        The worker keeps its round, rank and process group: no new round forms and
        nothing rolls back. The driver's round, update generation and aborted round
        continue from the highest the adopted workers have seen, so that every
        later round number (and so every later store namespace) is new to them.
        Idempotent for a worker already adopted.
        """
        w = self.workers.get(worker_id)
        if w is not None:
            return None if w.alive else f"worker {worker_id} was already given up"
        if not self.adopting:
            return "the adoption window of the restarted driver has closed"
        self._seq = max(self._seq, seq)
        w = WorkerRecord(worker_id, slot, seq, launched_at=now, last_seen=self._clock(now), commits=request.commits,
                         commit_seq=request.commit_seq)
        self._commit_high = max(self._commit_high, request.commit_seq)
        if request.round and request.ranks is not None:
            w.state, w.round, w.rank = S.RUNNING, request.round, request.ranks.rank
            self._adopted.setdefault(request.round, {})[worker_id] = (request.ranks, request.update_gen)
        else:
            w.state = S.CONNECTED
        self.workers[worker_id] = w
        self.update_gen = max(self.update_gen, request.seen_update)
        self.abort_round = max(self.abort_round, request.seen_abort)
        self.round = max(self.round, request.round)
        if w.holds_state:
            self.state_committed = True
        log.info("job %s: adopted worker %s (%s) of round %d at commit %d", self.job_id, worker_id, w.label,
                 request.round, request.commit_seq or request.commits)
        self._emit("worker_adopted", worker=worker_id, host=slot.host, slot=slot.index, round=request.round,
                   rank=w.rank, commit_step=request.commit_seq or None)
        return None

    def end_adoption(self, now: float, missing: dict[str, str]) -> None:
        """The adoption window closed; ``missing`` (worker id -> what became of it) did not come back.

        When the adopted members form their round completely, the job simply goes
        on in it (zero steps lost). Otherwise the normal failure path applies: the
        round is aborted, the survivors roll back to their last commit and a new
        round forms (from the latest checkpoint if no state holder came back).
        """
        self.adopting = False
        members = self._adopted.get(self.round, {})
        self._emit("adoption_done", round=self.round, adopted=len(members), missing=sorted(missing))
        if not members:
            return
        self.phase = Phase.RUNNING
        self._ranks = {wid: ranks for wid, (ranks, _gen) in members.items()}
        self._round_update_gen = max(gen for _ranks, gen in members.values())
        self._needs_sync = False
        self._from_checkpoint = False
        sizes = {ranks.size for ranks in self._ranks.values()}
        complete = len(sizes) == 1 and sorted(r.rank for r in self._ranks.values()) == list(range(sizes.pop()))
        # Workers the predecessor had launched that never joined a round are newcomers: they are
        # admitted at a commit like any other, and one that did not come back is simply replaced.
        # Only a member of an older round (its group cannot go on) or a missing member of this
        # one makes the adopted round unusable.
        stragglers = [w.worker_id for w in self._alive()
                      if w.worker_id not in members and w.state in _MEMBER and w.round != self.round]
        what = "; ".join(f"{wid} {why}" for wid, why in sorted(missing.items()))
        log.warning("job %s: adopted %d running worker(s) of round %d%s", self.job_id, len(members), self.round,
                    f"; not back: {what}" if what else "")
        if not complete:
            self._last_failure = (f"round {self.round} is incomplete after the driver restart"
                                  + (f" (not back: {what})" if what else ""))
            self._abort_round()
        elif stragglers:
            self._last_failure = (f"worker(s) {', '.join(sorted(stragglers))} came back in a round older than "
                                  f"{self.round}")
            self._abort_round()


#: States of alive workers that are staying (see _active) and of round members (MEMBER_STATES), as
#: tuples: membership in a tuple tests identity first, while an enum's hash is computed in Python.
_ACTIVE = (S.STARTING, S.CONNECTED, S.WAITING, S.RUNNING)
_MEMBER = (S.RUNNING, S.DRAINING)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _ranks_by_host(ordered: list[WorkerRecord]) -> dict[str, list[int]]:
    by_host: dict[str, list[int]] = {}
    for w in ordered:
        if w.rank is not None:
            by_host.setdefault(w.slot.host, []).append(w.rank)
    return by_host
