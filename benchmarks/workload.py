"""One training workload, run the way each system in the peer comparison runs it.

    workload.py elastic ...           under ``cloud-elastic run`` (commit every --commit-every steps)
    workload.py ddp ...               under ``torchrun`` (plain DDP, no elastic features)
    workload.py torchrun-elastic ...  under ``torchrun --nnodes MIN:MAX --rdzv-backend c10d``: DDP plus a
                                      disk checkpoint every --checkpoint-every steps, resumed from on start
    workload.py torchft --replicas N  a torchft Lighthouse and N replica groups of one worker each (Gloo)

The model, the data and the optimizer are those of ``examples/torch_synthetic.py``
(an MLP; SGD with momentum; a synthetic regression batch per step and rank), or
with ``--adamw-tensors N`` a model of N small layers trained with AdamW (many
tensors, as a real network has). With ``--step-log`` every worker prints one
``STEPLOG {json}`` line per completed step (wall time, step, world size, pid,
the step's wall and CPU seconds). ``--state-mb N`` adds N MB to the optimizer's state
(:func:`add_state`): every sync carries it, and each step changes 64 KiB of it (:func:`change_state`). A step whose commit raises ``HostsUpdatedInterrupt`` completed (its commit is kept),
so it is logged too.

Under ``elastic`` only: ``--device-s S`` sleeps S seconds at the start of every
step (an emulated GPU's device time, which loads no CPU, as ``goodput_worker.py``
emulates it; before the backward pass, so that the gradients' allreduce still
waits for a late peer), so that three workers on 2 cores step as fast as two;
``--trace`` prints the admission path's calls (``admission_trace.py``) and each
step's phases (``phase device`` ... in its STEPLOG line: seconds from the step's
start to the end of its device time, backward, optimizer step and commit) and
its minor page faults (``faults``) and the time Python's cyclic collector ran in
it (``gc``, with ``gc gen`` its oldest generation, -1 for none).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "examples"))
from torch_synthetic import batch, make_model  # noqa: E402


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("system", choices=["elastic", "ddp", "torchrun-elastic", "torchft", "torchft-worker"])
    p.add_argument("--steps", type=int, default=10**9)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--features", type=int, default=256)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--adamw-tensors", type=int, default=0, help="use a model of this many small layers and AdamW")
    p.add_argument("--commit-every", type=int, default=1)
    p.add_argument("--checkpoint-every", type=int, default=100)
    p.add_argument("--checkpoint-dir", default="")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--lighthouse-heartbeat-ms", type=int, default=5000)
    p.add_argument("--lighthouse-join-ms", type=int, default=60000)
    p.add_argument("--lighthouse-tick-ms", type=int, default=100)
    p.add_argument("--lighthouse", default="")
    p.add_argument("--pg-timeout-s", type=float, default=0.0,
                   help="collective timeout (torchrun: torch's default 30 min; torchft: 10 s) if 0")
    p.add_argument("--replica-id", type=int, default=0)
    p.add_argument("--torchft-manual-allreduce", action="store_true",
                   help="torchft: allreduce the flattened gradients through Manager.allreduce after backward instead "
                        "of torchft.DistributedDataParallel (whose comm hook asserts when a collective times out)")
    p.add_argument("--step-log", action="store_true")
    p.add_argument("--device-s", type=float, default=0.0,
                   help="elastic: sleep this long at the start of every step (an emulated GPU's device time, "
                        "which loads no CPU; goodput_worker.py's --device-s)")
    p.add_argument("--trace", action="store_true",
                   help="elastic: print TRACE lines of the admission path's calls (admission_trace.py) and each "
                        "step's phases in its STEPLOG line")
    p.add_argument("--state-mb", type=float, default=0.0,
                   help="add this many MB (10^6 bytes) to the optimizer's state (see add_state): carried by every "
                        "sync, used by no step")
    return p.parse_args(argv)


def build(args: argparse.Namespace) -> tuple[nn.Module, type, dict]:
    """The model and (optimizer class, its arguments)."""
    if args.adamw_tensors:
        torch.manual_seed(1234)
        width = args.features
        layers: list[nn.Module] = []
        for _ in range(args.adamw_tensors // 2):  # weight and bias per layer
            layers += [nn.Linear(width, width), nn.Tanh()]
        layers.append(nn.Linear(width, 1))
        return nn.Sequential(*layers), torch.optim.AdamW, {"lr": 1e-3}
    return make_model(args), torch.optim.SGD, {"lr": args.lr, "momentum": 0.9}


def add_state(optimizer: torch.optim.Optimizer, args: argparse.Namespace) -> None:
    """``--state-mb``: that many MB more in the optimizer's state, as an entry of the first parameter's state
    that the optimizer's step never reads (SGD keeps its own momentum beside it).

    It travels in ``optimizer.state_dict()``, so every sync carries it to a newcomer as it carries Adam's
    moments; a commit kept in place copies no optimizer state, so the steps cost what they cost without it.
    A registered buffer would not do: a commit copies a model's buffers every time (1 GB: a 0.33 s step
    against 12 ms). Filled, not left as zero pages: every byte is resident, as trained state is.
    """
    if args.state_mb:
        first = optimizer.param_groups[0]["params"][0]
        optimizer.state[first]["ballast"] = torch.full((int(args.state_mb * 1e6) // 4,), 0.5)
        if args.state_mb > 200:
            # A receiver takes at most 256 times its optimizer's parameter bytes (plus 64 MiB) of state from a peer
            # (``comm.skeleton.state_limit``: more is "corrupt or forged"): a frozen parameter of 1/200 of the entry
            # raises that bound. It trains nothing and is in no bucket: the step stays the small model's.
            frozen = torch.nn.Parameter(torch.zeros(int(args.state_mb * 1e6) // 200 // 4), requires_grad=False)
            optimizer.add_param_group({"params": [frozen]})


#: Elements of the ``--state-mb`` entry that change at each step (64 KiB), at an offset that moves on each step.
CHANGED_A_STEP = 16384


def change_state(optimizer: torch.optim.Optimizer, step: int) -> None:
    """``--state-mb``: every step changes 64 KiB of the entry, a different part each step (after the update, before
    the commit), so that a newcomer that received it and did not follow the changes would end with another state:
    an entry that never changed would not test a follow mode (``commit.follow``). The entry is looked up each time:
    a sync replaces the optimizer's state tensors."""
    ballast = optimizer.state[optimizer.param_groups[0]["params"][0]].get("ballast")
    if ballast is not None:
        at = step * CHANGED_A_STEP % max(1, ballast.numel() - CHANGED_A_STEP)
        ballast[at: at + CHANGED_A_STEP].add_(1.0)


