"""A slow worker: the job's throughput before it is found, after it is drained, and without it.

    .venv/bin/python benchmarks/straggler.py [--quick] [--false-drains SECONDS]

Three workers (one per loopback host) train ``workload.py``'s MLP, committing every
step. In the first job the worker on 127.0.0.3 sleeps as long as a step takes more
per step (``CE_WORKLOAD_SLOW``: half the job's speed), ``--straggler-factor 1.5``
``--straggler-window 10`` drains it, and a fourth host in discovery replaces it.
The second job has three equal workers throughout. Throughput is samples per
second (world size x batch per second of rank 0's completed steps) over three
windows: with the slow worker (before it is found), after the replacement joined,
and the equal job's. ``--false-drains S`` also runs three equal workers for S
seconds at the default settings (factor 2, window 60 s) on this busy machine and
reports the drains (there must be none) and the largest ratio of a worker's
compute time to the median of the other workers' (the rule's reference) that
``cloud-elastic status`` showed.
Also timed, in this process: what the compute-time bookkeeping costs a step.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import docsection
from common import PY, REPO, WORKLOAD, Procs, command, stamp, where

SECTION = "Slow workers"
BATCH = 64
#: Not the defaults (factor 2, window 60 s): a half-speed worker's compute is about twice the others', at the
#: default factor's edge, where it is not reliably drained (docs/benchmarks.md, Slow workers).
DRAIN_SETTINGS = ["--straggler-factor", "1.5", "--straggler-window", "10"]
ARGS = ["--features", "256", "--hidden", "256", "--layers", "3", "--batch-size", str(BATCH), "--step-log"]


def _job(hosts: list[str], tmp: Path, extra: list[str], env: dict[str, str]) -> tuple[Procs, Path]:
    script = tmp / "hosts.sh"
    listing = tmp / "hosts.txt"
    listing.write_text("\n".join(hosts) + "\n")
    script.write_text(f"#!/bin/sh\ncat {listing}\n")
    script.chmod(0o755)
    events = tmp / "events.jsonl"
    cmd = [PY, "-m", "cloud_elastic.cli", "run", "-np", "3", "--min-np", "2", "--max-np", "3",
           "--host-discovery-script", str(script), "--discovery-interval", "0.5", "--events-file", str(events),
           *extra, PY, WORKLOAD, "elastic", *ARGS]
    return Procs([cmd], env), events


def _rate(logs: list[dict], since: float, until: float) -> float:
    """Samples per second of rank 0's completed steps between two wall times."""
    mine = [r for r in logs if r["rank"] == 0 and since <= r["t"] <= until]
    if len(mine) < 2:
        return float("nan")
    return sum(r["size"] * BATCH for r in mine[1:]) / (mine[-1]["t"] - mine[0]["t"])


def throughput(quick: bool) -> dict:
    window = 8.0 if quick else 20.0
    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        job, _ = _job(["127.0.0.1", "127.0.0.2", "127.0.0.3"], Path(tmp), [], {})
        job.wait(lambda: len([r for r in job.logs if r["size"] == 3]) > 30, 120, "three equal workers training")
        t0 = time.time()
        time.sleep(window)
        out["equal"] = _rate(job.logs, t0, time.time())
        normal = statistics.median(r["dt"] for r in job.logs if r["t"] >= t0)
        job.stop()
    # Half speed: the slow worker sleeps as long as a normal step takes, every step.
    slow = {"CE_WORKLOAD_SLOW": f"127.0.0.3={normal:.4f}"}
    with tempfile.TemporaryDirectory() as tmp:
        job, events = _job(["127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4"], Path(tmp),
                           DRAIN_SETTINGS, slow)
        job.wait(lambda: len([r for r in job.logs if r["size"] == 3]) > 20, 120, "three workers training")
        t0 = time.time()

        def drained() -> bool:
            return events.exists() and '"straggler"' in events.read_text()

        job.wait(drained, 120, "the straggler drained")
        found = time.time()
        out["slow"] = _rate(job.logs, t0, found)
        out["found_after_s"] = found - t0
        before = {r["pid"] for r in job.logs if r["t"] < found}
        job.wait(lambda: any(r["pid"] not in before and r["size"] == 3 for r in job.logs), 120,
                 "the replacement training")
        joined = time.time()
        time.sleep(window)
        out["drained"] = _rate(job.logs, joined + 1, time.time())
        job.stop()
    return out


