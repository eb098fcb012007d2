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
   rank's step, and ratios to DDP are taken within a round.
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
from datetime import datetime, timezone
from pathlib import Path

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
def step_time_variants(ckpt_root: str) -> dict[str, tuple[list[str], dict[str, str]]]:
    common = [*MODEL, "--step-log"]
    out: dict[str, tuple[list[str], dict[str, str]]] = {
        "ddp": ([PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", WORKLOAD, "ddp", *common], {}),
        "cloud-elastic, commit every step": (elastic_cmd(2, "127.0.0.1:2", [*common, "--commit-every", "1"], 60), {}),
        "cloud-elastic, commit every 10": (elastic_cmd(2, "127.0.0.1:2", [*common, "--commit-every", "10"], 60), {}),
        "torchft": ([PY, WORKLOAD, "torchft", "--replicas", "2", *common, "--lighthouse-heartbeat-ms", "600000"], {}),
        "torchft, 10 ms quorum tick": ([PY, WORKLOAD, "torchft", "--replicas", "2", *common,
                                        "--lighthouse-heartbeat-ms", "600000", "--lighthouse-tick-ms", "10"], {}),
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


def interleaved(variants: dict[str, tuple[list[str], dict[str, str]]], rounds: int, slice_s: float,
                warmup: int) -> dict[str, list[float]]:
    """name -> per round, the median step of the slowest rank within the round's slice (nan if too few)."""
    jobs = [Job(name, cmd, {**QUIET, **env}) for name, (cmd, env) in variants.items()]
    try:
        for job in jobs:
            job.pause()
        # Start-up (imports, rendezvous) in slices too, but not measured.
        for job in jobs:
            deadline = time.monotonic() + 180
            while len(steplogs(job.lines)) < 2 * warmup and time.monotonic() < deadline and not job.done():
                job.run_for(2.0)
        for job in jobs:
            job.windows.clear()
        for _ in range(rounds):
            for job in jobs:
                job.run_for(slice_s)
    finally:
        for job in jobs:
            job.kill()
    out = {}
    for job in jobs:
        logs = steplogs(job.lines)
        per_round = []
        for t0, t1 in job.windows:
            by_rank: dict[int, list[float]] = {}
            for e in logs:
                if e["t"] - e["dt"] >= t0 and e["t"] <= t1:
                    by_rank.setdefault(e["rank"], []).append(e["dt"])
            ok = len(by_rank) == 2 and min(len(v) for v in by_rank.values()) >= 5
            per_round.append(max(statistics.median(v[1:]) for v in by_rank.values()) if ok else float("nan"))
        out[job.name] = per_round
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


def recovery_systems(ckpt_root: str) -> dict[str, callable]:
    """name -> factory of a fresh three-worker job, and how to recognise the first step after a kill."""
    common = [*MODEL, "--step-log"]
    hosts = "127.0.0.1:1,127.0.0.2:1,127.0.0.3:1"

    def te(every: int, monitor: float | None, last_call: float | None):
        return lambda: Procs(torchrun_elastic_cmds(3, 1, [*common, "--checkpoint-every", str(every)],
                                                   tempfile.mkdtemp(dir=ckpt_root), monitor, last_call), {})

    return {
        "cloud-elastic": lambda: Procs([elastic_cmd(3, hosts, [*common, "--commit-every", "1"])], {}),
        "torchrun elastic (monitor 0.1 s, last call 1 s, checkpoint every 10)": te(10, 0.1, 1),
        "torchft (defaults)": lambda: Procs([[PY, WORKLOAD, "torchft", "--replicas", "3", *common]], {}),
        "torchft (heartbeat 1 s, tick 10 ms)": lambda: Procs([[PY, WORKLOAD, "torchft", "--replicas", "3", *common,
                                                              "--lighthouse-heartbeat-ms", "1000",
                                                              "--lighthouse-tick-ms", "10"]], {}),
    }


def one_kill(make, warm_steps: int) -> tuple[float, int]:
    job = make()
    try:
        job.wait(lambda: len({e["rank"] for e in job.logs if e["step"] >= warm_steps}) == 3, 300, "three ranks stepping")
        victim = next(e["pid"] for e in reversed(job.logs) if e["rank"] == 1)
        with job.cond:
            before_pids = {e["pid"] for e in job.logs}
        t_kill = time.time()
        os.kill(victim, signal.SIGKILL)

        def next_step():
            for e in job.logs:
                if e["t"] <= t_kill or e["pid"] == victim:
                    continue
                # A survivor's step in the new group (size 2), or the restarted group's first step (torchrun).
                if e["size"] == 2 or e["pid"] not in before_pids:
                    return e
            return None

        nxt = job.wait(next_step, 300, "the first step after the kill")
        last = max(e["step"] for e in job.logs if e["t"] <= t_kill)
        return nxt["t"] - t_kill, max(0, last - (nxt["step"] - 1))
    finally:
        job.stop()


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
    p.add_argument("--repeats", type=int, default=5, help="kills per system")
    p.add_argument("--rounds", type=int, default=8, help="step-time rounds")
    p.add_argument("--slice", type=float, default=4.0)
    p.add_argument("--quick", action="store_true", help="2 kills, 3 rounds: a smoke run")
    p.add_argument("--only", choices=["steps", "recovery"], default=None)
    p.add_argument("--out", default=str(REPO / "benchmarks" / "peers" / "results.json"))
    args = p.parse_args()
    if args.quick:
        args.repeats, args.rounds = 2, 3
    results: dict = {"when": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "machine": machine(),
                     "model": MODEL}
    if Path(args.out).exists():
        results = {**json.loads(Path(args.out).read_text()), **{k: results[k] for k in ("when", "machine", "model")}}
    with tempfile.TemporaryDirectory() as ckpt_root:
        if args.only in (None, "steps"):
            per_round = interleaved(step_time_variants(ckpt_root), args.rounds, args.slice, warmup=10)
            results["step_time"] = per_round
            print(json.dumps(per_round, indent=1), flush=True)
        if args.only in (None, "recovery"):
            rec: dict[str, dict] = {}
            for name, make in recovery_systems(ckpt_root).items():
                times, lost = [], []
                for i in range(args.repeats):
                    try:
                        t, n = one_kill(make, warm_steps=30)
                    except TimeoutError as exc:  # no recovery within the bound is a result, not a crash
                        print(f"{name}: kill {i + 1}: {str(exc).splitlines()[0]}", flush=True)
                        t, n = float("inf"), -1
                    times.append(t)
                    lost.append(n)
                    print(f"{name}: kill {i + 1}: next step after {t:.3f}s, {n} steps lost", flush=True)
                rec[name] = {"recovery_s": times, "steps_lost": lost}
            results["recovery"] = rec
    Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
