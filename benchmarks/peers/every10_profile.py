"""Where the time of a step goes, per phase, for AdamW committing every step against every 10 steps.

    flock /tmp/bench.lock python benchmarks/peers/every10_profile.py [--rounds 16] [--slice 2.5]

Starts every variant at once, each as 2 workers on one host (``cloud-elastic run -np 2``, as
``run_peers.py`` does; DDP under ``torchrun``), and runs them one at a time in round-robin
slices (SIGSTOP/SIGCONT, order rotated per round), so machine noise hits them alike. The
workers run ``workload.py``'s AdamW model (``--adamw-tensors 400 --features 128``) in
``workload.py``'s loop, timing each phase of every step (wall: ``perf_counter``; CPU: the main
thread's ``thread_time`` and the whole process's ``process_time``, Gloo's threads included;
minor page faults of the process) and printing one ``PHASE {json}`` line per step. Inside
``optimizer.step()`` the time is split by wrapping the optimizer's parts: the forced launch of
buckets, the snapshot flush/take, the waits for allreduces, and the update itself (torch's
step, or cloud-elastic's out-of-place one). Steps right after a commit are counted apart.

Variants (besides DDP and the two of the benchmark):
``every 10, copying path``: ``CLOUD_ELASTIC_ZERO_COPY_COMMIT=0``: the update after a kept
commit copies and then runs torch's own step after waiting for every allreduce;
``every 1, snapshot``: ``CLOUD_ELASTIC_COMMIT_MODE=snapshot``: every step takes the path of
commit-every-10 (kept commits, update overlapped with the allreduces).
With ``--before DIR``, also ``every 1, before`` and ``every 10, before``: the same loops with the
workers' ``cloud_elastic`` from another checkout (a before/after comparison in the same slices).

    python benchmarks/peers/every10_profile.py cprofile --commit-every 10 --steps 140

profiles, in one process (standalone), the kept commit, the step right after it and the
other steps with cProfile. ``worker`` / ``ddp-worker`` are the per-worker entry points (internal).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # workload.py, run_peers.py (not the repository: workers import cloud_elastic from PYTHONPATH)

PY = sys.executable
MODEL = ["--adamw-tensors", "400", "--features", "128", "--batch-size", "64"]
PHASES = ["batch", "zero_grad", "forward", "backward", "opt_step", "commit"]
#: Parts of a step measured by wrapping (summed over the step; some also run inside backward).
PARTS = ["launch", "flush", "take", "wait", "update", "torch_step", "extra_collectives"]


# ------------------------------------------------------------------------------------------ worker
class Clock:
    """Phase timings of one step; ``acc`` collects the wrapped parts."""

    def __init__(self) -> None:
        self.acc: dict[str, float] = {}
        self.row: dict[str, float] = {}

    def add(self, key: str, wall: float, cpu: float) -> None:
        self.acc[key] = self.acc.get(key, 0.0) + wall
        self.acc[key + "_cpu"] = self.acc.get(key + "_cpu", 0.0) + cpu

    def timed(self, key: str, fn):
        def wrapper(*a, **kw):
            t, c = time.perf_counter(), time.thread_time()
            try:
                return fn(*a, **kw)
            finally:
                self.add(key, time.perf_counter() - t, time.thread_time() - c)
        return wrapper

    def begin(self) -> None:
        self.acc, self.row = {}, {}
        self.t0 = self.t = time.perf_counter()
        self.c = time.thread_time()
        self.p0 = time.process_time()
        ru = resource.getrusage(resource.RUSAGE_SELF)
        self.flt0, self.flt = ru.ru_minflt, ru.ru_minflt
        self.csw0 = ru.ru_nvcsw + ru.ru_nivcsw
        self.wall0 = time.time()

    def mark(self, phase: str) -> None:
        t, c = time.perf_counter(), time.thread_time()
        flt = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        self.row[phase] = t - self.t
        self.row[phase + "_cpu"] = c - self.c
        self.row[phase + "_flt"] = flt - self.flt
        self.t, self.c, self.flt = t, c, flt

    def end(self) -> dict:
        ru = resource.getrusage(resource.RUSAGE_SELF)
        return {**{k: round(v, 6) for k, v in self.row.items()}, **{"p_" + k: round(v, 6) for k, v in self.acc.items()},
                "total": round(self.t - self.t0, 6), "proc_cpu": round(time.process_time() - self.p0, 6),
                "flt": ru.ru_minflt - self.flt0, "csw": ru.ru_nvcsw + ru.ru_nivcsw - self.csw0,
                "t0": self.wall0, "t1": time.time()}


def instrument(opt, ctx, clock: Clock) -> None:
    """Wrap the parts of DistributedOptimizer.step (instance attributes; the product code is unchanged)."""
    opt._ce_launch_ready = clock.timed("launch", opt._ce_launch_ready)
    ctx.wait = clock.timed("wait", ctx.wait)
    for handler in opt._ce_snapshots:
        handler.flush = clock.timed("flush", handler.flush)
        handler.take = clock.timed("take", handler.take)
    swap = opt._ce_swap_update

    def timed_swap():
        update = swap()
        return None if update is None else clock.timed("update", update)
    opt._ce_swap_update = timed_swap
    in_place = opt._ce_step_in_place
    opt._ce_step_in_place = lambda base, snaps, closure: in_place(clock.timed("torch_step", base), snaps, closure)
    group = ctx.group

    def counted_group(what):
        clock.acc["extra_collectives"] = clock.acc.get("extra_collectives", 0) + 1
        return group(what)
    ctx.group = counted_group


def path_of(row: dict) -> str:
    """Which update path the step took, from the parts that ran."""
    if row.get("p_torch_step"):
        return "in place"
    return "overlapped" if row.get("p_update") else "sync+torch"


def emit(variant: str, rank: int, step: int, after_commit: bool, path: str, row: dict) -> None:
    print("PHASE " + json.dumps({"v": variant, "rank": rank, "n": step, "after_commit": after_commit,
                                 "path": path, **row}), flush=True)


def run_worker(args: argparse.Namespace) -> None:
    import torch.nn.functional as F

    import cloud_elastic.torch as hvd
    from cloud_elastic.worker.context import get_context
    from workload import batch, build

    hvd.init()
    if hvd.rank() == 0:
        print(f"CODE {hvd.__file__}", flush=True)
    model, opt_cls, opt_kw = build(args)
    optimizer = hvd.DistributedOptimizer(opt_cls(model.parameters(), **opt_kw), named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, optimizer, step=0)
    if args.swap_only_after_commit:
        # every10_alone.py's variant: the out-of-place (zero-copy) update only when a commit's copies are pending.
        swap = optimizer._ce_swap_update
        optimizer._ce_swap_update = lambda: swap() if any(s._snap._pending for s in optimizer._ce_snapshots) else None
    clock = Clock()
    instrument(optimizer, get_context(), clock)
    committed = [False]

    @hvd.elastic.run
    def train(state) -> None:
        while state.step < args.steps:
            clock.begin()
            x, y = batch(args, state.step, hvd.rank())
            clock.mark("batch")
            optimizer.zero_grad()
            clock.mark("zero_grad")
            loss = F.mse_loss(model(x), y)
            clock.mark("forward")
            loss.backward()
            clock.mark("backward")
            optimizer.step()
            clock.mark("opt_step")
            state.step += 1
            after, committed[0] = committed[0], False
            if state.step % args.commit_every == 0:
                state.commit()
                committed[0] = True
            clock.mark("commit")
            row = clock.end()
            emit(args.variant, hvd.rank(), state.step, after, path_of(row), row)

    train(state)


def run_ddp_worker(args: argparse.Namespace) -> None:
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    from workload import batch, build

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model, opt_cls, opt_kw = build(args)
    model = DistributedDataParallel(model)
    optimizer = opt_cls(model.parameters(), **opt_kw)
    clock = Clock()
    step = 0
    while step < args.steps:
        clock.begin()
        x, y = batch(args, step, rank)
        clock.mark("batch")
        optimizer.zero_grad()
        clock.mark("zero_grad")
        loss = F.mse_loss(model(x), y)
        clock.mark("forward")
        loss.backward()  # DDP's allreduces and their wait are in here
        clock.mark("backward")
        optimizer.step()
        clock.mark("opt_step")
        step += 1
        clock.mark("commit")
        emit(args.variant, rank, step, False, "ddp", clock.end())


def run_cprofile(args: argparse.Namespace) -> None:
    """One process (standalone, rank 0 of 1): cProfile of the kept commit and of the step after it."""
    import cProfile
    import io
    import pstats

    import torch
    import torch.nn.functional as F

    import cloud_elastic.torch as hvd
    from workload import batch, build

    torch.set_num_threads(1)
    hvd.init()
    model, opt_cls, opt_kw = build(args)
    optimizer = hvd.DistributedOptimizer(opt_cls(model.parameters(), **opt_kw), named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, optimizer, step=0)
    profiles = {"commit (kept)": cProfile.Profile(), "step after a commit": cProfile.Profile(),
                "other steps": cProfile.Profile()}
    for step in range(args.steps):
        x, y = batch(args, step, 0)
        optimizer.zero_grad()
        F.mse_loss(model(x), y).backward()
        after = step % args.commit_every == 0 and step > 0
        prof = profiles["step after a commit" if after else "other steps"] if step >= 20 else None
        if prof:
            prof.enable()
        optimizer.step()
        if prof:
            prof.disable()
        state.step += 1
        if state.step % args.commit_every == 0:
            prof = profiles["commit (kept)"] if step >= 20 else None
            if prof:
                prof.enable()
            state.commit()
            if prof:
                prof.disable()
    for name, prof in profiles.items():
        out = io.StringIO()
        stats = pstats.Stats(prof, stream=out)
        print(f"\n=== {name}: calls over the run, top 14 by own time ({stats.total_tt * 1e3:.0f} ms in all)")
        stats.sort_stats("tottime").print_stats(14)
        print("\n".join(l for l in out.getvalue().splitlines() if l.strip() and not l.startswith("   Ordered")))


# ------------------------------------------------------------------------------------ orchestrator
def variants(before: str = "") -> dict[str, tuple[list[str], dict[str, str]]]:
    from run_peers import elastic_cmd

    me = str(Path(__file__).resolve())

    def elastic(name: str, every: int, env: dict[str, str], *extra: str) -> tuple[list[str], dict[str, str]]:
        cmd = elastic_cmd(2, "127.0.0.1:2", [], 60)
        cmd = cmd[: cmd.index(PY, 1)] + [PY, me, "worker", *MODEL, "--commit-every", str(every), "--variant", name,
                                         *extra]
        return cmd, env

    out = {
        "ddp": ([PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", me, "ddp-worker",
                 *MODEL, "--variant", "ddp"], {}),
        "every 1": elastic("every 1", 1, {}),
        "every 10": elastic("every 10", 10, {}),
        "every 10, copying path": elastic("every 10, copying path", 10, {"CLOUD_ELASTIC_ZERO_COPY_COMMIT": "0"}),
        "every 1, snapshot": elastic("every 1, snapshot", 1, {"CLOUD_ELASTIC_COMMIT_MODE": "snapshot"}),
        "every 10, zero-copy only after a commit": elastic("every 10, zero-copy only after a commit", 10, {},
                                                           "--swap-only-after-commit"),
    }
    if before:  # the same loops with the workers' cloud_elastic from another checkout (a before/after comparison)
        out["every 1, before"] = elastic("every 1, before", 1, {"PYTHONPATH": before})
        out["every 10, before"] = elastic("every 10, before", 10, {"PYTHONPATH": before})
    return out


def collect(jobs, warmup: int) -> dict[str, list[dict]]:
    """name -> PHASE rows that ran wholly inside one of the job's slices, the first step of each slice dropped."""
    out = {}
    for job in jobs:
        rows = []
        for line in job.lines:
            for part in line.split("PHASE ")[1:]:
                try:
                    rows.append(json.loads(part.strip()))
                except json.JSONDecodeError:
                    pass
        kept = []
        for t0, t1 in job.windows:
            inside = [r for r in rows if r["t0"] >= t0 and r["t1"] <= t1 and r["n"] > warmup]
            for rank in (0, 1):
                kept += [dict(r, slice_t0=t0) for r in inside if r["rank"] == rank][1:]
        out[job.name] = kept
    return out


