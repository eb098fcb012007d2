"""Sharded elastic training: FSDP2 inside a host, replicas across hosts (``hvd.shard``).

On loopback, two "hosts" of two workers each::

    cloud-elastic run --whole-hosts --slots-per-host 2 -np 4 --min-np 2 \\
        -H 127.0.0.1:2,127.0.0.2:2 python examples/sharded_fsdp2.py

Each host's two workers hold half of the model and of its AdamW state each;
the two hosts are replicas of each other. Kill one worker and its host leaves
whole; the other host rolls back to the last commit and trains on. It also runs
alone (``python examples/sharded_fsdp2.py``): one host of one worker.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

import cloud_elastic.torch as hvd


class Block(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    args = p.parse_args()

    hvd.init()
    torch.manual_seed(0)
    blocks = [Block(args.width) for _ in range(args.layers)]
    model = torch.nn.Sequential(*blocks, torch.nn.Linear(args.width, 1))
    # Every block is an FSDP2 unit (all-gathered one at a time), then the whole model.
    hvd.shard(model, modules=blocks)
    optimizer = hvd.DistributedOptimizer(torch.optim.AdamW(model.parameters(), lr=1e-3))
    state = hvd.elastic.TorchState(model, optimizer, step=0)

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> float:
        loss = torch.zeros(())
        while state.step < args.steps:
            g = torch.Generator().manual_seed(state.step * 1000 + hvd.rank())
            x = torch.randn(16, args.width, generator=g)
            optimizer.zero_grad()
            loss = F.mse_loss(model(x), x.mean(1, keepdim=True))
            loss.backward()
            optimizer.step()
            state.step += 1
            state.commit()
        return loss.item()

    loss = train(state)
    held = sum(p.to_local().numel() for p in model.parameters())
    full = sum(p.numel() for p in model.parameters())
    print(f"done: {state.step} steps, loss {loss:.4f}, {hvd.size()} worker(s) on {hvd.cross_size()} host(s); "
          f"this worker holds {held} of the model's {full} parameters", flush=True)


if __name__ == "__main__":
    main()
