"""Elastic state objects with Horovod's names: ``State``, ``ObjectState``, ``TorchState``.

``commit()`` = ``save()`` + the membership check of ``check_host_updates()``. ``save()`` copies the
model and optimizer into buffers allocated once and reused, which runs at
memory speed (fresh allocations page-fault and run an order of magnitude
slower); ``restore()`` copies them back after a failure; ``sync()``
gives every worker the state of rank 0, the holder of the newest commit: a
model's and an optimizer's tensors from every worker that holds that commit,
each sending a part to those that need it (``comm.heal``); everything else from
rank 0, with ``torch.save`` and ``weights_only`` loading, never pickle (see
``statecodec``).
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Iterable

import torch

from cloud_elastic.worker import sharded

from cloud_elastic.worker.comm import collectives
from cloud_elastic.worker.comm.heal import Heal, skeleton
from cloud_elastic.worker.comm.statecodec import StateSyncError, check_attributes
from cloud_elastic.worker.commit.handlers import (ModelHandler, OptimizerHandler, SamplerHandler, SnapshotHandler,
                                                  StateDictHandler, handler_for)
from cloud_elastic.worker.commit import follow, sync_facts
from cloud_elastic.worker.commit.fingerprint import fingerprint
from cloud_elastic.worker.commit.participant import CommitParticipant
from cloud_elastic.worker.context import get_context, is_initialized
from cloud_elastic.worker.exceptions import HostsUpdatedInterrupt
from cloud_elastic.worker.unsupported import UnsupportedError

__all__ = ["State", "ObjectState", "TorchState", "SMALL_STATE"]

#: The name of a sync's one broadcast of its small parts (see ``TorchState._small_state``).
SMALL_STATE = "state attributes"


def model_tensors(model: torch.nn.Module) -> list[list[Any]]:
    """``[name, shape, dtype]`` of each tensor of ``model.state_dict()``, in name order (as a sync sends them)."""
    return [[name, "uninitialized" if torch.nn.parameter.is_lazy(t) else list(t.shape), str(t.dtype)]
            for name, t in sorted(model.state_dict().items()) if isinstance(t, torch.Tensor)]


def _described(tensors: list[list[Any]]) -> dict[str, str]:
    """Name -> "float32 [16]" (or "float32 uninitialized") of :func:`model_tensors`' list."""
    return {name: f"{dtype.removeprefix('torch.')} {shape}" for name, shape, dtype in tensors}


def check_models(roots: list[list[list[Any]]], models: list[torch.nn.Module]) -> None:
    """A receiver's models against rank 0's (:func:`model_tensors`), before anything is received into them.

    A model built otherwise here (a layer of another size, a lazy module not run yet, a buffer more) would get
    bytes cut for another shape, silently when the sizes agree: StateSyncError, in one line, names the first
    tensor that differs; the worker leaves, and the others go back to their commit.
    """
    if len(roots) != len(models):
        raise StateSyncError(f"state sync: rank 0 syncs {len(roots)} model(s), this worker {len(models)}")
    for index, (root, model) in enumerate(zip(roots, models)):
        try:  # rank 0's, from the network: [name, shape, dtype] triples of strings and ints
            theirs = _described(root)
        except (TypeError, ValueError, AttributeError) as exc:
            raise StateSyncError(f"state sync: rank 0's description of model {index} is malformed ({exc}): "
                                 "corrupt or forged") from exc
        mine = _described(model_tensors(model))
        for name in sorted(mine.keys() | theirs.keys()):
            here, there = mine.get(name, "no such tensor"), theirs.get(name, "no such tensor")
            if here != there or here.endswith("uninitialized"):
                raise StateSyncError(f"state sync: this worker's model {index} differs from rank 0's at {name!r}: "
                                     f"{here} here, {there} on rank 0 (is the model built the same way on every "
                                     "worker?)")


