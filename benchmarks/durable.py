"""Durable checkpoints and driver restart: what background checkpoints cost a step, and how fast a restarted driver
resumes or adopts the job.

    .venv/bin/python benchmarks/durable.py [--quick] [--only overhead|restart|adopt] [--steps N] [--cycles N]

1. Overhead of background checkpointing on step time: the MLP of
   ``examples/torch_synthetic.py`` (committing every step) under
   ``cloud-elastic run`` with and without ``--checkpoint-dir`` (a local
   directory, ``--checkpoint-interval 10``), side by side in round-robin
   slices (``common.interleaved_step_times``). Target: <= 2 %.
   The interval is wall time and each job runs only in its own slices, so it
   checkpoints about every 5 s of its own running time: twice as often as in
   a real job, which overstates the overhead.
2. Driver restart past the grace: SIGKILL the driver mid-training, wait until
   its workers stopped, run the same command again, and time from the restart
   to the first step of the resumed job. Reported in two parts: the wait the
   restarted driver announces for the previous driver's workers, and the rest
   (start, launch, load, sync).
3. Driver restart within the grace (adoption): SIGKILL the driver, run the
   same command again one second later, and time from the restarted driver's
   start (its process spawned) to the adoption of the running workers and to
   rank 0's first step after it. The adopted workers' output went with the old
   driver, so their steps are read from the files of ``tests/integration/adopt_probe.py``.
   Target: <= 2 s to adopt.

Prints the tables and writes them into docs/benchmarks.md (``docsection``:
section ``durable`` and its glance rows).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import docsection
from common import PY, REPO, command, interleaved_step_times, median_and_middle_half, round_ratios, stamp, where

EXAMPLE = str(REPO / "examples" / "torch_synthetic.py")
MODEL = ["--features", "256", "--hidden", "1024", "--layers", "4", "--batch-size", "64"]
ELASTIC_CMD = [PY, "-m", "cloud_elastic.cli", "run", "-np", "2", "-H", "127.0.0.1:2",
               # Paused for the other job's slices: longer than the default 5 s of silence.
               "--heartbeat-timeout", "60", PY, EXAMPLE]
SECTION = "Durable checkpoints and driver restart"
GLANCE_OVERHEAD = "Step time with background checkpoints ≤ 1.02× without"
GLANCE_ADOPT = "Driver restarted within the grace → running workers adopted ≤ 2 s"


def overhead(steps: int, warmup: int, directory: str) -> tuple[list[float], dict[str, float], int]:
    common = [*MODEL, "--steps", str(steps), "--timing", "--log-every", "100000", "--commit-every", "1"]
    ckpt = ELASTIC_CMD[:-2] + ["--checkpoint-dir", directory, "--checkpoint-interval", "10"] + ELASTIC_CMD[-2:]
    variants = {"elastic": (ELASTIC_CMD + common, {}), "checkpointing": (ckpt + common, {})}
    per_round = interleaved_step_times(variants, slice_s=1.5, warmup=warmup)
    ratios = round_ratios(per_round, "checkpointing", base="elastic")
    ms = {n: statistics.median(w for w, _ in rounds if w == w) * 1e3 for n, rounds in per_round.items()}
    manifests = len(list(Path(directory).glob("ckpt-*/manifest.json")))
    return ratios, ms, manifests


def _workers_of(job_id: str) -> list[int]:
    needle = f"CLOUD_ELASTIC_JOB_ID={job_id}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if needle in (entry / "environ").read_bytes().split(b"\0") and ") Z " not in (entry / "stat").read_text():
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


class Run:
    def __init__(self, cmd: list[str], env: dict[str, str]) -> None:
        self.started = time.monotonic()
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env=dict(os.environ, **env), start_new_session=True)
        self.lines: list[tuple[float, str]] = []
        self._cond = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append((time.monotonic(), line.rstrip("\n")))
                self._cond.notify_all()

    def wait(self, pattern: str, timeout: float = 300.0) -> tuple[float, re.Match]:
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for t, line in self.lines:
                    m = rx.search(line)
                    if m:
                        return t, m
                if time.monotonic() > deadline or self.proc.poll() is not None and not self.lines[-1:]:
                    raise SystemExit(f"no {pattern!r}:\n" + "\n".join(l for _, l in self.lines[-40:]))
                self._cond.wait(0.5)


def _kill_driver_at(cmd: list[str], env: dict[str, str], pattern: str) -> str:
    """Start the job, SIGKILL its driver once its output matches ``pattern``; the job's id."""
    first = Run(cmd, env)
    _, m = first.wait(r"job (\w+): driver at")
    first.wait(pattern)
    os.kill(first.proc.pid, signal.SIGKILL)
    first.proc.wait()
    return m.group(1)


