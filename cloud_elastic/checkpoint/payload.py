"""What goes into a checkpoint: tensors and plain data, and the payload of a ``TorchState``.

A payload is a tree of dicts (``OrderedDict``, ``Counter``), lists, tuples and sets whose leaves are
tensors, ``str``, ``bytes``, ``bytearray``, ``int``, ``float``, ``complex``, ``bool``,
``None``, ``torch.Size``, ``torch.dtype``, ``torch.device`` or ``torch.layout`` (``plain_numpy.LEAVES``,
what a state sync carries too): exactly what ``torch.load(weights_only=True)`` reads back without running
code. The type
test is exact, so a raw NumPy scalar (a ``float`` subclass that unpickles
through NumPy) is refused when saved, not discovered unreadable when needed.

``state_payload(state)`` maps a state's public attributes (what the user
registered: ``TorchState(model, optimizer, sampler=..., epoch=0)``) to one
flat dict: modules, optimizers, LR schedulers, ``GradScaler``s and a
:class:`SavedByStateDict` (an ``ElasticSampler``) by their ``state_dict()``,
everything else as it is, but numpy numbers, numeric arrays and frozensets, which it
writes in the tagged plain form the state sync uses (``cloud_elastic.plain_numpy``)
and ``load_state_payload`` rebuilds with their type and value. A sampler's ``state_dict()`` is
its progress as spans of positions (O(spans), whatever the dataset size), so
checkpointing never builds a per-sample list on the training thread;
``load_state_payload`` also reads checkpoints that hold Horovod's form
``{"epoch", "processed_indices"}``. An optimizer whose saved param groups lack what its step reads is refused as
another model is, not left to fail at its first step (SGD's ``KeyError: 'momentum'`` in AdamW's groups:
``checkpoint.optimizer_fit``); the entry also names the optimizer's class (:data:`OPTIMIZER_CLASS`), for that
message. The file is usable without cloud-elastic:
``model.load_state_dict(ckpt["model"])``, ``optimizer.load_state_dict(ckpt["optimizer"])``.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch

from cloud_elastic import plain_numpy
from cloud_elastic.checkpoint.api import (FORMAT_VERSION, FROZENSET_FORMAT_VERSION, CheckpointError, CheckpointMismatch,
                                          StateDictMismatch)
from cloud_elastic.checkpoint.optimizer_fit import (OPTIMIZER_CLASS, OPTIMIZER_CLASSES, check_optimizer, check_state,
                                                    optimizer_class)
from cloud_elastic.checkpoint.safety import COPY_FACTOR, COPY_SLACK, MAX_NESTING, key_text

__all__ = ["OPTIMIZER_CLASS", "OPTIMIZER_CLASSES", "SavedByStateDict", "check_payload", "mismatch_of",
           "optimizer_class", "stage_payload", "state_payload", "load_state_payload"]

_LEAVES = plain_numpy.LEAVES
#: Counter too: MultiStepLR keeps its milestones in one, and torch's weights-only loader reads it.
_DICTS = plain_numpy.DICTS


def _kept_by_state_dict() -> tuple[type, ...]:
    """LR schedulers and GradScalers (and their older, deprecated classes where torch still has distinct ones):
    saved by ``state_dict()`` (a few plain values) and loaded in place, as ``TorchState`` commits them."""
    found = [torch.optim.lr_scheduler.LRScheduler, getattr(torch.optim.lr_scheduler, "_LRScheduler", None),
             torch.amp.GradScaler, getattr(torch.cuda.amp, "GradScaler", None)]
    return tuple(dict.fromkeys(kind for kind in found if isinstance(kind, type)))


_BY_STATE_DICT = _kept_by_state_dict()


def check_payload(payload: Any) -> int:
    """Raise CheckpointError naming the first value ``torch.load(weights_only=True)`` could not read; else the
    manifest format version the payload needs (``checkpoint.api``): newer only where it holds a frozenset."""
    _walk(payload, None, "payload", 1, copy=None)
    return FROZENSET_FORMAT_VERSION if plain_numpy.holds(payload, "frozenset") else FORMAT_VERSION


def stage_payload(payload: Any, previous: Any = None) -> Any:
    """A copy of ``payload`` that later changes to the original cannot reach.

    Tensors are copied to CPU into the tensors of ``previous`` (an earlier
    result of this function) where their shape and dtype match, so a steady
    job copies at memory speed into memory already touched; new buffers are
    allocated only for what changed. What the payload shares stays shared in
    the copy, as ``torch.save`` of the payload itself and the commit snapshot
    keep it (:class:`_Staging`): a resume then gets what a rollback gets. Raises
    CheckpointError like :func:`check_payload`.
    """
    return _walk(payload, previous, "payload", 1, copy=_Staging(payload))


def _walk(value: Any, old: Any, where: str, depth: int, *, copy: _Staging | None) -> Any:
    """``value`` checked (and copied with ``copy``), the container ``depth`` levels down, at ``where``: containers
    nested more than :data:`MAX_NESTING` deep are refused, as a load refuses them (``safety.check_loaded``)."""
    kind = type(value)
    if depth > MAX_NESTING and kind in (*_DICTS, list, tuple, set):
        raise CheckpointError(f"cannot checkpoint the {kind.__name__} at {where}: containers nested more than "
                              f"{MAX_NESTING} deep, which a load refuses")
    if isinstance(value, torch.Tensor):
        if kind not in (torch.Tensor, torch.nn.Parameter):
            raise _refuse(value, where)
        return copy.tensor(value, old) if copy else value
    if kind is bytearray:  # mutable: the staged copy must not change with the live state
        return bytearray(value) if copy else value
    if kind in _LEAVES:
        return value
    if kind in _DICTS:
        out = kind() if copy else None
        for key, item in value.items():
            _check_key(key, f"{where} key", depth + 1)
            staged = _walk(item, old.get(key) if isinstance(old, dict) else None, _at(where, key_text(key)), depth + 1,
                           copy=copy)
            if copy:
                out[key] = staged
        metadata = getattr(value, "_metadata", None)  # module state dicts carry versions for load_state_dict
        if metadata is not None:
            _walk(metadata, None, _at(where, "._metadata"), depth + 1, copy=None)
            if copy:
                out._metadata = _plain_copy(metadata)
        return out
    if kind in (list, tuple):
        olds = old if type(old) is kind and len(old) == len(value) else [None] * len(value)
        items = [_walk(v, o, _at(where, f"[{i}]"), depth + 1, copy=copy)
                 for i, (v, o) in enumerate(zip(value, olds))]
        return kind(items) if copy else None
    if kind is set:
        for item in value:
            _check_key(item, f"{where} element", depth + 1)
        return set(value) if copy else None
    raise _refuse(value, where)


def _check_key(key: Any, where: str, depth: int) -> None:
    """A dict key or set element: a plain leaf, or a tuple of plain data (a numpy number as
    ``plain_numpy.pack`` writes it, whose tensor is its own copy: kept as it is)."""
    if type(key) is tuple:
        _walk(key, None, where, depth, copy=None)
    elif type(key) not in _LEAVES:
        raise _refuse(key, where)


def _at(where: str, part: str) -> str:
    """``where`` one level down: bounded, for a key may be the size of the payload, at every level (the path of a
    payload nested 257 deep under a key of 256 KB took 24 GB)."""
    return where + part if len(where) <= 200 else where if where.endswith("…") else where + "…"


class _Staging:
    """The copies of one :func:`stage_payload`, which keep what the payload shares shared: a tensor referenced twice
    is copied once (one object, twice: ``state.pair = [t, t]``), and tensors that view one storage (a tied
    embedding's two keys; ``buf[:3]`` and ``buf[3:]``) into one copy of the bytes they cover, so the checkpoint
    holds them once and a resume gets them sharing memory, as a rollback to the commit does. Views that cover less
    than half of what lies between them (two small slices at either end of a big buffer) are copied each on its
    own, as before: tying them would write the bytes between. A buffer of the previous copy is reused at most once
    (it may be a view of one copy that both stood in before)."""

    def __init__(self, payload: Any) -> None:
        self._copies: dict[int, torch.Tensor] = {}  # id of a live tensor -> its copy
        self._spans = _shared_spans(payload)  # storage -> the bytes its views cover (first, end)
        self._staged: dict[tuple[Any, int], torch.Tensor] = {}  # storage -> the copy of those bytes (uint8)
        self._claimed: set[int] = set()  # the previous copy's buffers reused this time, by address

    def tensor(self, value: torch.Tensor, old: Any) -> torch.Tensor:
        copy = self._copies.get(id(value))
        if copy is None:
            src = value.detach()
            span = self._spans.get(_storage(src)) if _viewable(src) else None
            copy = self._view(src, span, old) if span else _copy_tensor(src, self._claim(old, None))
            self._copies[id(value)] = copy
        return copy

    def _view(self, src: torch.Tensor, span: tuple[int, int], old: Any) -> torch.Tensor:
        first, end = span
        buf = self._staged.get(_storage(src))
        if buf is None:
            reused = self._claim(old, end - first)
            buf = torch.empty(0, dtype=torch.uint8).set_(reused.untyped_storage()) if reused is not None else \
                torch.empty(end - first, dtype=torch.uint8)
            whole = torch.empty(0, dtype=torch.uint8, device=src.device).set_(src.untyped_storage())
            buf.copy_(whole[first:end])
            self._staged[_storage(src)] = buf
        offset = (src.storage_offset() * src.element_size() - first) // src.element_size()
        return torch.empty(0, dtype=src.dtype).set_(buf.untyped_storage(), offset, src.shape, src.stride())

    def _claim(self, old: Any, nbytes: int | None) -> torch.Tensor | None:
        """``old`` (a tensor of the previous copy) if its storage is not reused yet and is all its own (or, with
        ``nbytes``, that many bytes on the CPU: a copy of a span to reuse whole); else None."""
        if not isinstance(old, torch.Tensor) or old.device.type != "cpu" or old.layout != torch.strided:
            return None
        storage = old.untyped_storage()
        fits = storage.nbytes() == nbytes if nbytes is not None else (
            old.storage_offset() == 0 and storage.nbytes() == old.numel() * old.element_size())
        if not fits or storage.data_ptr() in self._claimed:
            return None
        self._claimed.add(storage.data_ptr())
        return old


def _storage(tensor: torch.Tensor) -> tuple[Any, int]:
    return tensor.device, tensor.untyped_storage().data_ptr()


def _viewable(tensor: torch.Tensor) -> bool:
    """Whether a copy of ``tensor`` can be a view of a copy of its storage's bytes (no conjugate or negative bit,
    which a view of plain bytes would drop; not quantized; not an empty storage, at address 0 like every other; no
    element reached twice, as ``expand`` makes: a checkpoint holding such a view is refused by every load)."""
    return (tensor.layout == torch.strided and tensor.device.type != "meta" and not tensor.is_quantized
            and not tensor.is_conj() and not tensor.is_neg() and tensor.untyped_storage().nbytes() > 0
            and tensor.numel() * tensor.element_size() <= _extent(tensor))


def _shared_spans(payload: Any) -> dict[tuple[Any, int], tuple[int, int]]:
    """The storages that two tensors of ``payload`` or more view, each with the bytes they cover (first, end),
    where those views together hold at least that many bytes and each starts at a whole element of its dtype from
    the first."""
    views: dict[tuple[Any, int], dict[int, torch.Tensor]] = {}
    todo, seen = [(payload, 1)], set()
    while todo:  # iterative and bounded: the walk that follows refuses what nests deeper
        value, depth = todo.pop()
        if isinstance(value, torch.Tensor):
            if _viewable(value):
                views.setdefault(_storage(value), {})[id(value)] = value
        elif type(value) in (*_DICTS, list, tuple) and depth <= MAX_NESTING and id(value) not in seen:
            seen.add(id(value))
            todo += [(v, depth + 1) for v in (value.values() if isinstance(value, dict) else value)]
    spans = {}
    for key, tensors in views.items():
        if len(tensors) < 2:
            continue
        ranges = [_byte_range(t) for t in tensors.values()]
        first, end = min(r[0] for r in ranges), max(r[1] for r in ranges)
        if sum(r[1] - r[0] for r in ranges) >= end - first and all(
                (t.storage_offset() * t.element_size() - first) % t.element_size() == 0 for t in tensors.values()):
            spans[key] = (first, end)
    return spans


def _byte_range(tensor: torch.Tensor) -> tuple[int, int]:
    """The bytes of its storage that ``tensor`` reaches: (first, end)."""
    first = tensor.storage_offset() * tensor.element_size()
    return first, first + _extent(tensor)


def _extent(tensor: torch.Tensor) -> int:
    """How many bytes from its first element ``tensor`` reaches in its storage."""
    if tensor.numel() == 0:
        return 0
    return tensor.element_size() * (1 + sum((n - 1) * stride for n, stride in zip(tensor.shape, tensor.stride())))


def _copy_tensor(value: torch.Tensor, old: Any) -> torch.Tensor:
    src = value.detach()
    if src.layout != torch.strided:
        return src.to("cpu", copy=True)
    if isinstance(old, torch.Tensor) and old.shape == src.shape and old.dtype == src.dtype:
        buf = old
    else:
        buf = torch.empty(src.shape, dtype=src.dtype, device="cpu")
    # A copy from a GPU into pageable memory is synchronous, so the buffer is complete on return.
    buf.copy_(src)
    return buf


def _plain_copy(value: Any) -> Any:
    if type(value) in _DICTS:
        return type(value)((k, _plain_copy(v)) for k, v in value.items())
    if type(value) in (list, tuple):
        return type(value)(_plain_copy(v) for v in value)
    if type(value) is set:
        return set(value)
    return value


def _refuse(value: Any, where: str) -> CheckpointError:
    name = f"{type(value).__module__}.{type(value).__qualname__}".removeprefix("builtins.")
    return CheckpointError(
        f"cannot checkpoint the {name} at {where}: a checkpoint holds only tensors and plain data "
        "(dict, list, tuple, set, str, bytes, int, float, bool, None), which load without running code"
    )


# -- the payload of a state ------------------------------------------------------------


@runtime_checkable
class SavedByStateDict(Protocol):
    """A value that a state payload holds as its ``state_dict()`` and loads with ``load_state_dict()``,
    besides modules and optimizers: a class opts in with ``saved_by_state_dict = True``.

    ``ElasticSampler`` (``cloud_elastic.worker.sampler``) does: its ``state_dict()`` is O(spans) plain data.
    ``load_state_dict`` must also take Horovod's form ``{"epoch", "processed_indices"}`` (a list).
    """

    saved_by_state_dict: bool

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...


def _public_attributes(state: Any) -> dict[str, Any]:
    """The attributes the user registered on the state: its public instance attributes."""
    return {name: value for name, value in vars(state).items() if not name.startswith("_")}


def state_payload(state: Any, skip: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The checkpoint payload of a ``State``: one entry per public attribute, by name (but those in ``skip``:
    a sharded checkpoint keeps its sharded model and optimizer in torch DCP's files).

    Returns references to live tensors, not copies: call it right after a
    commit, and hand the result to ``CheckpointWriter.submit`` (which copies
    before returning) or ``CheckpointStore.save`` (which writes before
    returning).
    """
    payload: dict[str, Any] = {}
    for name, value in _public_attributes(state).items():
        if name in skip:
            continue
        # A sampler's state_dict() is O(spans) plain data: nothing on this thread grows with the dataset.
        if isinstance(value, torch.optim.Optimizer):
            payload[name] = value.state_dict()
            if isinstance(payload[name], dict):  # torch's are; an optimizer of its own may keep another form
                payload[name] = {**payload[name], OPTIMIZER_CLASS: optimizer_class(value)}
        elif isinstance(value, (torch.nn.Module, SavedByStateDict, *_BY_STATE_DICT)):
            payload[name] = value.state_dict()
        else:
            payload[name] = value
    # Numpy values (state.loss = np.mean(...)) and frozensets as the sync carries them: plain data, nothing that
    # torch.load(weights_only=True) would refuse.
    return plain_numpy.pack(payload)


