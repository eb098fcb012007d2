"""Train ``--steps`` steps (rank 1 only ``--short-steps``: uneven data), committing each; rank 0 then evaluates for
``--eval-s`` seconds inside its training function (after the loop's last commit), rank 1 for ``--eval1`` seconds (no
collective in either), while the other ranks return and wait for rank 0. Prints
``LOOP_DONE rank=R step=S pid=P`` when a rank's loop ends, and ``START step=S`` when it enters (a resumed run starts
at the checkpoint's step)."""

from __future__ import annotations

import argparse
import os
import time

import torch

import cloud_elastic.torch as hvd


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--eval-s", type=float, default=0.0)
    p.add_argument("--short-steps", type=int, default=None)
    p.add_argument("--eval1", type=float, default=0.0)
    args = p.parse_args()
    hvd.init()
    weight = torch.nn.Parameter(torch.zeros(4))
    opt = hvd.DistributedOptimizer(torch.optim.SGD([weight], lr=0.01), named_parameters=[("weight", weight)])
    state = hvd.elastic.TorchState(optimizer=opt, step=0)

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        print(f"START rank={hvd.rank()} step={state.step}", flush=True)
        short = hvd.rank() == 1 and args.short_steps is not None
        while state.step < (args.short_steps if short else args.steps):
            opt.zero_grad()
            (weight * 2).sum().backward()
            opt.step()
            state.step += 1
            state.commit()
        print(f"LOOP_DONE rank={hvd.rank()} step={state.step} pid={os.getpid()}", flush=True)
        if hvd.rank() == 0:
            time.sleep(args.eval_s)  # a rank-0-only evaluation at the end of the training function
        elif hvd.rank() == 1:
            time.sleep(args.eval1)  # a local evaluation: rank 0 may wait for it in its next collective

    train(state)
    print(f"END rank={hvd.rank()} step={state.step}", flush=True)


if __name__ == "__main__":
    main()