def following() -> bool:
    """Whether this worker's round has a follower now (``commit.follow``; False under a cloud-elastic without it)."""
    try:
        from cloud_elastic.worker.comm import followers
        from cloud_elastic.worker.context import get_context
    except ImportError:
        return False
    return followers.current(get_context()) is not None


def _faults() -> int:
    """This process's minor page faults so far."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


#: ``--trace``: the seconds Python's cyclic collector ran in the current step, and its oldest generation.
_GC: dict[str, float] = {"s": 0.0, "gen": -1, "t0": 0.0}


def _gc_timer(phase: str, info: dict) -> None:
    if phase == "start":
        _GC["t0"] = time.perf_counter()
    else:
        _GC["s"] += time.perf_counter() - _GC["t0"]
        _GC["gen"] = max(_GC["gen"], info.get("generation", -1))


class Steps:
    """Times each step; with ``--step-log``, prints its STEPLOG line."""

    def __init__(self, args: argparse.Namespace, system: str) -> None:
        self.args, self.system = args, system

    def start(self) -> None:
        self.t0, self.c0 = time.perf_counter(), time.process_time()
        self.f0 = _faults() if self.args.trace else 0
        _GC["s"], _GC["gen"] = 0.0, -1
        self.phases: dict[str, float] = {}

    def mark(self, phase: str) -> None:
        """``--trace``: the end of one of the step's phases, in seconds from its start (in its STEPLOG line)."""
        if self.args.trace:
            self.phases[phase] = round(time.perf_counter() - self.t0, 6)

    def done(self, step: int, size: int, rank: int, follows: bool = False) -> None:
        wall, cpu = time.perf_counter() - self.t0, time.process_time() - self.c0
        if self.args.step_log:
            extra = {f"phase {k}": v for k, v in self.phases.items()}  # flat: common.parse reads no nesting
            if self.args.trace:
                extra["faults"] = _faults() - self.f0  # the step's page faults: fresh memory costs a step ~1 ms/4 MB
                extra["gc"], extra["gc gen"] = round(_GC["s"], 6), _GC["gen"]  # Python's collector in the step
            print("STEPLOG " + json.dumps({"system": self.system, "step": step, "t": time.time(), "size": size,
                                          "rank": rank, "pid": os.getpid(), "dt": round(wall, 6),
                                          "cpu": round(cpu, 6), "following": follows, **extra}),
                  flush=True)


