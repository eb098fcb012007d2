"""Does a short heartbeat timeout raise false alarms on a loaded machine, and how fast does it find a SIGSTOP?

    flock /tmp/bench.lock python benchmarks/peers/false_alarms.py [--timeouts 1 1.5 2] [--seconds 180]
                                                                  [--hogs 2] [--stops 3]

1. Steady training, per heartbeat timeout (``cloud-elastic run --heartbeat-timeout``):
   the kill benchmark's job (three loopback "hosts", one worker each, the
   peers' model, a commit every step) trains; once all three step, ``--hogs``
   busy-looping Python processes start (on this 2-core machine: 3 workers, the
   driver and 2 hogs), and for ``--seconds`` nothing else is done to the job.
   Every worker that the driver gives up on in that window is a false alarm;
   counted from the driver's ``--events-file`` (``worker_failed``,
   ``rollback``, ``round_formed``) and its log (``stopped answering
   heartbeats``, ``the driver did not run for``). A slot given up on is
   blacklisted for ``--cooldown`` s, then a new worker is started there and
   admitted, so the job keeps three workers at risk. The workers' ``poll_gap``
   PROBE lines (``stall_probe.py``) give the longest wait between two
   heartbeat polls: the margin left below the timeout. Linux's autogroup
   scheduling shares the CPU between sessions first: the job runs in a
   session of its own, and the hogs share this script's session unless
   ``--hog-sessions`` gives each one its own (then each hog gets as much
   CPU as the whole job).
2. SIGSTOP of one worker of three, per timeout, ``--stops`` repeats, no hogs:
   time to the survivors' next step (``run_peers.one_fault``, as the peers'
   silent-loss scenario measures it).

Raw numbers into ``false_alarms.json`` beside this file; a table on stdout.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from host_added import Group  # this folder is on sys.path when the script runs
from kill_profile import HOSTS, driver_events, job_command
from peer_results import load, record
from run_peers import MODEL, PY, Procs, elastic_cmd, kill_all, machine, one_fault, pct

HERE = Path(__file__).resolve().parent
HOG = "while True: pass"


def steady_command(events: Path, timeout_s: float, cooldown_s: float) -> list[str]:
    cmd = job_command(events, timeout_s)
    at = cmd.index("--blacklist-cooldown-range")
    cmd[at + 1:at + 3] = [str(cooldown_s), str(cooldown_s)]
    return cmd


def steady(timeout_s: float, seconds: float, hogs: int, cooldown_s: float, tmp: Path,
           hog_sessions: bool = False) -> dict[str, Any]:
    """One window of steady training under load at ``timeout_s``; what the driver did in it."""
    events = tmp / f"steady-{timeout_s}.jsonl"
    job = Group([steady_command(events, timeout_s, cooldown_s)], {})
    burners: list[subprocess.Popen] = []
    try:
        job.wait(lambda: len({e["rank"] for e in job.logs if e["step"] >= 10}) == 3, 300, "three ranks stepping")
        burners = [subprocess.Popen([PY, "-c", HOG], start_new_session=hog_sessions) for _ in range(hogs)]
        t0 = time.time()
        time.sleep(seconds)  # the window itself: nothing to wait for but the clock
        t1, load_end = time.time(), os.getloadavg()[0]
    finally:
        kill_all([b.pid for b in burners])
        for b in burners:
            b.wait()
        job.stop()
    with job.cond:
        logs, probes, lines = list(job.logs), list(job.probes), list(job.lines)
    inside = [e for e in driver_events(events) if t0 <= e["ts"] <= t1]
    failed = [e for e in inside if e["event"] == "worker_failed"]
    steps = [e for e in logs if t0 <= e["t"] <= t1]
    by_pid: dict[int, list[float]] = {}
    for e in steps:
        by_pid.setdefault(e["pid"], []).append(e["t"])
    gaps = [b - a for ts in by_pid.values() for a, b in zip(ts, ts[1:])]
    polls = [p for p in probes if p["event"] == "poll_gap" and t0 <= p["t"] <= t1]
    driver_log = [l for l in lines if "STEPLOG" not in l and "PROBE" not in l]
    return {
        "timeout_s": timeout_s, "seconds": round(t1 - t0, 1), "hogs": hogs, "hog_sessions": hog_sessions,
        "load_end": round(load_end, 2),
        "false_alarms": len(failed), "failed": [e.get("reason", "") for e in failed],
        "rollbacks": sum(e["event"] == "rollback" for e in inside),
        "rounds_formed": sum(e["event"] == "round_formed" for e in inside),
        "silence_lines": sum("stopped answering heartbeats" in l for l in driver_log),
        "driver_stall_lines": sum("the driver did not run for" in l for l in driver_log),
        "steps_rank0": sum(e["rank"] == 0 for e in steps),
        "step_p50_s": statistics.median(e["dt"] for e in steps) if steps else None,
        "longest_step_gap_s": max(gaps, default=None),
        "longest_poll_gap_s": max((p["gap"] for p in polls), default=None),
        "longest_poll_idle_s": max((p["idle"] for p in polls), default=None),
        "poll_gaps_over_half_timeout": sum(p["gap"] > timeout_s / 2 for p in polls),
        "driver_lines": [l.rstrip()[:200] for l in driver_log if "heartbeat" in l or "aborted" in l
                         or "did not run" in l][:40],
    }


def sigstops(timeout_s: float, repeats: int) -> dict[str, Any]:
    """SIGSTOP of rank 1 of a fresh job, ``repeats`` times: seconds to the survivors' next step."""
    cmd = elastic_cmd(3, HOSTS, [*MODEL, "--step-log", "--commit-every", "1"], timeout_s)
    times, lost = [], []
    for i in range(repeats):
        try:
            t, n = one_fault(lambda: Procs([cmd], {}), "stop", warm_steps=21 + (4 * i + 2) % 10, bound_s=60)
        except TimeoutError as exc:
            print(f"SIGSTOP at {timeout_s:g} s: {str(exc).splitlines()[0]}", flush=True)
            t, n = float("inf"), -1
        times.append(t)
        lost.append(n)
        print(f"SIGSTOP at {timeout_s:g} s, {i + 1}: next step after {t:.3f}s, {n} steps lost, "
              f"load {os.getloadavg()[0]:.1f}", flush=True)
    return {"recovery_s": times, "steps_lost": lost}


