"""What ``elastic.run`` asks of a durable-checkpoint schedule (:class:`DurableSchedule`), and which one a job gets.

Two schedules implement it: :class:`~cloud_elastic.worker.durable.rank_zero.RankZeroCheckpoints`
(rank 0 writes a replica's checkpoints) and
:class:`~cloud_elastic.worker.durable.sharded.ShardedCheckpoints` (with ``hvd.shard``,
the workers of host 0 write theirs together). :func:`open_schedule` picks one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from cloud_elastic.checkpoint.api import CheckpointInfo
    from cloud_elastic.worker.context import WorkerContext
    from cloud_elastic.worker.rounds.groups import RoundInfo

__all__ = ["DurableSchedule", "open_schedule"]


class DurableSchedule(Protocol):
    """One process's durable-checkpoint schedule. Made by :func:`open_schedule`; its constructor does no I/O.

    Guarantees: :meth:`after_commit` never makes the step wait for storage
    (beyond a background write's staging copy); :meth:`load_latest` leaves the
    state at its last commit when it raises; :meth:`stop_writing` returns
    within its timeout; :meth:`finish` returns when the final write ends, however
    long it takes, on a replica's rank 0 and on every worker of host 0 of an ``hvd.shard``
    job alike (counting as progress while bytes move; storage that moves none for
    ``--progress-timeout`` ends the round); a leaving worker waits for its writes up to 120 s.
    """

    def loads_here(self, info: RoundInfo) -> bool:
        """Whether this worker loads the checkpoint in a round the driver formed ``from_checkpoint``."""
        ...

    def after_commit(self, state: Any) -> None:
        """After each commit (the ledger's hook): write a checkpoint of ``state`` here if one is due."""
        ...

    def stop_writing(self, timeout: float | None = ...) -> bool:
        """Wait (up to ``timeout``) for the checkpoint being written; True when none is left."""
        ...

    def leaving(self, state: Any) -> None:
        """This worker was sent away (``WorkerRemoved``): finish its writes; as rank 0 of the last holders of the
        state, sent away with no successor, first checkpoint ``state`` where it can. Never raises."""
        ...

    def load_latest(self, state: Any) -> CheckpointInfo:
        """Load the newest usable checkpoint into ``state`` and make it its last commit; CheckpointError if none."""
        ...

    def finish(self, state: Any) -> str | None:
        """Training completed: write the final state and wait; None when stored (or not written here), else why not."""
        ...


def open_schedule(ctx: WorkerContext) -> DurableSchedule | None:
    """The schedule for this worker's job, None without ``--checkpoint-dir`` (or without a driver).

    Rank 0 writes a replica's checkpoints; with ``hvd.shard`` (the host's group
    formed before ``elastic.run``), the workers of rank 0's host write theirs together.
    """
    if ctx.standalone or not ctx.settings.checkpoint_dir:
        return None
    # Imported here: a job without checkpoints never loads the checkpoint package (3 ms of a forked worker's start).
    from cloud_elastic.worker.durable.rank_zero import DurableSettings, RankZeroCheckpoints

    settings = DurableSettings.from_settings(ctx.settings)
    if settings is None:
        return None
    if ctx.host_group is not None:
        from cloud_elastic.worker.durable.sharded import ShardedCheckpoints

        return ShardedCheckpoints(settings, ctx)
    return RankZeroCheckpoints(settings, ctx)
