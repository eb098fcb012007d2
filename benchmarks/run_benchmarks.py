"""cloud-elastic benchmarks; results go to docs/benchmarks.md.

    .venv/bin/python benchmarks/run_benchmarks.py [--quick]

1. Step time of examples/torch_synthetic.py under ``cloud-elastic run``,
   committing every step, against the same model under plain torch DDP
   (launched with torchrun) on the same host; also the copying commit and
   no commits, for a breakdown. All variants run at once in round-robin
   slices (SIGSTOP/SIGCONT), so machine noise hits them alike; ratios are
   taken within each round. Target: ratio <= 1.10.
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
sys.path.insert(0, str(REPO))
from cloud_elastic.worker.memory import MMAP_THRESHOLD_BYTES, TRIM_THRESHOLD_BYTES  # noqa: E402
EXAMPLE = str(REPO / "examples" / "torch_synthetic.py")
MODEL = ["--features", "256", "--hidden", "1024", "--layers", "4", "--batch-size", "64"]
#: The same model with 4x the samples per step: same state to keep, 4x the compute.
MODEL_BATCH_256 = MODEL[:-1] + ["256"]
PY = sys.executable


ELASTIC_CMD = [PY, "-m", "cloud_elastic.cli", "run", "-np", "2", "-H", "127.0.0.1:2",
               # Paused for the other jobs' slices (~6 s): longer than the default 5 s of silence.
               "--heartbeat-timeout", "60", PY, EXAMPLE]
DDP_CMD = [PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", EXAMPLE]
TUNED_MALLOC = {"MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD_BYTES), "MALLOC_TRIM_THRESHOLD_": str(TRIM_THRESHOLD_BYTES)}


def variants_for(model: list[str], steps: int) -> dict[str, tuple[list[str], dict[str, str]]]:
    """name -> (command, extra environment) of the step-time jobs."""
    common = [*model, "--steps", str(steps), "--timing", "--log-every", "100000"]
    return {
        "elastic": (ELASTIC_CMD + common + ["--commit-every", "1"], {"CLOUD_ELASTIC_ZERO_COPY_COMMIT": "1"}),
        "copying": (ELASTIC_CMD + common + ["--commit-every", "1"], {"CLOUD_ELASTIC_ZERO_COPY_COMMIT": "0"}),
        "no_commit": (ELASTIC_CMD + common + ["--commit-every", str(10**9)], {}),
        "ddp": (DDP_CMD + common + ["--ddp"], {"OMP_NUM_THREADS": "1"}),
        # DDP given the allocator settings cloud-elastic's workers make (worker/memory.py).
        "ddp_tuned": (DDP_CMD + common + ["--ddp"], {"OMP_NUM_THREADS": "1", **TUNED_MALLOC}),
    }


class PausableJob:
    """A job whose whole process tree can be stopped and resumed (SIGSTOP/SIGCONT)."""

    def __init__(self, name: str, cmd: list[str], env: dict[str, str]) -> None:
        self.name = name
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env=dict(os.environ, **env), start_new_session=True)
        self.lines: list[str] = []
        self.windows: list[tuple[float, float]] = []  # wall-clock (resumed, paused) of every slice it ran
        self._reader = threading.Thread(target=lambda: self.lines.extend(self.proc.stdout), daemon=True)
        self._reader.start()

    def _tree(self) -> list[int]:
        children: dict[int, list[int]] = {}
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    continue
                children.setdefault(ppid, []).append(int(entry.name))
        tree, todo = [], [self.proc.pid]
        while todo:
            pid = todo.pop()
            tree.append(pid)
            todo.extend(children.get(pid, []))
        return tree

    def _signal(self, sig: int) -> None:
        # The root first, so it cannot start a child between the listing and the signal.
        for pid in [self.proc.pid] + self._tree():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def pause(self) -> None:
        self._signal(signal.SIGSTOP)

    def run_for(self, seconds: float) -> None:
        t0 = time.time()
        self._signal(signal.SIGCONT)
        try:
            self.proc.wait(seconds)
        except subprocess.TimeoutExpired:
            self.pause()
        self.windows.append((t0, time.time()))

    def done(self) -> bool:
        return self.proc.poll() is not None

    def kill(self) -> None:
        if self.done():
            return
        # The whole tree, listed while its root lives: launchers start workers in sessions of their own,
        # which a kill of the root's process group does not reach.
        self._signal(signal.SIGKILL)

    def rows(self) -> list[dict]:
        self._reader.join(30)
        rows = [json.loads(m.group(1)) for m in re.finditer(r"TIMING (\{.*\})", "".join(self.lines))]
        if self.proc.returncode != 0 or len(rows) != 2:
            raise SystemExit(f"{self.name} run failed (exit {self.proc.returncode}):\n{''.join(self.lines)[-3000:]}")
        return rows


def _exit_on_signal(signum: int, _frame: object) -> None:
    raise SystemExit(f"stopped by signal {signum}")


def interleaved_step_times(variants: dict[str, tuple[list[str], dict[str, str]]], slice_s: float, warmup: int,
                           timeout_s: float = 1200,
                           rows_out: dict[str, list[dict]] | None = None) -> dict[str, list[tuple[float, float]]]:
    """Run every variant at once, one at a time in round-robin slices; per round, each one's step time.

    All jobs live through the same minutes of the shared machine, and within
    a round (one slice of each) they run seconds apart, so drifts in the
    machine's speed hit them alike. A step counts only when it started and
    ended inside one slice of its job (a pause never falls into it) and
    comes after ``warmup`` steps. Returns name -> per round (wall, CPU)
    seconds per step: the median over the slice's steps of the slowest
    rank's wall time, and of the CPU time summed over both workers.
    ``rows_out``, if given, receives each job's TIMING rows (for extra fields).
    """
    # A SIGTERM (kill, timeout) must also run the cleanup below, or the paused jobs stay behind, stopped.
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _exit_on_signal) if main else None
    jobs = [PausableJob(name, cmd, env) for name, (cmd, env) in variants.items()]
    deadline = time.monotonic() + timeout_s
    try:
        for job in jobs:
            job.pause()
        while not all(job.done() for job in jobs):
            if time.monotonic() > deadline:
                raise SystemExit("interleaved step-time jobs did not finish in time")
            for job in jobs:
                if not job.done():
                    job.run_for(slice_s)
    finally:
        for job in jobs:
            job.kill()
        if main:
            signal.signal(signal.SIGTERM, previous)
    per_round: dict[str, list[tuple[float, float]]] = {}
    for job in jobs:
        rows = job.rows()
        if rows_out is not None:
            rows_out[job.name] = rows
        rounds = []
        for t0, t1 in job.windows:
            walls, cpus = [], []
            for row in rows:
                kept = [(w, c) for i, (e, w, c) in enumerate(zip(row["end"], row["wall_s"], row["cpu_s"]))
                        if i >= warmup and e - w >= t0 and e <= t1]
                walls.append([w for w, _ in kept])
                cpus.append([c for _, c in kept])
            if min(len(w) for w in walls) >= 5:
                rounds.append((max(statistics.median(w) for w in walls), sum(statistics.median(c) for c in cpus)))
            else:
                rounds.append((float("nan"), float("nan")))
        per_round[job.name] = rounds
    return per_round


def round_ratios(per_round: dict[str, list[tuple[float, float]]], name: str, base: str = "ddp",
                 which: int = 0) -> list[float]:
    """Per round in which both ran steady steps: ``name``'s step time / ``base``'s."""
    return [a[which] / b[which] for a, b in zip(per_round[name], per_round[base])
            if a[which] == a[which] and b[which] == b[which]]


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
    steps, warmup, cycles = (160, 40, 2) if args.quick else (700, 100, 8)

    # All four variants live through the same minutes, in round-robin slices (see
    # interleaved_step_times); ratios are taken within each round, then the median.
    per_round = interleaved_step_times(variants_for(MODEL, steps), slice_s=1.5, warmup=warmup)
    ratio_rounds = {n: round_ratios(per_round, n) for n in ("elastic", "copying", "no_commit")}
    vs_tuned = round_ratios(per_round, "elastic", base="ddp_tuned")
    ddp_tuned = round_ratios(per_round, "ddp_tuned")
    cpu_rounds = {n: round_ratios(per_round, n, which=1) for n in ("elastic", "copying", "no_commit")}
    ms = {n: statistics.median(w for w, _ in rounds if w == w) * 1e3 for n, rounds in per_round.items()}
    print(f"step time (ms): {ms}", flush=True)

    # How the overhead scales: the same model and state with 4x the compute per step.
    big_variants = {n: v for n, v in variants_for(MODEL_BATCH_256, steps // 2).items() if n in ("elastic", "copying", "ddp")}
    big_rounds = interleaved_step_times(big_variants, slice_s=2.0, warmup=warmup // 2)
    big_ratio = {n: statistics.median(round_ratios(big_rounds, n)) for n in ("elastic", "copying")}
    big_ddp_ms = statistics.median(w for w, _ in big_rounds["ddp"] if w == w) * 1e3
    recoveries, stalls, normal = measure_recovery_and_stall(cycles)
    print(f"recovery {recoveries}\nstalls {stalls}", flush=True)

    med = {n: statistics.median(r) for n, r in ratio_rounds.items()}
    cpu_med = {n: statistics.median(r) for n, r in cpu_rounds.items()}
    q = {n: (pct(r, 0.25), pct(r, 0.75)) for n, r in ratio_rounds.items()}
    rec95, stall95 = pct(recoveries, 0.95), pct(stalls, 0.95)
    verdict = lambda ok: "meets target" if ok else "MISSES target"  # noqa: E731
    rounds_n = len(ratio_rounds["elastic"])
    report = f"""# Benchmarks

