"""Horovod's elastic loop, ported by changing the import (``tests/integration/test_repeat_horovod_loop.py``).

``horovod_loop_probe.py MODE``. The same failure every time, at batch 3 of ``for state.batch in
range(state.batch, 12): ...; state.commit()`` (each restore redoes the committed batch and commits it again
before the failure comes back): ``raise`` (rank 1 raises ValueError), ``all`` (every rank raises), ``stall``
(rank 0 runs an allreduce rank 1 never runs), ``hang`` (rank 1 takes a lock twice: a deadlock, its heartbeats
going on).

A job that gets further each time: ``while state.batch < 16: ...; state.batch += 1``, a commit every 4 batches,
and a failure 6 batches into each process (one commit = 4 batches gained per relaunch, a different error each
time): ``rare`` (rank 1 raises), ``rare_hang`` (rank 1 is stuck on a read), ``rare_all`` (every rank raises).
Each rank prints ``done at batch N`` at the end.
"""

from __future__ import annotations

import sys
import threading
import time

import torch
import torch.nn.functional as F

import cloud_elastic.torch as hvd

MODE = sys.argv[1]
ERRORS = [OSError("transient read error on shard"), RuntimeError("NCCL watchdog timeout"),
          TimeoutError("dataloader worker timed out"), MemoryError("fragmentation")]

hvd.init()
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(20, 10), torch.nn.LogSoftmax(dim=1))
sgd = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.01), named_parameters=net.named_parameters())
trained = [0]  # batches this process trained


def step() -> None:
    sgd.zero_grad()
    F.nll_loss(net(torch.randn(16, 20)), torch.randint(0, 10, (16,))).backward()
    sgd.step()
    trained[0] += 1


def at_batch_3(batch: int) -> None:
    """The bug of the first four modes, every time the loop reaches batch 3."""
    if batch != 3:
        return
    if MODE == "all" or MODE == "raise" and hvd.rank() == 1:
        time.sleep(0.6)  # the batch's work: the driver hears of the last commit (a heartbeat) first
        raise ValueError("poison sample in batch 3")
    if MODE == "stall":
        if hvd.rank() == 0:
            hvd.allreduce(torch.ones(1), name="loss")  # a logging collective under `if hvd.rank() == 0`
        else:
            hvd.broadcast(torch.zeros(1), root_rank=0)
    if MODE == "hang" and hvd.rank() == 1:
        lock = threading.Lock()
        lock.acquire()
        lock.acquire()


@hvd.elastic.run
def same_place(state):
    for state.batch in range(state.batch, 12):
        time.sleep(0.05)
        at_batch_3(state.batch)
        step()
        state.commit()


@hvd.elastic.run
def further_each_time(state):
    while state.batch < 16:
        time.sleep(0.02)
        if trained[0] == 6 and (MODE == "rare_all" or hvd.rank() == 1):
            if MODE == "rare_hang":
                print(f"rank 1 stuck on a read at batch {state.batch}", flush=True)
                threading.Event().wait()  # its heartbeats go on
            time.sleep(0.6)  # the batch's work: the driver hears of the last commit (a heartbeat) first
            error = ERRORS[state.batch // 4 % len(ERRORS)]
            raise type(error)(f"{error} (batch {state.batch})")
        step()
        state.batch += 1
        if state.batch % 4 == 0:
            state.commit()


state = hvd.elastic.TorchState(net, sgd, batch=0)
(same_place if MODE in ("raise", "all", "stall", "hang") else further_each_time)(state)
print(f"done at batch {state.batch}", flush=True)
