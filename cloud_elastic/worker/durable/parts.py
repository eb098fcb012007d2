"""The sharded values of an elastic state as torch DCP state dicts, and back (``hvd.shard``'s checkpoints).

:mod:`cloud_elastic.worker.durable.sharded` writes what :func:`sharded_parts` gives with ``dcp.save`` and
loads into it with ``dcp.load``; :func:`set_parts` then sets the loaded values into the live model and
optimizers.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch

from cloud_elastic.checkpoint.api import CheckpointError

__all__ = ["sharded_parts", "set_parts"]


def sharded_parts(state: Any) -> tuple[dict[str, Any], frozenset[str]]:
    """The sharded values of ``state`` as DCP state dicts, by attribute name, and those names.

    The sharded model by ``get_model_state_dict``; each optimizer over its DTensor
    parameters by ``get_optimizer_state_dict``, which needs that model: a state with
    sharded optimizers must hold exactly one sharded model.
    """
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    from cloud_elastic.worker.sharded import is_sharded

    public = {name: value for name, value in vars(state).items() if not name.startswith("_")}
    models = {n: v for n, v in public.items() if isinstance(v, torch.nn.Module) and is_sharded(v)}
    optimizers = {n: v for n, v in public.items() if isinstance(v, torch.optim.Optimizer) and is_sharded(v)}
    if optimizers and len(models) != 1:
        raise CheckpointError(f"a sharded checkpoint needs the state to hold exactly one model sharded with hvd.shard "
                              f"for its optimizers ({', '.join(sorted(optimizers))}); it holds {len(models)}")
    tensors: dict[str, Any] = {name: get_model_state_dict(model) for name, model in models.items()}
    for name, optimizer in optimizers.items():
        model = next(iter(models.values()))
        with _plain_step(optimizer):
            tensors[name] = get_optimizer_state_dict(model, optimizer)
    return tensors, frozenset(models) | frozenset(optimizers)


def set_parts(state: Any, tensors: dict[str, Any]) -> None:
    """Set ``tensors`` (loaded into what :func:`sharded_parts` gave) into the state's models and optimizers."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions as Options
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    models = {n: getattr(state, n) for n in tensors if isinstance(getattr(state, n), torch.nn.Module)}
    for name, model in models.items():
        set_model_state_dict(model, tensors[name])
    for name in tensors:
        optimizer = getattr(state, name)
        if isinstance(optimizer, torch.optim.Optimizer):
            with _plain_step(optimizer):  # not strict: a parameter the checkpoint holds no state of starts with none
                set_optimizer_state_dict(next(iter(models.values())), optimizer, tensors[name],
                                         options=Options(strict=False))


@contextlib.contextmanager
def _plain_step(optimizer: Any) -> Iterator[None]:
    """Let torch initialise an optimizer that has no state yet with the wrapped optimizer's own step.

    ``get_optimizer_state_dict`` gives such an optimizer its state by a step with zero gradients
    at learning rate 0. Through ``DistributedOptimizer.step`` that step would count as a training
    step and average the gradients over every host, while only host 0 takes it.
    """
    if optimizer.state or not hasattr(optimizer, "_ce_skip"):
        yield
        return
    base = type(optimizer).__mro__[1].step
    base = getattr(base, "__wrapped__", base) if getattr(base, "hooked", False) else base
    optimizer.step = lambda closure=None: base(optimizer, closure)
    try:
        yield
    finally:
        del optimizer.step
