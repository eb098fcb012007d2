"""``elastic.run``: the loop that keeps a training function going across membership changes.

::

    sync state from rank 0 (which holds the job's newest commit); save it as the last commit
    (a later run in the same process, after one completed: tell the driver, and the job is elastic again)
    loop:
        call the training function
          returned                 -> tell the driver, return its result
          CollectiveError          -> restore the last commit   (a peer failed)
          HostsUpdatedInterrupt    -> keep the state just committed (graceful change)
          FollowerActivated        -> a follow window ended (commit.follow): same round, state.reset()
                                      (samplers re-shard), no callbacks, no rendezvous
        rendezvous into the next round (or leave, if the driver says so)
        sync state from rank 0 if the driver says this round needs it
          (in a round formed from_checkpoint, rank 0 first loads the latest durable checkpoint;
           with hvd.shard, every worker of rank 0's host loads its shards of it)
        reset callbacks

Whether to sync is decided by the driver for the whole round, so old and new
workers can never disagree about it (Horovod #3494).
"""

from __future__ import annotations

import functools
import logging
import sys
from typing import Any, Callable, TypeVar

from cloud_elastic.worker import sharded, termination

from cloud_elastic.worker.comm.statecodec import StateSyncError
from cloud_elastic.worker.commit import follow, sync_facts
from cloud_elastic.worker.commit.follow import FollowerActivated
from cloud_elastic.worker.commit.fingerprint import fingerprint
from cloud_elastic.worker.commit.state import State
from cloud_elastic.worker.context import WorkerContext, current, get_context, init
from cloud_elastic.worker.durable.api import DurableSchedule, open_schedule
from cloud_elastic.worker.durable.failure import CheckpointFailed, report
from cloud_elastic.worker.exceptions import CollectiveError, HostsUpdatedInterrupt, WorkerRemoved

__all__ = ["run"]

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])


def run(func: F) -> F:
    """Decorate ``func(state, *args, **kwargs)`` so it survives membership changes.

    After ``hvd.shutdown()`` the decorated function raises ValueError, as every call that needs the job does,
    until ``hvd.init()`` again; before any ``init()`` it initializes.
    """

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> Any:
        shut = current()
        if shut is not None and shut.shut_down:
            get_context()  # its ValueError: init() below would undo the shutdown
        try:
            with termination.leave_at_commit_on_sigterm(init()):  # SIGTERM: leave at the next commit
                return _run(func, state, *args, **kwargs)
        except WorkerRemoved as exc:
            if _schedule is not None:
                _schedule.leaving(state)  # a leaving rank 0 finishes its checkpoint (the last holders': writes one)
            init().leave()
            print(f"cloud-elastic: leaving the job: {exc}", file=sys.stderr, flush=True)
            sys.exit(0)
        except CheckpointFailed as exc:
            # Rank 0 told the driver, which ends the job with this line (``durable.failure``).
            if _schedule is not None:
                _schedule.stop_writing()
            print(f"cloud-elastic: {exc}", file=sys.stderr, flush=True)
            sys.exit(1)
        except StateSyncError as exc:
            # This worker's state cannot take part in a sync: at a sync (a model built otherwise...) or at a
            # commit (an attribute a sync could not carry). The same on every worker; one line, no traceback.
            if _schedule is not None:
                _schedule.stop_writing()  # the checkpoint of an earlier commit in flight is finished, not cut
            print(f"cloud-elastic: {exc}", file=sys.stderr, flush=True)
            sys.exit(1)

    return wrapper  # type: ignore[return-value]


#: This process's durable-checkpoint schedule, made by the first ``run`` (see :func:`_durable`); None before,
#: and in a job without ``--checkpoint-dir``.
_schedule: DurableSchedule | None = None


