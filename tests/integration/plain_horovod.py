"""A plain Horovod training script: ``hvd.init()``, ``DistributedOptimizer``, ``broadcast_parameters``,
and no ``hvd.elastic.run`` (as most Horovod scripts are written). Its Horovod import is ``cloud_elastic.torch``.

It prints ``EVENT {json}`` lines for the tests (hello, step, done with a checksum of the parameters).
``--checkpoint FILE``: rank 0 saves the model, optimizer and step there after every step, and every
worker resumes from it at start-up when it exists (the script's own checkpointing, as under torchrun).
``--fail-at-step N --only-slot PREFIX``: that worker raises at step N, once per ``--fail-once FILE``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time

import torch
import torch.nn.functional as F

import cloud_elastic.torch as hvd


def event(kind: str, **fields: object) -> None:
    fields.update(kind=kind, worker=os.environ.get("CLOUD_ELASTIC_WORKER_ID"), pid=os.getpid())
    print("EVENT " + json.dumps(fields), flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--step-sleep", type=float, default=0.05)
    p.add_argument("--checkpoint", default="")
    p.add_argument("--fail-at-step", type=int, default=-1)
    p.add_argument("--only-slot", default="")
    p.add_argument("--fail-once", default="", help="fail only while this file does not exist (then create it)")
    args = p.parse_args()

    hvd.init()
    torch.manual_seed(hvd.rank())  # different initial weights on each rank: the broadcast must even them
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    start = 0
    if args.checkpoint and os.path.exists(args.checkpoint):
        saved = torch.load(args.checkpoint, weights_only=True)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        start = int(saved["step"])
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    event("hello", rank=hvd.rank(), size=hvd.size(), start=start)

    mine = os.environ.get("CLOUD_ELASTIC_WORKER_ID", "").startswith(args.only_slot)
    for step in range(start, args.steps):
        g = torch.Generator().manual_seed(step * 1000 + hvd.rank())
        x = torch.randn(4, 8, generator=g)
        optimizer.zero_grad()
        F.mse_loss(model(x), x.sum(1, keepdim=True)).backward()
        optimizer.step()
        event("step", rank=hvd.rank(), size=hvd.size(), step=step + 1)
        if mine and step + 1 == args.fail_at_step and not (args.fail_once and os.path.exists(args.fail_once)):
            if args.fail_once:
                open(args.fail_once, "w").close()
            raise RuntimeError(f"the script failed at step {step + 1}")
        if args.checkpoint and hvd.rank() == 0:
            tmp = args.checkpoint + ".tmp"
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step + 1}, tmp)
            os.replace(tmp, args.checkpoint)
        time.sleep(args.step_sleep)

    h = hashlib.sha256()
    for value in model.state_dict().values():
        h.update(value.detach().contiguous().numpy().tobytes())
    event("done", rank=hvd.rank(), size=hvd.size(), step=args.steps, checksum=h.hexdigest()[:16])


if __name__ == "__main__":
    main()