def run_elastic(args: argparse.Namespace) -> None:
    import cloud_elastic.torch as hvd

    if args.trace:
        import gc

        from admission_trace import install

        install()
        gc.callbacks.append(_gc_timer)
    hvd.init()
    model, opt_cls, opt_kw = build(args)
    optimizer = hvd.DistributedOptimizer(opt_cls(model.parameters(), **opt_kw), named_parameters=model.named_parameters())
    add_state(optimizer, args)
    state = hvd.elastic.TorchState(model, optimizer, step=0)
    steps = Steps(args, "elastic")
    # CE_WORKLOAD_SLOW=HOST=SECONDS: the worker on HOST computes that much longer per step (a slow instance).
    slow_host, _, slow = os.environ.get("CE_WORKLOAD_SLOW", "").partition("=")
    slow_s = float(slow) if slow and os.environ.get("CLOUD_ELASTIC_HOSTNAME") == slow_host else 0.0

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        while state.step < args.steps:
            steps.start()
            if args.device_s:
                # Before the backward pass that launches the gradients' allreduce, so that the collective waits
                # for every peer's device time, as it waits for their last bucket on a GPU: after it, the sleep
                # would hide a late peer. As a GPU's kernels would, it loads no CPU.
                time.sleep(args.device_s)
            steps.mark("device")
            x, y = batch(args, state.step, hvd.rank())
            optimizer.zero_grad()
            F.mse_loss(model(x), y).backward()
            steps.mark("backward")
            if slow_s:
                time.sleep(slow_s)
            optimizer.step()
            steps.mark("optimizer step")
            change_state(optimizer, state.step)
            state.step += 1
            if state.step % args.commit_every == 0:
                try:
                    state.commit()
                except hvd.HostsUpdatedInterrupt:
                    # The step completed and its commit is kept: log it, or the gap to the first step
                    # at the new size would count a step of work as stall.
                    steps.mark("commit")
                    steps.done(state.step, hvd.size(), hvd.rank(), following())
                    raise
            steps.mark("commit")
            steps.done(state.step, hvd.size(), hvd.rank(), following())

    train(state)


def run_ddp(args: argparse.Namespace, checkpoints: bool) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    # torch's default collective timeout (30 min) unless given: nothing else in torchrun notices a silent peer.
    dist.init_process_group("gloo", **({"timeout": timedelta(seconds=args.pg_timeout_s)} if args.pg_timeout_s else {}))
    rank, size = dist.get_rank(), dist.get_world_size()
    model, opt_cls, opt_kw = build(args)
    model = DistributedDataParallel(model)
    optimizer = opt_cls(model.parameters(), **opt_kw)
    step = 0
    path = Path(args.checkpoint_dir) / "checkpoint.pt" if checkpoints else None
    if path is not None and path.exists():
        # Every worker of the new group reads rank 0's last checkpoint (torchrun restarts them all).
        saved = torch.load(path, weights_only=True)
        model.module.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        step = saved["step"]
        if rank == 0:
            print(f"RESUMED {json.dumps({'step': step, 't': time.time(), 'size': size})}", flush=True)
    steps = Steps(args, "torchrun-elastic" if checkpoints else "ddp")
    while step < args.steps:
        steps.start()
        x, y = batch(args, step, rank)
        optimizer.zero_grad()
        F.mse_loss(model(x), y).backward()
        optimizer.step()
        step += 1
        if path is not None and step % args.checkpoint_every == 0 and rank == 0:
            tmp = path.with_suffix(".tmp")
            torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, tmp)
            os.replace(tmp, path)  # atomic: a kill mid-save leaves the previous checkpoint
        steps.done(step, size, rank)
    dist.destroy_process_group()


