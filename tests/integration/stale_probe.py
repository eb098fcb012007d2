"""Training script for tests/integration/test_told_facts.py: a member whose account at rendezvous goes stale.

Every worker trains a small model, committing every step. On ``--stale`` (a host), at the first reset (the
admission of a newcomer), the worker's reset callback, which runs after its rendezvous and before the state sync,
changes its parameters and says that it cannot restore its last commit (``ledger.lost_commit``), as a failure in an
update's window does: at rendezvous it still held rank 0's commit. It trains until ``--steps`` in a round of three,
and prints ``EVENT`` lines: commit, done (step, size, checksum of the parameters).
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import signal
import time

import torch
import torch.nn.functional as F

import cloud_elastic.torch as hvd
from cloud_elastic.worker.context import get_context
from probe import checksum  # the script's own directory is on sys.path


def event(kind: str, **fields: object) -> None:
    print("EVENT " + json.dumps({"kind": kind, "host": os.environ.get("CLOUD_ELASTIC_HOSTNAME"), **fields}), flush=True)


def main() -> None:
    faulthandler.register(signal.SIGUSR1)  # the harness dumps stacks of a hung job
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--stale", required=True, help="the host whose worker's account goes stale after rendezvous")
    args = p.parse_args()
    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                         named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, optimizer, step=0)
    resets = {"n": 0}

    def went_stale() -> None:
        resets["n"] += 1
        if resets["n"] == 1 and os.environ.get("CLOUD_ELASTIC_HOSTNAME") == args.stale:
            with torch.no_grad():
                for param in model.parameters():
                    param.add_(1.0)
            get_context().ledger.lost_commit("the test changed the parameters after rendezvous")
            event("stale", step=state.step)

    state.register_reset_callbacks([went_stale])

    @hvd.elastic.run
    def train(state) -> None:
        while (state.step < args.steps or hvd.size() < 3) and state.step < 3000:
            g = torch.Generator().manual_seed(state.step * 1000 + hvd.rank())
            x = torch.randn(4, 8, generator=g)
            optimizer.zero_grad()
            F.mse_loss(model(x), x.sum(1, keepdim=True).tanh()).backward()
            optimizer.step()
            state.step += 1
            state.commit()
            event("commit", step=state.step, size=hvd.size())
            time.sleep(0.02)

    train(state)
    event("done", step=state.step, size=hvd.size(), checksum=checksum(model))


if __name__ == "__main__":
    main()
