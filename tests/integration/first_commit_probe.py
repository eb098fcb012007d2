"""Every rank raises right after the job's first commit (``tests/integration/test_first_commit_checkpoint.py``).

``first_commit_probe.py EVENTS MODE``: each rank commits batch 1, waits until the driver's events file
(``--events-file EVENTS``) holds ``checkpoint_saved`` (rank 0's report reached the driver; no heartbeat need
have), and raises at once, on every rank: the driver hears of the commit only from that report. An attempt that
starts past batch 0 (resumed from the checkpoint) trains on to batch 6. MODE ``saved``: as said; ``spoilt``: rank 0
first truncates the checkpoint's data file (a write the report called done but storage did not keep). Each rank
prints ``enters at batch N`` on entering its training function, and ``done at batch N`` at the end.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import cloud_elastic.torch as hvd

EVENTS, MODE = Path(sys.argv[1]), sys.argv[2]
CHECKPOINTS = Path(sys.argv[3])

hvd.init()
torch.manual_seed(0)
net = torch.nn.Linear(4, 2)
sgd = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.01), named_parameters=net.named_parameters())


def reported_saved() -> bool:
    try:
        return any(json.loads(line).get("event") == "checkpoint_saved" for line in EVENTS.read_text().splitlines())
    except (OSError, ValueError):
        return False


def fail_at_once() -> None:
    """The driver was told of the checkpoint: every rank fails now, before any heartbeat tells of the commit."""
    deadline = time.monotonic() + 30
    while not reported_saved() and time.monotonic() < deadline:
        time.sleep(0.01)
    if MODE == "spoilt" and hvd.rank() == 0:
        for data in CHECKPOINTS.glob("ckpt-*/state.pt"):
            with data.open("r+b") as f:
                f.truncate(100)
    raise ValueError(f"bug right after the first commit (rank {hvd.rank()})")


@hvd.elastic.run
def train(state):
    print(f"rank {hvd.rank()} enters at batch {state.batch}", flush=True)
    first_attempt = state.batch == 0
    while state.batch < 6:
        sgd.zero_grad()
        F.mse_loss(net(torch.randn(8, 4)), torch.zeros(8, 2)).backward()
        sgd.step()
        state.batch += 1
        state.commit()
        if first_attempt:
            fail_at_once()


state = hvd.elastic.TorchState(net, sgd, batch=0)
train(state)
print(f"done at batch {state.batch}", flush=True)
