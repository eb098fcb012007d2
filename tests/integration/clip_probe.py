"""Training script for tests/integration/test_clip_kill.py: a critic whose weights are clipped in place.

From ``--clip-from`` on, every iteration starts as WGAN's critic loop does: each
parameter is clamped under ``torch.no_grad()``, outside the optimizer, between the
last commit and the next update. The worker on ``--kill-host`` SIGKILLs itself in
the backward pass of the step that starts at ``--kill-at``. Prints ``EVENT`` lines:
commit (step, checksum of model, optimizer state and step, whether it was kept in
place), resumed (the same when a round starts, after the restore and the sync), done.
"""

from __future__ import annotations

import argparse
import os
import signal

import torch
import torch.nn.functional as F

import cloud_elastic.torch as hvd
from commit_probe import checksum, event  # the script's own directory is on sys.path


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--clip-from", type=int, required=True)
    p.add_argument("--kill-host", required=True)
    p.add_argument("--kill-at", type=int, required=True)
    args = p.parse_args()
    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    state = hvd.elastic.TorchState(model, optimizer, step=0)
    dies = os.environ.get("CLOUD_ELASTIC_HOSTNAME") == args.kill_host
    current = {"start": -1}

    def hook(_grad: torch.Tensor) -> None:
        if dies and current["start"] == args.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)  # survivors then fail in this step's gradient allreduce

    model[2].weight.register_hook(hook)

    @hvd.elastic.run
    def train(state) -> None:
        event("resumed", step=state.step, checksum=checksum(model, optimizer, state.step))
        while state.step < args.steps:
            start = current["start"] = state.step
            if start >= args.clip_from:
                with torch.no_grad():
                    for param in model.parameters():
                        param.clamp_(-0.15, 0.15)
            x = torch.randn(16, 8, generator=torch.Generator().manual_seed(start * 1000 + hvd.rank()))
            optimizer.zero_grad()
            F.mse_loss(model(x), x.sum(1, keepdim=True).tanh()).backward()
            optimizer.step()
            state.step += 1
            state.commit()
            event("commit", step=state.step, checksum=checksum(model, optimizer, state.step),
                  in_place=all(h.in_place for h in optimizer._ce_snapshots))

    train(state)
    event("done", step=state.step, checksum=checksum(model, optimizer, state.step))


if __name__ == "__main__":
    main()