def med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def table(rows_by: dict[str, list[dict]], rank: int | None, after: bool | None) -> str:
    keys = PHASES + ["total"]
    head = "| variant | steps | " + " | ".join(keys) + " | proc CPU | faults | ctx sw | " + " | ".join(PARTS) + " |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for name, rows in rows_by.items():
        sel = [r for r in rows if (rank is None or r["rank"] == rank) and (after is None or r["after_commit"] == after)]
        if not sel:
            continue
        cells = [f"{med([r.get(k, 0) for r in sel]) * 1e3:.1f} ({med([r.get(k + '_cpu', 0) for r in sel]) * 1e3:.1f})"
                 if k != "total" else f"{med([r[k] for r in sel]) * 1e3:.1f}" for k in keys]
        parts = [f"{med([r.get('p_' + k, 0) for r in sel]):.0f}" if k == "extra_collectives"
                 else f"{med([r.get('p_' + k, 0) for r in sel]) * 1e3:.1f}" for k in PARTS]
        lines.append(f"| {name} | {len(sel)} | " + " | ".join(cells)
                     + f" | {med([r['proc_cpu'] for r in sel]) * 1e3:.1f} | {med([r['flt'] for r in sel]):.0f}"
                     + f" | {med([r['csw'] for r in sel]):.0f} | " + " | ".join(parts) + " |")
    return "\n".join(lines)


