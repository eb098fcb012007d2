"""The worker of ``early_return.py``: one epoch over a ``DistributedSampler`` sized once at start-up.

As Horovod's MNIST elastic example builds its sampler (from ``hvd.size()``/``hvd.rank()`` after
``hvd.init()``), with the usual bookkeeping: ``state.batch`` is the position in the epoch, and a
worker skips the batches before it. A worker that joins two running ones shards the data three
ways, so its epoch ends at batch ``len(dataset) / 3 / batch``: once the others are past that, it
returns from its training function at once. While the file ``--slow`` names exists, each step
sleeps ``--step-s`` (a model's compute). Every step prints ``EVENT {"kind": "step", "rank": ...}``.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.nn.functional as F

import cloud_elastic.torch as hvd


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--samples", type=int, default=28800)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--step-s", type=float, default=0.2)
    p.add_argument("--slow", default="", help="steps sleep --step-s only while this file exists")
    args = p.parse_args()

    hvd.init()
    torch.set_num_threads(1)
    dataset = torch.utils.data.TensorDataset(torch.randn(args.samples, 8))
    sampler = torch.utils.data.distributed.DistributedSampler(dataset, num_replicas=hvd.size(), rank=hvd.rank())
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
    model = torch.nn.Linear(8, 1)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                         named_parameters=model.named_parameters())

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        for state.batch, (x,) in enumerate(loader):
            if state.batch < state.done:
                continue
            optimizer.zero_grad()
            F.mse_loss(model(x), x.sum(1, keepdim=True)).backward()
            optimizer.step()
            print("EVENT " + json.dumps({"kind": "step", "rank": hvd.rank(), "size": hvd.size(),
                                         "batch": state.batch, "pid": os.getpid()}), flush=True)
            if args.slow and os.path.exists(args.slow):
                time.sleep(args.step_s)
            state.done = state.batch + 1
            state.commit()

    train(hvd.elastic.TorchState(model, optimizer, batch=0, done=0))


if __name__ == "__main__":
    main()
