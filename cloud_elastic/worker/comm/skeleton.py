"""A state dict's *skeleton*: its tensors replaced by slots (index, shape, dtype), and what a receiver allocates by it.

A state sync sends an optimizer state's skeleton first (``collectives.broadcast_state_dict``,
``heal.Heal.state_dict``); a receiver allocates one tensor per slot, then the tensors' bytes
arrive into them. Process-group traffic is not authenticated, so a skeleton is checked
before anything is allocated by it (:func:`allocate`): a forged or corrupted one (a shape of
2^62 elements, a negative one, a slot shared by a thousand branches) ends the sync in one
line, not in a ``MemoryError`` or the OOM killer.
"""

from __future__ import annotations

import math
import mmap
from typing import Any

import torch

from cloud_elastic.worker.comm.statecodec import StateSyncError

__all__ = ["allocate", "state_limit"]

#: Key of the plain dict that stands for a tensor in a skeleton (plain, so weights_only loads it).
_TENSOR = "__cloud_elastic_tensor__"

#: An optimizer's state may take at most this many times its parameters' bytes (see :func:`state_limit`)...
STATE_FACTOR = 256
#: ... plus this many bytes (scalars, step counts: a tiny model's state is mostly these).
STATE_SLACK = 64 * 1024 * 1024


def state_limit(optimizer: torch.optim.Optimizer) -> int:
    """The most bytes a receiver allocates for ``optimizer``'s state from a peer's skeleton.

    Derived from what the receiver holds (its parameters), not from the sender: 256 times their
    bytes, plus 64 MiB. Adam's state is 2 to 3 times its parameters (4 to 6 for 16-bit ones with
    fp32 moments), L-BFGS's default history about 200 times; a skeleton announcing more than that
    is corrupt or forged.
    """
    params = sum(p.numel() * p.element_size() for group in optimizer.param_groups for p in group["params"])
    return STATE_FACTOR * params + STATE_SLACK


def _slot(index: int, shape: tuple[int, ...], dtype: str) -> dict[str, Any]:
    return {_TENSOR: index, "shape": list(shape), "dtype": dtype}


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, str(name), None)
    if not isinstance(dtype, torch.dtype):
        raise StateSyncError(f"optimizer state: {name!r} is not a torch dtype")
    return dtype


def _is_slot(obj: Any) -> bool:
    return isinstance(obj, dict) and _TENSOR in obj


def _split_tensors(obj: Any, out: list[torch.Tensor] | None = None, copy: bool = True) -> tuple[Any, list[torch.Tensor]]:
    """``obj`` with each tensor replaced by a slot, and the tensors (CPU copies, or with ``copy`` false themselves)."""
    out = [] if out is None else out
    if isinstance(obj, torch.Tensor):
        out.append(obj.detach().cpu().contiguous().clone() if copy else obj.detach())
        return _slot(len(out) - 1, tuple(obj.shape), str(obj.dtype).replace("torch.", "")), out
    if isinstance(obj, dict):
        return {k: _split_tensors(v, out, copy)[0] for k, v in obj.items()}, out
    if isinstance(obj, (list, tuple)):
        return type(obj)(_split_tensors(v, out, copy)[0] for v in obj), out
    return obj, out


def _join_tensors(skeleton: Any, tensors: list[torch.Tensor]) -> Any:
    if _is_slot(skeleton):
        return tensors[skeleton[_TENSOR]]
    if isinstance(skeleton, dict):
        return {k: _join_tensors(v, tensors) for k, v in skeleton.items()}
    if isinstance(skeleton, (list, tuple)):
        return type(skeleton)(_join_tensors(v, tensors) for v in skeleton)
    return skeleton


def _checked_slots(skeleton: Any, name: str) -> list[tuple[list[int], torch.dtype]]:
    """Each slot's (shape, dtype), by index, of a skeleton a peer sent; StateSyncError if it is not one
    :func:`_split_tensors` could have made: a tree (a container reached twice would make
    :func:`_join_tensors` build it once per path), slots numbered 0..n-1 once each, shapes of
    non-negative ints, torch dtypes."""
    found: dict[Any, tuple[list[int], torch.dtype]] = {}
    seen: set[int] = set()
    stack = [skeleton]
    while stack:
        o = stack.pop()
        if isinstance(o, (dict, list, tuple)):
            if id(o) in seen:
                raise StateSyncError(f"{name}: rank 0's skeleton is not a tree (one part reached twice): corrupt or forged")
            seen.add(id(o))
        if _is_slot(o):
            index, shape = o.get(_TENSOR), o.get("shape")
            if (type(index) is not int or index in found or not isinstance(shape, (list, tuple))
                    or not all(type(n) is int and n >= 0 for n in shape)):
                raise StateSyncError(f"{name}: rank 0's skeleton has a malformed tensor slot (index {index!r}, "
                                     f"shape {str(shape)[:80]}): corrupt or forged")
            found[index] = (list(shape), _dtype(o.get("dtype")))
        elif isinstance(o, dict):
            stack.extend(o.values())
        elif isinstance(o, (list, tuple)):
            stack.extend(o)
    if sorted(found) != list(range(len(found))):
        raise StateSyncError(f"{name}: rank 0's skeleton numbers its {len(found)} tensors otherwise than 0 to "
                             f"{len(found) - 1}: corrupt or forged")
    return [found[i] for i in range(len(found))]


def allocate(skeleton: Any, name: str, limit: int, zeroed: bool = False) -> list[torch.Tensor]:
    """Empty CPU tensors for each slot of ``skeleton`` (a peer's), in index order, once it is checked:
    StateSyncError, in one line naming the state and the sizes, if it is malformed or its tensors would
    take more than ``limit`` bytes (see :func:`state_limit`). Nothing is allocated before the check.
    ``zeroed``: zeros instead, without touching their pages now (:func:`zeros`)."""
    slots = _checked_slots(skeleton, name)
    total = sum(math.prod(shape) * dtype.itemsize for shape, dtype in slots)  # Python ints: no overflow
    if total > limit:
        raise StateSyncError(f"{name}: rank 0's skeleton announces {len(slots)} tensor(s) of {total} bytes, more "
                             f"than the {limit} bytes this worker allows for it: corrupt or forged")
    return [zeros(shape, dtype) if zeroed else torch.empty(shape, dtype=dtype) for shape, dtype in slots]


#: A zeroed tensor of at least this many bytes is made by :func:`zeros` in an anonymous mapping.
MAPPED_BYTES = 1 << 20


def zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A CPU tensor of zeros whose pages are not touched now: from :data:`MAPPED_BYTES` on, an anonymous mapping,
    whose pages the OS gives zeroed as they are first written (``torch.zeros`` writes every page at once: 0.4-1 s
    a GB, which a follower paid while the running workers waited for its first piece, bench41); smaller, or where
    no mapping can be had (``vm.max_map_count``), ``torch.zeros``."""
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes >= MAPPED_BYTES:
        try:
            # Private: a fork (an async checkpoint writer) sees it copy-on-write, as any other memory (review rvD).
            private = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            return torch.frombuffer(private, dtype=dtype).view(shape)
        except (OSError, ValueError, TypeError, RuntimeError):
            pass
    return torch.zeros(shape, dtype=dtype)