def _check_small(small: Any, samplers: int, schedulers: int = 0) -> None:
    """StateSyncError unless rank 0's small parts (from the network) are lists where a sync takes them one by
    one, with one sampler position per sampler of this worker's state (the same ``TorchState`` on every worker),
    and one ``state_dict()`` per LR scheduler or GradScaler."""
    parts = ("sampler state", "scheduler state", "optimizer state", "model tensors")
    if (not isinstance(small, dict) or not all(isinstance(small.get(part), list) for part in parts)
            or not isinstance(small.get("ObjectState attributes"), dict)):
        raise StateSyncError(f"{SMALL_STATE}: rank 0's parts are malformed (not lists of {', '.join(parts)} and a "
                             "dict of attributes): corrupt or forged")
    if len(small["sampler state"]) != samplers:
        raise StateSyncError(f"{SMALL_STATE}: rank 0 sends {len(small['sampler state'])} sampler position(s), this "
                             f"worker has {samplers} sampler(s)")
    if len(small["scheduler state"]) != schedulers:
        raise StateSyncError(f"{SMALL_STATE}: rank 0 sends {len(small['scheduler state'])} LR scheduler or GradScaler "
                             f"state(s), this worker has {schedulers}")


def _followers(small: Any, size: int) -> list[int]:
    """Rank 0's followers of this sync (``commit.follow``), checked: ranks of this round other than 0."""
    ranks = small.get("followers", [])
    if not isinstance(ranks, list) or not all(type(r) is int and 0 < r < size for r in ranks):
        raise StateSyncError(f"{SMALL_STATE}: rank 0's followers are malformed: corrupt or forged")
    return ranks


