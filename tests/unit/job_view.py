"""A small stand-in for :class:`~cloud_elastic.driver.job.view.JobView`: a piece of the job tested without the job.

It holds the shared state as plain attributes and records the moves a piece
makes (actions, events, aborts, the end, ticks, workers given up) instead of
carrying them out, so a test sees exactly what the piece decided.
"""

from __future__ import annotations

import random
from typing import Any

from cloud_elastic.driver.job.actions import Finish, Phase, Policy
from cloud_elastic.driver.job.hosts import Blacklist, HostManager, Slot
from cloud_elastic.driver.job.repeats import Trained
from cloud_elastic.driver.job.workers import WorkerBook, WorkerRecord, WorkerState

S = WorkerState
T0 = 1000.0


class FakeJob:
    """The job as its pieces see it; nothing happens unless a test makes it happen."""

    def __init__(self, np: int = 2, *, min_np: int | None = None, max_np: int | None = None,
                 hosts: HostManager | None = None, **policy: Any) -> None:
        self.job_id = "t"
        self.policy = Policy(np, np if min_np is None else min_np, np if max_np is None else max_np, **policy)
        self.hosts = hosts or HostManager(Blacklist((10.0, 10.0), random.Random(0)))
        self.workers = WorkerBook()
        self.phase = Phase.STARTING
        self.round = 0
        self.resets = 0
        self.update_gen = 0
        self.abort_round = 0
        self.outcome: Finish | None = None
        self.state_committed = False
        self.resumed = False
        self.last_failure = ""
        self.abort_reason = ""
        self.failure_since_round = False
        self.commit_high = 0
        self.commit_base: int | None = None
        self.trained = Trained()
        self.wall_offset = 0.0
        self.discovered_once = True
        self.last_discovery_error = ""
        self.discovery_failing_since: float | None = None
        self.adopting = False
        self.actions: list[Any] = []
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.aborts = 0
        self.ticks: list[float] = []
        self.given_up: list[tuple[str, str]] = []
        self.forgotten = 0

    # ------------------------------------------------------------ test helpers
    def worker(self, host: str, index: int, state: WorkerState = S.STARTING, *, round_: int = 0,
               rank: int | None = None, commits: int = 0) -> WorkerRecord:
        """Add a worker on ``host[index]`` in ``state`` (set directly: the piece under test is not the state machine)."""
        seq = len(self.workers) + 1
        w = WorkerRecord(f"{host}[{index}]#{seq}", Slot(host, index), seq, launched_at=T0, last_seen=T0,
                         state=state, round=round_, rank=rank, commits=commits)
        self.workers[w.worker_id] = w
        return w

    def kinds(self) -> list[str]:
        return [kind for kind, _ in self.events]

    # ------------------------------------------------------------- JobView
    @property
    def completed_workers(self) -> int:
        return sum(1 for w in self.workers.values() if w.state is S.COMPLETED)

    def running(self, now: float) -> float:
        return now

    def alive(self) -> list[WorkerRecord]:
        return [w for w in self.workers.values() if w.alive]

    def active(self) -> list[WorkerRecord]:
        staying = (S.STARTING, S.CONNECTED, S.WAITING, S.RUNNING)
        return [w for w in self.alive() if w.state in staying]

    def members(self) -> list[WorkerRecord]:
        return [w for w in self.alive() if w.member_of(self.round)]

    def forget_alive(self) -> None:
        self.forgotten += 1

    def emit(self, kind: str, **fields: Any) -> None:
        self.events.append((kind, fields))

    def act(self, action: Any) -> None:
        self.actions.append(action)

    def abort(self) -> None:
        self.failure_since_round = True
        if self.phase is Phase.RUNNING and self.abort_round < self.round:
            self.abort_round = self.round
            self.aborts += 1

    def end(self, success: bool, reason: str, exit_code: int) -> None:
        if self.outcome is None:
            self.phase = Phase.DONE
            self.outcome = Finish(success, reason, exit_code)

    def tick(self, now: float) -> None:
        self.ticks.append(now)

    def give_up(self, w: WorkerRecord, what: str, now: float) -> None:
        self.given_up.append((w.worker_id, what))

    def note_commits(self, w: WorkerRecord, commits: int | None, commit_seq: int | None = None) -> None:
        if isinstance(commit_seq, int) and commit_seq > w.commit_seq:
            w.commit_seq = commit_seq
        if isinstance(commits, int) and commits > w.commits:
            w.commits = commits

    def commits_lost_reason(self) -> str:
        return ""
