"""Train (a commit per step) until ``EVENTS_DIR/go`` exists, writing the step reached to ``EVENTS_DIR/steps``; then
end as ENDING says: ``return`` (the script returns), ``exit3`` (``sys.exit(3)``) or ``hang`` (write
``EVENTS_DIR/trained`` with this process's pid and wait: the test SIGKILLs it). The driver that adopts this worker
reads nothing of it but what the worker says: its output went to the dead driver."""

from __future__ import annotations

import os
import sys
import time

import torch

import cloud_elastic.torch as hvd

events, ending = sys.argv[1], sys.argv[2]
hvd.init()
model = torch.nn.Linear(2, 1)
state = hvd.elastic.TorchState(model, step=0)


@hvd.elastic.run
def train(state: hvd.elastic.TorchState) -> None:
    while not os.path.exists(os.path.join(events, "go")):
        state.step += 1
        state.commit()
        with open(os.path.join(events, "steps.tmp"), "w") as f:
            f.write(str(state.step))
        os.replace(os.path.join(events, "steps.tmp"), os.path.join(events, "steps"))
        time.sleep(0.05)


train(state)
if ending == "exit3":
    sys.exit(3)
if ending == "hang":
    with open(os.path.join(events, "trained"), "w") as f:
        f.write(str(os.getpid()))
    while True:
        time.sleep(1)
