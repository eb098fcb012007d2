"""The job's shared state, as its pieces see it: :class:`JobState`, the implementation of :class:`~.view.JobView`.

:class:`~.elastic_job.ElasticJob` extends it with the pieces and the entry points. Here are only the fields the
pieces share (the workers, the round, the phase, what the job has learnt of its commits and of discovery), the
queues of actions and events the runtime takes, and the lists of workers a step asks for over and over: alive
(memoised within a step), active, members. Pure: no I/O, no clock of its own (``running`` is the driver's
running time, see :mod:`.liveness`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cloud_elastic.driver.job.actions import Action, Finish, Phase, Policy
from cloud_elastic.driver.job.hosts import HostManager
from cloud_elastic.driver.job.liveness import RunningClock, SilenceWatch
from cloud_elastic.driver.job.repeats import Trained
from cloud_elastic.driver.job.workers import WorkerBook, WorkerRecord, WorkerState

__all__ = ["JobState", "ACTIVE", "MEMBER"]

S = WorkerState

#: States of alive workers that are staying (see active) and of round members (MEMBER_STATES), as
#: tuples: membership in a tuple tests identity first, while an enum's hash is computed in Python.
ACTIVE = (S.STARTING, S.CONNECTED, S.WAITING, S.RUNNING)
MEMBER = (S.RUNNING, S.DRAINING)


@dataclass
class JobState:
    """The elastic job's shared state and queues (see module docstring)."""

    policy: Policy
    hosts: HostManager
    job_id: str = "job"
    phase: Phase = Phase.STARTING
    round: int = 0
    resets: int = 0
    update_gen: int = 0
    abort_round: int = 0
    workers: WorkerBook = field(default_factory=WorkerBook)  # every worker the job started (see WorkerBook)
    outcome: Finish | None = None
    #: Some worker has committed: from now on, the state must never be lost.
    state_committed: bool = False
    #: A restarted driver resuming the job from its durable checkpoints: the state exists
    #: before any worker runs, so the first round loads the latest checkpoint.
    resumed: bool = False
    # What the pieces share (see view.JobView).
    last_failure: str = field(default="", init=False)
    abort_reason: str = field(default="", init=False)
    failure_since_round: bool = field(default=False, init=False)
    commit_high: int = field(default=0, init=False)  # the highest commit reported since the last checkpoint load
    commit_base: int | None = field(default=None, init=False)  # a resumed job's first load or adoption (see view)
    trained: Trained = field(default_factory=Trained, init=False)  # the states its commits held (see view)
    wall_offset: float = field(default=0.0, init=False)
    discovered_once: bool = field(default=False, init=False)
    last_discovery_error: str = field(default="", init=False)
    discovery_failing_since: float | None = field(default=None, init=False)
    #: The time of the latest step (or discovery failure): a failing end that checkpoints first starts then.
    stepped_at: float | None = field(default=None, init=False)
    _actions: list[Action] = field(default_factory=list, init=False)
    _events: list[tuple[str, dict[str, Any]]] = field(default_factory=list, init=False)
    _clock: RunningClock = field(default_factory=RunningClock, init=False)
    _alive_memo: list[WorkerRecord] | None = field(default=None, init=False)  # alive() during one step
    _alive_count: int = field(default=0, init=False)  # as of the last step
    silence: SilenceWatch = field(init=False)  # fed each heartbeat's arrival by the runtime (see liveness)

    def take_actions(self) -> list[Action]:
        """Return and forget the queued actions."""
        actions, self._actions = self._actions, []
        return actions

    def take_events(self) -> list[tuple[str, dict[str, Any]]]:
        """Return and forget the queued events (kind, fields) for the events file."""
        events, self._events = self._events, []
        return events

    @property
    def alive_count(self) -> int:
        """How many workers were alive at the last step (a cheap size of the group)."""
        return self._alive_count

    def rank_of(self, worker_id: str) -> int | None:
        w = self.workers.get(worker_id)
        return w.rank if w is not None else None

    def running(self, now: float) -> float:
        """The driver's running time at ``now`` (see :mod:`.liveness`)."""
        return self._clock(now)

    def emit(self, kind: str, **fields: Any) -> None:
        self._events.append((kind, fields))

    def act(self, action: Action) -> None:
        self._actions.append(action)

    def alive(self) -> list[WorkerRecord]:
        # A step asks this many times over thousands of workers: one scan per step (kept in
        # _alive_memo until a worker is born or dies), identity tests instead of WorkerRecord.alive.
        if self._alive_memo is not None:
            return self._alive_memo
        return [w for w in self.workers.unexited() if w.state is not S.LOST]

    def forget_alive(self) -> None:
        self._alive_memo = None

    def active(self) -> list[WorkerRecord]:
        """Alive workers that are staying (not draining, exiting or done)."""
        return [w for w in self.alive() if w.state in ACTIVE]

    def members(self) -> list[WorkerRecord]:
        r = self.round  # WorkerRecord.member_of, inlined for the same reason as in alive
        return [w for w in self.alive() if w.round == r and w.state in MEMBER] if r > 0 else []
