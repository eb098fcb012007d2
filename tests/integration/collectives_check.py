"""Checks collectives and gradient averaging across real workers; prints CHECK lines."""

from __future__ import annotations

import json

import torch
import torch.nn.functional as F

import cloud_elastic.torch as hvd


def data(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(8, 5, generator=g)
    return x, x.sum(1, keepdim=True)


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    # The 512x512 weight (1 MiB) is allreduced in place on its own; the rest is packed into buckets.
    return torch.nn.Sequential(
        torch.nn.Linear(5, 512), torch.nn.Tanh(), torch.nn.Linear(512, 512), torch.nn.Tanh(), torch.nn.Linear(512, 1)
    )


def main() -> None:
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    checks = {}
    # Expected: the mean of every worker's gradient, computed locally for all ranks.
    reference = model()
    grads = []
    for r in range(size):
        reference.zero_grad()
        x, y = data(r)
        F.mse_loss(reference(x), y).backward()
        grads.append([p.grad.clone() for p in reference.parameters()])
    expected = [p.detach() - 0.1 * sum(g[i] for g in grads) / size for i, p in enumerate(reference.parameters())]

    net = model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1), named_parameters=net.named_parameters())
    x, y = data(rank)
    F.mse_loss(net(x), y).backward()
    opt.step()
    checks["gradient_average"] = all(torch.allclose(p, e, atol=1e-6) for p, e in zip(net.parameters(), expected))

    checks["allreduce_average"] = torch.allclose(hvd.allreduce(torch.tensor([float(rank)])), torch.tensor([(size - 1) / 2]))
    checks["allreduce_sum"] = hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum).item() == size
    gathered = hvd.allgather(torch.full((rank + 1, 2), float(rank)))
    checks["allgather_ragged"] = gathered.shape == (size * (size + 1) // 2, 2) and gathered[-1, 0].item() == size - 1
    checks["broadcast_object"] = hvd.broadcast_object({"from": rank}, root_rank=1) == {"from": 1}
    checks["broadcast"] = hvd.broadcast(torch.tensor([rank * 10.0]), root_rank=size - 1).item() == (size - 1) * 10
    ranks = hvd.allgather(torch.tensor([hvd.local_rank(), hvd.local_size(), hvd.cross_rank(), hvd.cross_size()]))
    checks["topology"] = ranks.view(size, 4).tolist()
    print("CHECK " + json.dumps({"rank": rank, **checks}), flush=True)


if __name__ == "__main__":
    main()
