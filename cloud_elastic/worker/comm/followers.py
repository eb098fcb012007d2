"""Who follows in this round (see ``commit.follow``): what averages divide by, which shard a sampler gives.

Light on purpose (torch and ``comm.ops`` only): the collectives, the optimizer and the sampler ask it at every
call, and a round with nobody following answers from one attribute of the context.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

import torch

from cloud_elastic.worker.comm.ops import Average, Max, Min, Product, Sum

__all__ = ["current", "averaging_size", "is_follower", "pending", "land", "received_only", "data_shard",
           "identity_fill"]


def current(ctx: Any) -> Any:
    """This round's follow window (``commit.follow.Window``), if one is open; else None."""
    window = getattr(ctx, "following", None)
    if window is None or ctx.info is None or window.round != ctx.info.round:
        return None
    return window


def averaging_size(ctx: Any) -> int:
    """What an average divides by: the round's active members (its size when nobody follows)."""
    window = current(ctx)
    return ctx.info.size if window is None else window.active


def is_follower(ctx: Any) -> bool:
    """Whether this worker follows in its round (its contributions to reductions must change nothing)."""
    window = current(ctx)
    return window is not None and ctx.info.rank in window.followers


def pending(ctx: Any, param: torch.Tensor) -> bool:
    """Whether this worker follows and none of ``param``'s committed state has arrived yet: it must not update
    it (what it holds of it is its own, or zeros; the update would read state it never received)."""
    window = current(ctx)
    return window is not None and ctx.info.rank in window.followers and window.first.get(id(param), -1) >= window.boundary


def land(ctx: Any) -> None:
    """Before an optimizer update, and at a commit: the window's piece in flight (``commit.follow``: sent at the
    last commit while this step computed) is in place, on the holders (sent: their tensors may change now) and on
    the followers (received and copied in). Elsewhere, nothing."""
    window = current(ctx)
    flight = None if window is None else window.in_flight
    if flight is not None:
        window.in_flight = None
        flight.land(ctx)


@contextmanager
def received_only(ctx: Any, optimizer: torch.optim.Optimizer) -> Iterator[None]:
    """Around a follower's update: the parameters still :func:`pending` have no gradient (torch's optimizers skip
    them), and get it back afterwards. Elsewhere, nothing."""
    held = []
    if is_follower(ctx):
        held = [(p, p.grad) for group in optimizer.param_groups for p in group["params"]
                if p.grad is not None and pending(ctx, p)]
        for p, _ in held:
            p.grad = None
    try:
        yield
    finally:
        for p, grad in held:
            p.grad = grad


def data_shard(ctx: Any) -> tuple[int, int]:
    """(number of shards, this worker's) for an ``ElasticSampler``: a follower copies an active member's shard,
    whose samples it computes on and does not train, and records them as that member does (so the processed
    count is the active members' alone)."""
    window = current(ctx)
    if window is None:
        return ctx.info.size, ctx.info.rank
    return window.active, ctx.info.rank % window.active


_IDENTITY = {Sum: 0, Average: 0, Product: 1}


def identity_fill(tensor: torch.Tensor, op: str) -> None:
    """A follower's contribution to a reduction with ``op``: its identity, so that it changes nothing."""
    if op in _IDENTITY:
        tensor.fill_(_IDENTITY[op])
    elif op in (Min, Max):
        if tensor.dtype.is_floating_point:
            tensor.fill_(float("inf") if op == Min else float("-inf"))
        elif tensor.dtype == torch.bool:
            tensor.fill_(op == Min)
        else:
            info = torch.iinfo(tensor.dtype)
            tensor.fill_(info.max if op == Min else info.min)
