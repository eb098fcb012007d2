"""A newcomer whose sampler runs short: rank 0's speed with and without it (issue 44, finding 10).

    .venv/bin/python benchmarks/early_return.py [--quick] [--window SECONDS]

``early_return_worker.py`` trains one epoch over a ``DistributedSampler`` built once at start-up,
as Horovod's MNIST elastic example builds it, with the usual bookkeeping (``state.batch`` is the
position in the epoch). Two workers train 96,000 samples in batches of 4: 12,000 steps each. Once
rank 0 is past step 8,010, each step is braked to 0.2 s (a model's compute) and the measured window
starts (the epoch's 3,990 steps left last longer than it). In two of the three jobs a third host
appears in discovery at that moment: a worker there shards the data three ways (8,000 steps an
epoch), so it is past its epoch's end as it joins and
returns at once, while rank 0 trains on; it is sent away after rank 0 waited 5 s for it, and its
slot is refilled, by a worker that does the same, either after the blacklist's growing cooldown
(the default ``--blacklist-cooldown-range 10 300``) or at once (``0 0``: what the driver did before
issue 44). The third job has no third host. Rank 0's speed is its steps per second over the window,
and over its first 60 and 240 s (a step rolled back and run again counts twice: at most one per
reset); the back-off's cost shrinks with the job's length, as the refills' spacing doubles. Horovod's MNIST example
itself resets its batch count at each reset, so there a newcomer returns early only while the
others are far enough into an epoch: ``tests/integration/test_early_return_backoff.py`` runs it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import docsection
from common import PY, QUIET, REPO, command, descendants, signal_all, stamp, where

SECTION = "A newcomer that returns early"
KEY = "early_return"
# the first cell of its glance row, which identifies the row: the same at every window
GLANCE = "Newcomer returning early (short sampler) → rank 0's speed ≥ 0.90× of a run without it"
WORKER = REPO / "benchmarks" / "early_return_worker.py"
TRAIN, BATCH = 96000, 4
START_AT = TRAIN // 3 // BATCH + 10  # past the newcomer's epoch: it returns at once
_EVENT = re.compile(r"EVENT (\{.*\})")


class Job:
    """One ``cloud-elastic run`` of the worker script; rank 0's steps and the driver's lines, timed."""

    def __init__(self, tmp: Path, cooldown: tuple[str, str]) -> None:
        self.hosts, self.slow = tmp / "hosts.txt", tmp / "slow"
        self.hosts.write_text("127.0.0.1\n127.0.0.2\n")
        script = tmp / "hosts.sh"
        script.write_text(f"#!/bin/sh\ncat {self.hosts}\n")
        script.chmod(0o755)
        self.events = tmp / "events.jsonl"
        cmd = [PY, "-m", "cloud_elastic.cli", "run", "-np", "2", "--min-np", "2", "--max-np", "3",
               "--host-discovery-script", str(script), "--discovery-interval", "0.5", "--events-file",
               str(self.events), "--blacklist-cooldown-range", *cooldown, PY, str(WORKER), "--samples",
               str(TRAIN), "--batch-size", str(BATCH), "--slow", str(self.slow)]
        env = dict(os.environ, **QUIET)
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env=env, start_new_session=True)
        self.steps: list[float] = []  # times of rank 0's steps
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            m = _EVENT.search(line)
            if m and '"kind": "step"' in line:
                try:
                    event = json.loads(m.group(1))
                except json.JSONDecodeError:
                    continue
                if event.get("rank") == 0:
                    self.steps.append(time.monotonic())

    def wait_steps(self, n: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while len(self.steps) < n:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise SystemExit(f"rank 0 did not reach step {n}:\n{''.join(self.lines[-30:])}")
            time.sleep(0.1)

    def stop(self) -> None:
        signal_all(descendants([self.proc.pid]))
        self.proc.wait()


def run(window: float, cooldown: tuple[str, str] | None) -> dict:
    """Rank 0's step times over ``window`` seconds (from the start of the window); with a short-sampler
    newcomer unless ``cooldown`` is None."""
    with tempfile.TemporaryDirectory() as tmp:
        job = Job(Path(tmp), cooldown or ("10", "300"))
        try:
            job.wait_steps(START_AT, 600)
            job.slow.touch()
            if cooldown is not None:
                job.hosts.write_text("127.0.0.1\n127.0.0.2\n127.0.0.3\n")
            began = time.monotonic()
            time.sleep(window)
            steps = [t - began for t in job.steps if began <= t <= began + window]
            records = [json.loads(line) for line in job.events.read_text().splitlines()]
        finally:
            job.stop()
    left = [r for r in records if r.get("event") == "worker_left" and r.get("early_return")]
    return {"steps": steps, "newcomers": sum(1 for r in records if r.get("event") == "worker_started"
                                             and r.get("host") == "127.0.0.3"),
            "early_returns": len(left), "cooldowns": [r.get("blacklisted_s") for r in left],
            "resets": sum(1 for r in records if r.get("event") == "round_formed") - 1,
            "explanations": sum(line.count("sized for another world size") for line in job.lines)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip-refill-at-once", action="store_true",
                    help="leave out the job that refills the slot at once (the behaviour before the fix)")
    ap.add_argument("--window", type=float, default=None,
                    help="seconds measured per job (default 600; 40 with --quick); rank 0's speed is also given "
                         "over its first 60 and 240 s")
    docsection.add_arguments(ap)
    args = ap.parse_args()
    window = args.window or (40.0 if args.quick else 600.0)
    spans = [w for w in (60.0, 240.0) if w < window] + [window]
    results = {"without a newcomer": run(window, None),
               "newcomer, default back-off (10 300)": run(window, ("10", "300"))}
    if not args.skip_refill_at_once:
        results["newcomer, refilled at once (0 0, as before)"] = run(window, ("0", "0"))

    def speed(r: dict, span: float) -> float:
        return sum(1 for t in r["steps"] if t <= span) / span

    base = results["without a newcomer"]
    head = " | ".join(f"rank 0 over {w:g} s (steps/s, / without)" for w in spans)
    rows = [f"| job | {head} | newcomers started | early returns | their cooldowns (s) | resets | explanations "
            "printed |", "|---|" + "---|" * len(spans) + "---|---|---|---|---|"]
    for name, r in results.items():
        cells = " | ".join(f"{speed(r, w):.2f}, {speed(r, w) / speed(base, w):.2f}" for w in spans)
        cooldowns = ", ".join(f"{c:g}" for c in r["cooldowns"]) or "–"
        if len(set(r["cooldowns"])) == 1 and len(r["cooldowns"]) > 3:
            cooldowns = f"{r['cooldowns'][0]:g} (×{len(r['cooldowns'])})"
        rows.append(f"| {name} | {cells} | {r['newcomers']} | {r['early_returns']} | {cooldowns} | {r['resets']} | "
                    f"{r['explanations']} |")
    ratio = speed(results["newcomer, default back-off (10 300)"], window) / speed(base, window)
    text = "\n".join([stamp(command()) + " Windows start at the third host's appearance.", "", *rows])
    print(json.dumps({k: {**v, "steps": len(v["steps"])} for k, v in results.items()}, indent=1), file=sys.stderr)
    docsection.publish(args, KEY, SECTION, text, [[
        GLANCE, f"{ratio:.2f}× over {window:g} s", f"{ratio / 0.90:.2f}", where(SECTION),
        docsection.verdict(ratio >= 0.90)]])


if __name__ == "__main__":
    main()
