"""Training script for the two-optimizer test in test_commit_kill_points.py: a GAN-style loop.

Two models, each with its own DistributedOptimizer, one backward over both
losses, then ``opt_a.step()``, ``opt_b.step()`` and ``commit()``, all in one
TorchState. Model B runs its forward first, so its nodes come last in the
backward: model A's gradients are produced (and their allreduces launched)
first, and model B's first layer's weight gradient is the very last.

The worker on ``--kill HOST:STEP`` dies in the hook of that last gradient, in
the step that starts at ``state.step == STEP``, once its own allreduces of
model A have completed: the survivors' ``opt_a.step()`` then succeeds and
updates model A, and their ``opt_b.step()`` fails waiting for model B's last
bucket, inside the window that update opened.

Prints ``EVENT`` lines: commit (step, checksum of both models, both optimizers'
state and the step), resumed (step and checksum when a round starts), done.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import signal

import torch
import torch.nn.functional as F

import cloud_elastic.torch as hvd
from commit_probe import checksum, event  # the script's own directory is on sys.path


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--kill", default="", help="HOST:STEP")
    args = p.parse_args()
    faulthandler.register(signal.SIGUSR1)  # the harness dumps stacks of a hung job
    hvd.init()
    host, _, step = args.kill.partition(":")
    kill_step = int(step) if host == os.environ.get("CLOUD_ELASTIC_HOSTNAME") else -1

    torch.manual_seed(0)
    model_a = torch.nn.Sequential(torch.nn.Linear(8, 200), torch.nn.Tanh(), torch.nn.Linear(200, 1))
    model_b = torch.nn.Sequential(torch.nn.Linear(8, 300), torch.nn.Tanh(), torch.nn.Linear(300, 1))
    opt_a = hvd.DistributedOptimizer(torch.optim.Adam(model_a.parameters(), lr=1e-3), bucket_cap_mb=1)
    opt_b = hvd.DistributedOptimizer(torch.optim.SGD(model_b.parameters(), lr=0.05, momentum=0.9), bucket_cap_mb=1)
    state = hvd.elastic.TorchState(model_a=model_a, opt_a=opt_a, model_b=model_b, opt_b=opt_b, step=0)
    current = {"start": -1}

    def both() -> str:
        return checksum(model_a, opt_a, state.step) + checksum(model_b, opt_b, state.step)

    def last_gradient(_grad: torch.Tensor) -> None:
        if current["start"] == kill_step:
            opt_a.synchronize()  # model A's allreduces complete everywhere: the survivors will update it
            os.kill(os.getpid(), signal.SIGKILL)

    model_b[0].weight.register_hook(last_gradient)

    @hvd.elastic.run
    def train(state) -> None:
        event("resumed", step=state.step, checksum=both())
        while state.step < args.steps:
            current["start"] = state.step
            g = torch.Generator().manual_seed(state.step * 1000 + hvd.rank())
            x = torch.randn(4, 8, generator=g)
            opt_a.zero_grad()
            opt_b.zero_grad()
            target = x.sum(1, keepdim=True).tanh()
            loss_b = F.mse_loss(model_b(x), -target)  # first: its backward comes last
            loss_a = F.mse_loss(model_a(x), target)
            (loss_a + loss_b).backward()
            opt_a.step()
            opt_b.step()
            state.step += 1
            state.commit()
            event("commit", step=state.step, checksum=both())

    train(state)
    event("done", step=state.step, checksum=both())


if __name__ == "__main__":
    main()