def largest_ratio(status: dict) -> float | None:
    """The largest ratio in ``cloud-elastic status --json`` of a worker's compute time to the figure the straggler
    rule holds it against: the median of the other workers' (under --whole-hosts, the other hosts')."""
    sys.path.insert(0, str(REPO))
    from cloud_elastic.driver.job.health import _medians_of_others

    figures, host_of = {}, {}
    for h in status["hosts"]:
        for w in h["workers"]:
            if w.get("compute_s"):
                figures[w["worker"]], host_of[w["worker"]] = w["compute_s"], h["host"]
    others = _medians_of_others(figures, host_of if status.get("whole_host_slots") else None)
    ratios = [figures[wid] / m for wid, m in others.items() if m]
    return max(ratios, default=None)


def false_drains(seconds: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        run.mkdir()
        env = {"XDG_RUNTIME_DIR": str(run)}
        job, events = _job(["127.0.0.1", "127.0.0.2", "127.0.0.3"], Path(tmp), [], env)
        job.wait(lambda: len([r for r in job.logs if r["size"] == 3]) > 20, 120, "three equal workers training")
        job_id = next(line.split("job ")[1].split(":")[0] for line in job.lines if "driver at" in line)
        ratios = []
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            time.sleep(5)
            reply = subprocess.run([PY, "-m", "cloud_elastic.cli", "status", job_id, "--json"], cwd=REPO,
                                   env=dict(os.environ, **env), capture_output=True, text=True, timeout=60)
            if reply.returncode != 0:
                continue
            ratio = largest_ratio(json.loads(reply.stdout))
            if ratio is not None:
                ratios.append(ratio)
        drains = [json.loads(line) for line in events.read_text().splitlines() if '"straggler"' in line]
        job.stop()
    return {"seconds": seconds, "drains": len(drains), "largest_ratio": max(ratios, default=float("nan")),
            "samples": len(ratios)}


def bookkeeping_cost() -> float:
    """Seconds a step's compute-time bookkeeping costs (Progress.step + one waiting() block)."""
    sys.path.insert(0, str(REPO))
    from cloud_elastic.worker.link.progress import Progress

    p, n = Progress(), 200_000
    began = time.perf_counter()
    for _ in range(n):
        with p.waiting():
            pass
        p.step()
    return (time.perf_counter() - began) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--false-drains", type=float, default=None, metavar="SECONDS",
                    help="also run three equal workers this long at the default settings (default 300; 0 with --quick)")
    docsection.add_arguments(ap)
    args = ap.parse_args()
    if args.false_drains is None:
        args.false_drains = 0.0 if args.quick else 300.0
    result = throughput(args.quick)
    cost = bookkeeping_cost()
    rows = [
        "| job | samples/s | / equal job |",
        "|---|---|---|",
        f"| three workers, one at half speed, before it is found ({result['found_after_s']:.0f} s at "
        f"`{' '.join(DRAIN_SETTINGS)}`) "
        f"| {result['slow']:.0f} | {result['slow'] / result['equal']:.2f} |",
        f"| after it was drained and replaced | {result['drained']:.0f} | {result['drained'] / result['equal']:.2f} |",
        f"| three equal workers | {result['equal']:.0f} | 1.00 |",
    ]
    text = (f"{stamp(command())}\n\n" + "\n".join(rows) + f"\n\nThe compute-time bookkeeping costs "
            f"{cost * 1e6:.1f} µs per step.")
    if args.false_drains:
        fd = false_drains(args.false_drains)
        text += (f" Three equal workers for {fd['seconds']:.0f} s at the defaults: {fd['drains']} drain(s); the "
                 f"largest compute time `cloud-elastic status` showed was {fd['largest_ratio']:.2f}x the median of "
                 f"the other workers' (the rule's reference; {fd['samples']} samples).")
    met = result["drained"] / result["equal"] >= 0.9
    settings = " ".join(DRAIN_SETTINGS)
    glance = [["A worker at half speed is drained and replaced: throughput back within 10 % of a job without it",
               f"{result['slow'] / result['equal']:.2f}x before, {result['drained'] / result['equal']:.2f}x after, at "
               f"`{settings}` (the defaults are 2 and 60 s)",
               f"{(result['drained'] / result['equal']) / 0.9:.2f}", where(SECTION),
               docsection.verdict(met) + f" at `{settings}`, not the defaults"]]
    docsection.publish(args, "straggler", SECTION, text, glance)


if __name__ == "__main__":
    main()
