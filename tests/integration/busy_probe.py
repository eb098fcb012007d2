"""A training script whose workers are healthy but busy, for the silence tests and the heartbeat traces.

Run under ``cloud-elastic run``; prints ``EVENT {json}`` lines like ``probe.py``
(hello, step, done). One worker (``--only-slot``, a worker id prefix) can be made busy:

* ``--first-step-s S``: its first step lasts S seconds, as a ``torch.compile`` or a
  first CUDA step does: Python work (tracing), torch operators and a full garbage
  collection over ``--heap`` objects, in turns, while its peers wait for it in the
  gradient allreduce;
* ``--gc-every-s S``: every S seconds of training it runs a full garbage collection
  over ``--heap`` objects (the GIL held for the whole collection).

Every step sleeps ``--step-sleep``; the job ends after ``--steps`` steps, or at
``--seconds`` of training when given, or once the ``--stop-when`` file exists (rank 0 decides).
"""

from __future__ import annotations

import argparse
import faulthandler
import gc
import json
import os
import signal
import time

import torch
import torch.nn.functional as F

import cloud_elastic.torch as hvd


def event(kind: str, **fields: object) -> None:
    fields.update(kind=kind, worker=os.environ.get("CLOUD_ELASTIC_WORKER_ID"), pid=os.getpid())
    print("EVENT " + json.dumps(fields), flush=True)


def busy_first_step(seconds: float, heap: list) -> None:
    """Seconds of compile-like work: Python loops, torch operators, a full collection over ``heap``."""
    end = time.monotonic() + seconds
    a = torch.randn(256, 256)
    while time.monotonic() < end:
        sum(i * i for i in range(200_000))  # tracing: pure Python, the GIL handed over every 5 ms
        a = torch.tanh(a @ a.T / 256)  # kernels: the GIL released
        if heap:
            gc.collect()


def main() -> None:
    faulthandler.register(signal.SIGUSR1)
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--seconds", type=float, default=0.0, help="train this long instead of --steps")
    p.add_argument("--stop-when", default="", help="train until this file exists instead of --steps")
    p.add_argument("--step-sleep", type=float, default=0.05)
    p.add_argument("--only-slot", default="", help="the busy worker's id prefix")
    p.add_argument("--first-step-s", type=float, default=0.0)
    p.add_argument("--gc-every-s", type=float, default=0.0)
    p.add_argument("--heap", type=int, default=0, help="objects the busy worker keeps (its collections scan them)")
    args = p.parse_args()

    hvd.init()
    mine = bool(args.only_slot) and os.environ.get("CLOUD_ELASTIC_WORKER_ID", "").startswith(args.only_slot)
    heap = [[i] for i in range(args.heap)] if mine else []
    event("hello", rank=hvd.rank(), size=hvd.size(), busy=mine)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01))
    state = hvd.elastic.TorchState(model, optimizer, step=0)
    started = time.monotonic()
    last_gc = [started]

    def more() -> bool:
        if args.stop_when:
            return not hvd.broadcast_object(os.path.exists(args.stop_when), root_rank=0)
        if args.seconds:
            return not hvd.broadcast_object(time.monotonic() - started >= args.seconds, root_rank=0)
        return state.step < args.steps

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        while more():
            if mine and state.step == 0 and args.first_step_s:
                event("busy", rank=hvd.rank(), seconds=args.first_step_s)
                busy_first_step(args.first_step_s, heap)
            if mine and args.gc_every_s and time.monotonic() - last_gc[0] >= args.gc_every_s:
                t = time.monotonic()
                gc.collect()
                last_gc[0] = time.monotonic()
                event("collected", rank=hvd.rank(), seconds=round(last_gc[0] - t, 3))
            x = torch.randn(32, 64)
            optimizer.zero_grad()
            F.mse_loss(model(x), x.sum(1, keepdim=True)).backward()
            optimizer.step()
            state.step += 1
            state.commit()
            event("step", rank=hvd.rank(), size=hvd.size(), step=state.step, t=time.time())
            time.sleep(args.step_sleep)

    train(state)
    event("done", rank=hvd.rank(), size=hvd.size(), step=state.step)


if __name__ == "__main__":
    main()
