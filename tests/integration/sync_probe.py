"""Training script for tests/integration/test_sync_kill_points.py: a worker dies during a state sync.

Every worker trains a small model with an optimizer that keeps state
(``--optimizer``), committing every step (commits kept in place, the
default commit mode). The worker on ``--victim`` dies at ``--point`` of the
first state sync of a round of three (a newcomer the test adds by discovery
joins the two that train), while its peers are in that sync:

- ``attributes``: as the sync's small parts (plain attributes, optimizer state's skeleton) are
  broadcast, its first transfer: once their first bytes came from rank 0 (so its peers are in the
  sync: a newcomer told its round's facts at rendezvous waits there before they switch rounds);
- ``parameters``: then, as the model's parameters are sent (healed from the peers that hold the commit);
- ``optimizer``: then, as the optimizer state's tensors are sent;
- ``stop``: at ``attributes``, SIGSTOP instead of SIGKILL (the driver gives it up for silence).

The victim is the newcomer (it receives), or rank 0 (a holder, and the root of the rest). The others
train until ``--steps`` and two resets (the newcomer admitted, then the round
without the victim). Prints ``EVENT`` lines: commit (step, checksum of model,
optimizer state and step, as ``commit_probe.py``; also for the commit that is
interrupted by the membership change), resumed (step and checksum as a round
starts), stopping (pid), done.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import signal
import time

import torch
import torch.nn.functional as F

import cloud_elastic.torch as hvd
from cloud_elastic.worker.comm import collectives, heal
from cloud_elastic.worker.commit.state import SMALL_STATE
from cloud_elastic.worker.exceptions import HostsUpdatedInterrupt
from commit_probe import OPTIMIZERS, checksum, event  # the script's own directory is on sys.path

#: point -> (where the function is, the function the victim dies in, the name of its transfer): the name is its
#: third argument (``Heal.tensors(self, tensors, name)``, ``broadcast_state(obj, root_rank, name)``)
POINTS = {
    "parameters": (heal.Heal, "tensors", "parameters"),
    "optimizer": (heal.Heal, "tensors", "optimizer state"),
    "attributes": (collectives, "broadcast_state", SMALL_STATE),
    "stop": (collectives, "broadcast_state", SMALL_STATE),
}


def die_in_sync(point: str) -> None:
    """Make this worker die as it enters ``point``'s transfer in a round of three or more (a receiver of the small
    parts: once their first bytes came)."""
    owner, function, name = POINTS[point]
    original = getattr(owner, function)

    def die() -> None:
        if point == "stop":
            event("stopping", pid=os.getpid())
            os.kill(os.getpid(), signal.SIGSTOP)
        else:
            os.kill(os.getpid(), signal.SIGKILL)

    def dying(*args, **kwargs):
        if hvd.size() >= 3 and (args[2] if len(args) > 2 else kwargs.get("name")) == name:
            if owner is collectives and hvd.rank() != 0:  # a receiver: once rank 0 sent the first bytes
                transfer = collectives.broadcast_

                def arrived(*a, **k):
                    out = transfer(*a, **k)
                    die()
                    return out
                collectives.broadcast_ = arrived
            else:
                die()
        return original(*args, **kwargs)

    setattr(owner, function, dying)  # the sync looks it up at each call


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--optimizer", choices=sorted(OPTIMIZERS), required=True)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--victim", required=True, help="the host whose worker dies in the sync")
    p.add_argument("--point", choices=sorted(POINTS), required=True)
    p.add_argument("--step-sleep", type=float, default=0.02)
    p.add_argument("--wide", action="store_true", help="a tensor of over 4 MiB, broadcast alone")
    args = p.parse_args()
    faulthandler.register(signal.SIGUSR1)  # the harness dumps stacks of a hung job
    hvd.init()
    if os.environ.get("CLOUD_ELASTIC_HOSTNAME") == args.victim:
        die_in_sync(args.point)

    torch.manual_seed(0)
    # Every tensor travels packed (``collectives.pack_chunks``); with --wide, the 600x1800 weight
    # (4.3 MB) and its optimizer state go alone, first: a sync meets both ways.
    width = 1800 if args.wide else 300
    model = torch.nn.Sequential(torch.nn.Linear(8, 600), torch.nn.Tanh(), torch.nn.Linear(600, width), torch.nn.Tanh(),
                                torch.nn.Linear(width, 1))
    optimizer = hvd.DistributedOptimizer(OPTIMIZERS[args.optimizer](model.parameters()), bucket_cap_mb=1)
    state = hvd.elastic.TorchState(model, optimizer, step=0)
    resets = {"n": 0}  # the same on every worker that trains: each reset is a round they all form
    state.register_reset_callbacks([lambda: resets.update(n=resets["n"] + 1)])

    def committed(**extra: object) -> None:
        event("commit", step=state.step, checksum=checksum(model, optimizer, state.step), **extra)

    @hvd.elastic.run
    def train(state) -> None:
        event("resumed", step=state.step, checksum=checksum(model, optimizer, state.step))
        while state.step < args.steps or resets["n"] < 2:
            start = state.step
            g = torch.Generator().manual_seed(start * 1000 + hvd.rank())
            x = torch.randn(4, 8, generator=g)
            optimizer.zero_grad()
            F.mse_loss(model(x), x.sum(1, keepdim=True).tanh()).backward()
            optimizer.step()
            state.step += 1
            try:
                state.commit()
            except HostsUpdatedInterrupt:
                committed(interrupted=True)  # saved before the interrupt: the commit the sync starts from
                raise
            committed()
            time.sleep(args.step_sleep)

    train(state)
    event("done", step=state.step, checksum=checksum(model, optimizer, state.step))


if __name__ == "__main__":
    main()
