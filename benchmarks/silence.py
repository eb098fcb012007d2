"""Silent loss at the default settings: SIGSTOP one worker of three → survivors' next step; and false alarms.

    .venv/bin/python benchmarks/silence.py [--stops 12] [--soak-minutes 30] [--hogs 1] [--quick]

*Stops*: three loopback "hosts", one worker each (``workload.py``, the recovery
benchmark's model, a commit every step), every setting at its default (no
``--heartbeat-timeout``). Once rank 1 has trained for ``--warm-s`` seconds (the
driver judges a worker's silence by the fast rule after a few seconds of its
heartbeats), it is SIGSTOPped, and the time to the survivors' first completed step
at the smaller size is measured; also whether the driver named the stalled
collective before giving the worker up, and by which rule it was given up.

*Soak*: one job of three equal workers for ``--soak-minutes`` with ``--hogs``
CPU-bound processes beside it on this 2-core machine (other work on the machine
only makes it harsher). A false alarm is any worker given up: every worker is
healthy. Stalls named while every worker heartbeats are counted too.

Prints the tables and writes them into docs/benchmarks.md (``docsection``:
section ``silence`` and the SIGSTOP glance row).
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import signal
import tempfile
import time
from pathlib import Path

import docsection
from common import PY, JobExited, Miss, Procs, WORKLOAD, command, pct, stamp, where
from recovery import GLANCE_STOP, HOSTS, MODEL, STOP_TARGET_S

SECTION = "Silent workers: detection and false alarms"
FAST = "while rank(s)"  # in the give-up reason of the fast rule (driver/job/liveness.py)
NAMED = "stalled: rank(s)"  # the driver's line naming a stalled collective's culprits


def cmd(events: str) -> list[str]:
    return [PY, "-m", "cloud_elastic.cli", "run", "-np", "3", "--min-np", "2", "--max-np", "3", "-H", HOSTS,
            "--blacklist-cooldown-range", "300", "300", "--events-file", events,
            PY, WORKLOAD, "elastic", *MODEL, "--step-log", "--commit-every", "1"]


def one_stop(warm_s: float, bound_s: float) -> dict:
    """A fresh job; SIGSTOP rank 1 after it trained ``warm_s``; the survivors' next step, and what the log said."""
    with tempfile.TemporaryDirectory() as tmp:
        job = Procs([cmd(os.path.join(tmp, "events.jsonl"))], {})
        try:
            first = job.wait(lambda: next((e for e in job.logs if e["rank"] == 1), None), 300, "rank 1 stepping")
            victim = job.wait(lambda: next((e for e in job.logs if e["rank"] == 1 and e["t"] > first["t"] + warm_s
                                            and len({x["rank"] for x in job.logs}) == 3), None),
                              300, "three ranks stepping")["pid"]
            t_stop = time.time()
            os.kill(victim, signal.SIGSTOP)
            try:
                nxt = job.wait(lambda: next((e for e in job.logs if e["t"] > t_stop and e["pid"] != victim
                                             and e["size"] == 2), None), bound_s, "the survivors' next step")
            except (TimeoutError, JobExited) as exc:
                raise Miss(str(exc)) from exc
            with job.cond:
                text = "".join(job.lines)
        finally:
            job.stop()
    named, lost = text.find(NAMED), text.find("stopped answering heartbeats")
    return {"s": nxt["t"] - t_stop, "fast": FAST in text[lost:lost + 400] if lost >= 0 else False,
            "named_first": 0 <= named < lost}


def stops(n: int, warm_s: float, bound_s: float) -> list[dict]:
    out = []
    for i in range(n):
        try:
            r = one_stop(warm_s, bound_s)
        except Miss as exc:
            print(f"stop {i + 1}: {str(exc).splitlines()[0]}", flush=True)
            r = {"s": math.inf, "fast": False, "named_first": False}
        out.append(r)
        print(f"stop {i + 1}: survivors' next step after {r['s']:.3f}s (fast rule: {r['fast']}, named first: "
              f"{r['named_first']}), load {os.getloadavg()[0]:.1f}", flush=True)
    return out


def _hog() -> None:
    while True:
        pass


