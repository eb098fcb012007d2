"""Whether a checkpoint's optimizer state fits the live optimizer: what torch's step reads, not its class's name.

torch's ``Optimizer.load_state_dict`` runs the optimizer's load_state_dict pre-hooks on the saved dict, takes the
saved ``param_groups`` as they are then (only ``params`` is the live optimizer's: the checkpoint's hyperparameters
win over the ones the live optimizer was built with), and the class's ``__setstate__`` fills in the keys it has a
default for (those a later torch added: ``foreach``, ``fused``...). torch's own optimizers read each of their
hyperparameters from a group by key, so another optimizer's groups load without a word and the first step fails
(SGD's ``KeyError: 'momentum'`` in AdamW's groups) on every worker, at every resume. :func:`check_optimizer`
refuses, before anything is loaded, saved groups that still lack a hyperparameter of the torch optimizer the live
one is (or subclasses: ``LoggingAdamW`` reads AdamW's) once the pre-hooks and ``__setstate__`` have run on a probe.

The check only refuses what it knows the step fails on, and otherwise lets torch load, as before checkpoints named
optimizers:

* A key the user's own class adds (an optional ``clip`` read with ``group.get``) is not required: how its step
  reads it cannot be told. An optimizer that is not torch's, nor a subclass of one, is not checked at all.
* Of torch's own hyperparameters (its classes' ``__init__`` keywords), those its step does not read by key are not
  required (:data:`_NOT_READ`, checked against every torch optimizer by dropping each key: SparseAdam's
  ``maximize`` is read with ``group.get``, Adagrad's ``initial_accumulator_value`` only by ``__init__``), and one
  read only when a parameter's state is first set up (Rprop's ``lr``, :data:`_FIRST_STEP`) only where the saved
  state lacks a parameter of the group (on the sharded path, whose state is not read, never).
* The probe never touches the checkpoint's tensors, the live optimizer or its class. Decision (review s58 rvM F1): the
  pre-hooks run on a dict of the probe's own, whose ``state`` is empty and whose ``param_groups`` are a deep copy of
  the saved ones (groups are small), never on the checkpoint's state: a hook may change the state in place (torch
  allows it), and the real load runs it again, so a hook that halved the momentum buffers halved them twice. A hook
  that needs the saved state fails on the probe, and then the check does not refuse (torch loads as it did).
  Checking the live groups after the real load instead would need the restore of the last commit on a refusal
  and a second path for sharded checkpoints, whose groups are checked before DCP reads anything.
  The probe is a bare instance of the class whose attributes are copies (containers one level deep; its groups
  and defaults its own), whose state is empty, and whose ``_patch_step_function`` (torch's ``__setstate__``
  patches the class's ``step`` with it) does nothing.
* DCP's metadata holds a sharded checkpoint's group keys, not their values: there the probe's groups hold the live
  optimizer's values under the saved keys (None for a key the live one lacks), so a pre-hook that computes a key
  from a saved value (``clip = 10 * lr``) computes it from the live one.
* A wrapper that delegates (its class defines ``param_groups``, ``defaults`` or ``state``, as accelerate's
  ``AcceleratedOptimizer`` does), a class with its own ``load_state_dict``, and one whose pre-hooks or
  ``__setstate__`` fail on the probe, are not checked.

The class's name decides nothing: a subclass, a renamed copy, or Adam for AdamW resume (with the checkpoint's
hyperparameters: an AdamW built with ``weight_decay=0.05`` resuming Adam's checkpoint runs with its 0, which is
logged), and another optimizer that shares the name is refused only when its groups lack a key. The name a
checkpoint records (:func:`optimizer_class`) only names the writer in the message. Which per-parameter state the live
class needs is not checked: a fresh optimizer has none until its first step, so it cannot be told cheaply, and a saved
group's flag (Adam's ``amsgrad``) rightly changes which state the step reads. What the saved state holds is compared
with the parameters it is loaded for (:func:`check_state`, review s63 rvX F3): torch's ``load_state_dict`` checks
neither shapes nor dtypes, so a state of another shape loaded and the first step failed at every resume, and it casts
every state tensor to its parameter's dtype (a bool state becomes float64, 8 times its bytes). A state that does not
fit is refused as another optimizer's is (a mismatch), not as an unusable checkpoint: the store that picks the
checkpoint does not know the script's parameters, and a script that gives its optimizer the parameters in another
order fails the same way with every checkpoint it wrote, which ends the job naming the newest. Only when an older
checkpoint fits does the load pass over the newer one (``worker.durable.failure.Misfits``: altered since written).
"""