def _sampler_state(value: Any) -> dict[str, Any]:
    """A sampler entry as ``ElasticSampler.load_state_dict`` takes it (spans, or checkpoints before spans)."""
    if "processed_indices" in value:  # written before checkpoints held the spans: an int64 tensor
        return {"epoch": int(value["epoch"]), "processed_indices": value["processed_indices"].tolist()}
    return dict(value)


def load_state_payload(state: Any, payload: Any, skip: frozenset[str] = frozenset()) -> None:
    """Load a :func:`state_payload` into ``state`` and make it the state's last commit (the attributes in
    ``skip`` are not in the payload: a sharded checkpoint's loader has loaded them already).

    The names must match the state's public attributes both ways; a mismatch, or an optimizer's saved param
    groups that lack what its step reads (``optimizer_fit.check_optimizer``: an OptimizerMismatch) or whose saved
    state does not fit its parameters (``optimizer_fit.check_state``: another shape, a cast past the copy bound),
    raises CheckpointMismatch before anything is changed; one that does not fit
    (shapes, optimizer groups) restores the state's last commit and raises
    CheckpointMismatch (naming the first mismatch); any other failure of a load (out of
    memory, I/O) restores it too and raises a plain CheckpointError: it is no sign of
    another model. A malformed numpy value raises CheckpointError (before anything is changed). After loading,
    ``state.save()`` runs, so a later rollback returns to the checkpoint and
    never to the weights the process started with. When that save fails (out of memory), CheckpointError: the
    state then holds the whole checkpoint, but its last commit may hold only part of it: nothing may train on (a
    worker exits).
    """
    live = {name: value for name, value in _public_attributes(state).items() if name not in skip}
    if not isinstance(payload, dict):
        raise CheckpointError(f"a state checkpoint is a dict of attributes, got {type(payload).__name__}")
    missing, unexpected = sorted(set(live) - set(payload)), sorted(set(payload) - set(live))
    if missing or unexpected:
        raise CheckpointMismatch(_bounded("attributes " + "; ".join(
            f"{what}: {', '.join(names)}" for what, names in (("missing", missing), ("unexpected", unexpected))
            if names)))
    for name, target in live.items():
        if isinstance(target, torch.optim.Optimizer) and isinstance(payload[name], dict):
            entry = payload[name]
            check_optimizer(name, target, entry.get("param_groups"), entry.get(OPTIMIZER_CLASS), entry.get("state"))
            check_state(name, target, entry.get("param_groups"), entry.get("state"), COPY_FACTOR, COPY_SLACK)
    payload = _numpy_rebuilt(payload)
    try:
        for name, value in payload.items():
            target = live[name]
            if isinstance(target, torch.optim.Optimizer) and isinstance(value, dict):
                target.load_state_dict({k: v for k, v in value.items() if k != OPTIMIZER_CLASS})
            elif isinstance(target, (torch.nn.Module, torch.optim.Optimizer, *_BY_STATE_DICT)):
                target.load_state_dict(value)
            elif isinstance(target, SavedByStateDict):
                target.load_state_dict(_sampler_state(value))
            else:
                setattr(state, name, value)
    except Exception as exc:
        # load_state_dict copies what matches before it reports what does not: go back to the last commit.
        state.restore()
        first = _bounded(str(exc)) if isinstance(exc, StateDictMismatch) else mismatch_of(exc)
        if first is None:  # out of memory, I/O...: the checkpoint may well fit, and must not be called another model's
            raise CheckpointError(f"could not load the checkpoint's {name}: {type(exc).__name__}: "
                                  f"{_bounded(str(exc), 500)}") from exc
        raise CheckpointMismatch(f"{name}: {first}") from exc
    try:
        state.save()
    except Exception as exc:
        # No restore: a snapshot that failed part way may hold some of the checkpoint already, and a restore would
        # mix it with the last commit. The live state holds the whole checkpoint; the caller stops (a worker exits).
        raise CheckpointError(f"could not keep the loaded checkpoint as the state's last commit: "
                              f"{type(exc).__name__}: {_bounded(str(exc), 300)}") from exc


