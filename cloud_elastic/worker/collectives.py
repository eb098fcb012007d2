"""Collectives with Horovod's names, on the current round's process group.

Every call waits through :meth:`WorkerContext.wait`, so a failed or
abandoned collective raises :class:`CollectiveError` instead of hanging.
Tensors may live on CPU or GPU; with NCCL, CPU tensors are staged through
the worker's device and results come back on the caller's device.
"""

from __future__ import annotations

import ctypes
import io
import pickle
from typing import Any, Iterable, Mapping

import torch
import torch.distributed as dist

from cloud_elastic.worker import statecodec
from cloud_elastic.worker.context import get_context

__all__ = [
    "Average",
    "Sum",
    "allreduce",
    "allreduce_",
    "allgather",
    "broadcast",
    "broadcast_",
    "broadcast_object",
    "broadcast_state",
    "broadcast_parameters",
    "broadcast_optimizer_state",
]

Average = "average"
Sum = "sum"


def _on_device(tensor: torch.Tensor) -> torch.Tensor:
    ctx = get_context()
    if tensor.device != ctx.device:
        return tensor.to(ctx.device)
    return tensor if tensor.is_contiguous() else tensor.contiguous()


def allreduce_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None, op: str | None = None) -> torch.Tensor:
    """Reduce ``tensor`` in place across all workers (average by default); return it."""
    ctx = get_context()
    mean = op != Sum if average is None else average
    work_tensor = _on_device(tensor)
    what = f"allreduce {name or ''}".strip()
    ctx.wait(ctx.group(what).allreduce([work_tensor]), what)
    if mean:
        work_tensor.div_(ctx.info.size)
    if work_tensor is not tensor:
        tensor.copy_(work_tensor)
    return tensor


def allreduce(tensor: torch.Tensor, average: bool | None = None, name: str | None = None, op: str | None = None) -> torch.Tensor:
    """Return the average (or sum, ``op=Sum``) of ``tensor`` over all workers."""
    return allreduce_(tensor.detach().clone(), average=average, name=name, op=op)


def allgather(tensor: torch.Tensor, name: str | None = None) -> torch.Tensor:
    """Concatenate every worker's ``tensor`` along dimension 0 (first dims may differ)."""
    ctx = get_context()
    size = ctx.info.size
    local = _on_device(tensor)
    if local.dim() == 0:
        local = local.reshape(1)
    lengths = torch.tensor([local.shape[0]], dtype=torch.int64, device=ctx.device)
    all_lengths = [torch.zeros_like(lengths) for _ in range(size)]
    ctx.wait(ctx.group("allgather sizes").allgather([all_lengths], [lengths]), "allgather sizes")
    counts = [int(x.item()) for x in all_lengths]
    longest = max(counts)
    padded = local
    if local.shape[0] < longest:
        pad = torch.zeros((longest - local.shape[0],) + tuple(local.shape[1:]), dtype=local.dtype, device=local.device)
        padded = torch.cat([local, pad])
    outs = [torch.empty_like(padded) for _ in range(size)]
    ctx.wait(ctx.pg.allgather([outs], [padded]), f"allgather {name or ''}".strip())
    result = torch.cat([o[:n] for o, n in zip(outs, counts)])
    return result.to(tensor.device)


def broadcast_(tensor: torch.Tensor, root_rank: int = 0, name: str | None = None) -> torch.Tensor:
    """Overwrite ``tensor`` with ``root_rank``'s value, in place; return it."""
    ctx = get_context()
    work_tensor = _on_device(tensor)
    opts = dist.BroadcastOptions()
    opts.rootRank = root_rank
    what = f"broadcast {name or ''}".strip()
    ctx.wait(ctx.group(what).broadcast([work_tensor], opts), what)
    if work_tensor is not tensor:
        tensor.copy_(work_tensor)
    return tensor


def broadcast(tensor: torch.Tensor, root_rank: int = 0, name: str | None = None) -> torch.Tensor:
    """Return ``root_rank``'s value of ``tensor``."""
    return broadcast_(tensor.detach().clone(), root_rank, name)


