"""A training script whose output the tests follow across a driver's death: a numbered line each step.

Usage: ``output_probe.py DIR --steps N [--burst-gate PATH --burst-bytes B --burst-slot PREFIX]``.
Every step prints ``STEP <rank> <step>`` and writes the step to ``DIR/<pid>.step`` (the tests read how far a
worker got while no driver reads its output). The worker whose id starts with ``--burst-slot`` prints, once,
when the ``--burst-gate`` file exists, ``--burst-bytes`` of ``BURST <n>`` lines and then ``BURST END <n>``,
and writes ``burst`` to ``DIR/<pid>.burst``. ``--children N`` children forked at the start (as DataLoader
workers are) print ``CHILD <n>`` lines all along. While the ``--pause-gate`` file exists the training loop
waits, printing nothing.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time

import torch

import cloud_elastic.torch as hvd


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("dir")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--step-sleep", type=float, default=0.1)
    p.add_argument("--burst-gate", default="")
    p.add_argument("--burst-bytes", type=int, default=0)
    p.add_argument("--burst-slot", default="-")
    p.add_argument("--children", type=int, default=0)
    p.add_argument("--pause-gate", default="")
    args = p.parse_args()
    hvd.init()
    children = [multiprocessing.get_context("fork").Process(target=_child_prints, daemon=True)
                for _ in range(args.children)]
    for child in children:
        child.start()
    model = torch.nn.Linear(4, 1)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01))
    state = hvd.elastic.TorchState(model, optimizer, step=0)
    me = os.environ.get("CLOUD_ELASTIC_WORKER_ID", "")
    mark = os.path.join(args.dir, f"{os.getpid()}")
    burst = {"done": False}

    def maybe_burst() -> None:
        if burst["done"] or not me.startswith(args.burst_slot) or not os.path.exists(args.burst_gate):
            return
        burst["done"] = True
        n, written = 0, 0
        while written < args.burst_bytes:
            line = f"BURST {n:07d} " + "x" * 80
            say(line)
            written += len(line) + 1
            n += 1
        say(f"BURST END {n}")
        with open(mark + ".burst", "w") as f:
            f.write("burst")

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        while state.step < args.steps:
            optimizer.zero_grad()
            model(torch.ones(2, 4)).sum().backward()
            optimizer.step()
            state.step += 1
            state.commit()
            say(f"STEP {hvd.rank()} {state.step}")
            with open(mark + ".step.tmp", "w") as f:
                f.write(str(state.step))
            os.replace(mark + ".step.tmp", mark + ".step")
            maybe_burst()
            time.sleep(args.step_sleep)
            while args.pause_gate and os.path.exists(args.pause_gate):
                time.sleep(0.05)

    train(state)
    say(f"FINISHED {hvd.rank()}")
    for child in children:
        child.kill()


def say(line: str) -> None:
    """``line`` in one write: ``print`` writes the text, then the newline, and the worker's own words (its
    heartbeat thread's, on the same pipe) could come between them, which the tests would count as a line lost."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _child_prints() -> None:
    n = 0
    while True:
        say(f"CHILD {n}")
        n += 1
        time.sleep(0.02)


if __name__ == "__main__":
    main()
