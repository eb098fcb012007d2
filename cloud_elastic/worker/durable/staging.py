"""The host copy of a sharded checkpoint's DCP state dicts, which a write in the background reads while
training goes on (``worker.durable.sharded``)."""

from __future__ import annotations

from typing import Any

import torch

from cloud_elastic.worker.commit.snapshot import clone

__all__ = ["stage"]


def stage(tensors: dict[str, Any], previous: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """A copy of DCP state dicts in host memory, refilling ``previous`` (an earlier copy no write uses any more)
    where every tensor's shape and dtype match, as the replicas' writer reuses its buffers.

    A new copy: CPU tensors are cloned (DCP's staging would copy each of them twice); GPU tensors go to
    pinned memory as DCP's own async staging copies them (None where this torch lacks those functions:
    the write is then synchronous).
    """
    if previous is not None:
        try:
            with torch.no_grad():
                staged = _refill(tensors, previous)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            return staged
        except _Mismatch:
            pass
    if not torch.cuda.is_available():
        return clone(tensors)  # a DTensor's clone copies its local shard, with no collective
    try:
        from torch.distributed._state_dict_utils import _copy_state_dict, _create_cpu_state_dict
    except ImportError:  # pragma: no cover - older or newer torch: write synchronously
        return None
    staged = _create_cpu_state_dict(tensors, pin_memory=True)
    _copy_state_dict(tensors, staged)
    torch.cuda.synchronize()
    return staged


class _Mismatch(Exception):
    """The earlier copy does not have this state's shape: a new copy is made."""


def _refill(value: Any, into: Any) -> Any:
    """``value`` copied into the tensors of ``into`` (the same structure), containers and other values new."""
    from torch.distributed.tensor import DTensor

    if isinstance(value, DTensor):
        if not isinstance(into, DTensor) or into.to_local().shape != value.to_local().shape or \
                into.dtype != value.dtype:
            raise _Mismatch()
        into.to_local().copy_(value.to_local())
        return into
    if isinstance(value, torch.Tensor):
        if type(into) is not torch.Tensor or into.shape != value.shape or into.dtype != value.dtype:
            raise _Mismatch()
        return into.copy_(value)
    if isinstance(value, dict):
        if not isinstance(into, dict) or into.keys() != value.keys():
            raise _Mismatch()
        return {key: _refill(item, into[key]) for key, item in value.items()}
    if type(value) in (list, tuple):
        if type(into) is not type(value) or len(into) != len(value):
            raise _Mismatch()
        return type(value)(_refill(item, old) for item, old in zip(value, into))
    return value