def soak(minutes: float, hogs: int) -> dict:
    """One job of three healthy workers for ``minutes`` beside ``hogs`` CPU hogs: what it gave up and named."""
    hog_procs = [multiprocessing.Process(target=_hog, daemon=True) for _ in range(hogs)]
    for p in hog_procs:
        p.start()
    loads = []
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "events.jsonl")
        job = Procs([cmd(path)], {})
        try:
            job.wait(lambda: len({e["rank"] for e in job.logs}) == 3, 300, "three ranks stepping")
            started, end = time.monotonic(), time.monotonic() + 60 * minutes
            while time.monotonic() < end and all(p.poll() is None for p in job.procs):
                time.sleep(10)
                loads.append(os.getloadavg()[0])
            with job.cond:
                steps = max((e["step"] for e in job.logs), default=0)
            ran_s = time.monotonic() - started
        finally:
            job.stop()
            for p in hog_procs:
                p.terminate()
        events = [json.loads(line) for line in Path(path).read_text().splitlines()]
    failed = [e for e in events if e["event"] == "worker_failed"]
    stalled = [e for e in events if e["event"] == "collective_stalled"]
    return {"minutes": ran_s / 60, "hogs": hogs, "steps": steps, "false_alarms": len(failed),
            "reasons": [e.get("reason", "")[:200] for e in failed], "stalls_named": len(stalled),
            "load_median": sorted(loads)[len(loads) // 2] if loads else 0.0}


def _s(t: float, bound: float) -> str:
    return f"miss (> {bound:.0f} s)" if math.isinf(t) else f"{t:.2f} s"


def text_of(results: list[dict], soaked: dict | None, bound: float) -> str:
    """One table: the stops (survivors' next step, by which rule, named first) and the soak (false alarms)."""
    lines = ["| run, every setting at its default | survivors' next step p50 / p95 | each (s) | given up | "
             "stall named before the give-up |", "|---|---|---|---|---|"]
    if results:
        t = [r["s"] for r in results]
        each = ", ".join("miss" if math.isinf(x) else f"{x:.2f}" for x in t)
        lines.append(f"| {len(results)} SIGSTOPs of one worker of three | {_s(pct(t, .5), bound)} / "
                     f"{_s(pct(t, .95), bound)} | {each} | {sum(r['fast'] for r in results)} of {len(results)} by "
                     f"the fast rule | {sum(r['named_first'] for r in results)} of {len(results)} |")
    if soaked:
        reasons = f" ({'; '.join(soaked['reasons'])})" if soaked["reasons"] else ""
        lines.append(f"| {soaked['minutes']:.0f}-min soak: three equal workers, {soaked['hogs']} CPU hog(s) beside "
                     f"(median load {soaked['load_median']:.1f}), {soaked['steps']} steps | – | – | "
                     f"**{soaked['false_alarms']} (false alarms)**{reasons} | {soaked['stalls_named']} stall(s) "
                     "named while all heartbeat |")
    return "\n".join(lines)


def glance(results: list[dict], soaked: dict | None, bound: float) -> list[list[str]]:
    if not results:
        return []
    p95 = pct([r["s"] for r in results], .95)
    alarms = "" if soaked is None else f"; {soaked['false_alarms']} false alarm(s) in a {soaked['minutes']:.0f}-min soak"
    met = p95 <= STOP_TARGET_S and (soaked is None or soaked["false_alarms"] == 0)
    return [[GLANCE_STOP, f"p95 {_s(p95, bound)} over {len(results)} stops{alarms}", f"{p95 / STOP_TARGET_S:.2f}",
             where(SECTION), docsection.verdict(met)]]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--stops", type=int, default=None, help="SIGSTOPs (default 12; 2 with --quick)")
    p.add_argument("--warm-s", type=float, default=6.0, help="seconds rank 1 trains before its stop")
    p.add_argument("--bound", type=float, default=60.0, help="seconds the survivors get to step again")
    p.add_argument("--soak-minutes", type=float, default=None, help="false-alarm soak (default 30; 1 with --quick)")
    p.add_argument("--hogs", type=int, default=1, help="CPU-bound processes beside the soak's job")
    p.add_argument("--results", type=Path, default=None, help="also write the raw results here (JSON)")
    p.add_argument("--from-results", type=Path, default=None,
                   help="publish a run saved with --results (its stamp line given by --stamp) instead of running")
    p.add_argument("--stamp", default="", help="with --from-results: the saved run's stamp line")
    docsection.add_arguments(p)
    args = p.parse_args()
    if args.from_results:
        saved = json.loads(args.from_results.read_text())
        results = [dict(r, s=float(r["s"])) for r in saved["stops"]]
        docsection.publish(args, "silence", SECTION, "\n\n".join([args.stamp, text_of(results, saved["soak"],
                                                                                          args.bound)]),
                           glance(results, saved["soak"], args.bound))
        return
    n = args.stops if args.stops is not None else 2 if args.quick else 12
    minutes = args.soak_minutes if args.soak_minutes is not None else 1 if args.quick else 30
    results = stops(n, args.warm_s, args.bound)
    soaked = soak(minutes, args.hogs) if minutes > 0 else None
    if args.results:
        args.results.write_text(json.dumps({"stops": results, "soak": soaked}, default=str))
    docsection.publish(args, "silence", SECTION, "\n\n".join([stamp(command()), text_of(results, soaked, args.bound)]),
                       glance(results, soaked, args.bound))


if __name__ == "__main__":
    main()
