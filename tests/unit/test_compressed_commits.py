"""Compression on the update paths of kept commits: bucket by bucket as exact as all at once, and restorable.

With a kept commit, ``step()`` updates each bucket's parameters as soon as its
allreduce completes (see docs/architecture/commits.md, "Zero-copy commits"); with
``compression=fp16`` each bucket must be cast back before its update, and a
failure between buckets must still leave the commit restorable.
"""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

import cloud_elastic.torch as hvd
from cloud_elastic.worker.context import get_context
from cloud_elastic.worker.exceptions import CollectiveError

pytestmark = [pytest.mark.timeout(60), pytest.mark.commit_mode("snapshot")]


def wide_model() -> torch.nn.Module:
    # With bucket_cap_mb=1 the 512x512 weight (1 MiB) is a solo bucket, reduced in place and launched
    # first; the rest is packed into the bucket after it.
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(),
                               torch.nn.Linear(512, 1))


def backward(model: torch.nn.Module, seed: int) -> None:
    x = torch.randn(8, 6, generator=torch.Generator().manual_seed(seed))
    F.mse_loss(model(x), x.sum(1, keepdim=True)).backward()


def values(model: torch.nn.Module, opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()] + [opt.state[p]["momentum_buffer"].clone()
                                                               for p in model.parameters() if p in opt.state]


def compressed(model: torch.nn.Module) -> tuple[torch.optim.Optimizer, hvd.elastic.TorchState]:
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                   compression=hvd.Compression.fp16, bucket_cap_mb=1)
    return opt, hvd.elastic.TorchState(model, opt)


def test_the_bucket_by_bucket_update_is_bitwise_the_update_after_synchronize():
    hvd.init()
    overlapped, whole = wide_model(), wide_model()
    (opt_a, state_a), (opt_b, state_b) = compressed(overlapped), compressed(whole)
    for seed in range(4):
        for model, opt in ((overlapped, opt_a), (whole, opt_b)):
            opt.zero_grad()
            backward(model, seed)
        opt_a.step()  # synchronizes itself: after a kept commit, bucket by bucket
        opt_b.synchronize()  # every bucket first, then torch's update
        with opt_b.skip_synchronize():
            opt_b.step()
        state_a.commit()
        state_b.commit()
    for a, b in zip(values(overlapped, opt_a), values(whole, opt_b)):
        assert torch.equal(a, b)


def lose_a_peer_at_wait(monkeypatch: pytest.MonkeyPatch, n: int) -> None:
    """The ``n``-th ``WorkerContext.wait`` from now raises, as a peer's death makes it raise."""
    ctx, count = get_context(), itertools.count(1)
    real = ctx.wait

    def wait(work: object, what: str, **how: bool) -> None:
        if next(count) == n:
            raise CollectiveError("gradient allreduce failed: Connection closed by peer")
        real(work, what, **how)

    monkeypatch.setattr(ctx, "wait", wait)


def test_a_compressed_step_that_fails_between_buckets_restores_exactly_to_the_commit(monkeypatch):
    hvd.init()
    model = wide_model()
    opt, state = compressed(model)
    opt.zero_grad()
    backward(model, 1)
    opt.step()
    state.commit()
    committed = values(model, opt)
    opt.zero_grad()
    backward(model, 2)
    lose_a_peer_at_wait(monkeypatch, 2)  # the first bucket's parameters are already updated by then
    with pytest.raises(CollectiveError):
        opt.step()
    monkeypatch.undo()
    assert not torch.equal(model[2].weight, committed[2])  # the solo 512x512 weight (first bucket) had moved
    state.restore()
    for a, b in zip(values(model, opt), committed):
        assert torch.equal(a, b)