def table(rows: dict[str, dict[str, Any]], stops: dict[str, dict[str, Any]]) -> str:
    lines = ["| heartbeat timeout | window | load avg (1 min, at end) | false alarms (workers given up) | rollbacks | "
             "longest poll gap | longest gap between a worker's steps | SIGSTOP → next step, each | p95 |",
             "|---|---|---|---|---|---|---|---|---|"]
    for key, r in rows.items():
        s = stops.get(key, {}).get("recovery_s", [])
        stop_cells = f"{', '.join(f'{t:.2f}' for t in s)} | {pct(s, 0.95):.2f} s" if s else "– | –"
        poll = f"{r['longest_poll_gap_s']:.2f} s" if r["longest_poll_gap_s"] is not None else "< 0.6 s"
        step_gap = f"{r['longest_step_gap_s']:.2f} s" if r["longest_step_gap_s"] is not None else "no steps"
        lines.append(f"| {key} s | {r['seconds']:.0f} s, {r['hogs']} hogs | {r['load_end']:.1f} | {r['false_alarms']} | "
                     f"{r['rollbacks']} | {poll} | {step_gap} | {stop_cells} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--timeouts", type=float, nargs="+", default=[1.0, 1.5, 2.0])
    p.add_argument("--seconds", type=float, default=180.0, help="steady window per timeout")
    p.add_argument("--hogs", type=int, default=2, help="busy-looping processes during the window")
    p.add_argument("--hog-sessions", action="store_true",
                   help="each hog in a session of its own (under autogroup scheduling: as much CPU as the whole job)")
    p.add_argument("--cooldown", type=float, default=10.0, help="blacklist cooldown of a slot given up on")
    p.add_argument("--stops", type=int, default=3, help="SIGSTOP repeats per timeout")
    p.add_argument("--key", default="steady", help="results key of the steady rows (another keeps the earlier rows)")
    p.add_argument("--out", default=str(HERE / "false_alarms.json"))
    args = p.parse_args()
    out = Path(args.out)
    results = load(out)
    results["machine"] = machine()
    rows: dict[str, dict[str, Any]] = {}
    stops: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for timeout in args.timeouts:
            key = f"{timeout:g}"
            rows[key] = steady(timeout, args.seconds, args.hogs, args.cooldown, Path(tmp), args.hog_sessions)
            print({k: v for k, v in rows[key].items() if k != "driver_lines"}, flush=True)
            record(out, results, args.key, rows)
        for timeout in args.timeouts:
            if args.stops:
                stops[f"{timeout:g}"] = sigstops(timeout, args.stops)
                record(out, results, args.key.replace("steady", "sigstop"), stops)
    print(table(rows, stops))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
