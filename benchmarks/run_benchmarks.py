"""cloud-elastic benchmarks; results go to docs/benchmarks.md.

    .venv/bin/python benchmarks/run_benchmarks.py [--quick]

1. Step time of examples/torch_synthetic.py under ``cloud-elastic run``,
   committing every step, against the same model under plain torch DDP
   (launched with torchrun) on the same host, runs interleaved A/B/A/B so
   machine noise hits both alike. Target: ratio <= 1.10.
2. Recovery: time from ``kill -9`` of a worker to the survivors' next
   completed step (rank 0's step log). Target: p95 <= 1 s.
3. Scale-up stall: when a new worker is admitted, how much longer than a
   normal step the running workers' longest step gap is. Target: <= 1 s.

These are measurements, not tests: the machine is shared and noisy, so
only ratios measured side by side and percentiles over repeats are reported.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = str(REPO / "examples" / "torch_synthetic.py")
MODEL = ["--features", "256", "--hidden", "1024", "--layers", "4", "--batch-size", "64"]
PY = sys.executable


def run_elastic_timing(steps: int, commit_every: int = 1) -> float:
    out = subprocess.run(
        [PY, "-m", "cloud_elastic.cli", "run", "-np", "2", "-H", "127.0.0.1:2", PY, EXAMPLE, *MODEL,
         "--steps", str(steps), "--commit-every", str(commit_every), "--timing", "--log-every", "100000"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )
    return _median_of_ranks(out.stdout, out.returncode, "elastic")


def run_ddp_timing(steps: int) -> float:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run(
        [PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", EXAMPLE, *MODEL,
         "--steps", str(steps), "--timing", "--ddp"],
        cwd=REPO, capture_output=True, text=True, timeout=600, env=env,
    )
    return _median_of_ranks(out.stdout, out.returncode, "ddp")


def _median_of_ranks(stdout: str, code: int, what: str) -> float:
    rows = [json.loads(m.group(1)) for m in re.finditer(r"TIMING (\{[^}]*\})", stdout)]
    if code != 0 or len(rows) != 2:
        raise SystemExit(f"{what} run failed (exit {code}):\n{stdout[-3000:]}")
    return max(r["median_s"] for r in rows)  # a step is as slow as its slowest rank


class ElasticJob:
    """A long-running elastic job whose rank-0 step log we follow."""

    def __init__(self) -> None:
        cmd = [
            PY, "-m", "cloud_elastic.cli", "run", "-np", "3", "--min-np", "2", "--max-np", "3",
            "-H", "127.0.0.1:1,127.0.0.2:1,127.0.0.3:1", "--blacklist-cooldown-range", "1", "1",
            PY, EXAMPLE, *MODEL, "--steps", "1000000", "--step-log", "--log-every", "100000",
        ]
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self.steps: list[dict] = []
        self.job_id: str | None = None
        self._cond = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode(errors="replace")
            with self._cond:
                m = re.search(r"job (\w+): driver at", line)
                if m:
                    self.job_id = m.group(1)
                m = re.search(r"STEPLOG (\{.*\})", line)
                if m:
                    self.steps.append(json.loads(m.group(1)))
                self._cond.notify_all()

    def wait(self, predicate, timeout: float = 120.0):
        deadline = time.monotonic() + timeout
        with self._cond:
            while not predicate():
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("elastic benchmark job stopped or stalled")
                self._cond.wait(0.5)

    def worker_pid(self, host: str) -> int:
        want = [f"CLOUD_ELASTIC_JOB_ID={self.job_id}".encode(), f"CLOUD_ELASTIC_HOSTNAME={host}".encode()]
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    env = (entry / "environ").read_bytes().split(b"\0")
                except OSError:
                    continue
                if all(w in env for w in want):
                    return int(entry.name)
        raise SystemExit(f"no worker on {host}")

    def stop(self) -> None:
        os.killpg(self.proc.pid, signal.SIGTERM)
        self.proc.wait(60)


def measure_recovery_and_stall(cycles: int) -> tuple[list[float], list[float], float]:
    job = ElasticJob()
    recoveries, stalls = [], []
    try:
        job.wait(lambda: len([s for s in job.steps if s["size"] == 3]) >= 30, timeout=180)
        normal = statistics.median(b["t"] - a["t"] for a, b in zip(job.steps[5:], job.steps[6:]) if b["size"] == 3)
        for i in range(cycles):
            host = "127.0.0.3" if i % 2 == 0 else "127.0.0.2"
            pid = job.worker_pid(host)
            mark = len(job.steps)
            t_kill = time.time()
            os.kill(pid, signal.SIGKILL)
            job.wait(lambda: any(s["size"] == 2 for s in job.steps[mark:]))
            first = next(s for s in job.steps[mark:] if s["size"] == 2)
            recoveries.append(first["t"] - t_kill)
            # The slot comes back after a 1 s cooldown; a fresh worker starts and is admitted.
            job.wait(lambda: len([s for s in job.steps[mark:] if s["size"] == 3]) >= 10, timeout=180)
            seq = job.steps[mark:]
            j = next(k for k, s in enumerate(seq) if s["size"] == 3)
            stalls.append(max(0.0, seq[j]["t"] - seq[j - 1]["t"] - normal))
    finally:
        job.stop()
    return recoveries, stalls, normal


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(round(q * len(ordered) + 0.5)) - 1))]


def machine() -> str:
    cpu = "unknown CPU"
    try:
        cpu = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    import torch

    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (f"{os.cpu_count()} cores ({cpu}), {mem:.0f} GiB RAM, no GPU; Python {platform.python_version()}, "
            f"torch {torch.__version__}, Gloo on loopback; shared machine, other jobs may run")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer repeats (a smoke run)")
    ap.add_argument("--out", default=str(REPO / "docs" / "benchmarks.md"))
    args = ap.parse_args()
    reps, steps, cycles = (1, 60, 2) if args.quick else (3, 200, 8)

    elastic, no_commit, ddp = [], [], []
    for _ in range(reps):
        elastic.append(run_elastic_timing(steps))
        no_commit.append(run_elastic_timing(steps, commit_every=10**9))
        ddp.append(run_ddp_timing(steps))
        print(f"step time: elastic {elastic[-1]*1e3:.2f} ms, without commits {no_commit[-1]*1e3:.2f} ms, "
              f"ddp {ddp[-1]*1e3:.2f} ms", flush=True)
    ratios = [e / d for e, d in zip(elastic, ddp)]
    ratios_nc = [e / d for e, d in zip(no_commit, ddp)]
    recoveries, stalls, normal = measure_recovery_and_stall(cycles)
    print(f"recovery {recoveries}\nstalls {stalls}", flush=True)

    ratio = statistics.median(ratios)
    rec95, stall95 = pct(recoveries, 0.95), pct(stalls, 0.95)
    verdict = lambda ok: "meets target" if ok else "MISSES target"  # noqa: E731
    report = f"""# Benchmarks

