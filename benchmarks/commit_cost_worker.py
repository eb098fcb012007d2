"""The training script of ``benchmarks/commit_cost.py``: one model, one optimizer, cloud-elastic or DDP.

    cloud-elastic run -np 2 -H 127.0.0.1:2 python benchmarks/commit_cost_worker.py --model blocks --optimizer adamw
    torchrun --standalone --nproc-per-node 2 benchmarks/commit_cost_worker.py --ddp ...

Models: ``blocks`` is issue 13's (40 residual blocks of Linear 256 +
LayerNorm, 162 parameter tensors, 2.6 M parameters, batch 32); ``mlp`` is
``docs/benchmarks.md``'s (4 hidden layers of width 1024, batch 64); ``many``
has 1,000+ small parameter tensors (the per-step bookkeeping case). Both
modes time the same loop body (batch, forward, backward, step; cloud-elastic
also commits every ``--commit-every`` steps) and print one ``TIMING`` JSON
line per worker with the step times and the process's peak RSS (``VmHWM``).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

OPTIMIZERS = {
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.01),
    "sgd-momentum": lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9),
    "adam": lambda ps: torch.optim.Adam(ps, lr=1e-3),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.01),
    "adamw-foreach": lambda ps: torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.01, foreach=True),
    "adamw-fused": lambda ps: torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.01, fused=True),
    "adagrad": lambda ps: torch.optim.Adagrad(ps, lr=0.01),
    "rmsprop": lambda ps: torch.optim.RMSprop(ps, lr=1e-3, momentum=0.9),
}
#: model -> (input features, batch size)
SHAPES = {"blocks": (256, 32), "mlp": (256, 64), "many": (32, 32)}


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm, self.linear = nn.LayerNorm(width), nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.relu(self.linear(self.norm(x)))


def make_model(name: str) -> nn.Module:
    torch.manual_seed(1234)
    if name == "blocks":
        return nn.Sequential(*[Block(256) for _ in range(40)], nn.Linear(256, 1))
    if name == "many":  # 300 blocks of width 32: 1,202 parameter tensors
        return nn.Sequential(*[Block(32) for _ in range(300)], nn.Linear(32, 1))
    layers: list[nn.Module] = []
    width = 256
    for _ in range(4):
        layers += [nn.Linear(width, 1024), nn.ReLU()]
        width = 1024
    return nn.Sequential(*layers, nn.Linear(width, 1))


def batch(features: int, size: int, step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step * 100_003 + rank)
    x = torch.randn(size, features, generator=g)
    return x, x[:, :1].tanh()


def peak_rss_bytes() -> int:
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def report(rank: int, walls: list[float], cpus: list[float], ends: list[float]) -> None:
    print("TIMING " + json.dumps({"rank": rank, "end": ends, "wall_s": walls, "cpu_s": cpus,
                                  "peak_rss": peak_rss_bytes()}), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=sorted(SHAPES), default="blocks")
    p.add_argument("--optimizer", choices=sorted(OPTIMIZERS), default="adamw")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--commit-every", type=int, default=1)
    p.add_argument("--ddp", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(1)
    features, size = SHAPES[args.model]
    model = make_model(args.model)
    walls: list[float] = []
    cpus: list[float] = []
    ends: list[float] = []

    def timed(body) -> None:
        t0, c0 = time.perf_counter(), time.process_time()
        body()
        walls.append(round(time.perf_counter() - t0, 6))
        cpus.append(round(time.process_time() - c0, 6))
        ends.append(round(time.time(), 4))

    if args.ddp:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        dist.init_process_group("gloo")
        rank = dist.get_rank()
        ddp = DistributedDataParallel(model)
        opt = OPTIMIZERS[args.optimizer](ddp.parameters())
        for step in range(args.steps):
            def body(step=step) -> None:
                x, y = batch(features, size, step, rank)
                opt.zero_grad()
                F.mse_loss(ddp(x), y).backward()
                opt.step()
            timed(body)
        # One rank at a time: both write to torchrun's one pipe, and a line this long is not written atomically.
        for turn in range(dist.get_world_size()):
            if turn == rank:
                report(rank, walls, cpus, ends)
            dist.barrier()
        dist.destroy_process_group()
        return

    import cloud_elastic.torch as hvd

    hvd.init()
    opt = hvd.DistributedOptimizer(OPTIMIZERS[args.optimizer](model.parameters()))
    state = hvd.elastic.TorchState(model, opt, step=0)

    @hvd.elastic.run
    def train(state) -> None:
        while state.step < args.steps:
            def body() -> None:
                x, y = batch(features, size, state.step, hvd.rank())
                opt.zero_grad()
                F.mse_loss(model(x), y).backward()
                opt.step()
                state.step += 1
                if state.step % args.commit_every == 0:
                    state.commit()
            timed(body)

    train(state)
    report(hvd.rank(), walls, cpus, ends)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
