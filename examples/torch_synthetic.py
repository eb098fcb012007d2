"""A small model on generated data, for demos and benchmarks.

    cloud-elastic run -np 2 -H 127.0.0.1:2 python examples/torch_synthetic.py --steps 200

Every worker draws its batches from a fixed random "teacher" network, seeded
by (step, rank), so runs are reproducible and the loss visibly falls.
Committing every step (``--commit-every 1``) is the worst case for elastic
overhead; the benchmarks use it. With ``--ddp`` the same model trains under
plain ``torch.distributed`` DDP instead (for side-by-side comparisons; start
it with torchrun or any launcher that sets RANK/WORLD_SIZE/MASTER_ADDR).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300, help="total training steps (global, across resets)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--features", type=int, default=64)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--commit-every", type=int, default=1, help="commit every N steps")
    p.add_argument("--log-every", type=int, default=20, help="print progress every N steps (rank 0)")
    p.add_argument("--step-sleep", type=float, default=0.0, help="extra seconds per step (slows demos down)")
    p.add_argument("--timing", action="store_true", help="print one JSON line of step timings at the end")
    p.add_argument("--step-log", action="store_true", help="rank 0 prints a STEPLOG JSON line per step (benchmarks)")
    p.add_argument("--ddp", action="store_true", help="train with plain torch DDP instead of cloud-elastic")
    return p.parse_args()


def make_model(args: argparse.Namespace) -> nn.Module:
    torch.manual_seed(1234)
    layers: list[nn.Module] = []
    width = args.features
    for _ in range(args.layers):
        layers += [nn.Linear(width, args.hidden), nn.ReLU()]
        width = args.hidden
    layers.append(nn.Linear(width, 1))
    return nn.Sequential(*layers)


_TEACHER: dict[int, torch.Tensor] = {}


def batch(args: argparse.Namespace, step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    if args.features not in _TEACHER:
        _TEACHER[args.features] = torch.randn(args.features, 1, generator=torch.Generator().manual_seed(7))
    g = torch.Generator().manual_seed(step * 100_003 + rank)
    x = torch.randn(args.batch_size, args.features, generator=g)
    return x, torch.tanh(x @ _TEACHER[args.features])


def report_timing(step_times: list[float], cpu_times: list[float], ends: list[float], rank: int) -> None:
    """One JSON line: median wall and CPU seconds per step (CPU: all of the process's threads, Gloo's
    included) after warm-up, and every step's wall-clock end, wall and CPU seconds (for benchmarks
    that pause and resume jobs and must drop the steps a pause fell into)."""
    skip = len(step_times) // 5  # warm-up
    steady, cpu = sorted(step_times[skip:]), sorted(cpu_times[skip:])
    if steady:
        print("TIMING " + json.dumps({"rank": rank, "steps": len(steady), "median_s": steady[len(steady) // 2],
                                      "mean_s": sum(steady) / len(steady), "cpu_median_s": cpu[len(cpu) // 2],
                                      "end": [round(t, 4) for t in ends], "wall_s": [round(t, 6) for t in step_times],
                                      "cpu_s": [round(t, 6) for t in cpu_times]}),
              flush=True)


def train_elastic(args: argparse.Namespace) -> None:
    import cloud_elastic.torch as hvd

    hvd.init()
    model = make_model(args)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, optimizer, step=0)
    step_times: list[float] = []
    cpu_times: list[float] = []
    ends: list[float] = []

    def on_reset() -> None:
        if hvd.rank() == 0:
            print(f"reset: training continues with {hvd.size()} worker(s) from step {state.step}", flush=True)

    state.register_reset_callbacks([on_reset])

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> float:
        loss = torch.tensor(0.0)
        while state.step < args.steps:
            t0, c0 = time.perf_counter(), time.process_time()
            x, y = batch(args, state.step, hvd.rank())
            optimizer.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            state.step += 1
            if args.step_sleep:
                time.sleep(args.step_sleep)
            if state.step % args.commit_every == 0:
                state.commit()
            step_times.append(time.perf_counter() - t0)
            cpu_times.append(time.process_time() - c0)
            ends.append(time.time())
            if args.step_log and hvd.rank() == 0:
                print("STEPLOG " + json.dumps({"step": state.step, "t": time.time(), "size": hvd.size()}), flush=True)
            if hvd.rank() == 0 and state.step % args.log_every == 0:
                print(f"step {state.step}/{args.steps}  loss {loss.item():.4f}  workers {hvd.size()}", flush=True)
        return float(loss.item())

    final = train(state)
    if hvd.rank() == 0:
        print(f"done: {state.step} steps, final loss {final:.4f}, {hvd.size()} worker(s) at the end", flush=True)
    if args.timing:
        report_timing(step_times, cpu_times, ends, hvd.rank())


def train_ddp(args: argparse.Namespace) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = DistributedDataParallel(make_model(args))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    step_times: list[float] = []
    cpu_times: list[float] = []
    ends: list[float] = []
    for step in range(args.steps):
        t0, c0 = time.perf_counter(), time.process_time()
        x, y = batch(args, step, rank)
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        step_times.append(time.perf_counter() - t0)
        cpu_times.append(time.process_time() - c0)
        ends.append(time.time())
    if args.timing:
        report_timing(step_times, cpu_times, ends, rank)
    dist.destroy_process_group()


if __name__ == "__main__":
    arguments = parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    (train_ddp if arguments.ddp else train_elastic)(arguments)
