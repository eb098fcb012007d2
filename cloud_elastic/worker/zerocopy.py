"""Zero-copy commits for ``torch.optim.SGD``: the update after a commit writes into the snapshot's spare buffer.

A commit must keep the committed parameters and momentum until the next
commit. The generic way (``state._Snapshot``) copies them just before the
next optimizer update overwrites them in place: an extra read and write of
the whole training state per commit, which is most of the cost of
committing every step.

For SGD the update can run out of place instead. Each live tensor trades
storage with its snapshot buffer (no data moves): the snapshot now holds
the committed values, and the update reads them and writes the new values
into the live tensor's new storage. The arithmetic is the same sequence of
operations as torch's single-tensor SGD, so the results are bitwise
identical to ``torch.optim.SGD.step()``; the only visible difference is that
a parameter's storage alternates between two buffers from commit to commit
(code that caches ``data_ptr()``, such as captured CUDA graphs, should set
``CLOUD_ELASTIC_ZERO_COPY_COMMIT=0``).

Anything this module does not handle exactly takes the copying path:
fused, differentiable or multi-tensor (``foreach``, torch's default on GPUs,
where the copy is a fast device-memory copy anyway) SGD, sparse or scaled
gradients, tensor hyperparameters other than ``lr``, parameters that are
views into a larger buffer, and other optimizers.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import torch

__all__ = ["settle", "swap_update_for", "tradeable_ptrs", "Update"]

#: A live tensor's storage address -> (its snapshot buffer, the live tensor as it was at the commit).
Taken = dict[int, tuple[torch.Tensor, torch.Tensor]]
#: ``update(optimizer, taken, pairs=None)``: one optimizer step over ``pairs`` of (group, parameter), default all.
Update = Callable[..., None]


def swap_update_for(optimizer: Any, enabled: bool = True) -> Update | None:
    """The out-of-place update for ``optimizer`` (a DistributedOptimizer), or None to copy instead.

    ``enabled`` is ``WorkerSettings.zero_copy_commit`` (``CLOUD_ELASTIC_ZERO_COPY_COMMIT``).
    """
    if not enabled:
        return None
    if type(optimizer).__mro__[1] is not torch.optim.SGD:  # a subclass may change step()
        return None
    if getattr(optimizer, "grad_scale", None) is not None or getattr(optimizer, "found_inf", None) is not None:
        return None
    for group in optimizer.param_groups:
        if group.get("fused") or group.get("differentiable"):
            return None
        # Torch's multi-tensor (foreach) SGD, its default on GPUs, batches kernel launches and
        # may round differently; there the copy is a cheap device-memory copy, so keep torch's step.
        foreach = group.get("foreach")
        if foreach or (foreach is None and any(p.device.type != "cpu" for p in group["params"])):
            return None
        if any(isinstance(group[k], torch.Tensor) for k in ("weight_decay", "momentum", "dampening")):
            return None
        lr = group["lr"]
        if isinstance(lr, torch.Tensor) and (lr.requires_grad or lr.numel() != 1):
            return None
        if any(p.grad is not None and p.grad.is_sparse for p in group["params"]):
            return None
    return _sgd_update


def tradeable_ptrs(optimizer: Any, params: Iterable[torch.Tensor] | None = None) -> frozenset[int]:
    """Storages of the tensors the next SGD update writes: parameters with a gradient and their momentum.

    With ``params``, those parameters (and their momentum) whether or not
    their gradient exists yet: they are about to be given one.
    """
    ptrs = set()
    chosen = None if params is None else {id(p) for p in params}
    for group in optimizer.param_groups:
        for p in group["params"]:
            if (p.grad is None) if chosen is None else (id(p) not in chosen):
                continue
            ptrs.add(p.data_ptr())
            buf = optimizer.state.get(p, {}).get("momentum_buffer") if group["momentum"] != 0 else None
            if isinstance(buf, torch.Tensor):
                ptrs.add(buf.data_ptr())
    return frozenset(ptrs)


def _owns_storage(t: torch.Tensor) -> bool:
    return t.is_contiguous() and t.storage_offset() == 0 and t.untyped_storage().nbytes() == t.numel() * t.element_size()


def _trade(live: torch.Tensor, taken: Taken) -> torch.Tensor:
    """The tensor holding ``live``'s current values; ``live`` then may be written without touching them.

    With a snapshot buffer pending for ``live``, the two trade storages: the
    snapshot keeps the current (committed) values and is returned; ``live``
    gets the snapshot's old storage, to be overwritten whole by the update.
    Without one, ``live`` itself is returned and updated in place.
    """
    pair = taken.pop(live.data_ptr(), None)
    if pair is None:
        return live
    snap = pair[0]
    if snap.shape != live.shape or snap.dtype != live.dtype or snap.device != live.device or not (
        _owns_storage(live) and _owns_storage(snap)
    ):
        snap.copy_(live)
        return live
    committed, spare = live.detach(), snap.detach()
    snap.set_(committed)
    live.data = spare
    return snap


def _sgd_update(optimizer: Any, taken: Taken, pairs: list[tuple[dict[str, Any], torch.Tensor]] | None = None) -> None:
    """``torch.optim.SGD``'s single-tensor update, reading committed values from traded storage.

    ``pairs`` (parameter group, parameter) limits it to some parameters and
    leaves what is left in ``taken`` to the caller's :func:`settle`:
    ``DistributedOptimizer`` updates each bucket's parameters as soon as its
    allreduce completes. Each parameter's update depends on nothing else, so
    the results are the same.
    """
    everything = pairs is None
    if pairs is None:
        pairs = [(group, p) for group in optimizer.param_groups for p in group["params"]]
    with torch.no_grad():
        for group, param in pairs:
            if param.grad is not None:
                _sgd_update_one(optimizer, group, param, taken)
    if everything:
        settle(taken)


def settle(taken: Taken) -> None:
    """Copy the snapshots taken for tensors no update wrote (none expected); they are unchanged, so this is exact."""
    for snap, src in taken.values():
        snap.copy_(src)
    taken.clear()


def _sgd_update_one(optimizer: Any, group: dict[str, Any], param: torch.Tensor, taken: Taken) -> None:
    lr = group["lr"]
    weight_decay, momentum = group["weight_decay"], group["momentum"]
    dampening, nesterov, maximize = group["dampening"], group["nesterov"], group["maximize"]
    grad = param.grad if not maximize else -param.grad
    current = _trade(param, taken)
    if weight_decay != 0:
        grad = grad.add(current, alpha=weight_decay)
    if momentum != 0:
        state = optimizer.state[param]
        buf = state.get("momentum_buffer")
        if buf is None:
            buf = grad.detach().clone()
            state["momentum_buffer"] = buf
        else:
            torch.mul(_trade(buf, taken), momentum, out=buf)
            buf.add_(grad, alpha=1 - dampening)
        grad = grad.add(buf, alpha=momentum) if nesterov else buf
    torch.add(current, grad, alpha=-lr, out=param)