def broadcast_object(obj: Any = None, root_rank: int = 0, name: str | None = None) -> Any:
    """Return ``root_rank``'s ``obj`` on every worker.

    Objects are pickled, as in Horovod and ``torch.distributed``: this trusts
    the round's members (only holders of the job secret can form a round, see
    ``worker/store.py``) and the network between them. ``sync()`` never uses
    it (see :func:`broadcast_state`); the control plane never pickles.
    """
    ctx = get_context()
    if ctx.info.rank == root_rank:
        buf = io.BytesIO()
        pickle.dump(obj, buf, protocol=pickle.HIGHEST_PROTOCOL)
        payload = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
        length = torch.tensor([payload.numel()], dtype=torch.int64)
    else:
        length = torch.zeros(1, dtype=torch.int64)
    broadcast_(length, root_rank, name)
    if ctx.info.rank != root_rank:
        payload = torch.empty(int(length.item()), dtype=torch.uint8)
    broadcast_(payload, root_rank, name)
    if ctx.info.rank == root_rank:
        return obj
    payload = payload.contiguous()
    return pickle.loads(ctypes.string_at(payload.data_ptr(), payload.numel()))  # no numpy needed


def broadcast_state(obj: Any = None, root_rank: int = 0, name: str = "state") -> Any:
    """Return ``root_rank``'s ``obj`` on every worker, never unpickling anything foreign.

    Used by ``sync()``: encoded with ``torch.save`` and decoded with
    ``weights_only=True`` (see ``statecodec``). If the root's object cannot be
    carried that way, every worker raises the same ``StateSyncError``.
    """
    ctx = get_context()
    error = ""
    if ctx.info.rank == root_rank:
        try:
            data = statecodec.encode(obj, name)
        except statecodec.StateSyncError as exc:
            data, error = str(exc).encode(), str(exc)
        length = torch.tensor([-len(data) if error else len(data)], dtype=torch.int64)
    else:
        length = torch.zeros(1, dtype=torch.int64)
    broadcast_(length, root_rank, name)
    n = int(length.item())
    payload = torch.frombuffer(bytearray(data), dtype=torch.uint8) if ctx.info.rank == root_rank else torch.empty(abs(n), dtype=torch.uint8)
    broadcast_(payload, root_rank, name)
    if n < 0:  # the root could not encode it: everyone fails alike, nobody waits for a peer
        raise statecodec.StateSyncError(error or ctypes.string_at(payload.data_ptr(), payload.numel()).decode(errors="replace"))
    if ctx.info.rank == root_rank:
        return obj
    return statecodec.decode(ctypes.string_at(payload.data_ptr(), payload.numel()), name)


#: Tensors are broadcast packed into flat buffers of at most this many bytes (one collective each).
_PACK_BYTES = 32 * 1024 * 1024


def broadcast_tensors_(tensors: list[torch.Tensor], root_rank: int = 0, name: str = "tensors") -> None:
    """Overwrite each of ``tensors`` with ``root_rank``'s value, in place, in as few collectives as fit.

    Tensors of one dtype and device travel packed in flat buffers of up to
    32 MiB: a state sync of a few dozen tensors is then a few collectives, not
    one each (each costs about a millisecond on loopback even when tiny).
    """
    ctx = get_context()
    root = ctx.info is None or ctx.info.rank == root_rank
    groups: dict[tuple[torch.dtype, torch.device], list[list[torch.Tensor]]] = {}
    sizes: dict[tuple[torch.dtype, torch.device], int] = {}
    for t in tensors:
        key = (t.dtype, t.device)
        nbytes = t.numel() * t.element_size()
        chunks = groups.setdefault(key, [[]])
        if chunks[-1] and sizes.get(key, 0) + nbytes > _PACK_BYTES:
            chunks.append([])
            sizes[key] = 0
        chunks[-1].append(t)
        sizes[key] = sizes.get(key, 0) + nbytes
    with torch.no_grad():
        for (dtype, device), chunks in groups.items():
            for chunk in chunks:
                if len(chunk) == 1:
                    broadcast_(chunk[0], root_rank, name)
                    continue
                if root:
                    flat = torch.cat([t.reshape(-1) for t in chunk])
                else:
                    flat = torch.empty(sum(t.numel() for t in chunk), dtype=dtype, device=device)
                broadcast_(flat, root_rank, name)
                if not root:
                    offset = 0
                    for t in chunk:
                        t.copy_(flat[offset: offset + t.numel()].view(t.shape))
                        offset += t.numel()


