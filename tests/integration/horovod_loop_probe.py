"""Horovod's elastic loop with a deterministic bug (``tests/integration/test_repeat_horovod_loop.py``).

Written as Horovod's docs write it, ported by changing the import: ``for state.batch in range(state.batch, ...):
...; state.commit()``, so each restore redoes the committed batch and commits it again. ``horovod_loop_probe.py
raise``: rank 1 raises ValueError at batch 3 (every time it gets there); ``leak``: rank 1 raises at every third
batch its process trains (a slow leak: each relaunch gets three commits further), and the job completes.
"""

import sys
import time

import torch
import torch.nn.functional as F

import cloud_elastic.torch as hvd

hvd.init()
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(20, 10), torch.nn.LogSoftmax(dim=1))
sgd = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.01), named_parameters=net.named_parameters())
trained = [0]  # batches this process trained


def poisoned(batch: int) -> bool:
    if hvd.rank() != 1:
        return False
    return batch == 3 if sys.argv[1] == "raise" else trained[0] == 3


@hvd.elastic.run
def train(state):
    for state.batch in range(state.batch, 12):
        time.sleep(0.3)  # the batch's work: the driver hears of the last commit (a heartbeat) first
        if poisoned(state.batch):
            raise ValueError(f"poison sample in batch {state.batch}" if sys.argv[1] == "raise" else "out of memory")
        sgd.zero_grad()
        F.nll_loss(net(torch.randn(16, 20)), torch.randint(0, 10, (16,))).backward()
        sgd.step()
        trained[0] += 1
        state.commit()


state = hvd.elastic.TorchState(net, sgd, batch=0)
train(state)
print(f"done at batch {state.batch}", flush=True)