def ratios(rows_by: dict[str, list[dict]]) -> str:
    """Per slice: the median step of the slower rank; per round, / DDP's; the median over rounds."""
    per_slice: dict[str, list[float]] = {}
    for name, rows in rows_by.items():
        slices: dict[float, dict[int, list[float]]] = {}
        for r in rows:
            slices.setdefault(r["slice_t0"], {}).setdefault(r["rank"], []).append(r["total"])
        per_slice[name] = [max(med(v) for v in s.values()) for _, s in sorted(slices.items()) if len(s) == 2]
    base = per_slice.get("ddp", [])
    out = []
    for name, values in per_slice.items():
        n = min(len(values), len(base))
        rs = sorted(v / b for v, b in zip(values[:n], base[:n]))
        cpu = med([r["proc_cpu"] for r in rows_by[name]]) / med([r["proc_cpu"] for r in rows_by["ddp"]])
        if rs:
            out.append(f"| {name} | {med(values) * 1e3:.1f} ms | {med(rs):.3f}x ({rs[len(rs) // 4]:.3f}-"
                       f"{rs[(3 * len(rs)) // 4]:.3f}, {n} rounds) | {cpu:.3f}x |")
    return "| variant | median step (slower rank) | / DDP per round (middle half) | process CPU / DDP |\n" \
           "|---|---|---|---|\n" + "\n".join(out)