from __future__ import annotations

import copy
import inspect
import logging
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from cloud_elastic.checkpoint.api import CheckpointMismatch

__all__ = ["OPTIMIZER_CLASS", "OPTIMIZER_CLASSES", "OptimizerMismatch", "OptimizerStateMismatch", "check_optimizer",
           "check_optimizers", "check_state", "lacking", "optimizer_class", "optimizer_classes"]

log = logging.getLogger(__name__)

#: The key of an optimizer's entry in a payload that names the optimizer's class (torch's ``load_state_dict``
#: reads only ``state`` and ``param_groups``, so the entry still loads without cloud-elastic).
OPTIMIZER_CLASS = "optimizer_class"
#: The key of a sharded checkpoint's manifest ``extra`` that names each sharded optimizer's class, by attribute.
OPTIMIZER_CLASSES = "optimizer_classes"
#: What a wrapper that delegates to another optimizer defines on its class (a property): its probe would read the
#: live optimizer's.
_DELEGATED = ("param_groups", "defaults", "state")


class OptimizerMismatch(CheckpointMismatch):
    """A checkpoint's optimizer state lacks what the live optimizer's step reads; ``remedy`` says what to do."""

    remedy = "resume with the optimizer that wrote it"


def optimizer_class(optimizer: torch.optim.Optimizer) -> str:
    """The name a checkpoint records of ``optimizer``'s class: ``AdamW`` for an AdamW in a DistributedOptimizer
    too (which subclasses it under the same name)."""
    return type(optimizer).__name__


def lacking(optimizer: torch.optim.Optimizer, groups: Iterable[Any], state: Any = None) -> list[str]:
    """The hyperparameters of the torch optimizer ``optimizer`` is (or subclasses) that its own groups all hold (in
    the order of its ``defaults``) and that one of the saved param ``groups`` (dicts, or the keys of each) lacks once
    ``optimizer``'s load_state_dict pre-hooks and ``__setstate__`` have run on them on a probe, as
    ``load_state_dict`` runs them; one its step reads only for a parameter without state is lacking only where the
    saved ``state`` (by parameter id: None when it is not known) lacks one of that group's ``params``. [] when none
    is lacking, and when it cannot be told (see the module's docstring): never an error, never a change to
    ``optimizer`` or to the saved groups and state."""
    groups = list(groups)
    if not groups:
        return []
    try:
        read = _read_by_torch(type(optimizer))
        if not read:
            return []
        groups = [dict(g) if isinstance(g, Mapping) else _live_valued(optimizer, i, g) for i, g in enumerate(groups)]
        filled = _as_loaded(optimizer, groups)
        # A key its own groups lack (a class that drops one after building them) is not one its step reads.
        needed = [key for key in optimizer.defaults if key in read and all(key in g for g in optimizer.param_groups)]
        first = _read_first(type(optimizer))
        unset = [_stateless(g, state) for g in groups]
    except Exception:  # noqa: BLE001 - the user's class, hooks or __setstate__ on a probe: loads as it did
        return []
    return [key for key in needed if any(key not in group and (key not in first or (i < len(unset) and unset[i]))
                                         for i, group in enumerate(filled))]


#: torch's hyperparameters (by its class's name) that its step does not read by key, so that a checkpoint lacking
#: one loads and steps (rvM l/dropkey.py drops each key of each torch optimizer): SparseAdam reads ``maximize``
#: with ``group.get`` (a torch before it wrote none), Adagrad ``initial_accumulator_value`` only in ``__init__``
#: (the saved state holds the accumulators).
_NOT_READ = {"SparseAdam": frozenset({"maximize"}), "Adagrad": frozenset({"initial_accumulator_value"})}
#: Those its step reads only when it sets up a parameter's state (Rprop's first step size is ``lr``).
_FIRST_STEP = {"Rprop": frozenset({"lr"})}