def broadcast_parameters(params: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]], root_rank: int = 0) -> None:
    """Broadcast a ``state_dict()`` or ``named_parameters()`` from ``root_rank``, in place."""
    items = sorted(params.items()) if isinstance(params, Mapping) else list(params)
    tensors = [t.detach() for _, t in items if isinstance(t, torch.Tensor)]
    broadcast_tensors_(tensors, root_rank, "parameters")


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int = 0) -> None:
    """Make every worker's optimizer state equal to ``root_rank``'s.

    Workers that joined late may not have created their state yet (momentum
    buffers appear on the first step), so the structure is agreed first: the
    root broadcasts its state dict with tensors replaced by shapes, every
    worker allocates the same tensors, then the tensors are broadcast.
    """
    ctx = get_context()
    state = optimizer.state_dict()
    skeleton, tensors = _split_tensors(state)
    skeleton = broadcast_state(skeleton if ctx.info.rank == root_rank else None, root_rank, "optimizer state")
    if ctx.info.rank != root_rank:
        tensors = [torch.empty(shape, dtype=_dtype(dtype)) for shape, dtype in _shapes(skeleton)]
    broadcast_tensors_(tensors, root_rank, "optimizer state")
    optimizer.load_state_dict(_join_tensors(skeleton, tensors))


#: Key of the plain dict that stands for a tensor in a state-dict skeleton (plain, so weights_only loads it).
_TENSOR = "__cloud_elastic_tensor__"


def _slot(index: int, shape: tuple[int, ...], dtype: str) -> dict[str, Any]:
    return {_TENSOR: index, "shape": list(shape), "dtype": dtype}


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, str(name), None)
    if not isinstance(dtype, torch.dtype):
        raise statecodec.StateSyncError(f"optimizer state: {name!r} is not a torch dtype")
    return dtype


def _is_slot(obj: Any) -> bool:
    return isinstance(obj, dict) and _TENSOR in obj


def _split_tensors(obj: Any, out: list[torch.Tensor] | None = None) -> tuple[Any, list[torch.Tensor]]:
    out = [] if out is None else out
    if isinstance(obj, torch.Tensor):
        out.append(obj.detach().cpu().contiguous().clone())
        return _slot(len(out) - 1, tuple(obj.shape), str(obj.dtype).replace("torch.", "")), out
    if isinstance(obj, dict):
        return {k: _split_tensors(v, out)[0] for k, v in obj.items()}, out
    if isinstance(obj, (list, tuple)):
        return type(obj)(_split_tensors(v, out)[0] for v in obj), out
    return obj, out


def _shapes(skeleton: Any) -> list[tuple[tuple[int, ...], str]]:
    found: dict[int, tuple[tuple[int, ...], str]] = {}

    def walk(o: Any) -> None:
        if _is_slot(o):
            found[o[_TENSOR]] = (tuple(o["shape"]), o["dtype"])
        elif isinstance(o, dict):
            for v in o.values():
                walk(v)
        elif isinstance(o, (list, tuple)):
            for v in o:
                walk(v)

    walk(skeleton)
    return [found[i] for i in range(len(found))]


def _join_tensors(skeleton: Any, tensors: list[torch.Tensor]) -> Any:
    if _is_slot(skeleton):
        return tensors[skeleton[_TENSOR]]
    if isinstance(skeleton, dict):
        return {k: _join_tensors(v, tensors) for k, v in skeleton.items()}
    if isinstance(skeleton, (list, tuple)):
        return type(skeleton)(_join_tensors(v, tensors) for v in skeleton)
    return skeleton
