"""The elastic job as a state machine: the driver's every decision, no I/O.

:class:`ElasticJob` is fed events (discovery snapshots, worker messages,
process exits, clock ticks) with the current time, and answers with replies
and queued :data:`Action` objects that the runtime (:mod:`.driver`) carries
out. It starts no thread, opens no socket and reads no clock of its own, so
every rule is tested alone with scripted timelines.

Worker lifecycle::

    STARTING --register/rendezvous--> WAITING --round formed--> RUNNING
        RUNNING --commit sees update / collective fails--> WAITING --> ...
        any --process ends--> EXITED

Round rules:

* A round forms when every live member of the previous round is WAITING (has
  left the old process group) and at least ``min_np`` workers wait. Newcomers
  that are still starting are not waited for; they join a later round.
* Survivors keep their relative order, newcomers follow (older hosts first),
  so the oldest worker is rank 0 and its committed state is broadcast.
* ``needs_sync`` is decided here, once, for everyone in the round: true when a
  newcomer joins or anyone came back from a failure (Horovod #3494 deadlocked
  when workers decided this locally and disagreed).
* A graceful change (newcomer ready, host leaving) raises the update
  generation; workers agree at a commit and come to rendezvous without
  rolling back. A failure of a member aborts the round: survivors abandon
  their collectives within a heartbeat and roll back to their last commit.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass, field
from typing import Union

from cloud_elastic.driver.hosts import HostManager, Slot
from cloud_elastic.driver.launch import ExitStatus
from cloud_elastic.driver.planner import Member, RankInfo, assign_ranks
from cloud_elastic.providers.api import DiscoveredHosts

__all__ = [
    "Policy",
    "Phase",
    "WorkerStatus",
    "WorkerRecord",
    "Launch",
    "Stop",
    "Finish",
    "Action",
    "Assignment",
    "ExitOrder",
    "PollReply",
    "ElasticJob",
]

log = logging.getLogger(__name__)


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


class Phase(enum.Enum):
    STARTING = "starting"  # waiting for -np slots / the first round
    RUNNING = "running"
    FINISHING = "finishing"  # a worker's training function returned
    DONE = "done"


class WorkerStatus(enum.Enum):
    STARTING = "starting"  # launched, not yet at rendezvous
    WAITING = "waiting"  # at rendezvous
    RUNNING = "running"  # assigned to the current or an earlier round
    EXITED = "exited"


@dataclass
class WorkerRecord:
    """What the driver knows about one worker process."""

    worker_id: str
    slot: Slot
    seq: int
    launched_at: float
    last_seen: float
    status: WorkerStatus = WorkerStatus.STARTING
    registered: bool = False
    round: int = 0
    rank: int | None = None
    rdzv_reason: str = "start"
    leaving: str | None = None
    completed: bool = False
    told_to_exit: bool = False
    lost: str | None = None  # failure already accounted (heartbeat loss, start timeout)

    @property
    def alive(self) -> bool:
        return self.status is not WorkerStatus.EXITED and self.lost is None


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
class Finish:
    """The job is over: stop everything and exit with ``exit_code``."""

    success: bool
    reason: str
    exit_code: int


Action = Union[Launch, Stop, Finish]


@dataclass(frozen=True)
class Assignment:
    """A worker's place in a formed round (the rendezvous reply)."""

    round: int
    ranks: RankInfo
    needs_sync: bool
    update_gen: int


@dataclass(frozen=True)
class ExitOrder:
    """Rendezvous reply telling a worker to leave (its host is going, or the job is ending)."""

    reason: str