def _durable(ctx: WorkerContext) -> DurableSchedule | None:
    """The job's checkpoint schedule (``durable.api.open_schedule``), made once per process: a later
    ``run`` in the same process keeps it, and its hooks (after each commit, before the driver-grace exit)
    are registered once."""
    global _schedule
    if _schedule is None:
        _schedule = schedule = open_schedule(ctx)
        if schedule is not None:
            ctx.ledger.after_commit.append(schedule.after_commit)
            ctx.before_grace_exit.append(lambda: schedule.stop_writing(timeout=10.0))
    return _schedule


def _load_checkpoint(ctx: WorkerContext, durable: DurableSchedule | None, state: State) -> None:
    """Rank 0 of a ``from_checkpoint`` round (every worker of its host, with ``hvd.shard``) loads the latest
    checkpoint before the state is broadcast.

    Without a usable checkpoint this worker exits non-zero with a one-line
    error (and tells the driver, which ends the job): broadcasting its
    initial weights instead would silently start training over.
    """
    from cloud_elastic.errors import CheckpointError
    from cloud_elastic.worker.settings import CHECKPOINT_DIR_ENV

    try:
        if durable is None:
            raise CheckpointError("this round must resume from a checkpoint, but the worker has no "
                                  f"{CHECKPOINT_DIR_ENV}")
        durable.load_latest(state)
    except CheckpointError as exc:
        line = report(ctx, exc.failure if isinstance(exc, CheckpointFailed) else "load", str(exc))
        print(f"cloud-elastic: {line}", file=sys.stderr, flush=True)
        sys.exit(1)


#: A training function of this process returned and the driver agreed (the job is completing): a later ``run``
#: (fine-tuning after pre-training) tells the driver first, and the job is elastic again.
_completed = False


def _run(func: Callable[..., Any], state: State, *args: Any, **kwargs: Any) -> Any:
    global _completed
    ctx = init()
    ctx.join_if_pending()  # a newcomer whose script called nothing that needs the round before elastic.run
    if _completed:
        ctx.report_completed(again=True)  # WorkerRemoved when the job is over: nothing left to train for
        _completed = False
    ledger = ctx.ledger
    ctx.elastic_entered = True  # an elastic script: its end is reported by report_completed, not at exit
    ctx.progress.watch_thread()  # the thread that trains is the one the driver's no-progress watch samples
    durable = _durable(ctx)
    sync = True
    while True:
        if sync:
            info = ctx.info
            try:
                if info is not None and info.from_checkpoint and (
                        info.rank == 0 if durable is None else durable.loads_here(info)):
                    _load_checkpoint(ctx, durable, state)  # CollectiveError: a host-mate was lost in a sharded load
                follow.shed(ctx, state)  # a newcomer: what it will not keep goes before the running workers wait
                _sync(ctx, state)
            except (CollectiveError, RuntimeError) as exc:
                if not _peer_lost(ctx, exc):
                    raise
                log.warning("state sync failed (%s); rejoining", exc)
                state.restore()
                ledger.note_restored()
                _rejoin(ctx, "failure", state)
                continue
        try:
            result = func(state, *args, **kwargs)
        except CollectiveError as exc:
            log.warning("collective failed (%s); rolling back to the last commit", exc)
            state.restore()
            ledger.note_rollback()
            sync = _rejoin(ctx, "failure", state)
            continue
        except FollowerActivated as exc:
            # A follow window ended at this commit, on every member (``commit.follow``): the same round goes on,
            # every sampler re-shards over every member, and only a follower that did not match syncs first.
            # ``reset()`` only, not the reset callbacks: they ran once for this admission, at the switch, as
            # with the whole sync (a Horovod script counts one reset per membership change).
            sync = exc.sync
            state.reset()
            continue
        except HostsUpdatedInterrupt:
            sync = _rejoin(ctx, "update", state)
            continue
        except RuntimeError as exc:
            if not sharded.peer_lost(ctx, exc):  # only a sharded host's own group, or NCCL's as it is aborted
                raise
            log.warning("a collective %sfailed (%s); rolling back to the last commit",
                        "of this host's group " if getattr(ctx, "host_group", None) is not None else "",
                        str(exc).splitlines()[0][:200])
            state.restore()
            ledger.note_rollback()
            sync = _rejoin(ctx, "failure", state)
            continue
        try:
            # NCCL: what the final checkpoint writes and the driver counts as trained was not cut short by an abort
            ctx.confirm_on_device("the training function's end")
            if follow.complete(ctx, state):  # a window still open at the end: the rest moves now (``commit.follow``)
                _sync(ctx, state)
        except (CollectiveError, RuntimeError) as exc:
            if not _peer_lost(ctx, exc):
                raise
            log.warning("collective failed (%s) as the training function returned; rolling back to the last "
                        "commit", exc)
            state.restore()
            ledger.note_rollback()
            sync = _rejoin(ctx, "failure", state)
            continue
        error = durable.finish(state) if durable is not None else None
        ctx.report_completed(error)  # WorkerRemoved when rank 0 is still training: this worker returned early
        _completed = True
        _name_failures_after_run()
        return result