def _read_by_torch(cls: type) -> frozenset[str]:
    """The hyperparameters (``__init__``'s keyword names) of the torch optimizers among ``cls``'s bases that their
    step reads from each group by key (not those of :data:`_NOT_READ`); none where the check cannot tell what a
    load does (a delegating wrapper, a class with its own ``load_state_dict``: see the module's docstring)."""
    if not _loads_as_torch(cls):
        return frozenset()
    return frozenset(name for c in cls.__mro__ if _of_torch(c) and c is not torch.optim.Optimizer
                     for name, p in inspect.signature(c.__init__).parameters.items()
                     if name not in ("self", "params") and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
                     and name not in _NOT_READ.get(c.__name__, ()))


def _loads_as_torch(cls: type) -> bool:
    """Whether ``cls`` loads a state dict with torch's ``Optimizer.load_state_dict`` (not a delegating wrapper's, nor
    a class's own)."""
    if any(name in vars(c) for c in cls.__mro__ for name in _DELEGATED):
        return False
    loader = next((c for c in cls.__mro__ if "load_state_dict" in vars(c)), None)
    return loader is not None and _of_torch(loader)


def _read_first(cls: type) -> frozenset[str]:
    """Of :func:`_read_by_torch`, those read only for a parameter without state (:data:`_FIRST_STEP`)."""
    return frozenset(k for c in cls.__mro__ if _of_torch(c) for k in _FIRST_STEP.get(c.__name__, ()))


def _stateless(group: Mapping[str, Any], state: Any) -> bool:
    """Whether the saved ``state`` is known and lacks one of the saved ``group``'s parameters."""
    params = group.get("params")
    return isinstance(state, Mapping) and isinstance(params, list) and any(p not in state for p in params)


def _live_valued(optimizer: torch.optim.Optimizer, index: int, keys: Iterable[str]) -> dict[str, Any]:
    """A saved group known by its ``keys`` alone (DCP's metadata), each holding the live optimizer's value (its group
    at ``index``, else its defaults; None where it has none) for the pre-hooks that compute a key from a value."""
    live = optimizer.param_groups[index] if index < len(optimizer.param_groups) else optimizer.defaults
    return {key: [] if key == "params" else live.get(key, optimizer.defaults.get(key)) for key in keys}


def _of_torch(cls: type) -> bool:
    """Whether ``cls`` is one of torch's optimizers (``torch.optim.SGD``, ``torch.optim.Optimizer`` itself)."""
    module = getattr(cls, "__module__", None) or ""
    return isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer) and \
        (module == "torch.optim" or module.startswith("torch.optim."))


def _as_loaded(optimizer: torch.optim.Optimizer, groups: list[dict[str, Any]]) -> list[set[str]]:
    """The keys of each of ``groups`` as ``optimizer``'s ``load_state_dict`` would leave them, found on a probe whose
    pre-hooks get a deep copy of ``groups`` and no state (the checkpoint's tensors are never theirs to change)."""
    probe = object.__new__(type(optimizer))
    vars(probe).update({key: _copied(value) for key, value in vars(optimizer).items()})
    vars(probe).update(param_groups=[_copied(g) for g in optimizer.param_groups], defaults=dict(optimizer.defaults),
                       state=defaultdict(dict), _patch_step_function=lambda: None)  # it patches the class's step
    saved: Any = {"state": {}, "param_groups": copy.deepcopy(groups)}
    for hook in list(getattr(probe, "_optimizer_load_state_dict_pre_hooks", {}).values()):
        result = hook(probe, saved)
        saved = saved if result is None else result
    probe.__setstate__({"state": {}, "param_groups": [{**g, "params": []} for g in saved["param_groups"]]})
    return [set(group) for group in probe.param_groups]


def _copied(value: Any) -> Any:
    """A new dict, list or set (of its type) with ``value``'s items; any other value as it is."""
    return copy.copy(value) if isinstance(value, (dict, list, set)) else value


def check_optimizer(name: str, optimizer: torch.optim.Optimizer, groups: Any, saved: Any = None,
                    state: Any = None) -> None:
    """OptimizerMismatch when the param ``groups`` a checkpoint holds for the optimizer ``name`` (a list of dicts,
    or of key sets: DCP's metadata) lack what ``optimizer``'s step reads (:func:`lacking`; the saved ``state``, by
    parameter id, only tells whether a key read at a parameter's first step is needed); ``saved``, the class name
    the checkpoint recorded (None before it did), names the writer, and a resume by another class is logged (it
    runs with the checkpoint's hyperparameters). Groups of another form are left to the load itself."""
    if not isinstance(groups, list) or not all(isinstance(g, (Mapping, set, frozenset)) for g in groups):
        return
    missing = lacking(optimizer, [{k: v for k, v in g.items() if isinstance(k, str)} if isinstance(g, Mapping)
                                  else [k for k in g if isinstance(k, str)] for g in groups], state)
    if not missing:
        if isinstance(saved, str) and saved != optimizer_class(optimizer):
            log.warning("%s: the checkpoint was written by %s, this is %s: it takes the checkpoint's param groups "
                        "(their hyperparameters, not the ones it was built with)", name, saved, optimizer_class(optimizer))
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


