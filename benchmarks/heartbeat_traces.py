"""Record real heartbeat arrival traces for the liveness rule's unit tests.

    .venv/bin/python benchmarks/heartbeat_traces.py [--seconds 60] [--out tests/unit/data/heartbeat_traces.json]

Runs three short jobs of three loopback workers (``tests/integration/busy_probe.py``)
under a driver in this process, and records when each worker's heartbeat arrived
at the driver (its running time, as the liveness rule sees it):

* ``jittery``: the machine as it is (other jobs may share it);
* ``loaded``: two CPU hogs beside the job on this 2-core machine;
* ``paused``: one worker runs a full garbage collection over 3 million objects
  every 10 s (the GIL held about 1-2 s each time, its heartbeats held with it).

The traces are written as JSON: ``{name: {worker: [[arrival, pause_s], ...]}}``: each
arrival in seconds from the first one, rounded to the millisecond, with the
garbage-collector pause the worker said to expect (``worker/link/pauses.py``).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROBE = REPO / "tests" / "integration" / "busy_probe.py"


def _hog() -> None:
    while True:
        pass


def record(name: str, seconds: float, probe_args: list[str], hogs: int) -> dict[str, list[float]]:
    """Run one job in a child process (its driver patched to log arrivals) and return the arrivals."""
    out = Path(f"/tmp/heartbeat-trace-{os.getpid()}-{name}.jsonl")
    out.unlink(missing_ok=True)
    code = f"""
import json, sys, time
from cloud_elastic.driver.job import liveness
heard = liveness.SilenceWatch.heard
log = open({str(out)!r}, "a", buffering=1)
def logged(self, worker_id, running, flight, pause_s=0.0):
    log.write(json.dumps([worker_id, running, pause_s]) + "\\n")
    return heard(self, worker_id, running, flight, pause_s)
liveness.SilenceWatch.heard = logged
from cloud_elastic.cli import main
sys.argv = ["cloud-elastic", "run", "-np", "3", "-H", "127.0.0.1:1,127.0.0.2:1,127.0.0.3:1",
            {sys.executable!r}, {str(PROBE)!r}, "--seconds", "{seconds}", *{probe_args!r}]
main()
"""
    hog_procs = [multiprocessing.Process(target=_hog, daemon=True) for _ in range(hogs)]
    for p in hog_procs:
        p.start()
    try:
        subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=seconds + 180,
                       stdout=subprocess.DEVNULL)
    finally:
        for p in hog_procs:
            p.terminate()
    arrivals: dict[str, list[list[float]]] = {}
    for line in out.read_text().splitlines():
        worker, running, pause_s = json.loads(line)
        arrivals.setdefault(worker, []).append([running, pause_s])
    out.unlink()
    t0 = min(v[0][0] for v in arrivals.values())
    return {w: [[round(t - t0, 3), p] for t, p in v] for w, v in sorted(arrivals.items())}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--out", default=str(REPO / "tests" / "unit" / "data" / "heartbeat_traces.json"))
    args = p.parse_args()
    traces = {
        "jittery": record("jittery", args.seconds, [], 0),
        "loaded": record("loaded", args.seconds, [], 2),
        "paused": record("paused", args.seconds, ["--only-slot", "127.0.0.2", "--gc-every-s", "10",
                                                   "--heap", "3000000"], 0),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(traces, separators=(",", ":")) + "\n")
    for name, trace in traces.items():
        gaps = [b[0] - a[0] for v in trace.values() for a, b in zip(v, v[1:])]
        print(f"{name}: {sum(len(v) for v in trace.values())} arrivals, longest gap {max(gaps):.3f}s")


if __name__ == "__main__":
    main()
