"""This worker's record of its commits (:class:`CommitLedger`) and its commit window (:class:`CommitWindow`).

The ledger is what the driver hears of the commits, at every rendezvous and
heartbeat: how many this process made, the position of its state in the job's
history of commits (``commit_seq``), whether it can restore its last commit
exactly, and how many steps its last rollback undid. The commit mechanics
(``worker.commit``: ``TorchState``, its handlers, the snapshots) and the
``DistributedOptimizer`` (``worker.optim``) write it; the context
(``worker.context``) holds one per process and reports it. It sits beside
the context, not in ``worker.commit``, because the collectives that the commit
mechanics use (``worker.comm``) run on the context: the ledger imports neither.

The commit window
-----------------

A commit must be restorable until the next one. Parameters and optimizer state
change only in the optimizer's update, after every gradient has arrived; in
the common loop (forward, backward, ``step()``, ``commit()``) nothing can fail
between that update and the commit, because no collective runs there. A failure
is then always seen *before* the update (in a gradient allreduce: the live state
still is the commit) or *after* the commit (the live state is the new commit),
so the last commit is the live state and nothing needs to be kept: the step is
transactional, as torchft's are, and a commit copies only what the update does
not own (buffers, hyperparameters, the ``State``'s attributes, the sampler).

The *window* is the time from an update to the next commit. A collective in it
(a loss allreduce for logging between ``step()`` and ``commit()``, the next
step's gradients when commits come every N steps, or the gradients of a second
optimizer that steps after the first one's update, as in a GAN loop with one
backward: launched before that update, waited for after it) can fail after the update,
and the restore then needs the values from before it. :class:`CommitWindow` learns
the loop: commits are kept in place until a collective is seen in a window, and
from then on, for the life of the process, every commit keeps those values (a
snapshot). A worker joining a running job learns it from rank 0 with
the state sync, confirmation included.

Until two windows in a row have closed at a commit with no collective in them (the
loop is then *confirmed* in place), a commit kept in place also keeps the whole state aside
(``commit.handlers.SnapshotHandler``, ``snapshot.Aside``: in host memory for state on a
GPU, in an unlinked temporary file for state in host memory): the first window
of a loop with collectives in its windows (Horovod's ImageNet example logs every
batch and commits every 100) restores exactly, at the price of two copies of the
state per process start, the last dropped at the second commit of a loop confirmed in place. One clean window
is not enough: a loop committing every K steps after the step (``if batch % K == 0: commit()``) commits right
after its first step, then runs K steps with their gradient allreduces before the next commit, and confirmed
after that first window it could restore nothing until its second commit (review s62 rvR: "training state
lost" at the first failure). The unprotected
window left is that of a loop that changes after it was confirmed (a logging
allreduce every 100 steps): a failure inside that very collective leaves the
worker unable to restore exactly; it tells the driver so, and the driver syncs it
from a peer that can, resumes from the durable checkpoint, or stops with an
error (see ``driver.job.plan``): never a silent restart from the wrong state.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Callable

from cloud_elastic.protocol_reports import UNTOLD

if TYPE_CHECKING:
    from cloud_elastic.worker.link.progress import Progress

__all__ = ["CommitLedger", "CommitWindow"]

log = logging.getLogger(__name__)


class CommitWindow:
    """One process's record of its commit windows (see the module docstring).

    ``mode`` is ``auto`` (learn) or ``snapshot`` (always keep the pre-update
    values: ``CLOUD_ELASTIC_COMMIT_MODE=snapshot``).
    """

    def __init__(self, mode: str = "auto") -> None:
        if mode not in ("auto", "snapshot"):
            raise ValueError(f"commit mode {mode!r}: use auto or snapshot")
        self.mode = mode
        #: An update ran since the last commit (or restore).
        self.open = False
        #: The update of the open window kept nothing (it ran in place on the committed state).
        self.unkept = False
        #: A collective was seen in a window: in-place updates are over for this process.
        self.has_collectives = False
        #: Two windows in a row with an in-place update closed at a commit with no collective in them: the loop
        #: is the common one, and commits kept in place need no whole copy any more.
        self.confirmed = False
        self._clean = 0

    def in_place(self) -> bool:
        """May the commit being made now keep nothing (the next update runs in place)?"""
        return self.mode == "auto" and not self.has_collectives

    def learn(self, has_collectives: bool, confirmed: bool = False) -> None:
        """Take what another worker's loop showed (rank 0's, with the state sync): a loop that had collectives
        in its windows, or one confirmed in place (then a newcomer keeps no whole copy of its first commit:
        every worker runs the same loop)."""
        self.has_collectives = self.has_collectives or has_collectives
        self.confirmed = self.confirmed or (confirmed and not self.has_collectives)

    def update(self, kept: bool) -> None:
        """An optimizer update starts; ``kept``: the values it overwrites are kept until the next commit."""
        self.open = True
        self.unkept = self.unkept or not kept

    def collective(self, what: str) -> None:
        """A collective starts (the optimizer's gradient allreduces included)."""
        if not self.open or self.has_collectives:
            return
        self.has_collectives = True
        if self.unkept and self.confirmed:  # before confirmation, the whole commit was kept aside
            log.warning(
                "cloud-elastic: %s ran between an in-place optimizer update and the next commit; from now on "
                "every update keeps the values it overwrites until the commit. Until the next commit, a failure "
                "cannot be rolled back exactly on this worker (set CLOUD_ELASTIC_COMMIT_MODE=snapshot to keep "
                "them from the start, or move the collective before step() or after commit())", what)

    def close(self) -> None:
        """A commit is being made: the window closes (the state is the new commit)."""
        if self.open and self.unkept and not self.has_collectives:
            self._clean += 1
            self.confirmed = self.confirmed or self._clean >= 2  # learnt from rank 0 (a newcomer): for good
        self.open = self.unkept = False

    def discard(self) -> None:
        """The state was restored or replaced (a rollback, a sync): no update is pending, and clean windows count
        again from none (Horovod's loop redoes the restored batch: that redo's window is no second clean one of a
        loop that commits every K steps after its first)."""
        self.open = self.unkept = False
        if not self.confirmed:
            self._clean = 0


class CommitLedger:
    """One process's record of its commits (see the module docstring); the context holds one.

    Written on the training thread only (commits, optimizer steps, rollbacks,
    syncs); the heartbeat thread reads ``commits`` and ``commit_seq``, two ints.
    ``progress`` is the context's (what the driver's no-progress watch sees):
    a commit and an optimizer step count as progress.
    """

    def __init__(self, mode: str, progress: Progress, worker_id: str = "") -> None:
        self.window = CommitWindow(mode)
        self.progress = progress
        self.worker_id = worker_id
        #: Commits made by this process (its progress, for the driver's status and events).
        self.commits = 0
        #: Position in the job's history of commits of the state this worker would restore: each commit
        #: adds one, a sync takes rank 0's. Reported to the driver, which makes the holder of the newest
        #: commit rank 0 (a collective may complete on some ranks and fail on others).
        self.commit_seq = 0
        self._live_seq = 0  # the same for the live state, ahead of commit_seq between a commit and a restore
        #: Whether this worker can restore its last commit exactly (False after a failure inside an
        #: update's window that kept nothing; see :class:`CommitWindow`). Reported at rendezvous: the driver
        #: then never takes the state from it.
        self.holds_commit = True
        #: This worker follows in its round (``commit.follow``): its commits hold no state of the job's yet.
        self.following = False
        #: ``DistributedOptimizer`` steps since the last commit: what a rollback undoes.
        self.steps_since_commit = 0
        #: Seconds between this worker's last two commits (``time.monotonic``), None before its second: how often
        #: the script commits, for a follow window's bound (``commit.follow``).
        self.commit_interval: float | None = None
        self._committed_at: float | None = None
        #: Steps the last rollback undid, told to the driver at the next rendezvous (then 0 again).
        self.rolled_back = 0
        #: ``commit_seq`` of the state the running (or last) sync broadcasts from rank 0.
        self.sync_root_seq: int | None = None
        #: The ranks the running (or last) sync gives rank 0's commit: those that do not hold it.
        self.sync_receivers: list[int] = []
        #: On rank 0, from the sync's gather: a key of each rank's host (``commit.follow`` wants the commit's
        #: holders on two hosts at least); None elsewhere.
        self.sync_hosts: list[int] | None = None
        #: A sync's facts (see ``commit.sync_facts``): gathered (``sync_begun``), on rank 0 waiting to be sent
        #: (``sync_pending``), and learnt by this worker (``sync_known``: ``sync_root_seq`` and
        #: ``sync_receivers`` are this sync's).
        self.sync_begun = self.sync_known = False
        self.sync_pending: dict[str, Any] | None = None
        #: The round's first sync takes its facts from the last assignment (``protocol.Assignment.facts``: to rank 0
        #: every member's as told at rendezvous; () elsewhere), not from a gather; None once taken (by every member
        #: alike: a commit in between, in a reset callback, is the survivors' alone, see ``commit.sync_facts``).
        self.told_facts: tuple[tuple[int, int, int], ...] | None = None
        #: Sharded training: the round of the last sync, and the hosts (cross ranks) that received this
        #: local rank's shards in it (the others held that commit already).
        self.shard_sync: tuple[int, list[int]] = (0, [])
        #: Called with the state after each commit (the durable checkpoint schedule, see ``worker.durable``).
        self.after_commit: list[Callable[[Any], None]] = []
        #: The fingerprint of the state of the commit it would restore (``commit.fingerprint``; see :attr:`trained`),
        #: whether this process committed since its last restore, sync or load, each optimizer's steps since then or
        #: since its last commit, whether a commit of it held attributes other than the state it followed (they
        #: move with training), and whether its attributes stood still over training (for good: they do not tell
        #: its commits apart).
        self._trained = ""
        self._in_a_row = False
        self._steps: dict[int, int] = {}
        self._moved = False
        self._untold = False

    @property
    def live_commit_seq(self) -> int:
        """``commit_seq`` of the live state (what a sync from this worker gives the others)."""
        return self._live_seq

    @property
    def trained(self) -> str:
        """What the driver hears of the state this worker would restore, for its repeat guards (``driver.job.repeats``):
        its fingerprint, marked ``+`` once this process saw its attributes move with training (a commit of it held
        attributes other than those of the state it followed: its previous commit, or the state restored, synced or
        loaded); "" before the first commit and for a state with nothing to fingerprint (the driver counts commits
        for those); ``UNTOLD`` once the attributes stood still over training (:meth:`note_commit`: the driver then
        counts commits for good). The driver trusts the fingerprints only once a worker marked them: a progressing
        job is never stopped for attributes that do not say where it is (a step kept in a tensor, ``epoch`` alone).
        Read by the heartbeat thread: one str, replaced whole."""
        if self._untold:
            return UNTOLD
        if self.commit_seq <= 0 or not self._trained:
            return ""
        return ("+" if self._moved else "") + self._trained

    def note_commit(self, state: Any = None, fingerprint: str = "") -> None:
        """A commit of ``state`` finished on this worker (``State.commit``), its ``fingerprint`` that of ``state``
        (``commit.fingerprint``); runs the after-commit hooks.

        The attributes *stand still* (:attr:`trained` is ``UNTOLD`` for good) when this commit holds the same
        attributes as the state it follows after optimizer steps (counted per optimizer, the most of any: a GAN's
        batch steps two optimizers once each): its predecessor in a row after one step or more, or the state restored
        (a rollback, a sync, a checkpoint load) after two or more. Horovod's loop redoes the restored batch, one step,
        and commits the restored attributes again: that redo is the one commit of a state seen before that stays
        telling; a commit with no step since (an end-of-epoch hook's commit followed by the next batch loop's) tells
        nothing either way."""
        steps = max(self._steps.values(), default=0)
        if fingerprint and fingerprint == self._trained and steps >= (1 if self._in_a_row else 2):
            self._untold = True
        if fingerprint and self._trained and fingerprint != self._trained:
            self._moved = True
        self._trained, self._in_a_row = fingerprint, True
        self._steps.clear()
        self.holds_commit = not self.following
        self.commits += 1
        self._live_seq += 1
        self.commit_seq = self._live_seq
        self.steps_since_commit = 0
        now = time.monotonic()
        if self._committed_at is not None:
            self.commit_interval = now - self._committed_at
        self._committed_at = now
        self.progress.mark()
        for hook in self.after_commit:
            hook(state)

    def note_step(self, optimizer: Any = None) -> None:
        """A step of ``optimizer`` finished (any optimizer's: the step post-hook ``context.init`` registers)."""
        self.steps_since_commit += 1
        self._steps[id(optimizer)] = self._steps.get(id(optimizer), 0) + 1
        self.progress.step()

    def note_rollback(self) -> None:
        """The state was just restored to the last commit: the steps since then are lost (told to the driver)."""
        if self.following:  # its "commit" is not the job's: say why it cannot restore that (``commit.follow``)
            log.warning("worker %s: cannot restore the last commit: a peer failed while this worker was still "
                        "receiving it (follow mode); the next round takes the state from a worker that holds it",
                        self.worker_id)
        self.rolled_back, self.steps_since_commit = self.steps_since_commit, 0
        self._live_seq = self.commit_seq
        self._in_a_row = False
        self._steps.clear()

    def note_restored(self) -> None:
        """The state was restored to the last commit without losing steps (e.g. after a cut-short sync)."""
        self._live_seq = self.commit_seq
        self._in_a_row = False
        self._steps.clear()

    def hold_commit(self, seq: int, fingerprint: str = "") -> None:
        """The state (live and saved) is now commit ``seq`` of the job, of that ``fingerprint``
        (``commit.fingerprint``): after a sync or a checkpoint load."""
        # First: the heartbeat thread must never see the new sequence next to a follower's stale True.
        self.holds_commit = not self.following  # a follower holds no commit until its window ends
        self._live_seq = self.commit_seq = max(0, int(seq))
        self._trained, self._in_a_row = fingerprint, False
        self._steps.clear()

    def lost_commit(self, why: str) -> None:
        """The live state is not the last commit and nothing kept can bring it back (see :class:`CommitWindow`)."""
        if self.holds_commit:
            log.warning("worker %s: cannot restore the last commit exactly (%s); the next round takes the state "
                        "from a worker that can", self.worker_id, why)
        self.holds_commit = False
