"""``optimizer.step(closure)`` on a ``DistributedOptimizer``: every call of the closure is averaged.

torch's closure form (``loss = optimizer.step(closure)``; LBFGS needs it, SGD and Adam take it) runs the
forward and backward *inside* ``step()``, after the step's own ``synchronize()``: the base optimizer would read
this worker's own gradients, and the replicas would drift apart under a job that ends "succeeded" (Horovod's
``DistributedOptimizer`` does the same). Here each call of the closure is wrapped:

* before it, what an earlier backward launched is waited for and forgotten (the closure's own
  ``zero_grad()`` would do the same; one that does not call it accumulates on the averaged gradients, the
  same on every worker);
* after it, this backward's gradients are averaged (``synchronize``: the buckets its hooks launched), so the
  base optimizer reads the job's gradients;
* the loss it returns is the workers' mean (a tensor or a number; ``None`` stays ``None``), so every worker's
  optimizer takes the same decisions from it: LBFGS's tolerance checks and line search call the closure a
  number of times that depends on the loss, and with each worker's own loss the workers would call it a
  different number of times and their collectives would no longer match.

The collectives run inside the update's window when the optimizer calls the closure after changing the
parameters (LBFGS's line search): the commit window learns it (``ledger.CommitWindow.collective``) and keeps
every commit from then on. A worker that followed (``commit.follow``) is refused a follow window once its
optimizer stepped with a closure (rank 0's ``_ce_closures``): the whole sync instead.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from cloud_elastic.worker.comm import collectives
from cloud_elastic.worker.context import get_context

__all__ = ["averaged", "idle"]


def idle(opt: Any) -> bool:
    """No gradient reached ``opt``'s hooks since its last step: its ``step(closure)`` needs no averaging first."""
    return not opt._ce_counts and not opt._ce_next


def _forget(opt: Any) -> None:
    """Wait for what an earlier backward launched and forget it (as ``zero_grad`` does)."""
    if opt._ce_counts or opt._ce_next:
        ctx = get_context()
        for bucket in opt._ce_buckets[: opt._ce_next]:
            ctx.wait(bucket.work, "gradient allreduce", host=False)
    opt._ce_clear()


def _mean(loss: Any) -> Any:
    if loss is None:
        return None
    if isinstance(loss, torch.Tensor):
        return collectives.allreduce(loss.detach(), average=True, name="the closure's loss")
    if isinstance(loss, (int, float)) and not isinstance(loss, bool):
        value = torch.tensor([float(loss)], dtype=torch.float64)
        return float(collectives.allreduce(value, average=True, name="the closure's loss")[0])
    raise TypeError(f"DistributedOptimizer.step(closure): the closure returned a {type(loss).__name__}; return the "
                    "loss (a tensor or a number) or None")


def averaged(opt: Any, closure: Callable[[], Any]) -> Callable[[], Any]:
    """``closure`` as ``opt``'s base ``step()`` should call it (see the module docstring)."""
    opt._ce_closures = True

    def call() -> Any:
        _forget(opt)
        with torch.enable_grad():
            loss = closure()
        opt.synchronize()
        return _mean(loss)

    return call