@dataclass(frozen=True)
class PollReply:
    """Heartbeat reply: what a running worker must know right now."""

    round: int
    update_gen: int
    abort_round: int
    shutdown: bool


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
    _actions: list[Action] = field(default_factory=list)
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
    _round_update_gen: int = 0

    # ------------------------------------------------------------------ events
    def start(self, now: float) -> None:
        """The driver is up; start timers."""
        self._started_at = now

    def discovered(self, snapshot: DiscoveredHosts, now: float) -> None:
        """A discovery snapshot arrived."""
        self._discovered_once = True
        self._discovery_failing_since = None
        changes = self.hosts.update(snapshot)
        if changes:
            log.info(
                "job %s: hosts changed: added=%s removed=%s draining=%s resized=%s (ready slots: %d)",
                self.job_id, list(changes.added), list(changes.removed), list(changes.draining),
                list(changes.resized), sum(self.hosts.ready.values()),
            )
        for w in self._alive():
            if w.leaving is None and not self.hosts.is_usable(w.slot):
                drain = self.hosts.draining.get(w.slot.host)
                w.leaving = f"host {w.slot.host} is draining ({drain.reason})" if drain else f"host {w.slot.host} left the group"
                log.info("job %s: worker %s (%s) will leave: %s", self.job_id, w.worker_id, _rank_label(w), w.leaving)
                if w.status is WorkerStatus.STARTING:
                    w.told_to_exit = True
                    self._actions.append(Stop(w.worker_id, w.leaving))
        self._step(now)

    def discovery_failed(self, message: str, *, fatal: bool, now: float) -> None:
        """A discovery call failed. The first failure and fatal ones end the job."""
        if fatal or not self._discovered_once:
            self._finish(False, f"host discovery failed: {message}", 1)
            return
        if self._discovery_failing_since is None:
            self._discovery_failing_since = now
        elif now - self._discovery_failing_since > self.policy.elastic_timeout_s:
            self._finish(False, f"host discovery kept failing for {self.policy.elastic_timeout_s:g}s: {message}", 1)

    def registered(self, worker_id: str, now: float) -> bool:
        """A worker process connected. False if the driver does not know it."""
        w = self.workers.get(worker_id)
        if w is None or not w.alive:
            return False
        w.registered = True
        w.last_seen = now
        return True

    def rendezvous(self, worker_id: str, last_round: int, reason: str, now: float) -> None:
        """A worker arrived at rendezvous, having left ``last_round``."""
        w = self.workers.get(worker_id)
        if w is None or not w.alive:
            return
        w.last_seen = now
        # A repeated long-poll for the same round changes nothing; once the
        # worker has been assigned a newer round, it waits for that reply.
        if w.round <= last_round and w.status is not WorkerStatus.WAITING:
            was_member = w.status is WorkerStatus.RUNNING and w.round == self.round
            w.status = WorkerStatus.WAITING
            w.rdzv_reason = reason
            if reason == "failure":
                self._failure_since_round = True
                if was_member:
                    # Its collective failed without anyone dying (a broken link, a group
                    # that could not form): its peers may still be blocked on it, and its
                    # old group is kept open, so only an abort releases them.
                    self._abort_round()
        self._step(now)

    def assignment(self, worker_id: str) -> Assignment | ExitOrder | None:
        """The reply for a worker waiting at rendezvous, or None while it must keep waiting."""
        w = self.workers.get(worker_id)
        if w is None or not w.alive:
            return ExitOrder("unknown or failed worker")
        if self.phase in (Phase.FINISHING, Phase.DONE):
            w.told_to_exit = True
            return ExitOrder("the job is finishing")
        if w.leaving is not None and w.status is WorkerStatus.WAITING:
            w.told_to_exit = True
            return ExitOrder(w.leaving)
        if w.status is WorkerStatus.RUNNING and w.round == self.round and self._ranks is not None:
            return Assignment(self.round, self._ranks[worker_id], self._needs_sync, self._round_update_gen)
        return None

    def heartbeat(self, worker_id: str, now: float) -> PollReply | None:
        """A worker's heartbeat; None if the worker is unknown or already given up."""
        w = self.workers.get(worker_id)
        if w is None or not w.alive:
            return None
        w.last_seen = now
        return PollReply(self.round, self.update_gen, self.abort_round, self.phase is Phase.DONE)

    def completed(self, worker_id: str, now: float) -> None:
        """A worker reports that its training function returned."""
        w = self.workers.get(worker_id)
        if w is None or w.completed:
            return
        w.completed = True
        w.last_seen = now
        if self.phase in (Phase.STARTING, Phase.RUNNING):
            log.info("job %s: rank %s (%s) finished training; round %d is completing", self.job_id, w.rank, worker_id, self.round)
            self.phase = Phase.FINISHING
            self._finishing_since = now
        self._step(now)

    def exited(self, worker_id: str, status: ExitStatus, now: float) -> None:
        """A worker process ended."""
        w = self.workers.get(worker_id)
        if w is None or w.status is WorkerStatus.EXITED:
            return
        was_member = w.status is WorkerStatus.RUNNING and w.round == self.round
        w.status = WorkerStatus.EXITED
        if w.completed:
            log.debug("job %s: worker %s exited after completing", self.job_id, worker_id)
        elif w.told_to_exit or w.leaving is not None:
            log.info("job %s: worker %s left (%s)", self.job_id, worker_id, w.leaving or "told to exit")
            if was_member and w.leaving is not None:
                # It vanished before leaving its round: peers may be blocked in a
                # collective with it, and only an abort releases them.
                self._abort_round()
        elif w.lost is not None:
            pass  # already accounted for when it was given up
        elif self.phase in (Phase.FINISHING, Phase.DONE):
            log.info("job %s: worker %s %s while the job was finishing", self.job_id, worker_id, status.describe)
        else:
            what = status.describe if status.code != 0 or status.transport_error else (
                "exited with code 0 before its training function returned"
            )
            self._fail_worker(w, what, now, was_member=was_member, transport=status.transport_error is not None)
        self._step(now)

    def tick(self, now: float) -> None:
        """Periodic check: heartbeats, timeouts, launches, rounds."""
        self._step(now)

    def stop(self, reason: str, exit_code: int) -> None:
        """End the job from outside (a signal): every worker is to be stopped."""
        self._finish(False, reason, exit_code)

    # --------------------------------------------------------------- queries
    def take_actions(self) -> list[Action]:
        """Return and forget the queued actions."""
        actions, self._actions = self._actions, []
        return actions

    def rank_of(self, worker_id: str) -> int | None:
        w = self.workers.get(worker_id)
        return w.rank if w is not None else None

    # ---------------------------------------------------------------- internals
    def _alive(self) -> list[WorkerRecord]:
        return [w for w in self.workers.values() if w.alive]

    def _finish(self, success: bool, reason: str, exit_code: int) -> None:
        if self.outcome is not None:
            return
        self.phase = Phase.DONE
        self.outcome = Finish(success, reason, exit_code)
        (log.info if success else log.error)("job %s: %s", self.job_id, reason)
        for w in self._alive():
            w.told_to_exit = True
        self._actions.append(self.outcome)

    def _fail_worker(self, w: WorkerRecord, what: str, now: float, *, was_member: bool, transport: bool) -> None:
        reason = f"worker {w.worker_id} ({_rank_label(w)}) {what}"
        self._last_failure = reason
        if transport:
            host_slots = self.hosts.ready.get(w.slot.host, w.slot.index + 1)
            # One outage is one failure of each slot, however many of the host's workers report it.
            slots = [Slot(w.slot.host, i) for i in range(host_slots)]
            delays = [
                self.hosts.blacklist.record_failure(s, now) for s in slots if not self.hosts.blacklist.blocked(s, now)
            ]
            log.warning(
                "job %s: %s; host %s blacklisted for %.0fs", self.job_id, reason, w.slot.host, max(delays, default=0.0)
            )
        else:
            delay = self.hosts.blacklist.record_failure(w.slot, now)
            log.warning("job %s: %s; slot %s blacklisted for %.0fs", self.job_id, reason, w.slot, delay)
        self._failure_since_round = True
        if was_member:
            self._abort_round()
        if not self._alive() and not any(x.completed for x in self.workers.values()):
            self._finish(False, f"all workers failed; last: {reason}", 1)

    def _abort_round(self) -> None:
        self._failure_since_round = True
        if self.phase is Phase.RUNNING and self.abort_round < self.round:
            self.abort_round = self.round
            log.info("job %s: round %d aborted; survivors roll back to their last commit", self.job_id, self.round)

    def _step(self, now: float) -> None:
        if self.phase is Phase.DONE:
            return
        self._check_heartbeats(now)
        if self.phase is Phase.FINISHING:
            self._step_finishing(now)
            return
        self._plan_launches(now)
        self._check_capacity(now)
        if self.phase is not Phase.DONE:
            self._maybe_request_update()
            self._maybe_form_round(now)

    def _check_heartbeats(self, now: float) -> None:
        for w in self._alive():
            if w.completed:
                continue
            if w.registered:
                silent = now - w.last_seen
                if silent > self.policy.heartbeat_timeout_s:
                    self._give_up(w, f"stopped answering heartbeats for {silent:.1f}s", now)
            elif now - w.launched_at > self.policy.start_timeout_s:
                self._give_up(w, f"did not reach rendezvous within {self.policy.start_timeout_s:g}s", now)

    def _give_up(self, w: WorkerRecord, what: str, now: float) -> None:
        was_member = w.status is WorkerStatus.RUNNING and w.round == self.round
        w.lost = what
        self._actions.append(Stop(w.worker_id, what, immediate=True))
        if w.leaving is None and self.phase is not Phase.FINISHING:
            self._fail_worker(w, what, now, was_member=was_member, transport=False)
        elif was_member and w.leaving is not None:
            self._abort_round()

    def _step_finishing(self, now: float) -> None:
        if not self._alive():
            done = sum(1 for w in self.workers.values() if w.completed)
            self._finish(True, f"training completed on {done} worker(s) after {self.resets} reset(s)", 0)
        elif self._finishing_since is not None and now - self._finishing_since > self.policy.completion_grace_s:
            for w in self._alive():
                w.told_to_exit = True
                self._actions.append(Stop(w.worker_id, "job completed; worker did not exit in time"))
            done = sum(1 for w in self.workers.values() if w.completed)
            self._finish(True, f"training completed on {done} worker(s) after {self.resets} reset(s)", 0)

    def _active(self) -> list[WorkerRecord]:
        return [w for w in self._alive() if w.leaving is None]

    def _plan_launches(self, now: float) -> None:
        occupied = {w.slot for w in self._alive()}
        free = [s for s in self.hosts.available_slots(now) if s not in occupied]
        active = len(self._active())
        if self.phase is Phase.STARTING and not self.workers:
            if len(free) < self.policy.num_proc:
                if self._started_at is not None and now - self._started_at > self.policy.start_timeout_s:
                    self._finish(
                        False,
                        f"only {len(free)} slot(s) available after {self.policy.start_timeout_s:g}s; "
                        f"-np {self.policy.num_proc} needed to start",
                        1,
                    )
                return
        room = self.policy.max_np - active
        for slot in free[: max(room, 0)]:
            self._seq += 1
            worker_id = f"{slot.host}[{slot.index}]#{self._seq}"
            self.workers[worker_id] = WorkerRecord(worker_id, slot, self._seq, launched_at=now, last_seen=now)
            self._actions.append(Launch(slot, worker_id))

    def _check_capacity(self, now: float) -> None:
        if self.phase is Phase.STARTING and self.round == 0 and not self.workers:
            return
        # Outside start-up a worker counts once it reaches rendezvous: a slot that
        # crashes on every launch must not restart the elastic timeout each time.
        counted = self._active()
        if self.phase is not Phase.STARTING:
            counted = [w for w in counted if w.status is not WorkerStatus.STARTING]
        if len(counted) >= self.policy.min_np:
            self._below_min_since = None
            return
        if self._below_min_since is None:
            self._below_min_since = now
            log.warning(
                "job %s: %d worker(s) available, below --min-np %d; waiting up to %gs for more",
                self.job_id, len(self._active()), self.policy.min_np, self.policy.elastic_timeout_s,
            )
        elif now - self._below_min_since > self.policy.elastic_timeout_s:
            last = f"; last failure: {self._last_failure}" if self._last_failure else ""
            self._finish(
                False,
                f"fewer than --min-np {self.policy.min_np} worker(s) for {self.policy.elastic_timeout_s:g}s "
                f"(elastic timeout){last}",
                1,
            )

    def _members(self) -> list[WorkerRecord]:
        return [w for w in self._alive() if w.round == self.round and w.round > 0 and w.rank is not None]

    def _maybe_request_update(self) -> None:
        if self.phase is not Phase.RUNNING or self._update_for_round == self.round:
            return
        members = self._members()
        running = [w for w in members if w.status is WorkerStatus.RUNNING]
        if not running:
            return
        newcomer_ready = any(
            w.status is WorkerStatus.WAITING and w.leaving is None and w.rank is None
            for w in self._alive()
        )
        member_leaving = any(w.leaving is not None for w in running)
        if newcomer_ready or member_leaving:
            self.update_gen += 1
            self._update_for_round = self.round
            log.info(
                "job %s: membership change requested (update %d): %s", self.job_id, self.update_gen,
                "new worker ready" if newcomer_ready else "a host is leaving",
            )

    def _maybe_form_round(self, now: float) -> None:
        members = self._members()
        if any(w.status is WorkerStatus.RUNNING and w.leaving is None for w in members):
            return  # the current round is still running
        alive = self._alive()
        if self.phase is Phase.STARTING and any(w.status is WorkerStatus.STARTING and w.leaving is None for w in alive):
            return  # first round: wait for everyone launched
        waiting = [w for w in alive if w.status is WorkerStatus.WAITING and w.leaving is None]
        if not waiting or len(waiting) < self.policy.min_np:
            return
        survivors = sorted((w for w in waiting if w.rank is not None), key=lambda w: w.rank)
        newcomers = sorted(
            (w for w in waiting if w.rank is None),
            key=lambda w: (self.hosts.order_of(w.slot.host), w.slot.index, w.seq),
        )
        ordered = (survivors + newcomers)[: self.policy.max_np]
        if self.round > 0:
            self.resets += 1
            if self.policy.reset_limit is not None and self.resets > self.policy.reset_limit:
                self._finish(False, f"reset limit exceeded: {self.resets} resets > --reset-limit {self.policy.reset_limit}", 1)
                return
        self.round += 1
        self._ranks = assign_ranks([Member(w.worker_id, w.slot.host, w.slot.index) for w in ordered])
        self._needs_sync = bool(newcomers) or self._failure_since_round
        self._round_update_gen = self.update_gen
        self._failure_since_round = False
        for w in ordered:
            w.status = WorkerStatus.RUNNING
            w.round = self.round
            w.rank = self._ranks[w.worker_id].rank
        if self.phase is Phase.STARTING:
            self.phase = Phase.RUNNING
        log.info(
            "job %s: round %d formed with %d worker(s) (sync=%s): %s", self.job_id, self.round, len(ordered),
            self._needs_sync, ", ".join(f"{w.rank}={w.worker_id}" for w in ordered),
        )


def _rank_label(w: WorkerRecord) -> str:
    return "not yet ranked" if w.rank is None else f"rank {w.rank}"
