"""The seam between a commit and the optimizer whose ``step()`` makes its copies: two Protocols.

``TorchState`` (``state``) commits each value through a handler (``handlers``).
When an optimizer is a :class:`CommitParticipant` (``DistributedOptimizer``,
``worker.optim``), the state binds to it the handlers of what its ``step()``
updates: its own state and the models whose parameters it updates. The
optimizer then treats each bound handler as a :class:`BoundCommit`: its step
makes the copies the commit deferred (overlapping the gradient allreduce), or
takes them over when it writes its results into the commit's spare buffers
(``optim.zerocopy``), or marks a commit kept in place as touched before its
update. A model no participant updates is copied whole at each commit.

The participant's members carry the ``_ce_`` prefix because they are set on a
subclass of the user's own optimizer class: they must never shadow a name of
the wrapped optimizer.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

__all__ = ["BoundCommit", "CommitParticipant"]


class BoundCommit(Protocol):
    """A handler's last commit, as the optimizer bound to it sees it.

    Guarantees: after :meth:`flush` the commit holds every value it owes,
    except the storages in ``keep``, which the caller takes (:meth:`take`) and
    fills itself before the update overwrites them.
    """

    #: The last commit kept nothing of what the update writes (see ``worker.ledger.CommitWindow``).
    in_place: bool

    @property
    def pending(self) -> bool:
        """The last commit still waits for copies that the next optimizer update makes (or takes over)."""
        ...

    @property
    def on_host(self) -> bool:
        """The last commit keeps GPU tensors in host memory (no buffer on the device to take over)."""
        ...

    def flush(self, keep: frozenset[int] = frozenset()) -> None:
        """Make the copies still owed, but those of the storages in ``keep`` (data pointers)."""
        ...

    def take(self, ptrs: frozenset[int]) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """Hand over the owed copies of the storages ``ptrs``: data pointer -> (live tensor, spare buffer)."""
        ...

    def touch(self) -> None:
        """The live tensors of a commit kept in place are about to change, with nothing kept of them."""
        ...


@runtime_checkable
class CommitParticipant(Protocol):
    """An optimizer whose ``step()`` takes part in commits; ``TorchState`` binds handlers to it.

    ``isinstance(optimizer, CommitParticipant)`` tells a ``DistributedOptimizer``
    from any other optimizer (whose state is copied whole at each commit).
    """

    #: The bound commits of every ``TorchState`` holding this optimizer (``TorchState`` adds and removes them).
    _ce_snapshots: list[BoundCommit]
    #: ``id()`` of each parameter this optimizer updates (a commit kept in place leaves them out).
    _ce_param_ids: frozenset[int]

    def _ce_param_ptrs(self) -> frozenset[int]:
        """Where this optimizer's parameters live now (zero-copy commits alternate two storages)."""
        ...
