"""The sharded values of an elastic state as torch DCP state dicts, and back (``hvd.shard``'s checkpoints).

:mod:`cloud_elastic.worker.durable.sharded` writes what :func:`sharded_parts` gives with ``dcp.save`` and
loads into it with ``dcp.load``; :func:`set_parts` then sets the loaded values into the live model and
optimizers.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch

from cloud_elastic.worker.durable.failure import CheckpointFailed
from cloud_elastic.worker.steps import uncounted

__all__ = ["sharded_parts", "set_parts", "same_payload"]


def sharded_parts(state: Any) -> tuple[dict[str, Any], frozenset[str]]:
    """The sharded values of ``state`` as DCP state dicts, by attribute name, and those names.

    Each sharded model by ``get_model_state_dict``; each optimizer over DTensor parameters by
    ``get_optimizer_state_dict`` with the model whose parameters it holds (:func:`model_of`: a GAN's
    generator and discriminator, each with its own optimizer). An optimizer that holds parameters of no
    sharded model of the state, or of several, cannot be written: ``CheckpointFailed`` (the job ends in
    one line at its first write rather than train on with no checkpoint).
    """
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    models, optimizers = _sharded(state)
    tensors: dict[str, Any] = {name: get_model_state_dict(model) for name, model in models.items()}
    for name, optimizer in optimizers.items():
        with _plain_step(optimizer):
            tensors[name] = get_optimizer_state_dict(models[model_of(name, optimizer, models)], optimizer)
    return tensors, frozenset(models) | frozenset(optimizers)


def _sharded(state: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The state's public sharded models and optimizers, by attribute name."""
    from cloud_elastic.worker.sharded import is_sharded

    public = {name: value for name, value in vars(state).items() if not name.startswith("_")}
    models = {n: v for n, v in public.items() if isinstance(v, torch.nn.Module) and is_sharded(v)}
    optimizers = {n: v for n, v in public.items() if isinstance(v, torch.optim.Optimizer) and is_sharded(v)}
    return models, optimizers


def model_of(name: str, optimizer: Any, models: dict[str, Any]) -> str:
    """The name of the one model in ``models`` that holds every parameter of ``optimizer`` (attribute ``name``);
    CheckpointFailed when there is none."""
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    owners = [m for m, model in models.items() if held <= {id(p) for p in model.parameters()}]
    if len(owners) != 1:
        theirs = ", ".join(sorted(models)) or "none"
        raise CheckpointFailed("write", f"a sharded checkpoint writes each optimizer with the model sharded with "
                                        f"hvd.shard that holds all its parameters: optimizer {name!r} has no such "
                                        f"model in the state (sharded models: {theirs}); give each model its own "
                                        "optimizer, both in the state")
    return owners[0]


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
                set_optimizer_state_dict(models[model_of(name, optimizer, models)], optimizer, tensors[name],
                                         options=Options(strict=False))


@contextlib.contextmanager
def _plain_step(optimizer: Any) -> Iterator[None]:
    """Let torch initialise an optimizer that has no state yet with the wrapped optimizer's own step.

    ``get_optimizer_state_dict`` gives such an optimizer its state by a step with zero gradients
    at learning rate 0. That step trains nothing: it is not counted (steps/s, steps_lost), for every
    optimizer; and through ``DistributedOptimizer.step`` it would average the gradients over every
    host, while only host 0 takes it.
    """
    with uncounted():
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


def same_payload(a: Any, b: Any) -> bool:
    """Whether two state payloads (``checkpoint.payload.state_payload``, or a staged copy of one) hold the same
    values: the same keys, types and items, tensors equal in shape, dtype and every element (a NaN is never
    equal: the payload is then written again, which loses nothing)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
                and a.dtype == b.dtype and torch.equal(a.detach().cpu(), b.detach().cpu()))
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_payload(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same_payload(x, y) for x, y in zip(a, b))
    return bool(a == b)
