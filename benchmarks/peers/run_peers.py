"""cloud-elastic against its peers on one workload, in one run; results into docs/benchmarks.md.

    benchmarks/peers/run.sh [--repeats N] [--quick]      (installs requirements/bench.txt, then runs this)

Systems (``workload.py``): plain DDP under torchrun (the speed limit), torchrun /
TorchElastic (``--nnodes MIN:MAX``, c10d rendezvous, a disk checkpoint every N
steps; default settings and faster ones), torchft (Lighthouse + Manager, one
replica group per worker, Gloo; default settings and faster ones), cloud-elastic.

1. Steady-state step time, two workers on one host. All variants are started
   at once and run one at a time in round-robin slices (SIGSTOP/SIGCONT, as
   ``benchmarks/run_benchmarks.py`` does), so machine noise hits them alike;
   each one's step time per round is the median over its slice of the slowest
   rank's step, and ratios to DDP are taken within a round. With ``--adamw-tensors N``
   (and e.g. ``--steps-key step_time_adamw``) on workload.py's model of N small
   tensors trained with AdamW instead of the MLP.
   Model size (``--only size``): DDP and cloud-elastic committing every step, side
   by side the same way, at each of several widths of the MLP (``--sizes``).
2. ``kill -9`` of one worker of three (three loopback "hosts"): time from the
   kill to the survivors' next completed step (for torchrun: the restarted
   group's first step), and the steps lost. A fresh job per repeat.

Every measurement run holds ``flock /tmp/bench.lock`` (run.sh takes it).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from peer_results import load, record  # this folder is on sys.path when the script runs

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))
from benchmarks.run_benchmarks import PausableJob  # noqa: E402

PY = sys.executable
WORKLOAD = str(HERE / "workload.py")
MODEL = ["--features", "256", "--hidden", "1024", "--layers", "4", "--batch-size", "64"]
QUIET = {"RUST_LOG": "warn", "OMP_NUM_THREADS": "1", "LOGLEVEL": "WARNING"}
_STEPLOG = re.compile(r"STEPLOG (\{[^{}]*\})")  # workers sharing a pipe can glue lines together


def descendants(roots: list[int]) -> list[int]:
    """The roots and every process below them (torchrun starts its workers in sessions of
    their own, so killing the agent's process group leaves them running)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], list(roots)
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def kill_all(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class Job(PausableJob):
    """A step-time job whose whole tree goes at the end, not just the root's process group."""

    def kill(self) -> None:
        kill_all(descendants([self.proc.pid]))
        self.proc.wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def elastic_cmd(np_: int, hosts: str, extra: list[str], heartbeat_s: float = 5.0) -> list[str]:
    return [PY, "-m", "cloud_elastic.cli", "run", "-np", str(np_), "--min-np", "2", "--max-np", str(np_), "-H", hosts,
            "--heartbeat-timeout", str(heartbeat_s), "--blacklist-cooldown-range", "300", "300",
            PY, WORKLOAD, "elastic", *extra]


def torchrun_elastic_cmds(nodes: int, nproc: int, extra: list[str], ckpt_dir: str, monitor_s: float | None,
                          last_call_s: float | None) -> list[list[str]]:
    """One torchrun agent per node, c10d rendezvous on the first."""
    port = free_port()
    base = [PY, "-m", "torch.distributed.run", "--nnodes", f"1:{nodes}" if nodes == 1 else f"2:{nodes}",
            "--nproc-per-node", str(nproc), "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
            "--rdzv-id", f"bench{port}", "--max-restarts", "100"]
    if monitor_s is not None:
        base += ["--monitor-interval", str(monitor_s)]
    if last_call_s is not None:
        base += ["--rdzv-conf", f"last_call_timeout={last_call_s}"]
    return [base + [WORKLOAD, "torchrun-elastic", "--checkpoint-dir", ckpt_dir, *extra] for _ in range(nodes)]


# ------------------------------------------------------------------------------ step time
def step_time_variants(ckpt_root: str, model: list[str]) -> dict[str, tuple[list[str], dict[str, str]]]:
    common = [*model, "--step-log"]
    out: dict[str, tuple[list[str], dict[str, str]]] = {
        "ddp": ([PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", WORKLOAD, "ddp", *common], {}),
        "cloud-elastic, commit every step": (elastic_cmd(2, "127.0.0.1:2", [*common, "--commit-every", "1"], 60), {}),
        "cloud-elastic, commit every 10": (elastic_cmd(2, "127.0.0.1:2", [*common, "--commit-every", "10"], 60), {}),
        # Timeouts longer than a pause (the other jobs' slices): a Gloo collective or quorum call in
        # flight when paused would otherwise time out on resume and the step be discarded.
        "torchft": ([PY, WORKLOAD, "torchft", "--replicas", "2", *common, "--lighthouse-heartbeat-ms", "600000",
                     "--pg-timeout-s", "600"], {}),
        "torchft, 10 ms quorum tick": ([PY, WORKLOAD, "torchft", "--replicas", "2", *common,
                                        "--lighthouse-heartbeat-ms", "600000", "--lighthouse-tick-ms", "10",
                                        "--pg-timeout-s", "600"], {}),
    }
    for every in (10, 100):
        d = tempfile.mkdtemp(dir=ckpt_root)
        cmd = torchrun_elastic_cmds(1, 2, [*common, "--checkpoint-every", str(every)], d, None, 1)[0]
        out[f"torchrun elastic, checkpoint every {every}"] = (cmd, {})
    return out


def parse(line: str) -> list[dict]:
    out = []
    for text in _STEPLOG.findall(line):
        try:
            out.append(json.loads(text))
        except json.JSONDecodeError:  # a line cut by another worker's output
            pass
    return out


def steplogs(lines: list[str]) -> list[dict]:
    return [e for line in lines for e in parse(line)]


def tree_cpu_s(pids: list[int]) -> float:
    """CPU seconds (user + system) used so far by these processes."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except (OSError, IndexError, ValueError):
            pass
    return total / os.sysconf("SC_CLK_TCK")


def interleaved(variants: dict[str, tuple[list[str], dict[str, str]]], rounds: int, slice_s: float,
                warmup: int, min_steps: int = 0) -> dict[str, dict[str, list[float]]]:
    """name -> {"wall": per round, the median step of the slowest rank within the round's slice;
    "cpu": per round, the median CPU seconds per step summed over both ranks (nan if too few steps);
    "paused_cpu_s": CPU its processes used outside its own slices (should be ~0: a job that runs
    while paused would slow every other one)}.

    The order of the jobs rotates by one each round, so no job always follows the same one. With
    ``min_steps``, a slice is long enough for that many of the slowest job's warm-up steps (large models)."""
    jobs = [Job(name, cmd, {**QUIET, **env}) for name, (cmd, env) in variants.items()]
    paused_cpu = {job.name: 0.0 for job in jobs}
    try:
        for job in jobs:
            job.pause()
        # Start-up (imports, rendezvous) in slices too, but not measured.
        for job in jobs:
            deadline = time.monotonic() + 180
            while len(steplogs(job.lines)) < 2 * warmup and time.monotonic() < deadline and not job.done():
                job.run_for(2.0)
        if min_steps:
            warm = [statistics.median(e["dt"] for e in steplogs(job.lines)) for job in jobs if steplogs(job.lines)]
            slice_s = max([slice_s] + [min_steps * w for w in warm])
            print(f"slices of {slice_s:.1f} s", flush=True)
        for job in jobs:
            job.windows.clear()
        last = {job.name: tree_cpu_s(descendants([job.proc.pid])) for job in jobs}
        for r in range(rounds):
            for job in jobs[r % len(jobs):] + jobs[:r % len(jobs)]:
                tree = descendants([job.proc.pid])
                before = tree_cpu_s(tree)
                paused_cpu[job.name] += before - last[job.name]
                job.run_for(slice_s)
                last[job.name] = tree_cpu_s(tree)
    finally:
        for job in jobs:
            job.kill()
    out = {}
    for job in jobs:
        logs = steplogs(job.lines)
        walls, cpus, counts = [], [], []
        for t0, t1 in job.windows:
            by_rank: dict[int, list[dict]] = {}
            for e in logs:
                if e["t"] - e["dt"] >= t0 and e["t"] <= t1:
                    by_rank.setdefault(e["rank"], []).append(e)
            counts.append(min((len(v) for v in by_rank.values()), default=0) if len(by_rank) == 2 else 0)
            ok = counts[-1] >= 5
            # The first step of a slice is dropped: caches and Gloo's peers are still waking up.
            walls.append(max(statistics.median(x["dt"] for x in v[1:]) for v in by_rank.values()) if ok else float("nan"))
            cpus.append(sum(statistics.median(x["cpu"] for x in v[1:]) for v in by_rank.values()) if ok else float("nan"))
        out[job.name] = {"wall": walls, "cpu": cpus, "paused_cpu_s": round(paused_cpu[job.name], 3)}
        print(f"{job.name}: steps per slice (fewest over ranks): {counts}", flush=True)
        if not any(counts):  # say why, instead of a silent row of n/a
            tail = [l.rstrip()[:300] for l in job.lines if "STEPLOG" not in l][-15:]
            print(f"{job.name}: no step in any slice (exit code {job.proc.poll()}); its last lines:\n  "
                  + "\n  ".join(tail), flush=True)
    return out


def with_hidden(model: list[str], hidden: int) -> list[str]:
    i = model.index("--hidden")
    return [*model[:i + 1], str(hidden), *model[i + 2:]]


def state_bytes(hidden: int) -> int:
    """Parameters + SGD momentum of the MLP at this width (float32)."""
    f, layers = int(MODEL[MODEL.index("--features") + 1]), int(MODEL[MODEL.index("--layers") + 1])
    params = f * hidden + hidden + (layers - 1) * (hidden * hidden + hidden) + hidden + 1
    return 2 * 4 * params


def model_sizes(hiddens: list[int], rounds: int, slice_s: float) -> dict[str, dict]:
    """Step time against model size: per width of the MLP, DDP and cloud-elastic committing every
    step side by side (one interleaved run per width; slices long enough for 8 steps)."""
    out = {}
    for hidden in hiddens:
        common = [*with_hidden(MODEL, hidden), "--step-log"]
        variants = {"ddp": ([PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", WORKLOAD,
                             "ddp", *common], {}),
                    "cloud-elastic, commit every step": (elastic_cmd(2, "127.0.0.1:2", [*common, "--commit-every", "1"],
                                                                     600), {})}
        print(f"model size: hidden {hidden}, state {state_bytes(hidden) / 2**20:.0f} MiB", flush=True)
        sliced = interleaved(variants, rounds, slice_s, warmup=5, min_steps=8)
        out[str(hidden)] = {"state_bytes": state_bytes(hidden), "wall": {n: v["wall"] for n, v in sliced.items()},
                            "cpu": {n: v["cpu"] for n, v in sliced.items()}}
    return out


def solo(variants: dict[str, tuple[list[str], dict[str, str]]], seconds: float, warmup: int) -> dict[str, float]:
    """name -> median step of the slowest rank, each variant run alone (one after another, no slicing):
    the sanity baseline for the sliced numbers."""
    out = {}
    for name, (cmd, env) in variants.items():
        job = Job(name, cmd, {**QUIET, **env})
        try:
            deadline = time.monotonic() + 180
            while len(steplogs(job.lines)) < 2 * warmup and time.monotonic() < deadline and not job.done():
                time.sleep(0.2)
            t0 = time.time()
            time.sleep(seconds)
            t1 = time.time()
        finally:
            job.kill()
        by_rank: dict[int, list[float]] = {}
        for e in steplogs(job.lines):
            if e["t"] - e["dt"] >= t0 and e["t"] <= t1:
                by_rank.setdefault(e["rank"], []).append(e["dt"])
        out[name] = max(statistics.median(v) for v in by_rank.values()) if len(by_rank) == 2 else float("nan")
        print(f"alone: {name}: {out[name] * 1000:.1f} ms", flush=True)
    return out


# ------------------------------------------------------------------------------ recovery
@dataclass
class Procs:
    """Processes of one job (one or several roots), their STEPLOG lines as they arrive."""

    cmds: list[list[str]]
    env: dict[str, str]
    logs: list[dict] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.cond = threading.Condition()
        self.procs = [subprocess.Popen(c, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                       env=dict(os.environ, **QUIET, **self.env), start_new_session=True)
                      for c in self.cmds]
        for p in self.procs:
            threading.Thread(target=self._read, args=(p,), daemon=True).start()

    def _read(self, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            with self.cond:
                self.lines.append(line)
                self.logs.extend(parse(line))
                self.cond.notify_all()

    def wait(self, pred, timeout: float, what: str):
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                v = pred()
                if v:
                    return v
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{what}: not within {timeout}s:\n{''.join(self.lines[-30:])}")
                self.cond.wait(0.2)

    def stop(self) -> None:
        kill_all(descendants([p.pid for p in self.procs]))
        for p in self.procs:
            p.wait()


def fault_systems(ckpt_root: str, fault: str) -> dict[str, callable]:
    """name -> factory of a fresh three-worker job (one worker per loopback "host").

    ``fault`` is "kill" (``kill -9``) or "stop" (SIGSTOP: a silent worker, as a hung host or a
    network partition looks). Each system at its defaults and at the fastest settings that
    stay correct."""
    common = [*MODEL, "--step-log"]
    hosts = "127.0.0.1:1,127.0.0.2:1,127.0.0.3:1"

    def te(every: int, monitor: float | None, last_call: float | None, extra: tuple[str, ...] = ()):
        return lambda: Procs(torchrun_elastic_cmds(3, 1, [*common, "--checkpoint-every", str(every), *extra],
                                                   tempfile.mkdtemp(dir=ckpt_root), monitor, last_call), {})

    def ft(*extra: str):
        return lambda: Procs([[PY, WORKLOAD, "torchft", "--replicas", "3", *common, *extra]], {})

    def ce(heartbeat_s: float):
        return lambda: Procs([elastic_cmd(3, hosts, [*common, "--commit-every", "1"], heartbeat_s)], {})

    fast_ft = ("--lighthouse-heartbeat-ms", "1000", "--lighthouse-tick-ms", "10")
    if fault == "kill":
        return {
            "cloud-elastic": ce(5.0),
            "torchrun elastic (monitor 0.1 s, last call 1 s, checkpoint every 10)": te(10, 0.1, 1),
            "torchft (defaults)": ft(),
            "torchft (heartbeat 1 s, tick 10 ms)": ft(*fast_ft),
            # The same without torchft.DistributedDataParallel, whose comm hook can assert on the error
            # a dead peer raises (see workload.py): gradients through Manager.allreduce.
            "torchft (heartbeat 1 s, tick 10 ms, Manager.allreduce)": ft(*fast_ft, "--torchft-manual-allreduce"),
        }
    return {
        "cloud-elastic (heartbeat timeout 5 s, the default)": ce(5.0),
        "cloud-elastic (heartbeat timeout 1 s)": ce(1.0),
        "torchrun elastic (fast settings, collective timeout 10 s)": te(10, 0.1, 1, ("--pg-timeout-s", "10")),
        # Manual allreduce: torchft's own DDP wrapper crashes the survivors on a timeout (see workload.py).
        "torchft (defaults: heartbeat 5 s, collective timeout 10 s)": ft("--torchft-manual-allreduce"),
        "torchft (heartbeat 1 s, tick 10 ms, collective timeout 2 s)": ft(*fast_ft, "--pg-timeout-s", "2",
                                                                          "--torchft-manual-allreduce"),
    }


def one_fault(make, fault: str, warm_steps: int, bound_s: float) -> tuple[float, int]:
    """Start a job, hit rank 1 with the fault once three ranks passed ``warm_steps``, and return
    (seconds from the fault to the survivors' next completed step, steps lost). TimeoutError past
    ``bound_s``. Vary ``warm_steps`` across repeats: a fault always right after a checkpoint step
    would hide what periodic checkpoints lose."""
    job = make()
    try:
        job.wait(lambda: len({e["rank"] for e in job.logs if e["step"] >= warm_steps}) == 3, 300, "three ranks stepping")
        victim = next(e["pid"] for e in reversed(job.logs) if e["rank"] == 1)
        with job.cond:
            before_pids = {e["pid"] for e in job.logs}
        t_fault = time.time()
        os.kill(victim, signal.SIGKILL if fault == "kill" else signal.SIGSTOP)

        def next_step():
            for e in job.logs:
                if e["t"] <= t_fault or e["pid"] == victim:
                    continue
                # A survivor's step in the new group (size 2), or the restarted group's first step (torchrun).
                if e["size"] == 2 or e["pid"] not in before_pids:
                    return e
            return None

        nxt = job.wait(next_step, bound_s, f"the first step after the {fault}")
        last = max(e["step"] for e in job.logs if e["t"] <= t_fault)
        return nxt["t"] - t_fault, max(0, last - (nxt["step"] - 1))
    finally:
        job.stop()  # SIGKILL: also ends a stopped worker


def faults(ckpt_root: str, fault: str, repeats: int, bound_s: float, out: dict, only: list[str] | None = None,
           quick: bool = False) -> None:
    """Every system's repeats of one fault into ``out``; a miss of the bound is recorded (inf), not fatal."""
    systems = fault_systems(ckpt_root, fault)
    if quick:  # a smoke run: each system at its first (default) settings only
        firsts = [next(n for n in systems if n.startswith(f)) for f in ("cloud-elastic", "torchrun", "torchft")]
        systems = {n: systems[n] for n in firsts}
    for name, make in systems.items():
        if only and not any(w in name for w in only):
            continue
        times, lost, misses = [], [], []
        for i in range(repeats):
            try:
                # 23, 27, 21, 25, 29, ...: the fault lands at different distances from a checkpoint every 10.
                t, n = one_fault(make, fault, warm_steps=21 + (4 * i + 2) % 10, bound_s=bound_s)
            except TimeoutError as exc:
                print(f"{name}: {fault} {i + 1}: {str(exc).splitlines()[0]}", flush=True)
                t, n = float("inf"), -1
                # What the job printed last (without step lines): why it did not step again.
                misses.append([l[:300] for l in str(exc).splitlines() if "STEPLOG" not in l][-12:])
            times.append(t)
            lost.append(n)
            print(f"{name}: {fault} {i + 1}: next step after {t:.3f}s, {n} steps lost", flush=True)
        out[name] = {"recovery_s": times, "steps_lost": lost, "bound_s": bound_s, "misses": misses}


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def machine() -> str:
    import torch

    mem = next((int(l.split()[1]) // 1024 // 1024 for l in open("/proc/meminfo") if l.startswith("MemTotal")), 0)
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    import importlib.metadata as md
    return (f"{os.cpu_count()} cores ({cpu}), {mem} GiB RAM, no GPU; Python {platform.python_version()}, "
            f"torch {torch.__version__}, torchft {md.version('torchft')}, Gloo on loopback; shared machine")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=4, help="faults per system and scenario")
    p.add_argument("--bound", type=float, default=90.0, help="seconds a system gets to step again after a fault")
    p.add_argument("--rounds", type=int, default=16, help="step-time rounds")
    p.add_argument("--slice", type=float, default=2.5)
    p.add_argument("--quick", action="store_true",
                   help="a smoke run of a few minutes: 3 rounds of 2 s, no run alone, one fault per system at its "
                        "default settings, 30 s bound")
    p.add_argument("--only", choices=["steps", "kill", "stop", "size"], action="append", default=None)
    p.add_argument("--adamw-tensors", type=int, default=0,
                   help="step time on workload.py's model of this many small tensors trained with AdamW instead of "
                        "the MLP (use with --steps-key)")
    p.add_argument("--adamw-width", type=int, default=128, help="width of each layer of the --adamw-tensors model")
    p.add_argument("--sizes", type=int, nargs="+", default=[256, 512, 1024, 2048, 4096],
                   help="model size: the MLP's hidden widths (state 2-410 MiB by default)")
    p.add_argument("--size-rounds", type=int, default=8, help="model size: rounds per width")
    p.add_argument("--variants", action="append", default=None,
                   help="step time: only the variants whose name contains this (and DDP, the base)")
    p.add_argument("--systems", action="append", default=None,
                   help="faults: only the systems whose name contains this (the others' rows are kept)")
    p.add_argument("--steps-key", default="step_time", help="results key of the step-time rows")
    p.add_argument("--out", default=None, help="default: results.json, or results-quick.json with --quick")
    args = p.parse_args()
    # A smoke run never overwrites the published numbers.
    args.out = args.out or str(HERE / ("results-quick.json" if args.quick else "results.json"))
    if args.quick:
        args.repeats, args.rounds, args.slice, args.bound = 1, 3, 2.0, 30.0
        args.sizes, args.size_rounds = [256, 1024], 2
    if args.adamw_tensors < 0 or args.adamw_tensors % 2:
        p.error("--adamw-tensors: an even number (a weight and a bias per layer)")
    model = MODEL + (["--adamw-tensors", str(args.adamw_tensors), "--features", str(args.adamw_width)]
                     if args.adamw_tensors else [])
    only = args.only or ["steps", "kill", "stop", "size"]
    out = Path(args.out)
    results = load(out)
    results.update({"machine": machine(), "model": MODEL, "quick": args.quick})

    def save(key: str, value) -> None:  # after each scenario: a later one that fails loses nothing
        record(out, results, key, value)

    with tempfile.TemporaryDirectory() as ckpt_root:
        if "steps" in only:
            def chosen() -> dict:
                every = step_time_variants(ckpt_root, model)
                return {n: v for n, v in every.items() if n == "ddp" or not args.variants
                        or any(w in n for w in args.variants)}

            key = args.steps_key
            save("workloads", {**results.get("workloads", {}), key: model})
            sliced = interleaved(chosen(), args.rounds, args.slice, warmup=10)
            save(key, {n: v["wall"] for n, v in sliced.items()})
            save(key.replace("step_time", "step_cpu"), {n: v["cpu"] for n, v in sliced.items()})
            save(key.replace("step_time", "paused_cpu_s"), {n: v["paused_cpu_s"] for n, v in sliced.items()})
            print(json.dumps(sliced, indent=1), flush=True)
            if not args.quick:
                save(key + "_alone", solo(chosen(), 8.0, warmup=10))
        if "size" in only:
            save("model_size", model_sizes(args.sizes, args.size_rounds, args.slice))
        for fault, key in (("kill", "recovery"), ("stop", "silent_loss")):
            if fault in only:
                # With --systems, the other systems' rows of an earlier run stay.
                rec: dict[str, dict] = dict(results.get(key, {})) if args.systems else {}
                faults(ckpt_root, fault, args.repeats, args.bound, rec, args.systems, args.quick)
                save(key, rec)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