class State:
    """Base of elastic state: commit/restore/sync plus reset callbacks.

    ``bcast_object`` and ``get_rank`` are Horovod's (``horovod.common.elastic.State``), taken so that its subclasses'
    ``super().__init__(bcast_object, get_rank)`` runs unchanged. They are kept as Horovod keeps them
    (``self._bcast_object``, ``self._rank``), for a subclass's own ``sync()`` to call, and are no part of the state:
    the state's own commit, sync and membership check use cloud-elastic's, whatever is passed.
    """

    def __init__(self, bcast_object: Callable[..., Any] | None = None, get_rank: Callable[[], int] | None = None) -> None:
        for name, fn in (("bcast_object", bcast_object), ("get_rank", get_rank)):
            if fn is not None and not callable(fn):
                raise TypeError(f"{type(self).__name__}({name}=...) takes a function (Horovod's: hvd.broadcast_object, "
                                f"hvd.rank), got a {type(fn).__name__}")
        self._bcast_object = bcast_object
        self._rank = get_rank
        self._reset_callbacks: list[Callable[[], None]] = []

    def register_reset_callbacks(self, callbacks: Iterable[Callable[[], None]]) -> None:
        """Call each of ``callbacks`` after every reset (membership change)."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        """Called by ``elastic.run`` once a new round has formed, before its state sync."""
        self.reset()
        self._in_reset = True  # see commit()
        try:
            for callback in self._reset_callbacks:
                callback()
        finally:
            self._in_reset = False

    def commit(self) -> None:
        """Save the state, then interrupt if membership is changing (on every worker at once).

        In a job, outside ``hvd.elastic.run``, raises UnsupportedError (see :func:`_inside_run`)."""
        ctx = _inside_run(get_context(), "commit")
        ctx.ledger.window.close()  # first: what the window taught decides how this commit is kept
        ctx.read_update_flag()
        if not (getattr(ctx, "training_done", False) or getattr(self, "_in_reset", False)):
            ctx.confirm_on_device("the commit")  # NCCL: nothing an abort cut short is committed (rounds.on_device)
        self.save()
        ctx.ledger.note_commit(self, fingerprint(self))  # what it trained, for the driver's repeat guards
        if getattr(ctx, "training_done", False) or getattr(self, "_in_reset", False):
            # After ``elastic.run`` returned (the driver agreed the training is over): a save, nothing more. No
            # round follows to interrupt into, and its membership check was a collective: a final commit on
            # rank 0 alone (a script saving from rank 0) waited for peers that had exited and failed the job.
            # In a reset callback too: the round has just formed, and its newcomers, which run no reset callback,
            # wait in its state sync: the check's allreduce hung until the progress timeout gave every holder up
            # ("training state lost"; review s66 rvT).
            return
        # Horovod's commit() is save() then self.check_host_updates(): a subclass that overrides it is called.
        self._just_committed = True
        try:
            self.check_host_updates()
        finally:
            self._just_committed = False
        follow.at_commit(ctx, self)  # a follower in the round: the next pieces of the commit (see ``follow``)

    def check_host_updates(self) -> None:
        """Raise HostsUpdatedInterrupt, on all workers at the same call, if membership is changing.

        Before it raises, the live state is committed (``save()``, and the ledger's after-commit hooks, the
        durable checkpoint schedule's among them): the interrupt keeps the live state, and the sync gives
        the newcomers rank 0's commit, so without it they would get the live model and optimizer next to
        the plain attributes (a step counter) and sampler of the last ``commit()``, and every worker would
        save that mix as its commit. Every worker is at this same call, after the same steps, so the live
        states are one consistent point of the job's history on all of them.
        """
        ctx = get_context()
        if getattr(self, "_in_reset", False):
            return  # in a reset callback: the round has just formed, and a newcomer is not at this call (see commit)
        if ctx.updates_agreed():
            if not getattr(self, "_just_committed", False):  # called alone, not from commit()
                # Not ``close()``: a window ended here rather than at ``commit()`` says nothing about whether
                # the loop runs collectives between its updates and its commits, so it must not confirm it.
                ctx.ledger.window.discard()
                ctx.confirm_on_device("the commit")
                self.save()
                ctx.ledger.note_commit(self, fingerprint(self))
            raise HostsUpdatedInterrupt(skip_sync=False)

    def save(self) -> None:
        raise NotImplementedError

    def restore(self) -> None:
        raise NotImplementedError

    def sync(self) -> None:
        raise NotImplementedError

    def reset(self) -> None:
        """Hook for subclasses; called on reset before the callbacks."""


def _inside_run(ctx: Any, call: str) -> Any:
    """``ctx``, once this process has entered ``hvd.elastic.run`` (or runs standalone, without a driver).

    Outside it, in a job, UnsupportedError in one line naming the fix. Horovod accepts the call there (a save and a
    broadcast, never an interrupt); here it would tell the driver of a commit that nothing can roll back to, sync
    or checkpoint: the job would take the script for an elastic one, and its workers' ends as failures.
    """
    if ctx.standalone or ctx.elastic_entered:
        return ctx
    raise UnsupportedError(f"state.{call}() called outside hvd.elastic.run: decorate the training function that "
                           "calls it with @hvd.elastic.run (see docs/porting.md), or drop the call to run the script "
                           "as a fixed-size job")


class ObjectState(State):
    """State made of plain attributes: ``ObjectState(epoch=0, batch=0)`` then ``state.epoch``.

    Horovod's ``ObjectState(bcast_object, get_rank, **kwargs)`` works too (``hvd.broadcast_object`` and ``hvd.rank``,
    by position or keyword): those two are not attributes of the state (see :class:`State`).
    """

    def __init__(self, bcast_object: Callable[..., Any] | None = None, get_rank: Callable[[], int] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(bcast_object, get_rank)
        check_attributes(kwargs)
        self._saved_state = dict(kwargs)
        self._set_attrs()

    def save(self) -> None:
        # Refused here, on every worker alike, what a sync could not carry: found at the first failure or
        # newcomer instead, it would fail every survivor's sync at once, and the job with its trained state.
        live = {name: getattr(self, name) for name in self._saved_state}
        check_attributes(live)
        self._saved_state = {name: copy.deepcopy(value) for name, value in live.items()}

    def restore(self) -> None:
        self._set_attrs()

    def sync(self) -> None:
        ctx = get_context()
        if not self._saved_state and not sync_facts.carried(ctx)[0]:
            return
        # Rank 0's attributes, and with them what the sync must know of its commit (see ``sync_facts``).
        small = sync_facts.share(ctx, lambda facts: {"ObjectState attributes": self._saved_state}, "ObjectState attributes")
        if self._saved_state:
            self._saved_state = small["ObjectState attributes"]
            self._set_attrs()

    def _set_attrs(self) -> None:
        for name, value in self._saved_state.items():
            setattr(self, name, copy.deepcopy(value))


class TorchState(ObjectState):
    """State of a PyTorch job: ``TorchState(model, optimizer, epoch=0, batch=0, sampler=...)``.

    Modules, optimizers, ElasticSamplers, LR schedulers and GradScalers get dedicated handlers (the
    object given is the one kept: ``state.scheduler is sched``); every other keyword is kept as an
    ObjectState attribute.
    """

    def __init__(self, model: torch.nn.Module | None = None, optimizer: torch.optim.Optimizer | None = None, **kwargs: Any) -> None:
        kwargs.update(model=model, optimizer=optimizer)
        handlers: dict[str, Any] = {}
        plain: dict[str, Any] = {}
        for name, value in kwargs.items():
            handler = handler_for(value)
            if handler is not None:
                handlers[name] = handler
            elif value is not None or name not in ("model", "optimizer"):
                plain[name] = value
        object.__setattr__(self, "_handlers", handlers)
        for name, handler in handlers.items():
            object.__setattr__(self, name, handler.value)
        self._defer_copies_to_optimizer_step()
        self._close_window()
        for handler in handlers.values():
            if isinstance(handler, SnapshotHandler):
                handler.save()
        super().__init__(**plain)

    def _close_window(self) -> None:
        """What is saved now is the commit: an update made before (a warm-up step outside the
        training loop, say) is no longer in a window (see ``ledger.CommitWindow``)."""
        if any(isinstance(h, SnapshotHandler) and h.bound for h in self._handlers.values()):
            get_context().ledger.window.close()

    def _defer_copies_to_optimizer_step(self) -> None:
        """Let a DistributedOptimizer take the commit copies off the critical path.

        Parameters and optimizer state change only in the optimizer's step, so
        their copies may wait until just before it, where they overlap the
        gradient allreduce, or be skipped when the step writes its results
        into the snapshot's spare buffers (SGD, see ``zerocopy``). Model
        parameters it does not update, buffers and everything else are still
        copied at commit time.

        Each model is bound to the optimizers that update its parameters, and each
        optimizer's step handles only its own state and those models: with two
        (a GAN's generator and discriminator), one's step neither copies nor marks
        as changed what only the other updates. A model no DistributedOptimizer
        updates (an EMA copy, a frozen teacher) is copied whole at each commit.
        """
        handlers = list(self._handlers.values())
        distributed: list[CommitParticipant] = [h.value for h in handlers
                                                if isinstance(h, OptimizerHandler) and h.distributed]
        for handler in handlers:
            if isinstance(handler, ModelHandler):
                params = {id(p) for p in handler.value.parameters()}
                handler.optimizers = tuple(opt for opt in distributed if not opt._ce_param_ids.isdisjoint(params))
        for opt in distributed:
            for handler in handlers:
                if handler.value is opt or isinstance(handler, ModelHandler) and opt in handler.optimizers:
                    opt._ce_snapshots.append(handler)

    def _unbind(self) -> None:
        """Undo :meth:`_defer_copies_to_optimizer_step`: no optimizer's step handles this state's commits."""
        ours = list(self._handlers.values())
        for handler in ours:
            if isinstance(handler, OptimizerHandler) and handler.distributed:
                handler.value._ce_snapshots[:] = [s for s in handler.value._ce_snapshots if s not in ours]
            elif isinstance(handler, ModelHandler):
                handler.optimizers = ()

    def __setattr__(self, name: str, value: Any) -> None:
        handlers = self.__dict__.get("_handlers", {})
        if name in handlers and handlers[name].value is not value:
            self._replace(name, value)
        super().__setattr__(name, value)

    def _replace(self, name: str, value: Any) -> None:
        """``state.model = other`` (an optimizer, a sampler): Horovod's ``set_value``.

        The new object's value now is its part of the commit (it is saved here);
        the others keep their last commit. The copies that commit still owes (left
        to the old optimizer's next step) are made first, and every model is bound
        again to the DistributedOptimizers that now update it: a binding left to the
        old optimizer would leave a kept commit waiting for copies that no step makes
        any more, and a restore would then give neither the committed model nor the
        committed optimizer state.
        """
        handlers = self._handlers
        new = handler_for(value)
        if new is None or type(new) is not type(handlers[name]):
            what = type(handlers[name].value).__name__
            raise TypeError(f"TorchState.{name} holds a {what}; it cannot be replaced by a {type(value).__name__}")
        for handler in handlers.values():
            if isinstance(handler, SnapshotHandler):
                handler.flush()
        self._unbind()
        handlers[name] = new
        self._defer_copies_to_optimizer_step()
        new.save()

    def save(self) -> None:
        self._close_window()
        for handler in self._handlers.values():
            handler.save()
        super().save()

    def restore(self) -> None:
        if is_initialized():  # a TorchState without DistributedOptimizer restores without init() too
            get_context().ledger.window.discard()
        for handler in self._handlers.values():
            handler.restore()
        super().restore()

    def sync(self) -> None:
        ctx = get_context()
        ledger = ctx.ledger
        ledger.window.discard()
        ledger.following = False  # until this sync makes it a follower again (``follow.start``)
        replicas = ctx.info is not None and any(isinstance(h, SnapshotHandler) and not getattr(h, "sharded", False)
                                                for h in self._handlers.values())
        small = self._small_state(ctx, replicas)  # first: it tells every worker rank 0's commit (sync_facts)
        ctx.following = None  # a window cut short by a round change was seen by rank 0's decision; it is over
        # A worker that holds rank 0's very commit (the usual case: after a graceful membership change,
        # or a failure every survivor rolled back from alike) keeps its own values, and sends a part of them.
        root_seq = ledger.sync_root_seq
        other = root_seq is None or root_seq != ledger.live_commit_seq or not ledger.holds_commit
        shards = [h.value for h in self._handlers.values() if getattr(h, "sharded", False)]
        if shards and ctx.info is not None:
            # A host whose workers' shards are not one commit holds none (this worker's commit is then lost):
            # it takes every shard from host 0, or, if it is host 0, the round ends here.
            sharded.check_hosts(ctx, shards)
        shard_other = other or not ledger.holds_commit
        # Only the workers whose values the sync gives change their live state (commit 0, the initial state, may
        # differ on every worker): rank 0 and the holders of its commit keep theirs, and with it a commit kept in
        # place, which a sync cut short (a peer dead in it) then still restores exactly. A receiver keeps its own
        # commit whole first (``SnapshotHandler.sync``), even one at rank 0's sequence.
        takes = ctx.info is not None and ctx.info.rank in ledger.sync_receivers
        overwritten = ctx.info is not None and ctx.info.rank != 0 and other or takes
        # A shard comes from local rank i of host 0 (cross rank 0), which holds rank 0's commit, and only to
        # the hosts that do not hold it (the initial state, commit 0, may differ on every host).
        shard_overwritten = ctx.info is not None and ctx.info.cross_rank != 0 and shard_other
        receivers = None
        if shards and ctx.info is not None:
            receivers = collectives.needing(ctx.info.cross_rank != 0 and (shard_other or ledger.live_commit_seq == 0),
                                            "shards of the commit", cross=True)
            ledger.shard_sync = (ctx.info.round, receivers)
        heal = None
        followers = _followers(small, ctx.info.size if ctx.info is not None else 1) if replicas else []
        if followers:  # the receivers follow (``commit.follow``): only the small parts move now
            if takes:
                check_models(small["model tensors"], [h.value for h in self._models()])
        elif replicas:
            # A replica comes from every worker that holds rank 0's commit, each sending a part, to those that
            # need it (see ``comm.heal``); with no one needing it, nothing moves.
            heal = Heal(ledger.sync_receivers, ctx.info.size, root_seq)
            heal.skeletons = list(small["optimizer state"])
            if takes:
                check_models(small["model tensors"], [h.value for h in self._handlers.values()
                                                      if isinstance(h, ModelHandler) and not getattr(h, "sharded", False)])
        samplers, schedulers = list(small["sampler state"]), list(small["scheduler state"])
        for handler in self._handlers.values():
            if getattr(handler, "sharded", False):
                handler.sync(shard_overwritten, receivers)
            elif isinstance(handler, SnapshotHandler):
                if not followers:
                    handler.sync(overwritten, takes=takes, heal=heal)
            else:
                handler.sync((samplers if isinstance(handler, SamplerHandler) else schedulers).pop(0))
        if followers:
            follow.start(ctx, self, followers, list(small["optimizer state"]), root_seq,
                         quiet_first=small.get("follow quiet") is True, ahead=small.get("follow ahead") is True)
        if heal is not None:
            if takes and getattr(ctx.device, "type", "cpu") == "cuda":
                # NCCL's futures complete as the work is queued: before this worker holds the commit (and may
                # restore it as exact), what it received must have landed.
                if ctx._nccl_group() is None:
                    torch.cuda.current_stream(ctx.device).synchronize()
                else:  # NCCL with peers: the same wait, and an abort may have cut what it received short
                    ctx.confirm_on_device("the state sync")
            heal.report(ctx.worker_id)
        if receivers is not None:
            # Sharded: every worker of the round leaves the sync together. A host-mate that failed in it (its
            # cross-host group lost a peer) must not leave the others in FSDP2's first all-gather over the host,
            # which no abort wakes; they wait here, where the driver's abort does.
            collectives.barrier()
        if self._saved_state:
            self._saved_state = small["ObjectState attributes"]
            self._set_attrs()

    def _small_state(self, ctx: Any, replicas: bool) -> Any:
        """The sync's small parts, from rank 0 to every worker in one broadcast (``collectives.broadcast_state``),
        not one each: which workers need rank 0's commit (``sync_facts``), its plain attributes, its samplers'
        positions and, when a replica's commit is to be sent, its optimizer states' skeletons (``comm.heal``)."""
        def parts(facts: dict[str, Any] | None) -> dict[str, Any]:  # on rank 0
            receivers = facts["receivers"] if facts is not None else ctx.ledger.sync_receivers
            send = replicas and bool(receivers)
            root_seq = facts["root_seq"] if facts is not None else ctx.ledger.sync_root_seq
            followers = follow.decide(ctx, self, list(receivers), root_seq,
                                      facts.get("fresh") if facts is not None else None) if send else []
            return {
                "followers": followers, "follow quiet": bool(followers) and follow.quiet(ctx),
                "follow ahead": bool(followers) and follow.ahead(self),
                "ObjectState attributes": self._saved_state,
                "sampler state": [h.value.state_dict() for h in self._handlers.values() if isinstance(h, SamplerHandler)],
                "scheduler state": [h.value.state_dict() for h in self._handlers.values()
                                    if isinstance(h, StateDictHandler) and not isinstance(h, SamplerHandler)],
                "optimizer state": [skeleton(h.value.state_dict()) for h in self._handlers.values()
                                    if send and isinstance(h, OptimizerHandler) and not getattr(h, "sharded", False)],
                "model tensors": [model_tensors(h.value) for h in self._handlers.values()
                                  if send and isinstance(h, ModelHandler) and not getattr(h, "sharded", False)],
                "trainable": [[bool(p.requires_grad) for p in h.value.parameters()] for h in self._models()],
            }

        small = sync_facts.share(ctx, parts, SMALL_STATE)
        _check_small(small, *self._counts())
        self._take_trainable(small.get("trainable"))
        return small

    def _models(self) -> list[ModelHandler]:
        return [h for h in self._handlers.values() if isinstance(h, ModelHandler)]

    def _take_trainable(self, flags: Any) -> None:
        """Rank 0's ``requires_grad`` of every parameter (a backbone unfrozen mid-training), and each
        DistributedOptimizer's buckets laid out for it: a newcomer built its model frozen, and a layout that
        differs from its peers' sends gradients that do not match theirs (Gloo aborts the round)."""
        models = self._models()
        if flags is None:  # a peer that does not send them
            return
        if (not isinstance(flags, list) or len(flags) != len(models) or not all(
                isinstance(f, list) and all(isinstance(b, bool) for b in f) for f in flags)):
            raise StateSyncError(f"{SMALL_STATE}: rank 0's requires_grad flags are malformed: corrupt or forged")
        changed = False
        for handler, wanted in zip(models, flags):
            params = list(handler.value.parameters())
            if len(wanted) != len(params):
                raise StateSyncError(f"{SMALL_STATE}: rank 0's model has {len(wanted)} parameters, this worker's "
                                     f"{len(params)}")
            for p, trains in zip(params, wanted):
                if p.requires_grad != trains:
                    p.requires_grad_(trains)
                    changed = True
        if changed:
            for handler in self._handlers.values():
                if isinstance(handler, OptimizerHandler) and handler.distributed:
                    handler.value._ce_follow_trainable()

    def _counts(self) -> tuple[int, int]:
        """How many samplers, and how many LR schedulers and GradScalers, this state holds."""
        plain = [h for h in self._handlers.values() if isinstance(h, StateDictHandler)]
        samplers = sum(isinstance(h, SamplerHandler) for h in plain)
        return samplers, len(plain) - samplers

    def reset(self) -> None:
        # Samplers re-shard over the new number of workers even when no sync runs.
        for handler in self._handlers.values():
            if isinstance(handler, SamplerHandler):
                handler.value.reset()