def _peer_lost(ctx: Any, exc: BaseException) -> bool:
    """A failure of the round (ours, or torch's as a sharded host's or an NCCL group is aborted under it)."""
    return isinstance(exc, CollectiveError) or sharded.peer_lost(ctx, exc)


#: What a collective that fails after ``run`` returned adds to its error (see :func:`_name_failures_after_run`).
AFTER_RUN = ("; it ran after hvd.elastic.run returned, where a lost peer cannot be rolled back from: run collectives "
             "(an evaluation's allreduce) inside the training function if they must survive a failure "
             "(docs/porting.md)")


def _name_failures_after_run() -> None:
    """Once a ``run`` has returned, a CollectiveError that ends the script says where it happened.

    Collectives after ``run`` work, as in Horovod (MNIST's ``test()`` averages its metrics there), over the
    last round's members; nothing there can roll back or re-form, so a peer lost there ends the script with
    the error of torch's Gloo or NCCL, which reads as the library's failure. The uncaught error is given the
    sentence :data:`AFTER_RUN` (so the driver's line of the worker's exit carries it too); one raised before
    ``run``, or inside a later ``run``, is left as it is. Installed once, around the hooks there are then.
    """
    previous = sys.excepthook
    if getattr(previous, "names_failures_after_run", False):
        return

    def hook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        if _completed and isinstance(value, CollectiveError) and not str(value).endswith(AFTER_RUN):
            # The same error, its message extended: its cause (Gloo's own error) and traceback stay (review rvQ).
            value.args = (f"{str(value).rstrip('.')}{AFTER_RUN}", *value.args[1:])
        previous(type(value), value, tb)

    hook.names_failures_after_run = True  # type: ignore[attr-defined]
    sys.excepthook = hook


def _sync(ctx: WorkerContext, state: State) -> None:
    """Every worker of the round: the state sync (rank 0 learns which workers hold its commit; the sync tells them)."""
    sync_facts.begin(ctx)
    state.sync()
    sync_facts.ensure_known(ctx)
    _hold_synced_state(ctx, state)


def _hold_synced_state(ctx: WorkerContext, state: State) -> None:
    """After a sync every worker holds rank 0's commit: take its ``commit_seq`` and save the synced state.

    Without the save a worker's snapshot would keep its own older model next to
    the attributes ``ObjectState.sync`` took from rank 0, and a failure before
    its next commit would restore that mix.
    """
    sync_facts.end(ctx.ledger)
    if ctx.standalone or ctx.info is None:
        return
    state.save()
    ctx.ledger.hold_commit(ctx.ledger.sync_root_seq, fingerprint(state))


def _rejoin(ctx: WorkerContext, reason: str, state: State) -> bool:
    """Rendezvous until a round forms; return whether that round needs a state sync."""
    while True:
        try:
            info = ctx.rendezvous(reason)
        except CollectiveError as exc:
            log.warning("could not join the next round (%s); retrying", exc)
            reason = "failure"
            continue
        state.on_reset()
        return info.needs_sync
