"""Training script for tests/integration/test_commit_kill_points.py: peers die at chosen points of a step.

Each worker on a host named in ``--kill`` SIGKILLs itself at one point of
the step that starts at a given ``state.step``:

- ``backward``: in the gradient hook of the first gradient of the backward
  pass (no bucket launched yet);
- ``buckets``: in the gradient hook of the last gradient, after the other
  buckets were launched (survivors finish the first buckets' allreduces and
  update their parameters, then lose the last one);
- ``update``: right after ``step()`` returned (the allreduces are complete:
  survivors finish the update and commit, and fail in the next step);
- ``collective``: after ``step()``, in the loss allreduce that every worker
  does between ``step()`` and ``commit()`` on every fourth step (logging;
  ``--log-every`` changes the period, 0 for none; ``--log-at`` adds one step);
- ``after-commit``: right after ``commit()`` returned;
- ``lonely``: not a death: this worker alone does an allreduce between
  ``step()`` and ``commit()``, which can only fail (with a peer dying at
  ``after-commit`` of that step, its other peers have committed the step and
  this worker has not: the survivors hold different commits).

Prints ``EVENT`` lines: commit (step, checksum of the model, the optimizer
state and the step counter), window (checksum just before the logging
allreduce), failed (a step, named by ``state.step`` at its start, failed in
a collective: ``at`` is ``gradients`` for its backward and update, ``loss``
for the logging allreduce) and resumed (step and checksum when a round starts,
after the restore and the sync).
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import hashlib
import json
import os
import signal
import time
from collections.abc import Iterator

import torch
import torch.nn.functional as F

import cloud_elastic.torch as hvd
from cloud_elastic.worker.context import get_context

OPTIMIZERS = {
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.05),
    "sgd-momentum": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01),
    "adam": lambda ps: torch.optim.Adam(ps, lr=1e-3, amsgrad=True),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.01),
    "adamw-foreach": lambda ps: torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.01, foreach=True),
    "adamw-fused": lambda ps: torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.01, fused=True),
    "adagrad": lambda ps: torch.optim.Adagrad(ps, lr=0.01, lr_decay=0.01, weight_decay=0.01),
    "rmsprop": lambda ps: torch.optim.RMSprop(ps, lr=1e-3, momentum=0.9, centered=True),
}


def event(kind: str, **fields: object) -> None:
    fields.update(kind=kind, host=os.environ.get("CLOUD_ELASTIC_HOSTNAME"), rank=hvd.rank(), size=hvd.size())
    print("EVENT " + json.dumps(fields), flush=True)


def checksum(model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int) -> str:
    h = hashlib.sha256(str(step).encode())
    for t in model.state_dict().values():
        h.update(t.detach().contiguous().numpy().tobytes())
    for p in model.parameters():
        for key, value in sorted(optimizer.state[p].items()):
            if isinstance(value, torch.Tensor):
                h.update(key.encode() + value.detach().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


@contextlib.contextmanager
def failing(step: int, at: str) -> Iterator[None]:
    """Say where a step failed in a collective (the round is then rolled back as usual)."""
    try:
        yield
    except hvd.CollectiveError:
        event("failed", step=step, at=at)
        raise


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--optimizer", choices=sorted(OPTIMIZERS), required=True)
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--kill", default="", help="host:point:step,... (see the module docstring)")
    p.add_argument("--log-every", type=int, default=4, help="a loss allreduce between step() and commit() every N steps")
    p.add_argument("--log-at", type=int, default=-1, help="... and at the step that starts at this state.step")
    p.add_argument("--window-barrier", default=None,
                   help="a directory: a worker dying at 'collective' waits there until every worker has updated")
    args = p.parse_args()
    faulthandler.register(signal.SIGUSR1)  # the harness dumps stacks of a hung job
    hvd.init()
    plan = {}
    for item in filter(None, args.kill.split(",")):
        host, point, step = item.split(":")
        plan[host] = (point, int(step))
    point, kill_step = plan.get(os.environ.get("CLOUD_ELASTIC_HOSTNAME", ""), ("", -1))
    collective_steps = {step for at, step in plan.values() if at == "collective"}

    torch.manual_seed(0)
    # Buckets in launch order (bucket_cap_mb=1): [last Linear, 600->300 Linear, the 600x600 bias] packed, the
    # 600x600 weight alone (1.4 MB, reduced in place), [the first Linear] packed; its weight gradient comes last.
    model = torch.nn.Sequential(torch.nn.Linear(8, 600), torch.nn.Tanh(), torch.nn.Linear(600, 600), torch.nn.Tanh(),
                                torch.nn.Linear(600, 300), torch.nn.Tanh(), torch.nn.Linear(300, 1))
    optimizer = hvd.DistributedOptimizer(OPTIMIZERS[args.optimizer](model.parameters()), bucket_cap_mb=1)
    state = hvd.elastic.TorchState(model, optimizer, step=0)
    current = {"start": -1}

    def hook_at(which: str):
        def hook(_grad: torch.Tensor) -> None:
            if point == which and current["start"] == kill_step:
                die()
        return hook

    model[6].weight.register_hook(hook_at("backward"))  # the first gradient of backward
    model[0].weight.register_hook(hook_at("buckets"))  # the last one

    @hvd.elastic.run
    def train(state) -> None:
        event("resumed", step=state.step, checksum=checksum(model, optimizer, state.step))
        while state.step < args.steps:
            start = current["start"] = state.step
            g = torch.Generator().manual_seed(start * 1000 + hvd.rank())
            x = torch.randn(4, 8, generator=g)
            optimizer.zero_grad()
            loss = F.mse_loss(model(x), x.sum(1, keepdim=True).tanh())
            with failing(start, "gradients"):
                loss.backward()
                optimizer.step()
            if point == "update" and start == kill_step:
                die()
            state.step += 1
            logging_now = (args.log_every and start % args.log_every == args.log_every - 1) or start == args.log_at
            if logging_now:  # logging: a collective between step() and commit()
                event("window", step=state.step, checksum=checksum(model, optimizer, state.step - 1))
                if args.window_barrier and start in collective_steps:
                    open(os.path.join(args.window_barrier, f"{start}-{hvd.rank()}"), "w").close()
                if point == "collective" and start == kill_step:
                    # With --window-barrier: once every peer has updated in place (its window event), so that
                    # none of them is still short of its update when the round fails (a slow one then still
                    # held its commit exactly, and the job rightly trained on from it).
                    deadline = time.monotonic() + 30
                    while args.window_barrier and time.monotonic() < deadline and sum(
                            name.startswith(f"{start}-") for name in os.listdir(args.window_barrier)) < hvd.size():
                        time.sleep(0.01)
                    die()
                with failing(start, "loss"):
                    hvd.allreduce(loss.detach(), name="loss")
            if point == "lonely" and start == kill_step:
                # Only once the driver has aborted the round: a collective started then fails at once.
                # Sent earlier, it would meet the peers' next gradient allreduce (a size mismatch).
                ctx = get_context()
                deadline = time.monotonic() + 30
                while not ctx._aborted(ctx.info.round) and time.monotonic() < deadline:
                    time.sleep(0.05)
                hvd.allreduce(loss.detach(), name="lonely")
            state.commit()
            # in_place: this commit keeps no copy of the parameters and optimizer state (worker.window).
            event("commit", step=state.step, checksum=checksum(model, optimizer, state.step),
                  in_place=all(h.in_place for h in optimizer._ce_snapshots))
            if point == "after-commit" and start == kill_step:
                die()

    train(state)
    event("done", step=state.step, checksum=checksum(model, optimizer, state.step))


if __name__ == "__main__":
    main()
