"""Training script for sharded training at host granularity (``hvd.shard``) under ``cloud-elastic run --whole-hosts``.

An MLP sharded with FSDP2 across the host's workers, AdamW, one commit per step.
It prints ``EVENT {json}`` lines (see ``probe.py``): hello (with how much of the
model this worker holds), entered (at each entry into the training function: the
round of the last state sync and the hosts that received shards in it), commit and reset (with a checksum of this worker's
shards: parameters and optimizer state) and done; with ``--full-checksum`` also
a checksum of the whole state, which does not depend on the layout. The replicas of shard *i* on
every host must be bitwise equal at each step, and a rollback must give back
exactly the last commit's shards.
"""

from __future__ import annotations

import argparse
import faulthandler
import hashlib
import json
import os
import signal
import time

import torch
import torch.nn.functional as F

import cloud_elastic.torch as hvd
from cloud_elastic.worker.context import get_context


def event(kind: str, **fields: object) -> None:
    fields.update(kind=kind, worker=os.environ.get("CLOUD_ELASTIC_WORKER_ID"), pid=os.getpid())
    print("EVENT " + json.dumps(fields), flush=True)


def local_tensors(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    out = [p.to_local() for p in model.parameters()]
    for p in model.parameters():
        out += [v.to_local() if hasattr(v, "to_local") else v for _, v in sorted(optimizer.state[p].items())]
    return out


def full_checksum(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> str:
    """Of the whole model and optimizer state, whatever the layout (a collective over the host's workers)."""
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.full_tensor().detach().contiguous().numpy().tobytes())
        for _, v in sorted(optimizer.state[p].items()):
            v = v.full_tensor() if hasattr(v, "full_tensor") else v
            h.update(v.detach().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def checksum(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> str:
    h = hashlib.sha256()
    for t in local_tensors(model, optimizer):
        h.update(t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def main() -> None:
    faulthandler.register(signal.SIGUSR1)  # the harness dumps stacks of a hung job
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--step-sleep", type=float, default=0.05)
    p.add_argument("--stop-when", default="", help="keep training past --steps until this file exists (rank 0 looks)")
    p.add_argument("--no-loss-log", action="store_true",
                   help="no loss allreduce between the update and the commit: the common loop, commits kept in place")
    p.add_argument("--die-after-update", default="", metavar="WORKER:STEP",
                   help="the worker whose id starts with WORKER dies (exit 1) right after step STEP's update, "
                        "before its commit")
    p.add_argument("--die-before-forward", default="", metavar="WORKER:FILE",
                   help="the worker whose id starts with WORKER dies (exit 1) as a step starts once FILE exists "
                        "(or as step FILE starts, when FILE is a number): its host-mate is then left alone in the "
                        "forward pass's all-gather")
    p.add_argument("--die-before-shard", default="", metavar="WORKER",
                   help="the worker whose id starts with WORKER dies (exit 1) after hvd.init(), before hvd.shard(): "
                        "its host-mate is then left waiting for it in the formation of the host's group")
    p.add_argument("--late-to-shard", default="", metavar="WORKER:SECONDS",
                   help="in the first round, the worker whose id starts with WORKER sleeps SECONDS before hvd.shard(): "
                        "its host-mate waits for it there")
    p.add_argument("--odd-layout", default="", metavar="WORKER",
                   help="this worker's model has another hidden width (a layout that differs from its peers')")
    p.add_argument("--scale-after-training", type=int, default=None, metavar="LOCAL_RANK",
                   help="after the loop's last commit, the worker of this local rank (on every host) halves its "
                        "shards of the parameters in place through .data (no step, no version bump): a change "
                        "only the final checkpoint holds")
    p.add_argument("--full-checksum", action="store_true",
                   help="commit, done and entered events also carry a checksum of the whole model and optimizer "
                        "state (\"full\"), the same for any layout")
    args = p.parse_args()

    hvd.init()
    me = os.environ.get("CLOUD_ELASTIC_WORKER_ID", "")
    if args.die_before_shard and get_context().info.round == 1:
        # Every worker of the first round has formed its group and used it before the victim dies: dying
        # while a peer still formed it would abort round 1 inside that peer's hvd.init(), and its host-mate,
        # already in hvd.shard(), would wait for it there (a fresh-clone run saw that; see the test).
        hvd.allreduce(torch.zeros(1), name="formed")
        if me.startswith(args.die_before_shard):
            time.sleep(2)  # the others' allreduce has ended
            event("dying", rank=hvd.rank(), step=0)
            os._exit(1)
    late, _, late_s = args.late_to_shard.rpartition(":")
    if late and me.startswith(late) and get_context().info.round == 1:
        time.sleep(float(late_s))
    torch.manual_seed(0)
    width = 48 if args.odd_layout and me.startswith(args.odd_layout) else 64
    model = torch.nn.Sequential(torch.nn.Linear(8, width), torch.nn.ReLU(), torch.nn.Linear(width, 64),
                                torch.nn.ReLU(), torch.nn.Linear(64, 1))
    full = sum(p.numel() for p in model.parameters())
    hvd.shard(model, modules=[m for m in model if isinstance(m, torch.nn.Linear)])
    optimizer = hvd.DistributedOptimizer(torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1))
    state = hvd.elastic.TorchState(model, optimizer, step=0, resets=-1)
    in_place = state._handlers["model"]  # whether the commits keep no copy (reported with each commit)
    held = sum(p.to_local().numel() for p in model.parameters())
    event("hello", rank=hvd.rank(), size=hvd.size(), local_rank=hvd.local_rank(), cross_rank=hvd.cross_rank(),
          held=held, full=full)
    counters = {"executed": 0}
    update_victim, _, update_step = args.die_after_update.rpartition(":")
    forward_victim, _, forward_file = args.die_before_forward.partition(":")

    def on_reset() -> None:
        event("reset", rank=hvd.rank(), size=hvd.size(), local_rank=hvd.local_rank(), round=get_context().info.round,
              executed=counters["executed"], step=state.step, checksum=checksum(model, optimizer))
        counters["executed"] = state.step

    state.register_reset_callbacks([on_reset])

    def more() -> bool:
        if state.step < args.steps:
            return True
        return bool(args.stop_when) and not hvd.broadcast_object(os.path.exists(args.stop_when), root_rank=0)

    def whole() -> dict:
        return {"full": full_checksum(model, optimizer)} if args.full_checksum else {}

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        sync_round, receivers = get_context().ledger.shard_sync
        event("entered", rank=hvd.rank(), size=hvd.size(), local_rank=hvd.local_rank(), cross_rank=hvd.cross_rank(),
              round=get_context().info.round, sync_round=sync_round, receivers=receivers, step=state.step, **whole())
        state.resets += 1
        if not counters.get("entered"):  # this process's first round: it starts from the synced step
            counters["entered"] = True
            counters["executed"] = state.step
        while more():
            counters["executed"] += 1
            if me.startswith(forward_victim) and (str(state.step + 1) == forward_file if forward_file.isdigit()
                                                  else os.path.exists(forward_file)):
                event("dying", rank=hvd.rank(), step=state.step + 1)
                os._exit(1)
            g = torch.Generator().manual_seed(state.step * 1000 + hvd.rank())
            x = torch.randn(4, 8, generator=g)
            optimizer.zero_grad()
            loss = F.mse_loss(model(x), x.sum(1, keepdim=True))
            loss.backward()
            optimizer.step()
            if me.startswith(update_victim) and str(state.step + 1) == update_step:
                event("dying", rank=hvd.rank(), step=state.step + 1)
                os._exit(1)
            # The loss for the log, averaged over every worker between the update and the commit: a peer lost
            # here is lost after this step's update, which the rollback must undo.
            if not args.no_loss_log:
                hvd.allreduce(loss.detach(), name="loss")
            state.step += 1
            state.commit()
            event("commit", rank=hvd.rank(), size=hvd.size(), local_rank=hvd.local_rank(), step=state.step,
                  checksum=checksum(model, optimizer), in_place=in_place.in_place, **whole())
            time.sleep(args.step_sleep)
        if args.scale_after_training == hvd.local_rank():
            for q in model.parameters():
                q.data.to_local().mul_(0.5)

    train(state)
    event("done", rank=hvd.rank(), size=hvd.size(), local_rank=hvd.local_rank(), step=state.step,
          checksum=checksum(model, optimizer), **whole())


if __name__ == "__main__":
    main()
