"""Two ``hvd.elastic.run`` functions one after the other, pre-training then fine-tuning, as Horovod allows.

Run under ``cloud-elastic run``; prints ``EVENT {json}`` lines like ``probe.py``: ``after`` once each
function returned (``phase``, ``step``, the model's weights ``w``). Each step moves both weights by -1,
so after ``--finetune-steps`` steps every weight is minus that many, however often the job rolled back.
``--kill-at-step N --only-slot PREFIX``: that worker SIGKILLs itself at fine-tuning step N (once: ``--mark``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal

import torch

import cloud_elastic.torch as hvd


def event(kind: str, **fields: object) -> None:
    fields.update(kind=kind, worker=os.environ.get("CLOUD_ELASTIC_WORKER_ID"), rank=hvd.rank())
    print("EVENT " + json.dumps(fields), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pretrain-steps", type=int, default=5)
    parser.add_argument("--finetune-steps", type=int, default=10)
    parser.add_argument("--kill-at-step", type=int)
    parser.add_argument("--only-slot", default="")
    parser.add_argument("--mark", default="")
    args = parser.parse_args()
    hvd.init()
    model = torch.nn.Linear(2, 1, bias=False)
    torch.nn.init.zeros_(model.weight)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0),
                                   named_parameters=model.named_parameters())
    me = os.environ.get("CLOUD_ELASTIC_WORKER_ID", "")

    def step(state: hvd.elastic.TorchState) -> None:
        opt.zero_grad()
        model(torch.ones(1, 2)).sum().backward()
        opt.step()
        state.step += 1
        state.commit()

    @hvd.elastic.run
    def pretrain(state: hvd.elastic.TorchState) -> None:
        while state.step < args.pretrain_steps:
            step(state)

    @hvd.elastic.run
    def finetune(state: hvd.elastic.TorchState) -> None:
        while state.step < args.finetune_steps:
            if (state.step == args.kill_at_step and me.startswith(args.only_slot) and args.mark
                    and not os.path.exists(args.mark)):
                open(args.mark, "w").close()
                os.kill(os.getpid(), signal.SIGKILL)
            step(state)

    state = hvd.elastic.TorchState(model, opt, step=0)
    pretrain(state)
    event("after", phase="pretrain", step=state.step, w=model.weight.flatten().tolist())
    finetune(state)
    event("after", phase="finetune", step=state.step, w=model.weight.flatten().tolist())


if __name__ == "__main__":
    main()
