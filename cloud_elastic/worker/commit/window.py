"""Whether a step may update the training state in place, with nothing kept: the commit window.

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
and the restore then needs the values from before it. This class learns the
loop: commits are kept in place until a collective is seen in a window, and
from then on, for the life of the process, every commit keeps those values (a
snapshot, as before). A worker joining a running job learns it from rank 0 with
the state sync, confirmation included.

Until a window has closed at a commit with no collective in it (the loop is then
*confirmed* in place), a commit kept in place also keeps the whole state aside
(``commits._SnapshotHandler``, ``snapshot.Aside``: in host memory for state on a
GPU, in an unlinked temporary file for state in host memory): the first window
of a loop with collectives in its windows (Horovod's ImageNet example logs every
batch and commits every 100) restores exactly, at the price of one copy of the
state per process start, dropped at the first commit of a loop confirmed in place. The unprotected
window left is that of a loop that changes after it was confirmed (a logging
allreduce every 100 steps): a failure inside that very collective leaves the
worker unable to restore exactly; it tells the driver so, and the driver syncs it
from a peer that can, resumes from the durable checkpoint, or stops with an
error (see ``driver.rounds``): never a silent restart from the wrong state.
"""

from __future__ import annotations

import logging

__all__ = ["CommitWindow"]

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
        #: A window with an in-place update closed at a commit with no collective in it: the loop is
        #: the common one, and commits kept in place need no whole copy any more.
        self.confirmed = False

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
                "every update keeps the values it overwrites until the commit. A failure in this one collective "
                "cannot be rolled back exactly on this worker (set CLOUD_ELASTIC_COMMIT_MODE=snapshot to keep "
                "them from the start, or move the collective before step() or after commit())", what)

    def close(self) -> None:
        """A commit is being made: the window closes (the state is the new commit)."""
        if self.open and self.unkept and not self.has_collectives:
            self.confirmed = True
        self.open = self.unkept = False

    def discard(self) -> None:
        """The state was restored or replaced (a rollback, a sync): no update is pending."""
        self.open = self.unkept = False