Measured {datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')} by `benchmarks/run_benchmarks.py`
{'(--quick) ' if args.quick else ''}on {machine()}.

Model: `examples/torch_synthetic.py {' '.join(MODEL)}` (an MLP of
4 hidden layers of width 1024, about 3.4 M parameters), 2 workers on one host for the
step-time comparison, 3 workers on three loopback "hosts" for recovery and scale-up.

| measurement | result | target | |
|---|---|---|---|
| step time, cloud-elastic (commit every step) / plain DDP | **{med['elastic']:.3f}×** (middle half of {rounds_n} rounds: {q['elastic'][0]:.3f}–{q['elastic'][1]:.3f}) | ≤ 1.10× | {verdict(med['elastic'] <= 1.10)} |
| same with the copying commit (`CLOUD_ELASTIC_ZERO_COPY_COMMIT=0`; what `foreach`/`fused` settings and optimizers without an out-of-place update get) / plain DDP | {med['copying']:.3f}× ({q['copying'][0]:.3f}–{q['copying'][1]:.3f}) | (breakdown) | |
| same, never committing (the optimizer path alone) / plain DDP | {med['no_commit']:.3f}× ({q['no_commit'][0]:.3f}–{q['no_commit'][1]:.3f}) | (breakdown) | |
| cloud-elastic (commit every step) / DDP given the same allocator settings (`MALLOC_MMAP_THRESHOLD_`, `MALLOC_TRIM_THRESHOLD_`; see below) | {statistics.median(vs_tuned):.3f}× ({pct(vs_tuned, 0.25):.3f}–{pct(vs_tuned, 0.75):.3f}); that DDP / plain DDP: {statistics.median(ddp_tuned):.3f}× | (breakdown) | |
| CPU time per step / plain DDP (cross-check immune to CPU stolen by other VMs): commit every step, copying commit, never committing | {cpu_med['elastic']:.3f}×, {cpu_med['copying']:.3f}×, {cpu_med['no_commit']:.3f}× | | |
| the same at batch size 256 (same state to keep, 4× the compute per step): commit every step, copying commit / plain DDP | {big_ratio['elastic']:.3f}×, {big_ratio['copying']:.3f}× (DDP step {big_ddp_ms:.1f} ms) | | |
| recovery: `kill -9` → survivors' next completed step | p50 {statistics.median(recoveries):.3f} s, **p95 {rec95:.3f} s**, max {max(recoveries):.3f} s over {len(recoveries)} kills | p95 ≤ 1 s | {verdict(rec95 <= 1.0)} |
| scale-up stall of running workers (longest step gap − normal step) | p50 {statistics.median(stalls):.3f} s, **p95 {stall95:.3f} s**, max {max(stalls):.3f} s over {len(stalls)} admissions | ≤ 1 s | {verdict(stall95 <= 1.0)} |

Median step times over the rounds (slowest rank): cloud-elastic {ms['elastic']:.2f} ms, copying
commit {ms['copying']:.2f} ms, never committing {ms['no_commit']:.2f} ms, DDP {ms['ddp']:.2f} ms,
DDP with the allocator settings {ms['ddp_tuned']:.2f} ms.
A normal step in the 3-worker job took {normal*1e3:.1f} ms.

Reading the step-time rows: a commit must keep the parameters and the momentum (about
27 MB for this model) until the next commit. The generic way copies them before the next
update overwrites them, an extra read and write of the whole state per step (the "copying
commit" row). For `torch.optim.SGD` (and Adam, AdamW, Adagrad, RMSprop: see "Commit cost per optimizer") the update after a commit runs out of place instead
(`cloud_elastic/worker/zerocopy.py`): each tensor trades storage with its snapshot buffer
and the update writes the new values into the spare one, bitwise identical to
`SGD.step()`. That costs no copy, but the update writes into memory that is not in cache
(the spare buffers were last touched a step ago), which the CPU reads before writing, so
`step()` runs it bucket by bucket as each bucket's allreduce completes, overlapping the
allreduces still in flight. The "never committing"
row is below DDP because `DistributedOptimizer` hands the averaged gradients back as views
of their bucket, where DDP copies every gradient into its buckets and back (when this table
was measured, gradients of 1 MiB or more were also reduced alone, in place; they are now
packed as DDP packs them, see "Commit cost per optimizer").

Workers also fix glibc's malloc thresholds at `init()` (`cloud_elastic/worker/memory.py`):
otherwise the gradients a step frees can be handed back to the OS and faulted back in,
zero-filled, by the next backward, thousands of page faults per step in some runs and
none in others, depending on where the blocks happen to lie. That was the largest single
source of run-to-run noise here. The row "DDP given the same allocator settings" shows
how much of the comparison is this setting rather than the commit. This model is a hard case on
purpose: 3.4 M parameters for a batch of 64, so the state to keep is large next to the
compute of a step.

How each number is taken:
- *Side by side*: the step-time variants (commit every step, copying commit, never
  committing, DDP, DDP with the allocator settings) run as five jobs at once, but only
  one runs at a time: the benchmark stops every process of the others (SIGSTOP) and
  gives each job 1.5 s slices in turn
  (SIGCONT). One round is one slice of each job; a round's ratio divides step times
  measured seconds apart, so slow drifts in this shared machine's speed (run-to-run
  differences of ±20 % were seen when the jobs ran one after another) hit both sides
  alike. A step counts only when it started and ended inside one slice of its job and
  comes after the warm-up; the row reports the median over rounds of the per-round
  ratio, and the middle half of the rounds. cloud-elastic runs here with
  `--heartbeat-timeout 60`, since a paused job's driver and workers are silent for up to
  ~6 s, longer than the default timeout.
- *CPU time*: `time.process_time()` around the same loop body (all threads of a worker,
  Gloo's included), summed over both workers. CPU time does not count time stolen by
  other tenants of the VM, so its ratios show whether a wall-time ratio is signal or noise.
  Work done while a worker would otherwise wait for the allreduce (the bucket-by-bucket
  update, the copying commit's copies) counts in CPU time but not in step time, so a
  commit's CPU ratio is higher than its wall ratio: the commit is hidden, not free.
- *Step time*: both jobs time the same loop body (batch generation, forward, backward,
  optimizer step; cloud-elastic also commits: it keeps the parameters and momentum as
  described above and checks for membership changes, a flag that rides on the gradient
  allreduce). DDP is started by `torchrun --standalone --nproc-per-node 2`, cloud-elastic
  by `cloud-elastic run -np 2 -H 127.0.0.1:2`. Both use one OpenMP thread per worker.
- *Recovery*: the benchmark sends SIGKILL to a non-zero rank and takes the time stamp of
  rank 0's first completed step at the smaller size. Gloo sees a killed peer at once;
  the survivors restore their last commit, re-form at the next round and sync from rank 0.
- *Scale-up stall*: the killed slot's cooldown is 1 s, after which the driver starts a
  new worker; it imports torch and reaches rendezvous while the others keep training,
  then they are interrupted at a commit. The stall is the longest gap between rank 0's
  steps around the admission minus the normal step time.
"""
    # Sections other benchmarks write ("## ..." headings: commit cost per optimizer, peers) are kept.
    out = Path(args.out)
    previous = out.read_text() if out.exists() else ""
    kept = previous[previous.index("\n## ") + 1:] if "\n## " in previous else ""
    out.write_text(report + ("\n" + kept if kept else ""))
    print(report)


if __name__ == "__main__":
    main()
