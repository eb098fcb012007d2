"""Train ``--steps`` steps; after the training function returns, work until the GATE file exists (a final save,
heartbeating all along), then append one line per rank to ``EVENTS_DIR/final.txt``; ``--fail-rank R`` makes rank R
raise there (a final save that failed); ``--save-rank R`` makes the other ranks exit at once instead (only rank R
saves). Events go to ``EVENTS_DIR/<pid>.jsonl`` (the first argument): a worker adopted
by a restarted driver has lost its output pipe with the old driver."""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

import cloud_elastic.torch as hvd


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("events")
    p.add_argument("gate")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--fail-rank", type=int, default=-1)
    p.add_argument("--save-rank", type=int, default=-1)
    args = p.parse_args()

    def event(kind: str, **fields: object) -> None:
        fields.update(kind=kind, pid=os.getpid())
        with open(os.path.join(args.events, f"{os.getpid()}.jsonl"), "a", encoding="utf-8") as f:
            f.write(json.dumps(fields) + "\n")

    hvd.init()
    model = torch.nn.Linear(4, 1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01))
    state = hvd.elastic.TorchState(model, opt, step=0)

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        event("entered", step=state.step)
        while state.step < args.steps:
            opt.zero_grad()
            model(torch.ones(2, 4)).sum().backward()
            opt.step()
            state.step += 1
            state.commit()

    train(state)
    event("done", rank=hvd.rank(), step=state.step)
    if args.save_rank >= 0 and hvd.rank() != args.save_rank:
        return
    while not os.path.exists(args.gate):
        time.sleep(0.05)
    with open(os.path.join(args.events, "final.txt"), "a", encoding="utf-8") as f:
        f.write(f"rank {hvd.rank()} step {state.step}\n")
    if hvd.rank() == args.fail_rank:
        raise RuntimeError("the final save failed (--fail-rank)")


if __name__ == "__main__":
    main()
