"""Training script of ``test_follow_admission.py``: a small model whose whole state changes every step.

EVENT lines (as ``probe.py``'s): ``entered`` (each entry into the training function: round, size, step, a
checksum of the parameters and the optimizer state, and one of the BatchNorm buffers), ``commit``, ``metric`` (an
``hvd.allreduce`` average of ``rank + 1`` made in the loop, and whether this worker's round had a follower
then) and ``done`` (the same checksum at the end). The library's INFO lines are shown (what follows, what moved).
With ``--die-in-gather HOST``: ``gather`` (each member entering the window's final digest allgather, with its step
and checksum), and the worker on HOST kills itself there (see :func:`die_in_the_final_gather`).
"""

from __future__ import annotations

import argparse
import faulthandler
import hashlib
import json
import logging
import os
import signal
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import cloud_elastic.torch as hvd
from cloud_elastic.worker.context import get_context
from cloud_elastic.worker.comm import followers
from cloud_elastic.worker.commit import follow

logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")


def event(kind: str, **fields: object) -> None:
    fields.update(kind=kind, worker=os.environ.get("CLOUD_ELASTIC_WORKER_ID"), pid=os.getpid())
    print("EVENT " + json.dumps(fields), flush=True)


def checksum(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> str:
    """Of the parameters and the optimizer state: the same on every replica."""
    h = hashlib.sha256()
    for t in model.parameters():
        h.update(t.detach().contiguous().numpy().tobytes())
    for p_state in optimizer.state_dict()["state"].values():
        for key in sorted(p_state):
            if isinstance(p_state[key], torch.Tensor):
                h.update(p_state[key].detach().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def buffers(model: torch.nn.Module) -> str:
    """Of the BatchNorm statistics: each worker's own (a newcomer gets rank 0's)."""
    return hashlib.sha256(b"".join(b.numpy().tobytes() for b in model.buffers())).hexdigest()[:16]


def die_in_the_final_gather(host: str, marks: Path, state, model, optimizer) -> None:
    """Every member says ``gather`` as it enters the follow window's final digest allgather (``follow._gather``, at
    the commit after the last piece: the library's window says so, every piece moved); the worker on ``host`` then
    waits for the others to be there too (their marks in ``marks``) and is SIGKILLed, once a job. The hook is this
    script's, not the library's: it wraps the module's ``_gather``, which ``at_commit`` looks up at each call."""
    gather = follow._gather

    def marked(ctx, mine):
        window = followers.current(ctx)
        assert window is not None and window.boundary == len(window.plan), "not the window's final gather"
        rank, size, me = ctx.info.rank, ctx.info.size, os.environ.get("CLOUD_ELASTIC_HOSTNAME")
        event("gather", rank=rank, size=size, round=ctx.info.round, step=state.step, host=me,
              checksum=checksum(model, optimizer), following=rank in window.followers)
        mark = marks / f"{ctx.info.round}-{rank}"
        mark.with_suffix(".tmp").write_text(me or "")
        mark.with_suffix(".tmp").rename(mark)
        if me == host and not (marks / "killed").exists():
            others = [marks / f"{ctx.info.round}-{r}" for r in range(size) if r != rank]
            deadline = time.monotonic() + 60
            while not all(m.exists() for m in others) and time.monotonic() < deadline:
                time.sleep(0.01)
            (marks / "killed").write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)
        return gather(ctx, mine)

    follow._gather = marked


def main() -> None:
    faulthandler.register(signal.SIGUSR1)
    p = argparse.ArgumentParser()
    p.add_argument("--optimizer", choices=["sgd", "adam", "unsupported"], default="sgd")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--step-sleep", type=float, default=0.05)
    p.add_argument("--stop-when", default="")
    p.add_argument("--metric", action="store_true", help="an hvd.allreduce of rank + 1 every step")
    p.add_argument("--width", type=int, default=16, help="of the hidden layer")
    p.add_argument("--nan-guard", action="store_true", help="raise on a non-finite loss, as many loops do")
    p.add_argument("--die-in-gather", default="", help="the worker on this host is killed in the window's final "
                                                         "digest allgather (see die_in_the_final_gather)")
    p.add_argument("--marks", default="", help="a directory for --die-in-gather's marks")
    p.add_argument("--return-in-window", action="store_true",
                   help="the training function returns once a follow window has moved its first piece")
    args = p.parse_args()
    hvd.init()
    torch.manual_seed(0 if os.environ.get("CLOUD_ELASTIC_HOSTNAME") != "127.0.0.3" else 7)  # a newcomer's own init
    w = args.width
    model = torch.nn.Sequential(torch.nn.Linear(8, w), torch.nn.BatchNorm1d(w), torch.nn.ReLU(), torch.nn.Linear(w, 1))
    if args.optimizer == "adam":
        base = torch.optim.Adam(model.parameters(), lr=0.01)
    elif args.optimizer == "sgd":
        base = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    else:  # a subclass: its step may do anything, so nobody follows it
        base = type("MySGD", (torch.optim.SGD,), {})(model.parameters(), lr=0.05, momentum=0.9)
    optimizer = hvd.DistributedOptimizer(base)
    state = hvd.elastic.TorchState(model, optimizer, step=0)
    if args.die_in_gather:
        die_in_the_final_gather(args.die_in_gather, Path(args.marks), state, model, optimizer)

    def more() -> bool:
        window = followers.current(get_context())  # the same on every member
        if args.return_in_window and window is not None and window.boundary >= 1:
            return False  # with a window open: follow.complete moves the rest and ends it
        if state.step < args.steps:
            return True
        return bool(args.stop_when) and not hvd.broadcast_object(os.path.exists(args.stop_when), root_rank=0)

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        event("entered", rank=hvd.rank(), size=hvd.size(), round=get_context().info.round, step=state.step,
              checksum=checksum(model, optimizer), buffers=buffers(model), following=followers.current(get_context()) is not None)
        while more():
            g = torch.Generator().manual_seed(state.step * 1000 + hvd.rank())
            x = torch.randn(8, 8, generator=g)
            optimizer.zero_grad()
            loss = F.mse_loss(model(x), x.sum(1, keepdim=True))
            if args.nan_guard and not bool(torch.isfinite(loss)):
                raise RuntimeError(f"non-finite loss {float(loss)} at step {state.step}")
            loss.backward()
            optimizer.step()
            if args.metric:
                window = followers.current(get_context()) is not None
                value = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), name="metric")
                event("metric", rank=hvd.rank(), size=hvd.size(), step=state.step, value=float(value),
                      following=window)
            state.step += 1
            state.commit()
            event("commit", rank=hvd.rank(), size=hvd.size(), step=state.step)
            time.sleep(args.step_sleep)

    train(state)
    event("done", rank=hvd.rank(), size=hvd.size(), step=state.step, checksum=checksum(model, optimizer))


if __name__ == "__main__":
    main()