def orchestrate(args: argparse.Namespace) -> None:
    from run_peers import QUIET, Job

    print(f"start {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC, load {os.getloadavg()}", flush=True)
    chosen = {n: v for n, v in variants(args.before).items() if not args.only or n == "ddp" or n in args.only}
    jobs = [Job(name, cmd, {**QUIET, **env}) for name, (cmd, env) in chosen.items()]
    try:
        for job in jobs:
            job.pause()
        for job in jobs:  # start-up and warm-up, in slices too
            deadline = time.monotonic() + 180
            while sum("PHASE" in l for l in job.lines) < 2 * args.warmup and time.monotonic() < deadline \
                    and not job.done():
                job.run_for(2.0)
            if job.done() or sum("PHASE" in l for l in job.lines) < 2 * args.warmup:
                raise SystemExit(f"{job.name} did not start:\n" + "".join(job.lines[-30:]))
        for job in jobs:
            job.windows.clear()
        for r in range(args.rounds):
            for job in jobs[r % len(jobs):] + jobs[:r % len(jobs)]:
                job.run_for(args.slice)
    finally:
        for job in jobs:
            job.kill()
    print(f"end {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC, load {os.getloadavg()}", flush=True)
    rows = collect(jobs, args.warmup)
    for job in jobs:
        print(f"{job.name}: " + next((l.strip()[l.find("CODE"):] for l in job.lines if "CODE " in l), "torchrun"))
    if args.dump:
        Path(args.dump).write_text(json.dumps({job.name: job.lines for job in jobs}))
    if args.raw:
        Path(args.raw).write_text(json.dumps(rows))
    print("\nStep time, sliced, ratios within a round:\n" + ratios(rows))
    print("\nPer-phase medians, ms: wall (main-thread CPU); parts summed over the step, wall ms")
    for rank in (0, 1):
        for after, what in ((False, "steps not right after a commit"), (True, "steps right after a commit")):
            print(f"\nrank {rank}, {what}:\n" + table(rows, rank, after))
    print("\npaths taken:", {n: sorted({r['path'] for r in rs}) for n, rs in rows.items()})


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("mode", nargs="?", default="run", choices=["run", "worker", "ddp-worker", "cprofile"])
    p.add_argument("--rounds", type=int, default=16)
    p.add_argument("--slice", type=float, default=2.5)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--only", action="append", default=None, help="variants (besides DDP) to run")
    p.add_argument("--raw", default="", help="write every kept PHASE row to this JSON file")
    p.add_argument("--before", default="", help="also run every 1 / every 10 with cloud_elastic from this checkout")
    p.add_argument("--dump", default="", help="write every job's output lines to this JSON file")
    # worker arguments (workload.py's)
    p.add_argument("--variant", default="")
    p.add_argument("--commit-every", type=int, default=1)
    p.add_argument("--steps", type=int, default=10**9)
    p.add_argument("--adamw-tensors", type=int, default=400)
    p.add_argument("--features", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--swap-only-after-commit", action="store_true")
    args = p.parse_args()
    if args.mode == "worker":
        run_worker(args)
    elif args.mode == "ddp-worker":
        run_ddp_worker(args)
    elif args.mode == "cprofile":
        run_cprofile(args)
    else:
        orchestrate(args)


if __name__ == "__main__":
    main()
