"""A ported Horovod script that runs a collective before ``hvd.elastic.run``, as Horovod's
examples/elastic/pytorch/pytorch_cifar10_elastic.py broadcasts ``resume_from_epoch``.

Trains until the file named by ``argv[1]`` exists, saying ``trained N`` every 20 steps.
"""

import os
import sys
import time

import torch

import cloud_elastic.torch as hvd

hvd.init()
epoch = int(hvd.broadcast(torch.tensor(0), root_rank=0, name="resume_from_epoch").item())
model = torch.nn.Linear(2, 1)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01), named_parameters=model.named_parameters())


@hvd.elastic.run
def train(state):
    while not os.path.exists(sys.argv[1]):
        opt.zero_grad()
        model(torch.ones(4, 2)).sum().backward()
        opt.step()
        state.batch += 1
        state.commit()
        if state.batch % 20 == 0:
            print(f"trained {state.batch} on {hvd.size()}", flush=True)
        time.sleep(0.01)


train(hvd.elastic.TorchState(model, opt, batch=0, epoch=epoch))
