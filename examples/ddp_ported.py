"""examples/ddp_torchrun.py ported from torchrun / DDP to cloud-elastic: the "after" of docs/torchrun.md.

    cloud-elastic run -np 2 --min-np 1 -H 127.0.0.1:1,127.0.0.2:1 python examples/ddp_ported.py

What changed, and why:

* ``import cloud_elastic.torch as hvd`` and ``hvd.init()`` replace ``init_process_group``:
  the driver gives each worker its rank, and gives it again after every membership change;
* no ``DDP(model)``: ``hvd.DistributedOptimizer`` averages the gradients instead;
* ``hvd.elastic.ElasticSampler`` replaces ``DistributedSampler``: after a change it shards
  what is left of the epoch over the workers there are, and its progress is part of the state;
* the loop runs in a function decorated with ``hvd.elastic.run`` and calls ``state.commit()``
  after each step: a failed worker makes the others roll back to that in-memory commit, not
  restart from a checkpoint file, so the script's own save and load are gone
  (``--checkpoint-dir`` writes durable checkpoints of the commits if every worker may be lost).

``--step-sleep`` slows each step down, to watch a worker's loss; ``--log-every`` prints rank 0's
progress every N steps.
"""

from __future__ import annotations

import argparse
import hashlib
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import cloud_elastic.torch as hvd


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--samples", type=int, default=512, help="size of the generated dataset")
    p.add_argument("--batch-size", type=int, default=16, help="per worker")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--step-sleep", type=float, default=0.0, help="extra seconds per step")
    p.add_argument("--log-every", type=int, default=0, help="rank 0 prints its step every N steps (0: never)")
    return p.parse_args()


def make_dataset(samples: int) -> TensorDataset:
    """A fixed regression problem: the same samples on every worker."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(samples, 32, generator=g)
    return TensorDataset(x, torch.tanh(x @ torch.randn(32, 1, generator=g)))


def checksum(model: nn.Module) -> str:
    """Equal on every worker when the replicas are identical."""
    return hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()[:16]


def main() -> None:
    args = parse_args()
    hvd.init()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9))
    dataset = make_dataset(args.samples)
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, step=0)

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        while state.epoch < args.epochs:
            state.sampler.set_epoch(state.epoch)  # the epoch in progress goes on where its commit was
            for x, y in loader:
                optimizer.zero_grad()
                loss = F.mse_loss(model(x), y)
                loss.backward()
                optimizer.step()
                state.sampler.record_batch(0, args.batch_size)  # this batch of every worker is done
                state.step += 1
                state.commit()
                if args.log_every and hvd.rank() == 0 and state.step % args.log_every == 0:
                    print(f"epoch {state.epoch} step {state.step} loss {loss.item():.4f} "
                          f"on {hvd.size()} worker(s)", flush=True)
                time.sleep(args.step_sleep)
            if hvd.rank() == 0:
                print(f"epoch {state.epoch} done: {len(state.sampler.processed_indices)} of {len(dataset)} "
                      f"samples", flush=True)
            state.epoch += 1

    train(state)
    print(f"done: {state.epoch} epochs, {state.step} steps, rank {hvd.rank()} of {hvd.size()}, "
          f"weights {checksum(model)}", flush=True)


if __name__ == "__main__":
    main()