class OptimizerStateMismatch(OptimizerMismatch):
    """A checkpoint's per-parameter optimizer state does not fit the live optimizer's parameters."""

    remedy = ("resume with the model and optimizer that wrote it, their parameters given in the same order (a "
              "checkpoint altered since it was written fails the same way: move it aside to resume from the one "
              "before)")


#: The per-parameter state torch's optimizers keep in the shape of the parameter (their steps add it to the
#: parameter), by key; ``step`` and the like hold one number (their steps take ``.item()`` of it).
_LIKE_PARAM = frozenset({"exp_avg", "exp_avg_sq", "max_exp_avg_sq", "exp_inf", "momentum_buffer", "square_avg",
                         "acc_delta", "grad_avg", "sum", "prev", "step_size", "ax", "variance"})
_ONE_NUMBER = frozenset({"step", "eta", "mu", "mu_product", "H_diag"})
#: Adafactor's factors of a parameter of 2 dimensions or more: its shape with the dimension at this index made 1
#: (``row_var``: the last; ``col_var``: the one before it).
_FACTORS = {"row_var": -1, "col_var": -2}
#: LBFGS keeps its state under its first parameter, over all of them flattened into one vector: these are vectors
#: of that length, and ``old_dirs`` and ``old_stps`` lists of them; ``ro`` holds one number for each of their
#: pairs, and ``al`` room for as many.
_FLAT = frozenset({"d", "prev_flat_grad"})
_FLAT_LISTS = frozenset({"old_dirs", "old_stps"})


def check_state(name: str, optimizer: torch.optim.Optimizer, groups: Any, state: Any, factor: int, slack: int) -> None:
    """OptimizerStateMismatch, before anything is loaded, when the saved per-parameter ``state`` (by the ids in the
    saved param ``groups``, matched to ``optimizer``'s parameters in order, as torch's ``load_state_dict`` matches
    them) does not fit: where ``optimizer`` is one of torch's (or subclasses one, with torch's ``load_state_dict``),
    a state of :data:`_LIKE_PARAM` that is not a tensor of its parameter's shape, or one of :data:`_ONE_NUMBER`
    that is not one number (the first step would fail, at every resume); and for any optimizer that loads with
    torch's ``load_state_dict``, state that its cast to each parameter's dtype (a bool or int8 state made float64
    is 8 times its bytes; each reference to one tensor cast on its own) would make bigger than ``factor`` times the
    parameters' bytes plus ``slack``. Groups and state of another form are left to the load itself."""
    if not _loads_as_torch(type(optimizer)) or not isinstance(groups, list) or not isinstance(state, Mapping):
        return
    live = [g.get("params") for g in optimizer.param_groups]
    saved = [g.get("params") if isinstance(g, Mapping) else None for g in groups]
    if len(saved) != len(live) or not all(isinstance(s, list) and len(s) == len(p) for s, p in zip(saved, live)):
        return  # torch refuses it by itself ("a different number of parameter groups"): another model
    by_id = {}
    for index, (ids, params, group) in enumerate(zip(saved, live, groups)):
        flat = sum(p.numel() for p in params)
        for position, (key, param) in enumerate(zip(ids, params)):
            if isinstance(key, (int, str)) and key in state:
                by_id[key] = (param, f"parameter {position} of group {index}",
                              bool(group.get("fused") or group.get("capturable")), flat)
    shaped = any(_of_torch(c) and c is not torch.optim.Optimizer for c in type(optimizer).__mro__)
    budget = factor * sum(p.numel() * p.element_size() for p, _, _, _ in by_id.values()) + slack
    cast = 0
    for key, (param, where, step_cast, flat) in by_id.items():
        if shaped:
            _check_shapes(name, param, where, state[key], flat)
        cast += _cast_bytes(param, state[key], step_cast, {})
        if cast > budget:
            raise OptimizerStateMismatch(f"{name}: its saved state would take more than {budget:,} bytes once cast "
                                         f"to its parameters' dtypes (at {where}), {factor} times their size")