def restart(cycles: int, grace_s: float) -> list[tuple[float, float]]:
    """(wait for the previous workers, the rest) in seconds, per restart."""
    results = []
    for _ in range(cycles):
        with tempfile.TemporaryDirectory() as tmp:
            env = {"XDG_RUNTIME_DIR": tmp}
            cmd = [PY, "-m", "cloud_elastic.cli", "run", "-np", "2", "-H", "127.0.0.1:2", "--checkpoint-dir",
                   f"{tmp}/ckpt", "--checkpoint-interval", "2", "--driver-grace", str(grace_s), PY, EXAMPLE,
                   *MODEL, "--steps", "100000", "--step-log", "--log-every", "100000"]
            job_id = _kill_driver_at(cmd, env, r"checkpoint of step \d+ saved")
            while _workers_of(job_id):
                time.sleep(0.1)
            began = time.monotonic()
            second = Run(cmd, env)
            try:
                t_step, _ = second.wait(r"^\[0\].*STEPLOG")
                waited = 0.0
                for t, line in second.lines:
                    if "waiting" in line and "for them to stop" in line:
                        w = re.search(r"waiting (\d+)s", line)
                        waited = float(w.group(1)) if w else 0.0
                results.append((waited, t_step - began - waited))
            finally:
                _stop(second, job_id)
        print(f"restart: {results[-1]}", flush=True)
    return results


def _stop(driver, job_id: str) -> None:
    """End a measured driver and wait until none of the job's workers is left."""
    os.killpg(driver.proc.pid, signal.SIGTERM)
    driver.proc.wait(60)
    while _workers_of(job_id):
        time.sleep(0.1)


ADOPT_PROBE = str(REPO / "tests" / "integration" / "adopt_probe.py")


def _rank0_commits_after(events: Path, after: float) -> float | None:
    for path in events.glob("*.jsonl"):
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        if any(e["kind"] == "hello" and e["rank"] == 0 for e in lines):
            later = [e["t"] for e in lines if e["kind"] == "commit" and e["t"] > after]
            return min(later) if later else None
    return None


def adopt(cycles: int, grace_s: float) -> list[dict[str, float]]:
    """Per restart within the grace: spawn -> adopted (and the driver's own count), spawn -> rank 0's next step."""
    results = []
    for _ in range(cycles):
        with tempfile.TemporaryDirectory() as tmp:
            env = {"XDG_RUNTIME_DIR": tmp}
            events = Path(tmp) / "events"
            events.mkdir()
            cmd = [PY, "-m", "cloud_elastic.cli", "run", "-np", "2", "-H", "127.0.0.1:1,127.0.0.2:1",
                   "--checkpoint-dir", f"{tmp}/ckpt", "--checkpoint-interval", "2", "--driver-grace", str(grace_s),
                   PY, ADOPT_PROBE, str(events), "--steps", "100000", "--step-sleep", "0.05"]
            job_id = _kill_driver_at(cmd, env, r'"step": 20,')
            time.sleep(1.0)
            began = time.time()
            second = Run(cmd, env)
            try:
                _, m = second.wait(r"adopted \d+ running worker\(s\) ([\d.]+)s after the driver started", 60)
                # The summary waits for the checkpoint storage to open; each worker's own line comes at once.
                t_line = max(t for t, line in second.lines if re.search(r"adopted worker .* of round", line))
                adopted_wall = began + (t_line - second.started)
                step = None
                while step is None and time.time() < adopted_wall + 30:
                    step = _rank0_commits_after(events, adopted_wall)
                    time.sleep(0.05)
                results.append({"spawn_to_adopted_s": t_line - second.started, "driver_reported_s": float(m.group(1)),
                                "spawn_to_next_step_s": (step - began) if step else float("nan")})
            finally:
                _stop(second, job_id)
        print(f"adopt: {results[-1]}", flush=True)
    return results


