"""Zero-copy commits: the update after a commit writes into the snapshot's spare buffers.

A commit must keep the committed parameters and optimizer state until the
next commit. The generic way (``snapshot.Snapshot``) copies them just before
the next optimizer update overwrites them in place: an extra read and write
of the whole training state per commit, which is most of the cost of
committing every step (for AdamW: parameters and both moments).

For ``torch.optim.SGD``, ``Adam``, ``AdamW``, ``Adagrad`` and ``RMSprop`` the
update can run out of place instead. Each live tensor trades storage with
its snapshot buffer (no data moves): the snapshot now holds the committed
values, and the update reads them and writes the new values into the live
tensor's new storage. The arithmetic is the same sequence of operations as
torch's single-tensor implementation of each optimizer, each in-place
operation replaced by the same kernel with ``out=``, so the results are
bitwise identical to the optimizer's own ``step()``; the only visible
difference is that a parameter's storage alternates between two buffers
from commit to commit (code that caches ``data_ptr()``, such as captured
CUDA graphs, should set ``CLOUD_ELASTIC_ZERO_COPY_COMMIT=0``).

Anything this module does not handle exactly takes the copying path:
subclasses, fused, differentiable, capturable or multi-tensor (``foreach``,
torch's default on GPUs) settings, sparse, complex or scaled gradients,
tensor hyperparameters other than a one-element ``lr``, parameters whose
optimizer state does not exist yet (the first step), parameters that are
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
#: Optimizer state entries that are not written whole by the update (a one-element step count).
_NOT_TRADED = frozenset({"step"})


def swap_update_for(optimizer: Any, enabled: bool = True, params: Iterable[torch.Tensor] | None = None) -> Update | None:
    """The out-of-place update for ``optimizer`` (a DistributedOptimizer), or None to copy instead.

    ``enabled`` is ``WorkerSettings.zero_copy_commit`` (``CLOUD_ELASTIC_ZERO_COPY_COMMIT``).
    ``params`` are the parameters whose gradients may be sparse (default: all;
    ``DistributedOptimizer`` makes its bucketed ones dense).
    """
    if not enabled:
        return None
    base = type(optimizer).__mro__[1]  # a subclass may change step()
    spec = _SPECS.get(base)
    if spec is None:
        return None
    if getattr(optimizer, "grad_scale", None) is not None or getattr(optimizer, "found_inf", None) is not None:
        return None
    update, scalars = spec
    for group in optimizer.param_groups:
        if group.get("fused") or group.get("differentiable") or group.get("capturable"):
            return None
        # Torch's multi-tensor (foreach) step, its default on GPUs, batches kernel launches and
        # may round differently; there the copy is a cheap device-memory copy, so keep torch's step.
        foreach = group.get("foreach")
        if foreach or (foreach is None and any(p.device.type != "cpu" for p in group["params"])):
            return None
        if any(isinstance(v, torch.Tensor) for k in scalars if k in group for v in _values(group[k])):
            return None
        lr = group["lr"]
        # SGD's update uses a tensor lr as torch does; the others turn it into a number.
        if isinstance(lr, torch.Tensor) and (lr.requires_grad or lr.numel() != 1 or update is not _sgd_update):
            return None
    checked = params if params is not None else (p for g in optimizer.param_groups for p in g["params"])
    if any(p.grad is not None and p.grad.is_sparse for p in checked):
        return None
    if update is not _sgd_update and not _states_exist(optimizer):
        return None  # the first step creates the state: torch's own step does that
    return update


def _values(value: Any) -> tuple[Any, ...]:
    return value if isinstance(value, tuple) else (value,)


def _states_exist(optimizer: Any) -> bool:
    """Every parameter has its optimizer state (torch creates it at the first step) and is real.

    Remembered per state dict and size (``load_state_dict`` replaces the dict,
    ``add_param_group`` adds parameters without state), so steps do not rescan.
    """
    state = optimizer.state
    n = sum(len(g["params"]) for g in optimizer.param_groups)
    key = (id(state), len(state), n)
    if optimizer.__dict__.get("_ce_states_exist") == key:
        return True
    ok = all(len(state.get(p, ())) > 0 and not p.is_complex() for g in optimizer.param_groups for p in g["params"])
    if ok:
        optimizer.__dict__["_ce_states_exist"] = key
    return ok


def tradeable_ptrs(optimizer: Any, params: Iterable[torch.Tensor] | None = None) -> frozenset[int]:
    """Storages of the tensors the next update writes whole: parameters with a gradient and their state.

    With ``params``, those parameters (and their state) whether or not
    their gradient exists yet: they are about to be given one.
    """
    ptrs = set()
    state = optimizer.state
    candidates = params if params is not None else (p for g in optimizer.param_groups for p in g["params"] if p.grad is not None)
    for p in candidates:
        ptrs.add(p.data_ptr())
        for key, value in state.get(p, {}).items():
            if key not in _NOT_TRADED and isinstance(value, torch.Tensor):
                ptrs.add(value.data_ptr())
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


def _updater(update_one: Callable[[Any, dict[str, Any], torch.Tensor, Taken], None]) -> Update:
    def update(optimizer: Any, taken: Taken, pairs: list[tuple[dict[str, Any], torch.Tensor]] | None = None) -> None:
        """One optimizer step, reading committed values from traded storage.

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
                    update_one(optimizer, group, param, taken)
        if everything:
            settle(taken)

    return update


