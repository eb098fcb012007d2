"""A script whose workers fail the same way every time (``tests/integration/test_repeats.py``).

``repeat_probe.py MODE``: at step 3 (after two commits), ``rank1`` raises ValueError on rank 1,
``all`` on every rank, ``mismatch`` allreduces 4 elements on rank 0 against 3 on the others (a
collective that never completes). Each step prints ``EVENT {"kind": "step", ...}``.
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch

import cloud_elastic.torch as hvd

MODE = sys.argv[1]
FAIL_STEP = 3


def main() -> None:
    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model=model, optimizer=opt, step=0)

    @hvd.elastic.run
    def train(state):
        while state.step < 40:
            if state.step + 1 == FAIL_STEP:
                time.sleep(0.6)  # the step's work: the driver hears of the last commit (a heartbeat) first
                if MODE == "all" or (MODE == "rank1" and hvd.rank() == 1):
                    raise ValueError(f"user bug at step {FAIL_STEP}")
                if MODE == "mismatch":
                    hvd.allreduce(torch.ones(4 if hvd.rank() == 0 else 3), name="metric")
            loss = model(torch.randn(8, 4)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            state.step += 1
            print("EVENT " + json.dumps({"kind": "step", "step": state.step, "rank": hvd.rank(),
                                         "worker": os.environ.get("CLOUD_ELASTIC_WORKER_ID")}), flush=True)
            time.sleep(0.05)
            state.commit()

    train(state)


if __name__ == "__main__":
    main()
