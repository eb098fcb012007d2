"""What a ``TorchState`` commits, one handler per value: a model's, an optimizer's, a sampler's, a scheduler's.

:class:`SnapshotHandler` keeps one object's last commit (a reused-buffer
snapshot, or in place: see ``ledger.CommitWindow``), restores it, and syncs it from rank 0;
the sharded handlers do the same with this worker's FSDP2 shards (``hvd.shard``),
synced point to point from the peer host that holds the commit. ``TorchState``
(``state``) picks a handler for each value with :func:`handler_for`. A handler
bound to a ``DistributedOptimizer`` is a ``participant.BoundCommit`` to it.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from cloud_elastic.worker import sharded

from cloud_elastic.worker.comm import collectives
from cloud_elastic.worker.comm.heal import Heal
from cloud_elastic.worker.comm.skeleton import state_limit
from cloud_elastic.worker.context import get_context
from cloud_elastic.worker.commit.participant import CommitParticipant
from cloud_elastic.worker.commit.snapshot import Aside, Snapshot, clone as _clone, state_dict_without as _state_dict_without, to_host as _to_host

__all__ = ["SnapshotHandler", "ModelHandler", "OptimizerHandler", "StateDictHandler", "SamplerHandler",
           "ShardedModelHandler", "ShardedOptimizerHandler", "handler_for"]


class SnapshotHandler:
    """Keeps one object's last commit: a reused-buffer snapshot of its ``state_dict()``, or, when the
    next optimizer update runs in place (see ``ledger.CommitWindow``), only what that update does not write.

    In place, the tensors the optimizer updates are not kept at all: the live
    tensors *are* the commit until the update touches them (:meth:`touch`), and
    a restore after that cannot be exact; it tells the ledger so
    (``lost_commit``), and the driver takes the state from another worker.
    Until the loop is confirmed in place (``CommitWindow.confirmed``), such a commit
    also keeps the whole state aside (``_first``: in host memory, or in a temporary
    file when the state is in host memory, see ``snapshot.Aside``), so that the first
    window restores exactly whatever the loop turns out to be.
    """

    def __init__(self, value: Any) -> None:
        self.value = value
        self._snap = Snapshot()
        #: The last commit was kept in place (the optimizer's tensors not copied).
        self.in_place = False
        #: Since that commit, the live tensors were changed where nothing kept them.
        self._touched = False
        #: The whole last commit kept aside, while the loop is not yet confirmed in place.
        self._first: Aside | None = None
        # No save here: TorchState saves once it has bound the model to its optimizer, so that a
        # first commit kept in place never copies the parameters.

    @property
    def bound(self) -> bool:
        """Updated by a DistributedOptimizer (only then can a commit be kept in place)."""
        return False

    def deferred(self, state: Any) -> frozenset[int]:
        """Storages whose copy may wait for the next optimizer update (none by default)."""
        return frozenset()

    def save(self) -> None:
        window = get_context().ledger.window if self.bound else None
        if window is not None and window.in_place():
            if not self.in_place:
                self._snap = Snapshot()  # the buffers of an earlier kept commit are not needed any more
            self._save_in_place()
            self.in_place, self._touched = True, False
            self._first = None  # the last one's copy first: never two at once
            self._first = None if window.confirmed else Aside(self._live())
            return
        self.in_place, self._first = False, None
        state = self._state_dict()
        self._snap.save(state, self.deferred(state))

    def _state_dict(self) -> Any:
        return self.value.state_dict()

    def _save_in_place(self) -> None:
        raise NotImplementedError

    def touch(self) -> None:
        """The live tensors are about to change in place, with nothing kept of them."""
        self._touched = True

    @property
    def pending(self) -> bool:
        """The last commit still waits for copies that the next optimizer update does (or trades away)."""
        return self._snap.pending

    @property
    def on_host(self) -> bool:
        """The last commit keeps GPU tensors in host memory (nothing to trade on the device)."""
        return self._snap.on_host

    def flush(self, keep: frozenset[int] = frozenset()) -> None:
        self._snap.flush(keep)

    def take(self, ptrs: frozenset[int]) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        return self._snap.take(ptrs)

    def _live(self) -> Any:
        """The whole live state, uncopied (this worker's shards, for a sharded handler)."""
        return self.value.state_dict()

    def _whole(self) -> Any:
        """The whole state, copied to host memory (a sync's copy)."""
        return _to_host(self._live())

    def _load(self, saved: Any) -> None:
        """Make the live state ``saved`` (a whole kept commit, this handler's own copy)."""
        self.value.load_state_dict(saved)

    def restore(self) -> None:
        if not self.in_place:
            self._load(self._snap.load())
            return
        changed = self._changed_since_commit()
        if changed and self._first is not None:
            try:
                saved = self._first.load()  # the first window: kept whole, aside
            except Exception as exc:  # noqa: BLE001 (unreadable: as if nothing were kept, never a wrong state)
                changed, self._first = f"{changed}; the first window's copy could not be read back: {exc}", None
            else:
                self._load(saved)
                self._touched = False
                self._recorded()
                return
        if changed:
            get_context().ledger.lost_commit(changed)
        self._restore_in_place()

    def _changed_since_commit(self) -> str:
        """Why the live tensors are no longer the in-place commit ('' if they are)."""
        raise NotImplementedError

    def _restore_in_place(self) -> None:
        raise NotImplementedError

    def _recorded(self) -> None:
        """The live state is the commit again (restored whole): record what tells a later change."""

    def sync(self, overwritten: bool, receivers: list[int] | None = None, *, takes: bool = True,
             heal: Heal | None = None) -> None:
        """Make this state rank 0's commit; ``overwritten``: the sync changes this worker's values.

        A replica's comes from its peers (``heal``: every worker that holds that commit sends
        a part to those that need it, see ``comm.heal``); a sharded handler's from host 0,
        to ``receivers`` (see ``TorchState.sync``). ``takes``: false, this worker (rank 0, or
        one that holds its very commit) takes nothing and its live state is left untouched,
        so that its last commit, even one kept in place, still restores exactly if the sync
        is cut short."""
        self._snap.flush()
        if overwritten and self.in_place and not self._changed_since_commit():
            # The sync writes other values into the live tensors: keep this commit whole (in host
            # memory) first, so that a sync cut short restores it exactly. Only here, never in the loop.
            self.in_place = False
            self._snap = Snapshot()
            self._snap.keep(self._whole())
        elif overwritten and self.in_place:
            self._touched = True
        self._broadcast(receivers, takes, heal)

    def _broadcast(self, receivers: list[int] | None, takes: bool, heal: Heal | None) -> None:
        raise NotImplementedError


class ModelHandler(SnapshotHandler):
    """A model's commit. Bound to the optimizers that update its parameters: their steps copy those."""

    #: The DistributedOptimizers that update this model's parameters (set by TorchState): only their
    #: steps change those parameters, so only their steps take or touch this model's commit.
    optimizers: tuple[CommitParticipant, ...] = ()

    @property
    def bound(self) -> bool:
        return bool(self.optimizers)

    def _updated(self) -> tuple[frozenset[int], list[torch.nn.Parameter]]:
        """The ids of the parameters the bound optimizers update, and those of this model among them
        (cached per model object and binding: ``TorchState`` may be given another model or optimizer)."""
        cached = getattr(self, "_updated_cache", None)
        # An optimizer's set of parameters changes when one starts or stops training (it rebuilds its buckets).
        sets = tuple(opt._ce_param_ids for opt in self.optimizers)
        if (cached is None or cached[0] is not self.value or cached[1] != self.optimizers
                or any(a is not b for a, b in zip(cached[4], sets))):
            ids = frozenset().union(*sets)
            cached = self._updated_cache = (self.value, self.optimizers, ids,
                                            [p for p in self.value.parameters() if id(p) in ids], sets)
        return cached[2], cached[3]

    def _state_dict(self) -> Any:
        # state_dict()'s entries without its per-module cost; the snapshot copies them (detached).
        return _state_dict_without(self.value, frozenset())

    def deferred(self, state: Any) -> frozenset[int]:
        # Asked at every save: zero-copy commits move parameters between two storages.
        if len(self.optimizers) == 1:
            return self.optimizers[0]._ce_param_ptrs()
        return frozenset().union(*(opt._ce_param_ptrs() for opt in self.optimizers))

    def _save_in_place(self) -> None:
        # Everything but the optimizers' parameters (buffers such as BatchNorm statistics, frozen
        # parameters) is copied; the parameters' version counters tell a later in-place change.
        ids, params = self._updated()
        self._snap.save(_state_dict_without(self.value, ids))
        self._record_versions(params)

    def _record_versions(self, params: list[torch.nn.Parameter]) -> None:
        # The parameters themselves too: one that starts training after the commit (unfrozen) was copied
        # into the commit, and must not read as a change of the ones versioned here.
        self._versioned = list(params)
        self._versions = [p._version for p in params]

    def _changed_since_commit(self) -> str:
        if self._touched:
            return "the parameters were updated or overwritten since the commit"
        if [p._version for p in self._versioned] != self._versions:
            return "a parameter was changed in place outside the optimizer since the commit"
        return ""

    def _restore_in_place(self) -> None:
        self.value.load_state_dict(self._snap.load(), strict=False)  # the parameters are not in it

    def _recorded(self) -> None:
        self._record_versions(self._updated()[1])

    def _broadcast(self, receivers: list[int] | None, takes: bool, heal: Heal | None) -> None:
        if heal is not None:
            state = self.value.state_dict()
            params = {name for name, _ in self.value.named_parameters(remove_duplicate=False)}
            heal.parameters({k: v for k, v in state.items() if k in params})  # the same on every holder
            heal.buffers({k: v for k, v in state.items() if k not in params})  # rank 0's


class OptimizerHandler(SnapshotHandler):
    """An optimizer's commit. A ``DistributedOptimizer``'s (a :class:`CommitParticipant`) is bound to it."""

    def __init__(self, value: Any) -> None:
        _refuse_wrapped(value)
        super().__init__(value)
        self._participant = isinstance(value, CommitParticipant)

    def save(self) -> None:
        _refuse_wrapped(self.value)  # wrapped after the TorchState was made: its next commit would be empty
        super().save()

    @property
    def distributed(self) -> bool:
        """The optimizer is a :class:`CommitParticipant`: its ``step()`` makes this commit's copies."""
        return self._participant

    @property
    def bound(self) -> bool:
        return self.distributed

    def deferred(self, state: Any) -> frozenset[int]:
        if not self.distributed:
            return frozenset()
        # Optimizer state tensors change only in step(), which flushes first.
        return frozenset(t.data_ptr() for s in state["state"].values() for t in s.values() if isinstance(t, torch.Tensor))

    def _save_in_place(self) -> None:
        # The hyperparameters (an LR scheduler changes them between steps); the state tensors
        # change only in step(), which touches this handler first.
        opt = self.value
        self._groups = [{k: _clone(v) for k, v in g.items() if k != "params"} for g in opt.param_groups]
        self._shape = self._state_shape()

    def _state_shape(self) -> tuple[int, tuple[int, ...]]:
        # Not len(state): ``state`` is a defaultdict, and merely reading an entry adds an empty one.
        opt = self.value
        return id(opt.state), tuple(len(g["params"]) for g in opt.param_groups)

    def _changed_since_commit(self) -> str:
        if self._touched:
            return "the optimizer state was updated or overwritten since the commit"
        if self._state_shape() != self._shape:
            return "the optimizer's state or parameter groups were replaced since the commit"
        return ""

    def _recorded(self) -> None:
        self._shape = self._state_shape()

    def _restore_in_place(self) -> None:
        if len(self._groups) == len(self.value.param_groups):
            for group, saved in zip(self.value.param_groups, self._groups):
                group.update(_clone(saved))

    def _broadcast(self, receivers: list[int] | None, takes: bool, heal: Heal | None) -> None:
        if heal is None or not heal.receivers:
            return
        # A holder's state is read, never loaded back into it: a commit kept in place holds its very objects.
        synced = heal.state_dict(self.value.state_dict() if get_context().info.rank in heal.holders else None,
                                 limit=state_limit(self.value))
        if synced is not None and takes:
            self.value.load_state_dict(synced)


class ShardedModelHandler(ModelHandler):
    """An FSDP2 model (``hvd.shard``): its commits hold this worker's shards, as local tensors.

    In place in the common loop, as for a replica (an optimizer update bumps the
    DTensor parameters' version counters); a kept commit copies the shards at the
    commit, nothing deferred to the optimizer step. A restore copies back into the
    live shards (views of the parameters); a sync sends shard *i* from host 0's
    local rank *i* to the local rank *i* of each host that does not hold that
    commit, point to point; the hosts that hold it take no part (see ``TorchState.sync``).
    """

    sharded = True

    def _local(self, skip: frozenset[int] = frozenset()) -> dict[str, torch.Tensor]:
        return {k: sharded.local(v).detach() for k, v in _state_dict_without(self.value, skip).items()}

    def _state_dict(self) -> Any:
        return self._local()

    def deferred(self, state: Any) -> frozenset[int]:
        return frozenset()

    def _save_in_place(self) -> None:
        ids, params = self._updated()
        self._snap.save(self._local(ids))
        self._record_versions(params)

    def _restore_in_place(self) -> None:
        self._load(self._snap.load())

    def _live(self) -> Any:
        return self._local()

    def _load(self, saved: Any) -> None:
        live = self._local()
        with torch.no_grad():  # the shards are views of the parameters: copied into, never replaced
            for name, value in saved.items():
                live[name].copy_(value)

    def _broadcast(self, receivers: list[int] | None, takes: bool, heal: Heal | None) -> None:
        collectives.broadcast_tensors_([t for _, t in sorted(self._local().items())], 0, "parameters", cross=True,
                                       receivers=receivers)


class ShardedOptimizerHandler(OptimizerHandler):
    """An optimizer over FSDP2 shards: its state's local shards, committed as :class:`ShardedModelHandler` does."""

    sharded = True

    def deferred(self, state: Any) -> frozenset[int]:
        return frozenset()

    def _state_dict(self) -> Any:
        """``state_dict()`` with each DTensor replaced by its local shard; ``dtensors`` lists where they were."""
        from torch.distributed.tensor import DTensor

        full = self.value.state_dict()
        state: dict[Any, dict[str, Any]] = {}
        where: list[list[Any]] = []
        for index, entry in full["state"].items():
            state[index] = {}
            for key, value in entry.items():
                if isinstance(value, DTensor):
                    where.append([index, key])
                    value = value.to_local()
                state[index][key] = value
        return {"state": state, "param_groups": full["param_groups"], "dtensors": where}

    def _live(self) -> Any:
        return self._state_dict()

    def _load(self, saved: Any) -> None:
        from torch.distributed.tensor import DTensor

        params = [p for group in self.value.param_groups for p in group["params"]]
        wrap = {(index, key) for index, key in saved["dtensors"]}
        state: dict[Any, dict[str, Any]] = {}
        for index, entry in saved["state"].items():
            p = params[index]
            state[index] = {
                key: DTensor.from_local(value, p.device_mesh, p.placements, run_check=False, shape=p.shape,
                                        stride=p.stride()) if (index, key) in wrap else value
                for key, value in entry.items()
            }
        self.value.load_state_dict({"state": state, "param_groups": saved["param_groups"]})

    def _broadcast(self, receivers: list[int] | None, takes: bool, heal: Heal | None) -> None:
        me = get_context().info.cross_rank
        synced = collectives.broadcast_state_dict(self._state_dict() if me == 0 else None, 0, cross=True,
                                                  receivers=receivers, limit=state_limit(self.value))
        if me != 0 and (receivers is None or me in receivers):
            self._load(synced)


class StateDictHandler:
    """The commit of an object kept through its own ``state_dict()``: an LR scheduler, a ``GradScaler``.

    The user's object stays the state's (``state.scheduler is sched``), loaded in place at a restore or a
    sync: a copy would hold a copy of the optimizer, and its ``step()`` would change no live learning rate.
    Its ``state_dict()`` is a few plain values, synced from rank 0 with the sync's other small parts
    (``TorchState._small_state``)."""

    def __init__(self, value: Any) -> None:
        self.value = value
        self._saved = self._copy(value.state_dict())

    @staticmethod
    def _copy(state: Any) -> Any:
        # A scheduler's state_dict() holds its own lists (base_lrs, _last_lr), which its step() changes.
        return copy.deepcopy(state)

    def save(self) -> None:
        self._saved = self._copy(self.value.state_dict())

    def restore(self) -> None:
        self.value.load_state_dict(self._copy(self._saved))

    def sync(self, synced: Any) -> None:
        """Take rank 0's ``state_dict()`` (``synced``, broadcast with the sync's other small parts)."""
        self.value.load_state_dict(self._copy(synced))


class SamplerHandler(StateDictHandler):
    """An ``ElasticSampler``'s commit: its ``state_dict()``. Synced from rank 0: record_batch accounts for
    every worker, so rank 0's view is complete."""

    @staticmethod
    def _copy(state: Any) -> Any:
        # ElasticSampler.state_dict() is a fresh value of a few spans, so no copying is needed
        # here: a commit costs the same for any dataset size (Horovod deep-copies the whole
        # processed set).
        return state


def _refuse_wrapped(optimizer: Any) -> None:
    """TypeError if a live ``DistributedOptimizer`` wraps ``optimizer``: the wrapper took a copy of its state
    when it was made and updates only its own, so this one's commits and syncs would carry no momentum (a
    rollback would keep the post-update state, a newcomer would start with none). Refused rather than shared:
    ``load_state_dict`` (a restore, a sync) replaces an optimizer's ``state`` dict, which would part them."""
    ref = getattr(optimizer, "_ce_wrapped_by", None)
    wrapper = ref() if ref is not None else None
    if wrapper is not None and wrapper is not optimizer:
        raise TypeError("pass the DistributedOptimizer to TorchState, not the optimizer it wraps")


def handler_for(value: Any) -> Any:
    """The handler that commits ``value`` (a model, an optimizer, an ``ElasticSampler``, an LR scheduler, a
    ``GradScaler``), else None."""
    from cloud_elastic.worker.sampler import ElasticSampler

    if sharded.is_sharded(value):  # FSDP2 shards (``hvd.shard``): this worker's shards are its commit
        if isinstance(value, torch.nn.Module):
            return ShardedModelHandler(value)
        return ShardedOptimizerHandler(value)
    if isinstance(value, torch.nn.Module):
        return ModelHandler(value)
    if isinstance(value, torch.optim.Optimizer):
        return OptimizerHandler(value)
    if isinstance(value, ElasticSampler):
        return SamplerHandler(value)
    if isinstance(value, (torch.optim.lr_scheduler.LRScheduler, torch.amp.GradScaler)):
        return StateDictHandler(value)
    return None