Measured {datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')} by `benchmarks/run_benchmarks.py`
{'(--quick) ' if args.quick else ''}on {machine()}.

Model: `examples/torch_synthetic.py {' '.join(MODEL)}` (an MLP of
{4} hidden layers of width 1024, about 3.4 M parameters), 2 workers on one host for the
step-time comparison, 3 workers on three loopback "hosts" for recovery and scale-up.

| measurement | result | target | |
|---|---|---|---|
| step time, cloud-elastic (commit every step) / plain DDP | **{ratio:.3f}×** (per pair: {', '.join(f'{r:.3f}' for r in ratios)}) | ≤ 1.10× | {verdict(ratio <= 1.10)} |
| same, never committing (the optimizer path alone) / plain DDP | {statistics.median(ratios_nc):.3f}× (per pair: {', '.join(f'{r:.3f}' for r in ratios_nc)}) | (breakdown) | |
| recovery: `kill -9` → survivors' next completed step | p50 {statistics.median(recoveries):.3f} s, **p95 {rec95:.3f} s**, max {max(recoveries):.3f} s over {len(recoveries)} kills | p95 ≤ 1 s | {verdict(rec95 <= 1.0)} |
| scale-up stall of running workers (longest step gap − normal step) | p50 {statistics.median(stalls):.3f} s, **p95 {stall95:.3f} s**, max {max(stalls):.3f} s over {len(stalls)} admissions | ≤ 1 s | {verdict(stall95 <= 1.0)} |

Step times (median over steps after warm-up, slowest rank): cloud-elastic
{', '.join(f'{e*1e3:.2f}' for e in elastic)} ms; never committing {', '.join(f'{e*1e3:.2f}' for e in no_commit)} ms;
DDP {', '.join(f'{d*1e3:.2f}' for d in ddp)} ms; runs interleaved. A normal step in the 3-worker job took
{normal*1e3:.1f} ms.

Reading the step-time rows: committing every step copies the parameters and the momentum
buffers (about 27 MB for this model) once per step. On this machine a large copy runs at
about 5 GB/s on one core and both cores are busy with the two workers and Gloo's loopback
transport, so the copy (queued to overlap the gradient allreduce) costs roughly 5 ms of a
~60 ms step and cannot be hidden; that is the gap between the two rows. On GPUs the same
copy is device memory to device memory, orders of magnitude faster. Committing every few
steps, as Horovod's documentation suggests, makes the cost proportionally smaller.

How each number is taken:
- *Step time*: both runs time the same loop body (batch generation, forward, backward,
  optimizer step; cloud-elastic also commits: a copy of parameters and momentum into
  reused buffers plus the membership check, which rides on the gradient allreduce).
  DDP is started by `torchrun --standalone --nproc-per-node 2`, cloud-elastic by
  `cloud-elastic run -np 2 -H 127.0.0.1:2`. Both use one OpenMP thread per worker.
- *Recovery*: the benchmark sends SIGKILL to a non-zero rank and takes the time stamp of
  rank 0's first completed step at the smaller size. Gloo sees a killed peer at once;
  the survivors restore their last commit, re-form at the next round and sync from rank 0.
- *Scale-up stall*: the killed slot's cooldown is 1 s, after which the driver starts a
  new worker; it imports torch and reaches rendezvous while the others keep training,
  then they are interrupted at a commit. The stall is the longest gap between rank 0's
  steps around the admission minus the normal step time.
"""
    Path(args.out).write_text(report)
    print(report)


if __name__ == "__main__":
    main()
