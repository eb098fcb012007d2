"""A job that ends while a planned next round forms (``test_finish_while_planned``).

Rank 0 trains until ``--stop-when`` exists, then every worker returns; they commit every ``--commit-every``
steps, and a planned round is switched to only at a commit: until then a newcomer waits in the plan's group
(its state sync). ``--exit-hook-s``: an exit hook of the script's own (registered before ``hvd.init()``, so
it runs after the library's) takes that long, as a final upload would; the worker's heartbeats go on meanwhile.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import time

import torch
import torch.nn.functional as F

import cloud_elastic.torch as hvd


def event(kind: str, **fields: object) -> None:
    fields.update(kind=kind, worker=os.environ.get("CLOUD_ELASTIC_WORKER_ID"), pid=os.getpid())
    print("EVENT " + json.dumps(fields), flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--stop-when", required=True)
    p.add_argument("--exit-hook-s", type=float, default=0.0)
    p.add_argument("--commit-every", type=int, default=1, help="commit every N steps: a round change waits for it")
    args = p.parse_args()
    if args.exit_hook_s:
        atexit.register(time.sleep, args.exit_hook_s)
    hvd.init()
    event("hello", rank=hvd.rank(), size=hvd.size())
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01))
    state = hvd.elastic.TorchState(model, optimizer, step=0)

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        while not hvd.broadcast_object(os.path.exists(args.stop_when), root_rank=0):
            x = torch.randn(8, 4)
            optimizer.zero_grad()
            F.mse_loss(model(x), x.sum(1, keepdim=True)).backward()
            optimizer.step()
            state.step += 1
            if state.step % args.commit_every == 0:
                state.commit()
                event("commit", rank=hvd.rank(), step=state.step)
            time.sleep(0.05)

    train(state)
    event("done", rank=hvd.rank(), step=state.step)


if __name__ == "__main__":
    main()
