"""What a piece of the elastic job sees of the whole: the :class:`JobView` protocol.

:class:`~.elastic_job.ElasticJob` is assembled from pieces that each own one part of its
decisions and the state that part needs (:mod:`.formation`, :mod:`.leaving`,
:mod:`.capacity`, :mod:`.completion`, :mod:`.adoption`). What they share
(the workers, the round, the phase, the queues of actions and events, and the
few moves that any of them may make: give a worker up, abort the round, end
the job) is the job's own, and a piece reaches it only through this view. A
test of one piece can hand it a small fake instead of a whole job.

Guarantees the job gives every piece: ``alive()`` is exact at every call
(memoised within a step, forgotten by ``forget_alive()`` on every birth or
death); ``running(now)`` is the driver's running time (see :mod:`.liveness`);
``abort()`` and ``end()`` are idempotent.
"""

from __future__ import annotations

from typing import Any, Protocol

from cloud_elastic.driver.job.actions import Action, Finish, Phase, Policy
from cloud_elastic.driver.job.hosts import HostManager
from cloud_elastic.driver.job.repeats import Trained
from cloud_elastic.driver.job.workers import WorkerBook, WorkerRecord

__all__ = ["JobView"]


class JobView(Protocol):
    """The job's shared state and moves, as its pieces see them."""

    job_id: str
    policy: Policy
    hosts: HostManager
    workers: WorkerBook  # every worker started; unexited() the ones a step scans
    phase: Phase
    round: int
    resets: int
    update_gen: int
    abort_round: int
    outcome: Finish | None
    state_committed: bool
    resumed: bool
    #: Why the last worker failed (for the messages of a job that fails later).
    last_failure: str
    #: The failure of a member that aborted the current round ("" for another cause): what its rollback names.
    abort_reason: str
    #: A worker failed or came back from a failure since the current round formed: the next one syncs.
    failure_since_round: bool
    #: The highest commit any worker reported since the last checkpoint load.
    commit_high: int
    #: The commit this driver's run began at: its first checkpoint load, or the workers it adopted (None: a job
    #: that started afresh, from 0, or a resumed one before its first load).
    commit_base: int | None
    #: How far the job has trained, as its commits' fingerprints tell: the repeat guards' measure of progress.
    trained: Trained
    #: Unix time minus the job's clock (drain deadlines are Unix times).
    wall_offset: float
    #: Discovery has answered at least once, and what its last failure said.
    discovered_once: bool
    last_discovery_error: str
    #: Since when discovery has been failing (None: its last call answered, or none failed).
    discovery_failing_since: float | None
    #: A restarted driver's adoption window is open (see :mod:`.adoption`).
    adopting: bool

    @property
    def completed_workers(self) -> int: ...

    def running(self, now: float) -> float:
        """The driver's running time at ``now``."""

    def alive(self) -> list[WorkerRecord]:
        """Workers neither lost nor exited."""

    def active(self) -> list[WorkerRecord]:
        """Alive workers that are staying (not draining, exiting or done)."""

    def members(self) -> list[WorkerRecord]:
        """Live members of the current round."""

    def forget_alive(self) -> None:
        """A worker was born or died within a step: ``alive()`` must scan again."""

    def emit(self, kind: str, **fields: Any) -> None:
        """Queue an event for the events file."""

    def act(self, action: Action) -> None:
        """Queue an action for the runtime."""

    def abort(self) -> None:
        """Abort the current round (its members roll back); a no-op unless it is running and not aborted yet."""

    def end(self, success: bool, reason: str, exit_code: int) -> None:
        """End the job (once): every live worker is told to exit."""

    def tick(self, now: float) -> None:
        """Run every check of the job now (what changed may form a round, end the job, ...)."""

    def give_up(self, w: WorkerRecord, what: str, now: float, *, stacks: bool = True) -> None:
        """Stop ``w`` at once as lost (silent, stuck), with the failure path that applies to it;
        ``stacks``: its process is first asked for its Python stacks (by signal)."""

    def note_commits(self, w: WorkerRecord, commits: int | None, commit_seq: int | None = None, *,
                     exact: bool = False, trained: str = "") -> None:
        """``w`` reported its commits (both only grow), and the fingerprint of its last one's state (``trained``)."""

    def commits_lost_reason(self) -> str:
        """Why the state is lost when survivors could not restore their commit ('' if none did)."""
