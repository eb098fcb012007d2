"""How DistributedOptimizer groups gradients into allreduces: DDP's layout, one collective per bucket.

What a user relies on: a step costs as few collectives as DDP's (on Gloo each one costs
more than copying a few MiB), communication starts early in backward, and a gradient
that fills a bucket alone is reduced in place, without a copy.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import cloud_elastic.torch as hvd

pytestmark = pytest.mark.timeout(60)


def _mlp(hidden: int = 1024) -> torch.nn.Module:
    # docs/benchmarks.md's model: 256 -> 1024 -> 1024 -> 1024 -> 1024 -> 1 (4 MiB weights).
    torch.manual_seed(0)
    widths = [256, hidden, hidden, hidden, hidden]
    layers: list[torch.nn.Module] = []
    for a, b in zip(widths, widths[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(hidden, 1))


def _layout(opt) -> list[tuple[int, bool]]:
    """(bytes, reduced in place) per allreduce of a step, in launch order."""
    return [(b.numel * 4, b.solo) for b in opt._ce_buckets]


def test_gradients_are_bucketed_as_ddp_buckets_them():
    hvd.init()
    model = _mlp()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    # The first bucket closes at 1 MiB with the gradient that crossed it (the last 4 MiB weight),
    # the next holds everything else (under 25 MiB): two allreduces per step, as under DDP.
    last = 1024 + 1 + 1024 + 1024 * 1024
    total = sum(p.numel() for p in model.parameters())
    assert _layout(opt) == [(last * 4, False), ((total - last) * 4, False)]


def test_gradients_of_8_mib_or_more_are_reduced_alone_where_copying_them_would_cost_more():
    hvd.init()
    model = _mlp(2048)  # 16 MiB weights: a copy into a bucket costs more than a collective
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    layout = _layout(opt)
    assert [size for size, solo in layout if solo] == [16 << 20] * 3
    assert sum(size for size, _ in layout) == sum(p.numel() for p in model.parameters()) * 4


def test_a_gradient_as_large_as_a_bucket_is_reduced_alone_in_place():
    hvd.init()
    model = _mlp()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), bucket_cap_mb=4)
    layout = _layout(opt)
    assert [solo for _, solo in layout].count(True) == 3  # the three 1024x1024 weights (4 MiB each)
    assert all(size == 4 << 20 for size, solo in layout if solo)
    x = torch.randn(8, 256)
    opt.zero_grad()
    F.mse_loss(model(x), x[:, :1]).backward()
    produced = model[2].weight.grad  # the tensor autograd made
    opt.synchronize()
    assert model[2].weight.grad is produced  # averaged where it lies: no copy into a bucket and back


def test_large_gradients_reduced_alone_do_not_split_the_small_ones_into_a_bucket_each():
    hvd.init()
    model = _mlp(2048)  # three 16 MiB weights reduced alone, between which lie the small biases
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    layout = _layout(opt)
    # The three solo weights, then one packed bucket of everything else (2 MiB, the first
    # layer's weight, closes it): four allreduces a step, not one packed bucket per layer.
    assert [solo for _, solo in layout] == [True, True, True, False]
    assert opt._ce_buckets[-1].carries_flag
    x = torch.randn(8, 256)
    opt.zero_grad()
    F.mse_loss(model(x), x[:, :1]).backward()
    expected = {name: p.grad.clone() for name, p in model.named_parameters()}
    opt.step()  # world size 1: the average is the gradient itself
    for name, p in model.named_parameters():
        assert torch.equal(p.grad, expected[name]), name