def tables(over: tuple | None, restarts: list | None, adopts: list | None) -> str:
    out = []
    if over:
        ratios, ms, written = over
        out += ["| measurement | result |", "|---|---|",
                f"| step time with background checkpoints / without, side by side | median step {ms['checkpointing']:.1f} "
                f"ms vs {ms['elastic']:.1f} ms; per-round ratio {median_and_middle_half(ratios)}; {written} "
                "checkpoints kept at the end |"]
    if restarts:
        if not out:
            out += ["| measurement | result |", "|---|---|"]
        out.append("| driver restart past the grace (SIGKILL, workers gone, same command again) → first step of the "
                   "resumed job | announced wait " + ", ".join(f"{w:.0f} s" for w, _ in restarts)
                   + " for the previous driver's workers, then " + ", ".join(f"{r:.1f} s" for _, r in restarts)
                   + " to start, launch, load the checkpoint and sync |")
    if adopts:
        if not out:
            out += ["| measurement | result |", "|---|---|"]
        out += ["| driver restart within the grace (`--driver-grace 30`, restarted 1 s after the SIGKILL): its "
                "process spawned → last running worker adopted (the driver's own count), each restart | "
                + ", ".join(f"{a['spawn_to_adopted_s']:.2f} s ({a['driver_reported_s']:.2f} s)" for a in adopts) + " |",
                "| … → rank 0's first step after the adoption | "
                + ", ".join(f"{a['spawn_to_next_step_s']:.2f} s" for a in adopts) + " |"]
    return "\n".join(out)


def glance(over: tuple | None, adopts: list | None) -> list[list[str]]:
    rows = []
    if over:
        ratio = statistics.median(over[0])
        rows.append([GLANCE_OVERHEAD, f"{ratio:.3f}× (median of {len(over[0])} rounds)", f"{ratio / 1.02:.2f}",
                     where(SECTION), docsection.verdict(ratio <= 1.02)])
    if adopts:
        worst = max(a["spawn_to_adopted_s"] for a in adopts)
        rows.append([GLANCE_ADOPT, f"slowest {worst:.2f} s of {len(adopts)} restart(s)", f"{worst / 2:.2f}",
                     where(SECTION), docsection.verdict(worst <= 2)])
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=("overhead", "restart", "adopt"), help="run one measurement only")
    ap.add_argument("--steps", type=int, help="steps of each overhead job (more steps, more rounds; default 600)")
    ap.add_argument("--cycles", type=int, help="driver restarts measured of each kind (default 3)")
    docsection.add_arguments(ap)
    args = ap.parse_args()
    steps, warmup, cycles = (100, 20, 1) if args.quick else (600, 60, 3)
    steps, cycles = args.steps or steps, args.cycles or cycles
    over = restarts = adopts = None
    if args.only in (None, "overhead"):
        with tempfile.TemporaryDirectory() as d:
            over = overhead(steps, warmup, d)
        print(json.dumps({"ratios": over[0], "step_ms": over[1], "checkpoints_kept": over[2]}), flush=True)
    if args.only in (None, "restart"):
        restarts = restart(cycles, grace_s=5.0)
    if args.only in (None, "adopt"):
        adopts = adopt(cycles, grace_s=30.0)
    text = f"{stamp(command())} Two workers of the MLP on loopback.\n\n{tables(over, restarts, adopts)}"
    if args.only:
        args.no_write = True  # one part alone would replace the whole section
    docsection.publish(args, "durable", SECTION, text, glance(over, adopts))


if __name__ == "__main__":
    main()