def settle(taken: Taken) -> None:
    """Copy the snapshots taken for tensors no update wrote (none expected); they are unchanged, so this is exact."""
    for snap, src in taken.values():
        snap.copy_(src)
    taken.clear()


def _scalar(value: Any) -> Any:
    return value.item() if isinstance(value, torch.Tensor) else value


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


def _adam_update_one(optimizer: Any, group: dict[str, Any], param: torch.Tensor, taken: Taken) -> None:
    """``torch.optim.adam._single_tensor_adam`` (Adam and AdamW), out of place."""
    state = optimizer.state[param]
    lr, (beta1, beta2) = _scalar(group["lr"]), group["betas"]
    weight_decay, eps = group["weight_decay"], group["eps"]
    grad = param.grad if not group["maximize"] else -param.grad
    step_t = state["step"]
    step_t += 1
    current = _trade(param, taken)
    if weight_decay != 0:
        if group.get("decoupled_weight_decay", False):
            current = torch.mul(current, 1 - lr * weight_decay, out=param)
        else:
            grad = grad.add(current, alpha=weight_decay)
    exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
    torch.lerp(_trade(exp_avg, taken), grad, 1 - beta1, out=exp_avg)
    torch.mul(_trade(exp_avg_sq, taken), beta2, out=exp_avg_sq).addcmul_(grad, grad, value=1 - beta2)
    step = step_t.item()
    bias_correction1 = 1 - beta1**step
    bias_correction2 = 1 - beta2**step
    step_size = lr / bias_correction1
    bias_correction2_sqrt = bias_correction2**0.5
    if group["amsgrad"]:
        max_sq = state["max_exp_avg_sq"]
        torch.maximum(_trade(max_sq, taken), exp_avg_sq, out=max_sq)
        denom = (max_sq.sqrt() / bias_correction2_sqrt).add_(eps)
    else:
        denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
    torch.addcdiv(current, exp_avg, denom, value=-step_size, out=param)


def _adagrad_update_one(optimizer: Any, group: dict[str, Any], param: torch.Tensor, taken: Taken) -> None:
    """``torch.optim.adagrad._single_tensor_adagrad`` (dense gradients), out of place."""
    state = optimizer.state[param]
    step_t = state["step"]
    step_t += 1
    step = step_t.item()
    grad = param.grad if not group["maximize"] else -param.grad
    current = _trade(param, taken)
    if group["weight_decay"] != 0:
        grad = grad.add(current, alpha=group["weight_decay"])
    clr = _scalar(group["lr"]) / (1 + (step - 1) * group["lr_decay"])
    state_sum = state["sum"]
    torch.addcmul(_trade(state_sum, taken), grad, grad, value=1, out=state_sum)
    std = state_sum.sqrt().add_(group["eps"])
    torch.addcdiv(current, grad, std, value=-clr, out=param)


def _rmsprop_update_one(optimizer: Any, group: dict[str, Any], param: torch.Tensor, taken: Taken) -> None:
    """``torch.optim.rmsprop._single_tensor_rmsprop``, out of place."""
    state = optimizer.state[param]
    lr, alpha, momentum = _scalar(group["lr"]), group["alpha"], group["momentum"]
    grad = param.grad if not group["maximize"] else -param.grad
    state["step"] += 1
    current = _trade(param, taken)
    if group["weight_decay"] != 0:
        grad = grad.add(current, alpha=group["weight_decay"])
    square_avg = state["square_avg"]
    torch.mul(_trade(square_avg, taken), alpha, out=square_avg).addcmul_(grad, grad, value=1 - alpha)
    if group["centered"]:
        grad_avg = state["grad_avg"]
        torch.lerp(_trade(grad_avg, taken), grad, 1 - alpha, out=grad_avg)
        avg = square_avg.addcmul(grad_avg, grad_avg, value=-1).sqrt_()
    else:
        avg = square_avg.sqrt()
    avg = avg.add_(group["eps"])
    if momentum > 0:
        buf = state["momentum_buffer"]
        torch.mul(_trade(buf, taken), momentum, out=buf).addcdiv_(grad, avg)
        torch.add(current, buf, alpha=-lr, out=param)
    else:
        torch.addcdiv(current, grad, avg, value=-lr, out=param)


_sgd_update = _updater(_sgd_update_one)
#: optimizer class -> (its out-of-place update, hyperparameters that must be numbers)
_SPECS: dict[type, tuple[Update, tuple[str, ...]]] = {
    torch.optim.SGD: (_sgd_update, ("weight_decay", "momentum", "dampening")),
    torch.optim.Adam: (_updater(_adam_update_one), ("weight_decay", "eps", "betas")),
    torch.optim.AdamW: (_updater(_adam_update_one), ("weight_decay", "eps", "betas")),
    torch.optim.Adagrad: (_updater(_adagrad_update_one), ("weight_decay", "eps", "lr_decay")),
    torch.optim.RMSprop: (_updater(_rmsprop_update_one), ("weight_decay", "eps", "alpha", "momentum")),
}