def run_torchft_worker(args: argparse.Namespace) -> None:
    from torch.distributed import TCPStore
    from torchft import DistributedDataParallel, Manager, Optimizer, ProcessGroupGloo

    # One replica group of one worker: its own store, rank 0 of 1.
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    model, opt_cls, opt_kw = build(args)
    inner = opt_cls(model.parameters(), **opt_kw)
    add_state(inner, args)

    def state_dict() -> dict:
        return {"model": model.state_dict(), "optimizer": inner.state_dict()}

    def load_state_dict(sd: dict) -> None:
        model.load_state_dict(sd["model"])
        inner.load_state_dict(sd["optimizer"])

    timeout = timedelta(seconds=args.pg_timeout_s or 10)
    manager = Manager(
        pg=ProcessGroupGloo(timeout=timeout), min_replica_size=1,
        load_state_dict=load_state_dict, state_dict=state_dict,
        replica_id=f"replica_{args.replica_id}", store_addr="127.0.0.1", store_port=store.port, rank=0,
        world_size=1, lighthouse_addr=args.lighthouse, timeout=timeout,
    )
    # torchft 0.2.0's DistributedDataParallel comm hook does `assert fut._fut` after a collective that
    # failed by timeout (torchft/ddp.py:_comm_hook), so a silent peer crashes the survivors; the manual
    # path leaves the error to the Manager, which discards the step as it does for a dead peer.
    ddp = model if args.torchft_manual_allreduce else DistributedDataParallel(manager, model)
    params = list(model.parameters())
    optimizer = Optimizer(manager, inner)
    steps = Steps(args, "torchft")
    while manager.current_step() < args.steps:
        steps.start()
        before = manager.current_step()
        x, y = batch(args, before, args.replica_id)
        optimizer.zero_grad()
        F.mse_loss(ddp(x), y).backward()
        if args.torchft_manual_allreduce:
            flat = torch.cat([p.grad.reshape(-1) for p in params])
            manager.allreduce(flat).wait()  # averages; on an error the step is discarded at commit
            offset = 0
            for p in params:
                p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
        optimizer.step()
        if manager.current_step() > before:  # a committed step (a failed one is discarded)
            steps.done(manager.current_step(), manager.num_participants(), args.replica_id)
    manager.shutdown()


def run_torchft(args: argparse.Namespace, argv: list[str]) -> None:
    """The Lighthouse in this process, and the replica groups as children."""
    from torchft._torchft import LighthouseServer

    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=1, join_timeout_ms=args.lighthouse_join_ms,
                                  heartbeat_timeout_ms=args.lighthouse_heartbeat_ms,
                                  quorum_tick_ms=args.lighthouse_tick_ms)
    rest = [a for a in argv if a != "torchft"]
    children = [
        subprocess.Popen([sys.executable, __file__, "torchft-worker", *rest, "--replica-id", str(i),
                          "--lighthouse", lighthouse.address()], env=dict(os.environ, OMP_NUM_THREADS="1", RUST_LOG=os.environ.get("RUST_LOG", "warn")))
        for i in range(args.replicas)
    ]
    print(f"TORCHFT {json.dumps({'lighthouse': lighthouse.address(), 'pids': [c.pid for c in children]})}", flush=True)
    codes = [c.wait() for c in children]
    lighthouse.shutdown()
    sys.exit(max(codes))


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    if args.system == "elastic":
        run_elastic(args)
    elif args.system in ("ddp", "torchrun-elastic"):
        run_ddp(args, checkpoints=args.system == "torchrun-elastic")
    elif args.system == "torchft":
        run_torchft(args, argv)
    else:
        run_torchft_worker(args)


if __name__ == "__main__":
    main(sys.argv[1:])
