"""One worker's life as seen by the driver: an explicit state machine.

::

    STARTING ──register──► CONNECTED ──rendezvous──► WAITING ──round formed──► RUNNING
                                                       ▲                         │ │
                                                       └──── commit sees update ─┘ │ host leaving
                                                             / collective failed   ▼
    RUNNING ──training function returned──► COMPLETED                          DRAINING
    COMPLETED ──hvd.elastic.run entered again──► RUNNING
    any live state ──told to leave / job over──► EXITING   (DRAINING at rendezvous, too)
    DRAINING ──at rendezvous, the last holder of the state: stays (only WorkerRecord.stays)──► WAITING
    any live state ──given up (silent, never arrived)──► LOST
    any state ──process ended──► EXITED

A worker is *alive* until it is LOST or EXITED. Every transition goes through
:meth:`WorkerRecord.to`, which refuses the ones not drawn above: a refused
transition is a driver bug, and failing loudly beats a silently stuck job.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from cloud_elastic.driver.job.hosts import Slot

__all__ = ["WorkerState", "WorkerRecord", "WorkerBook", "IllegalTransition"]


class WorkerState(enum.Enum):
    STARTING = "starting"  # launched; has not registered yet
    CONNECTED = "connected"  # registered; not yet at rendezvous
    WAITING = "waiting"  # at rendezvous, wants a round
    RUNNING = "running"  # member of a round
    DRAINING = "draining"  # member of a round whose host is leaving: leaves at its next commit
    COMPLETED = "completed"  # its training function returned
    EXITING = "exiting"  # told to exit (its host is leaving, the job is over); process still there
    LOST = "lost"  # given up (silent, never arrived); counted once, killed
    EXITED = "exited"  # the process ended


_S = WorkerState
_ALLOWED: dict[WorkerState, frozenset[WorkerState]] = {
    _S.STARTING: frozenset({_S.CONNECTED, _S.EXITING, _S.LOST, _S.EXITED}),
    _S.CONNECTED: frozenset({_S.WAITING, _S.EXITING, _S.LOST, _S.EXITED}),
    _S.WAITING: frozenset({_S.RUNNING, _S.EXITING, _S.LOST, _S.EXITED}),
    _S.RUNNING: frozenset({_S.WAITING, _S.DRAINING, _S.COMPLETED, _S.EXITING, _S.LOST, _S.EXITED}),
    _S.DRAINING: frozenset({_S.EXITING, _S.COMPLETED, _S.LOST, _S.EXITED}),
    _S.COMPLETED: frozenset({_S.RUNNING, _S.EXITING, _S.LOST, _S.EXITED}),  # RUNNING: elastic.run entered again
    _S.EXITING: frozenset({_S.LOST, _S.EXITED}),
    _S.LOST: frozenset({_S.EXITED}),
    _S.EXITED: frozenset(),
}

#: States of a worker that belongs to a formed round (its group may be in use).
MEMBER_STATES = frozenset({_S.RUNNING, _S.DRAINING})


class IllegalTransition(RuntimeError):
    """A driver bug: a worker was moved along a transition the state machine does not have."""


@dataclass
class WorkerRecord:
    """What the driver knows about one worker process.

    ``last_seen`` is in the driver's *running time* (see :mod:`.liveness`).
    ``why`` says why the worker is draining, exiting or lost. ``commits`` is the
    number of commits the worker has reported; ``commit_seq`` the position in the
    job's history of the commit it would restore (it holds the job's committed
    training state once either is above zero: a worker that synced from rank 0
    holds rank 0's commit before it makes one of its own).
    """

    worker_id: str
    slot: Slot
    seq: int
    launched_at: float
    last_seen: float
    state: WorkerState = WorkerState.STARTING
    round: int = 0
    rank: int | None = None
    rdzv_reason: str = "start"
    #: The addresses it said it could not reach, and its own host's, at its last rendezvous (see :mod:`.partitions`;
    #: ``addresses`` None: an older worker, which reads no peer's addresses in the round's store).
    unreachable: tuple[str, ...] = ()
    addresses: tuple[str, ...] | None = None
    why: str = ""
    commits: int = 0
    commit_seq: int = 0
    #: It said at its last rendezvous that it cannot restore its last commit exactly.
    commit_lost: bool = False
    #: What it said there, exactly, of that commit: (``commit_seq``, ``holds_commit`` as 0 or 1), and whether it reads
    #: its round's sync facts in its assignment (``protocol.Assignment.facts``, told by :mod:`.formation`).
    sync_row: tuple[int, int] = (0, 0)
    takes_facts: bool = False
    #: A fallback worker the job no longer wants (:mod:`.sourcing`): it trains on until its replacements hold the
    #: state, and holds no place in the next round, as a last holder on a leaving host (:mod:`.formation`).
    replaced: bool = False
    #: Stopped because a round started over from step 0 without it (``Leavers.leave_uncommitted``): a commit it
    #: reports late is of a past no round continues, and must not count as the job's committed state.
    discarded: bool = False
    #: Its progress counter (see ``worker.link.progress``), and when (running time) it last grew.
    progress: int = 0
    progress_at: float = 0.0
    #: Optimizer steps it has taken in all, and how long it has been waiting in one collective.
    steps: int = 0
    waiting_s: float = 0.0
    waiting_at: float = 0.0  # running time of the heartbeat that reported waiting_s
    #: Its training function returned while rank 0 of its round had not: it waits for rank 0's verdict.
    returned: bool = False
    #: It was sent away for returning while rank 0 was still training, and how long its slot then cools down.
    returned_early: bool = False
    cooldown_s: float = 0.0
    #: Its compute time per optimizer step (median of its recent steps; see ``worker.link.progress``), if known.
    compute_s: float | None = None
    #: Its time per optimizer step in collectives (waiting on peers and sending), if known.
    comm_s: float | None = None
    #: Running time at which it said it was past its exit hooks (``exiting``): its heartbeats have stopped
    #: and its exit status is on the way; silence is then judged by ``EXIT_GRACE_S`` (see :mod:`.liveness`).
    exiting_at: float | None = None
    #: The exception its script ended with, as it said when exiting (first line, 300 characters at most).
    error: str = ""
    #: The stacks request it was last asked to answer, and the last one it answered.
    stacks_wanted: int = 0
    stacks_sent: int = 0
    #: Its main thread's innermost Python frame in the last stacks it sent (``stalls.main_frame``; "" before any).
    last_frame: str = ""
    #: Set as it is given up for making no progress (a progress timeout) or for silence while its process still ran:
    #: what it was doing then, for the line of a job that ends for it (see :mod:`.repeats`); "" otherwise.
    hung: str = ""
    #: Whether its process prints its stacks on the driver's signal, as it last said (registration, heartbeats):
    #: ``faulthandler`` holds SIGUSR1 and the process is the one the launcher signals (not a wrapper's child).
    #: False also when its process cannot be asked (the stop path says so); None: an older worker (taken as armed).
    stacks_signal: bool | None = None
    #: A heartbeat of its process arrived after it was given up for silence: it was not hung, only frozen or cut
    #: off, and it thawed (see :mod:`.liveness`).
    heard_after_given_up: bool = False
    #: It printed that a call to the driver failed and it retries (``protocol_reports.said_retrying``): it reached
    #: ``hvd.init()``, so if it never registers, the address or the network is why (see :mod:`.liveness`).
    tried_driver: bool = False

    def to(self, new: WorkerState, why: str = "") -> None:
        """Move to ``new``; IllegalTransition if the state machine has no such edge."""
        if new is self.state:
            return
        if new not in _ALLOWED[self.state]:
            raise IllegalTransition(f"worker {self.worker_id}: {self.state.value} -> {new.value} is not allowed")
        self.state = new
        if why:
            self.why = why

    def stays(self) -> None:
        """A draining worker at rendezvous stays after all (DRAINING -> WAITING): a fallback worker sent away that is
        the last holder of the training state (:meth:`.sourcing.Sourcing.keep_holder`). Only through this call: ``to``
        refuses it, so that no other path takes a leaver back by mistake."""
        if self.state is not WorkerState.DRAINING:
            raise IllegalTransition(f"worker {self.worker_id}: {self.state.value} -> waiting is not allowed")
        self.state, self.why = WorkerState.WAITING, ""

    @property
    def alive(self) -> bool:
        """Its process is (as far as the driver knows) running and not given up."""
        return self.state not in (WorkerState.LOST, WorkerState.EXITED)

    @property
    def registered(self) -> bool:
        return self.state is not WorkerState.STARTING

    @property
    def holds_state(self) -> bool:
        """It holds a commit of the job's training state (its own, or rank 0's from a sync), exactly."""
        return (self.commits > 0 or self.commit_seq > 0) and not self.commit_lost

    def member_of(self, round_: int) -> bool:
        """Whether it is a live member of round ``round_``."""
        return self.state in MEMBER_STATES and self.round == round_ and round_ > 0

    @property
    def label(self) -> str:
        return "not yet ranked" if self.rank is None else f"rank {self.rank}"


class WorkerBook(dict):
    """Every worker of the job by id, with those not yet EXITED kept apart (:meth:`unexited`).

    An exited worker's record stays: a late message names it, and the failure, completion and repeat rules look
    back at the workers that ran. But a long job with churn gathers thousands of them, and a driver step (every
    50 ms) that scanned them all to find the live few took most of its tick by 20,000 records (review h11): the
    step's scans go through :meth:`unexited` instead, whose cost is the workers still running.
    """

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self._open: dict[str, WorkerRecord] = {k: w for k, w in self.items() if w.state is not WorkerState.EXITED}

    def __setitem__(self, worker_id: str, w: WorkerRecord) -> None:
        super().__setitem__(worker_id, w)
        self._open[worker_id] = w

    def __delitem__(self, worker_id: str) -> None:
        super().__delitem__(worker_id)
        self._open.pop(worker_id, None)

    def unexited(self) -> list[WorkerRecord]:
        """The workers not EXITED (LOST ones too), in the order they were added."""
        gone = [k for k, w in self._open.items() if w.state is WorkerState.EXITED]
        for k in gone:
            del self._open[k]
        return list(self._open.values())