def _check_shapes(name: str, param: torch.Tensor, where: str, saved: Any, flat: int) -> None:
    """OptimizerStateMismatch when the saved state of ``param`` (at ``where``; ``flat``: the elements of its group's
    parameters) holds one of :data:`_LIKE_PARAM` that is not a tensor of its shape (None passes: SGD's buffer before
    momentum), one of :data:`_ONE_NUMBER` that is not one number, an Adafactor factor (:data:`_FACTORS`) or an
    LBFGS vector (:data:`_FLAT`, :data:`_FLAT_LISTS`) of another shape, or LBFGS lists of unequal lengths."""
    if not isinstance(saved, Mapping):
        return
    for key, value in saved.items():
        shape = list(param.shape) if key in _LIKE_PARAM else [flat] if key in _FLAT else None
        if key in _FACTORS and param.dim() > 1:
            shape = list(param.shape)
            shape[_FACTORS[key]] = 1
        if key in _FLAT_LISTS and isinstance(value, list):  # its first vector of another length, if any
            wrong = [v for v in value if not (isinstance(v, torch.Tensor) and list(v.shape) == [flat])][:1]
            value, shape = (wrong[0] if wrong else None), ([flat] if wrong else None)
        if shape is not None and value is not None and not (
                isinstance(value, torch.Tensor) and list(value.shape) == shape):
            held = f"a tensor of shape {list(value.shape)[:8]}" if isinstance(value, torch.Tensor) else \
                f"a {type(value).__name__}"
            first = f"{name}: the saved {key!r} of {where} is {held}, " + (
                f"its parameter's shape is {shape[:8]}" if key in _LIKE_PARAM else f"not {shape[:8]} (" + (
                    f"its parameter's shape is {list(param.shape)[:8]})" if key in _FACTORS else
                    f"its group's parameters hold {flat:,} elements)"))
        elif key in _ONE_NUMBER and isinstance(value, torch.Tensor) and value.numel() != 1:
            first = f"{name}: the saved {key!r} of {where} holds {value.numel():,} numbers, not one"
        elif key == "old_dirs" and not _lbfgs_lengths(saved):
            first = (f"{name}: the saved history of {where} holds lists of unequal lengths (old_dirs, old_stps, ro, "
                     "al)")
        else:
            continue
        raise OptimizerStateMismatch(first if len(first) <= 240 else first[:237] + "...")


def _lbfgs_lengths(saved: Mapping[str, Any]) -> bool:
    """Whether LBFGS's saved history, as its step indexes it, is as long in ``old_stps`` and ``ro`` (of numbers) as
    in ``old_dirs``, and ``al`` (if saved) has room for it."""
    dirs, stps, ro, al = (saved.get(k) for k in ("old_dirs", "old_stps", "ro", "al"))
    if not all(isinstance(v, list) for v in (dirs, stps, ro)) or len(stps) != len(dirs) or len(ro) != len(dirs):
        return False
    numbers = all(isinstance(r, torch.Tensor) and r.numel() == 1 or isinstance(r, (int, float)) for r in ro)
    return numbers and (al is None or isinstance(al, list) and len(al) >= len(dirs))


def _cast_bytes(param: torch.Tensor, value: Any, step_cast: bool, known: dict[int, int], key: Any = None) -> int:
    """The bytes torch's ``load_state_dict`` allocates to cast ``value``, saved state of ``param``, as its ``_cast``
    does: each tensor (each reference on its own) to ``param``'s dtype where that is floating (``step``: to float32
    where the group is fused or capturable, else kept), through dicts and other iterables. Nesting is bounded by the
    load's own check (``safety.check_loaded``)."""
    if isinstance(value, torch.Tensor):
        dtype = (torch.float32 if step_cast else None) if key == "step" else \
            (param.dtype if param.is_floating_point() else None)
        return 0 if dtype is None or value.dtype == dtype else value.numel() * dtype.itemsize
    if not isinstance(value, (dict, list, tuple, set)):
        return 0
    if id(value) not in known:  # a container referenced over and over is cast each time, priced once
        items = value.items() if isinstance(value, dict) else ((None, v) for v in value)
        known[id(value)] = sum(_cast_bytes(param, v, step_cast, known, k) for k, v in items)
    return known[id(value)]
