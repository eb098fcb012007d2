"""The training script of ``benchmarks/sharded.py``: FSDP2 inside a host, replicas across hosts, two ways.

    cloud-elastic run --whole-hosts --slots-per-host 2 -np 4 -H 127.0.0.1:2,127.0.0.2:2 \\
        python benchmarks/sharded_worker.py                      (hvd.shard, a commit every step)
    torchrun --standalone --nproc-per-node 4 benchmarks/sharded_worker.py --hsdp --slots-per-host 2
                                                                 (plain FSDP2 HSDP on a (hosts, slots) mesh)

    cloud-elastic run ... python benchmarks/sharded_worker.py --replica
                                                                 (no hvd.shard: a whole replica per worker)

The model is ``commit_cost_worker.py``'s residual blocks of LayerNorm + Linear(width, width)
(each block one FSDP2 unit), AdamW. Every mode times the same loop body (batch, forward, backward,
step; cloud-elastic also commits) and prints one ``TIMING`` JSON line per worker
with the step times, the process's peak RSS (``VmHWM``) and the bytes of model
and optimizer state the worker holds; with ``--step-log``, also a ``STEPLOG`` line
per step (``workload.py``'s format, ``size`` the number of hosts) for
``sharded_heal.py``, and ``--steps 0`` trains until it is stopped.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from commit_cost_worker import Block, peak_rss_bytes  # the same residual block as the commit-cost benchmark


def held_bytes(model: nn.Module, opt: torch.optim.Optimizer) -> int:
    def local(t: torch.Tensor) -> torch.Tensor:
        return t.to_local() if hasattr(t, "to_local") else t

    total = sum(local(p).numel() * p.element_size() for p in model.parameters())
    for state in opt.state.values():
        total += sum(local(v).numel() * v.element_size() for v in state.values() if isinstance(v, torch.Tensor))
    return total


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hsdp", action="store_true", help="plain FSDP2 HSDP under torchrun, no cloud-elastic")
    p.add_argument("--slots-per-host", type=int, default=2)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--steps", type=int, default=200, help="0: until stopped")
    p.add_argument("--replica", action="store_true", help="cloud-elastic without hvd.shard: a replica per worker")
    p.add_argument("--step-log", action="store_true", help="a STEPLOG line per step")
    args = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(1234)
    blocks = [Block(args.width) for _ in range(args.layers)]
    model = nn.Sequential(*blocks, nn.Linear(args.width, 1))
    if args.hsdp:
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        dist.init_process_group("gloo")
        rank, hosts = dist.get_rank(), dist.get_world_size() // args.slots_per_host
        mesh = init_device_mesh("cpu", (hosts, args.slots_per_host), mesh_dim_names=("replicate", "shard"))
        for block in blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
        state = None
    else:
        import cloud_elastic.torch as hvd

        hvd.init()
        rank = hvd.rank()
        if not args.replica:
            hvd.shard(model, modules=blocks)
        opt = hvd.DistributedOptimizer(torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01))
        state = hvd.elastic.TorchState(model, opt, step=0)
    walls: list[float] = []
    cpus: list[float] = []
    ends: list[float] = []

    def train(state) -> None:
        for step in range(args.steps) if args.steps else itertools.count():
            t0, c0 = time.perf_counter(), time.process_time()
            g = torch.Generator().manual_seed(step * 100_003 + (hvd.rank() if state is not None else rank0))
            x = torch.randn(args.batch_size, args.width, generator=g)
            opt.zero_grad()
            F.mse_loss(model(x), x[:, :1].tanh()).backward()
            opt.step()
            if state is not None:
                state.step += 1
                try:
                    state.commit()
                except hvd.HostsUpdatedInterrupt:  # the step completed and its commit is kept (workload.py)
                    done(step, t0, c0)
                    raise
            done(step, t0, c0)

    def done(step: int, t0: float, c0: float) -> None:
        walls.append(round(time.perf_counter() - t0, 6))
        cpus.append(round(time.process_time() - c0, 6))
        ends.append(time.time())
        if args.step_log:
            print("STEPLOG " + json.dumps({"step": step, "t": ends[-1], "rank": rank0, "pid": os.getpid(),
                                          "size": hvd.cross_size() if state is not None else 0}), flush=True)

    rank0 = rank
    if state is None:
        train(None)
    else:
        hvd.elastic.run(train)(state)
    line = "TIMING " + json.dumps({"rank": rank, "end": ends, "wall_s": walls, "cpu_s": cpus,
                                   "peak_rss": peak_rss_bytes(), "held": held_bytes(model, opt)})
    if args.hsdp:  # torchrun's workers share one pipe, and a line this long is not written at once: one at a time
        import torch.distributed as dist

        for turn in range(dist.get_world_size()):
            if turn == rank:
                print(line, flush=True)
            dist.barrier()
    else:  # cloud-elastic relays each worker's lines whole
        print(line, flush=True)


if __name__ == "__main__":
    main()
