"""Whether a checkpoint's optimizer state fits the live optimizer: what its next step reads, not its class's name.

torch's ``Optimizer.load_state_dict`` takes the saved ``param_groups`` as they are (only ``params`` is the live
optimizer's), then the class's ``__setstate__`` fills in the keys it has a default for (those a later torch added:
``foreach``, ``fused``...). A step reads each group's hyperparameters by key, and ``add_param_group`` gives every
group each key of the optimizer's ``defaults``. So another optimizer's groups load without a word, and the first step
fails (SGD's ``KeyError: 'momentum'`` in AdamW's groups) on every worker, at every resume. :func:`check_optimizer`
refuses, before anything is loaded, saved groups that still lack a key of the live ``defaults`` once the live
class's ``__setstate__`` has filled them in (run on a probe, never on the live optimizer). A subclass
(``LoggingAdamW``), a renamed copy, or Adam for AdamW have the same keys and load; another optimizer that happens
to share the name (an SGD called ``AdamW``) is refused. The class name a checkpoint records (:func:`optimizer_class`)
only names the writer in the message.

Per-parameter state is not compared: a fresh optimizer has none until its first step (torch creates it there), so
what the live class needs cannot be told cheaply, and a saved group's flag (Adam's ``amsgrad``) rightly changes
which state the step reads. An optimizer whose ``__setstate__`` fails on the probe is not checked (it loads as it
did before checkpoints named optimizers).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

from cloud_elastic.checkpoint.api import CheckpointMismatch

__all__ = ["OPTIMIZER_CLASS", "OPTIMIZER_CLASSES", "OptimizerMismatch", "check_optimizer", "check_optimizers",
           "lacking", "optimizer_class", "optimizer_classes"]

#: The key of an optimizer's entry in a payload that names the optimizer's class (torch's ``load_state_dict``
#: reads only ``state`` and ``param_groups``, so the entry still loads without cloud-elastic).
OPTIMIZER_CLASS = "optimizer_class"
#: The key of a sharded checkpoint's manifest ``extra`` that names each sharded optimizer's class, by attribute.
OPTIMIZER_CLASSES = "optimizer_classes"


class OptimizerMismatch(CheckpointMismatch):
    """A checkpoint's optimizer state lacks what the live optimizer's step reads; ``remedy`` says what to do."""

    remedy = "resume with the optimizer that wrote it"


def optimizer_class(optimizer: torch.optim.Optimizer) -> str:
    """The name a checkpoint records of ``optimizer``'s class: ``AdamW`` for an AdamW in a DistributedOptimizer
    too (which subclasses it under the same name)."""
    return type(optimizer).__name__


def lacking(optimizer: torch.optim.Optimizer, groups: Iterable[Iterable[str]]) -> list[str]:
    """The keys of ``optimizer.defaults`` (in their order; those its own groups all hold) that one of the saved param
    ``groups`` (each given by its keys) lacks once ``optimizer``'s class has filled it in as ``load_state_dict``
    would; [] when none does, or when the class's ``__setstate__`` cannot run on a probe (it is then not checked)."""
    groups = [{key: None for key in group if key != "params"} for group in groups]
    if not groups:
        return []
    try:
        probe = object.__new__(type(optimizer))
        probe.__dict__.update(vars(optimizer))  # a __setstate__ may read the optimizer's own attributes
        probe.__setstate__({"defaults": dict(optimizer.defaults), "state": {},
                            "param_groups": [{**group, "params": []} for group in groups]})
        filled = [set(group) for group in probe.param_groups]
    except Exception:  # noqa: BLE001 - a class of the user's that cannot be probed: loads as it did
        return []
    # A key of the defaults that the optimizer's own groups lack (a class that adds one after building them) is
    # not one its step reads from a group.
    needed = [key for key in optimizer.defaults if all(key in group for group in optimizer.param_groups)]
    return [key for key in needed if any(key not in group for group in filled)]


def check_optimizer(name: str, optimizer: torch.optim.Optimizer, groups: Any, saved: Any = None) -> None:
    """OptimizerMismatch when the param ``groups`` a checkpoint holds for the optimizer ``name`` (a list of dicts,
    or of key sets) lack what ``optimizer``'s step reads (:func:`lacking`); ``saved``, the class name the checkpoint
    recorded (None before it did), names the writer. Groups of another form are left to the load itself."""
    if not isinstance(groups, list) or not all(isinstance(g, (Mapping, set, frozenset)) for g in groups):
        return
    missing = lacking(optimizer, [[k for k in g if isinstance(k, str)] for g in groups])
    if not missing:
        return
    keys = ", ".join(repr(key) for key in missing[:4]) + (f" (and {len(missing) - 4} more)" if len(missing) > 4 else "")
    writer = f"saved by {saved}, whose param groups" if isinstance(saved, str) else "its saved param groups"
    first = f"{name}: {writer} lack {keys} that {_named(optimizer, saved)} needs"
    raise OptimizerMismatch(first if len(first) <= 240 else first[:237] + "...")


def optimizer_classes(state: Any, names: Iterable[str]) -> dict[str, str]:
    """:func:`optimizer_class` of each optimizer among the attributes ``names`` of ``state``, by name: what a sharded
    checkpoint's manifest records under :data:`OPTIMIZER_CLASSES`."""
    return {n: optimizer_class(getattr(state, n)) for n in sorted(names)
            if isinstance(getattr(state, n), torch.optim.Optimizer)}


def check_optimizers(optimizers: Mapping[str, torch.optim.Optimizer], groups: Mapping[str, Any], classes: Any) -> None:
    """:func:`check_optimizer` for each of ``optimizers`` (by name) with its saved ``groups`` (by name) and the class
    the manifest's ``classes`` (its :data:`OPTIMIZER_CLASSES`: absent before checkpoints recorded it) names."""
    for name, optimizer in optimizers.items():
        check_optimizer(name, optimizer, groups.get(name), classes.get(name) if isinstance(classes, dict) else None)


def _named(optimizer: torch.optim.Optimizer, saved: Any) -> str:
    """``optimizer``'s class name, with its module where the checkpoint's writer had the same name (another
    optimizer called ``AdamW``); the user's class, not a DistributedOptimizer's subclass of it."""
    name = optimizer_class(optimizer)
    if name != saved:
        return name
    own = next((c for c in type(optimizer).__mro__ if not c.__module__.startswith("cloud_elastic.")), type(optimizer))
    return f"this {name} ({own.__module__}.{own.__qualname__})"