#: How torch says that a saved value does not fit the live one: ``load_state_dict``'s lines (a module's, an
#: optimizer's, a GradScaler saved disabled) and torch DCP's load planner's (a sharded model).
_MISMATCH = ("size mismatch for ", "Missing key(s) in state_dict", "Unexpected key(s) in state_dict",
             "loaded state dict ", "The source state dict is empty", "Size mismatch between saved ",
             "Missing key in checkpoint state_dict")


def mismatch_of(exc: BaseException) -> str | None:
    """The first mismatch that ``exc``, raised by a ``load_state_dict`` or torch DCP's load, reports (a module's
    lists one a line under a heading, thousands for a large model), bounded, with how many more; None when it
    reports none (out of memory, I/O, a copy that failed for another reason): the state may then well fit."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if len(lines) > 1 and lines[0].startswith("Error(s) in loading state_dict"):
        lines = lines[1:]
    first = next((line for line in lines if line.startswith(_MISMATCH)), None)
    if first is None or isinstance(exc, (MemoryError, OSError, torch.OutOfMemoryError)):
        return None
    more = f" (and {len(lines) - 1} more)" if len(lines) > 1 else ""
    return _bounded(first.rstrip(".")) + more


def _bounded(text: str, limit: int = 240) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _numpy_rebuilt(payload: dict[str, Any]) -> dict[str, Any]:
    """``payload`` with the numpy values :func:`state_payload` tagged rebuilt (a checkpoint written before they
    were kept has none: it comes back as it is); CheckpointError, before anything is loaded, for a forged tag."""
    try:
        return plain_numpy.unpack(payload)
    except plain_numpy.Malformed as exc:
        raise CheckpointError(f"the checkpoint holds {exc}: corrupt or forged") from None
    except ImportError:
        raise CheckpointError("the checkpoint holds numpy values, and numpy is not installed here") from None
