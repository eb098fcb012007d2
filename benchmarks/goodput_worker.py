"""The goodput benchmark's worker: an emulated GPU host's costs, run the way each system runs it.

    goodput_worker.py elastic ...    under ``cloud-elastic run`` (a commit every step)
    goodput_worker.py torchrun ...   under ``torchrun`` with a c10d rendezvous: DDP plus a disk checkpoint
                                     every --checkpoint-every steps, resumed from on every (re)start
    goodput_worker.py torchft ...    one torchft replica group of one worker (--lighthouse ADDR)

Two costs of a GPU host are emulated so that capacity scales with the number
of workers on a machine of 2 cores: ``--startup-s`` is slept once per process
before it joins (CUDA initialisation and data loading on a real host), and
``--device-s`` is slept in every step (the device's time, which does not load
the host's CPU). The model itself is a small MLP (``examples/torch_synthetic``),
so the CPU's part of a step is a few milliseconds.

Every process prints ``STEPLOG {"hello": 1, ...}`` when it starts and one
``STEPLOG`` line per completed step: its end ``t`` and start ``t0`` (wall
clock), the step, the world size it completed at, pid and host.

A process started on a host that the benchmark has marked dead
(``GOODPUT_DEAD_DIR/<host>`` exists) exits at once with status 255, as an
ssh to a terminated instance fails: the driver cannot run a worker there.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "examples"))


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("system", choices=["elastic", "torchrun", "torchft"])
    p.add_argument("--startup-s", type=float, default=10.0, help="slept once per process before it joins")
    p.add_argument("--device-s", type=float, default=0.2, help="slept in every step (device time)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--features", type=int, default=64)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--checkpoint-every", type=int, default=10, help="torchrun: steps between disk checkpoints")
    p.add_argument("--checkpoint-dir", default="")
    p.add_argument("--lighthouse", default="", help="torchft: the Lighthouse's address")
    p.add_argument("--host", default="", help="torchft: the emulated host (names its replica group)")
    return p.parse_args(argv)


def host() -> str:
    return os.environ.get("GOODPUT_HOST") or os.environ.get("CLOUD_ELASTIC_HOSTNAME", "")


def log(**record) -> None:
    print("STEPLOG " + json.dumps({**record, "pid": os.getpid(), "host": host()}), flush=True)


def start_up(args: argparse.Namespace) -> None:
    dead = os.environ.get("GOODPUT_DEAD_DIR")
    if dead and host() and (Path(dead) / host()).exists():
        print(f"goodput: host {host()} is gone", file=sys.stderr, flush=True)
        os._exit(255)
    log(hello=1, t=time.time())
    time.sleep(args.startup_s)


def run_elastic(args: argparse.Namespace) -> None:
    import torch
    import torch.nn.functional as F
    from torch_synthetic import batch, make_model

    import cloud_elastic.torch as hvd

    start_up(args)
    hvd.init()
    model = make_model(args)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9),
                                         named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, optimizer, step=0)

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        while True:
            t0 = time.time()
            x, y = batch(args, state.step, hvd.rank())
            optimizer.zero_grad()
            F.mse_loss(model(x), y).backward()
            time.sleep(args.device_s)
            optimizer.step()
            state.step += 1
            size = hvd.size()
            try:
                state.commit()
            except hvd.HostsUpdatedInterrupt:
                log(step=state.step, t=time.time(), t0=t0, size=size)  # committed: the step counts
                raise
            log(step=state.step, t=time.time(), t0=t0, size=size)

    train(state)


def run_torchrun(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel
    from torch_synthetic import batch, make_model

    start_up(args)
    dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    rank, size = dist.get_rank(), dist.get_world_size()
    model = DistributedDataParallel(make_model(args))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    step = 0
    path = Path(args.checkpoint_dir) / "checkpoint.pt"
    if path.exists():  # every worker of the new group reads rank 0's last checkpoint
        saved = torch.load(path, weights_only=True)
        model.module.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        step = saved["step"]
    while True:
        t0 = time.time()
        x, y = batch(args, step, rank)
        optimizer.zero_grad()
        F.mse_loss(model(x), y).backward()
        time.sleep(args.device_s)
        optimizer.step()
        step += 1
        if step % args.checkpoint_every == 0 and rank == 0:
            tmp = path.with_suffix(".tmp")
            torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, tmp)
            os.replace(tmp, path)  # atomic: a kill mid-save leaves the previous checkpoint
        log(step=step, t=time.time(), t0=t0, size=size)


def run_torchft(args: argparse.Namespace) -> None:
    import torch
    import torch.nn.functional as F
    from torch.distributed import TCPStore
    from torch_synthetic import batch, make_model
    from torchft import Manager, Optimizer, ProcessGroupGloo

    start_up(args)
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)  # the replica group's own store
    model = make_model(args)
    inner = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    def state_dict() -> dict:
        return {"model": model.state_dict(), "optimizer": inner.state_dict()}

    def load_state_dict(sd: dict) -> None:
        model.load_state_dict(sd["model"])
        inner.load_state_dict(sd["optimizer"])

    timeout = timedelta(seconds=10)  # torchft's default
    manager = Manager(pg=ProcessGroupGloo(timeout=timeout), min_replica_size=1, load_state_dict=load_state_dict,
                      state_dict=state_dict, replica_id=f"replica_{args.host}", store_addr="127.0.0.1",
                      store_port=store.port, rank=0, world_size=1, lighthouse_addr=args.lighthouse, timeout=timeout)
    optimizer = Optimizer(manager, inner)
    params = list(model.parameters())
    while True:
        t0 = time.time()
        before = manager.current_step()
        x, y = batch(args, before, abs(hash(args.host)) % 1000)
        optimizer.zero_grad()
        F.mse_loss(model(x), y).backward()
        time.sleep(args.device_s)
        # Manager.allreduce rather than torchft.DistributedDataParallel, whose comm hook can assert on the
        # error a dead peer raises (benchmarks/workload.py); an error discards the step at commit.
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        manager.allreduce(flat).wait()
        offset = 0
        for p in params:
            p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
        optimizer.step()
        if manager.current_step() > before:  # committed (a failed step is discarded)
            log(step=manager.current_step(), t=time.time(), t0=t0, size=manager.num_participants())


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    if args.host:
        os.environ["GOODPUT_HOST"] = args.host
    {"elastic": run_elastic, "torchrun": run_torchrun, "torchft": run_torchft}[args.system](args)


if __name__ == "__main__":
    main(sys.argv[1:])
