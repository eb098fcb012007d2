"""Where the time of a ``kill -9`` goes: from the kill of one worker of three to the survivors' first step at size 2.

    flock /tmp/bench.lock python benchmarks/peers/kill_profile.py [--kills 10] [--heartbeat-timeout 5]

The job of ``run_peers.py``'s kill scenario (three loopback "hosts", one
worker each, the peers' model, a commit every step), a fresh job per kill, with
two sources of timestamps:

* the workers' ``PROBE`` lines (``workload.py --probe``, ``stall_probe.py``):
  the ``CollectiveError``'s arrival, the rollback (``restore``), the
  rendezvous call (sent, and returned once the driver formed the round), the
  new Gloo group, the state sync, the reset callbacks;
* the driver's ``--events-file`` (each event stamped when the driver emits it):
  ``worker_failed`` (the driver saw the dead worker go), ``round_formed``.

Each milestone is taken at the *later* survivor (the group moves at the pace of
its slowest member), except the first step, taken at the earlier one, as
``run_peers.py`` does. All processes share one clock (one machine).
Raw numbers into ``kill_profile.json`` beside this file; a table on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from host_added import Group  # this folder is on sys.path when the script runs
from peer_results import load, record
from run_peers import MODEL, elastic_cmd, machine, parse, pct

HERE = Path(__file__).resolve().parent
HOSTS = "127.0.0.1:1,127.0.0.2:1,127.0.0.3:1"

#: The survivors' way back (milestone, what it is), in the order it happens; seconds after the kill.
MILESTONES = [
    ("error", "collective raised CollectiveError"),
    ("restored", "restore() (rollback to the last commit) returned"),
    ("rdzv_sent", "rendezvous call sent"),
    ("rdzv_back", "rendezvous call returned (the driver formed the round)"),
    ("group", "new Gloo group formed (form_group returned)"),
    ("reset", "reset callbacks done"),
    ("synced", "state sync done (root_seq, sync, hold_synced)"),
    ("step", "first completed step at size 2 (earlier survivor)"),
]
#: The driver's side, from its events file (stamped when written, to the millisecond).
DRIVER = [
    ("driver_failed", "driver recorded worker_failed (saw the process go)"),
    ("round_formed", "driver recorded round_formed"),
]
_PROBE = re.compile(r"PROBE (\{[^{}]*\})")  # workers sharing a pipe can glue lines together


class ProbedJob(Group):
    """host_added's Group, keeping every PROBE of a line (a line may hold several workers' output)."""

    def _read(self, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            with self.cond:
                self.lines.append(line)
                self.logs.extend(parse(line))
                for text in _PROBE.findall(line):
                    try:
                        self.probes.append(json.loads(text))
                    except json.JSONDecodeError:  # cut by another worker's output
                        pass


def job_command(events: Path, heartbeat_s: float, extra: tuple[str, ...] = ()) -> list[str]:
    """run_peers.py's cloud-elastic kill job, with an events file and PROBE lines."""
    cmd = elastic_cmd(3, HOSTS, [*MODEL, "--step-log", "--commit-every", "1", "--probe", *extra], heartbeat_s)
    at = cmd.index("run") + 1
    return [*cmd[:at], "--events-file", str(events), *cmd[at:]]


def driver_events(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:  # the last line, cut by the kill at the end
            pass
    return out


def one_kill(tmp: Path, warm_steps: int, heartbeat_s: float, bound_s: float) -> dict[str, Any]:
    """Kill rank 1 once three ranks passed ``warm_steps``; the raw timestamps of the way back."""
    events = tmp / f"events-{time.monotonic_ns()}.jsonl"
    job = ProbedJob([job_command(events, heartbeat_s)], {})
    try:
        job.wait(lambda: len({e["rank"] for e in job.logs if e["step"] >= warm_steps}) == 3, 300, "three ranks stepping")
        with job.cond:
            victim = next(e["pid"] for e in reversed(job.logs) if e["rank"] == 1)
            survivors = sorted({e["pid"] for e in job.logs} - {victim})
        t_kill = time.time()
        os.kill(victim, signal.SIGKILL)

        def stepped(pid: int) -> bool:
            return any(e["pid"] == pid and e["size"] == 2 and e["t"] > t_kill for e in job.logs)

        job.wait(lambda: any(stepped(p) for p in survivors), bound_s, "a survivor's first step at size 2")
        job.wait(lambda: all(stepped(p) for p in survivors), 30, "both survivors' first step at size 2")
        with job.cond:
            logs, probes = list(job.logs), list(job.probes)
    finally:
        job.stop()
    return {"t_kill": t_kill, "victim": victim, "survivors": survivors,
            "steps": [e for e in logs if e["t"] > t_kill - 1 and e["pid"] != victim][:40],
            "probes": [p for p in probes if p["t"] >= t_kill - 1],
            "driver": [e for e in driver_events(events) if e["ts"] >= t_kill - 1]}


def _end(p: dict[str, Any]) -> float:
    return p["t"] + p.get("dt", 0.0)


def milestones(raw: dict[str, Any]) -> dict[str, float]:
    """Seconds after the kill of each milestone (see MILESTONES); absent ones are left out."""
    t_kill = raw["t_kill"]
    per: dict[str, list[float]] = {}
    for pid in raw["survivors"]:
        first = min(e["t"] for e in raw["steps"] if e["pid"] == pid and e["size"] == 2 and e["t"] > t_kill)
        mine = [p for p in raw["probes"] if p["pid"] == pid and t_kill <= p["t"] <= first]

        def first_of(event: str, end: bool = False) -> float | None:
            hits = [p for p in mine if p["event"] == event]
            return (_end(hits[0]) if end else hits[0]["t"]) if hits else None

        def last_end(*events: str) -> float | None:
            hits = [p for p in mine if p["event"] in events]
            return _end(hits[-1]) if hits else None

        # The last call is the one that returned with the round this worker stepped in (earlier ones may have
        # been retried after a group that did not form).
        rdzv = [p for p in mine if p["event"] == "rendezvous"]
        found = {
            "error": first_of("collective_error"), "restored": first_of("restore", end=True),
            "rdzv_sent": rdzv[0]["t"] if rdzv else None, "rdzv_back": _end(rdzv[-1]) if rdzv else None,
            "group": last_end("form_group"), "reset": last_end("reset"),
            # A round that needs no sync goes from the reset straight to training.
            "synced": last_end("root_seq", "sync", "hold_synced") or last_end("reset"), "step": first,
        }
        for key, t in found.items():
            if t is not None:
                per.setdefault(key, []).append(t - t_kill)
    out = {k: (min(v) if k == "step" else max(v)) for k, v in per.items() if len(v) == len(raw["survivors"])}
    for event, key in (("worker_failed", "driver_failed"), ("round_formed", "round_formed")):
        hit = next((e for e in raw["driver"] if e["event"] == event and e["ts"] >= t_kill), None)
        if hit is not None:
            out[key] = hit["ts"] - t_kill
    return out


def details(raw: dict[str, Any]) -> dict[str, Any]:
    """What else a reader of one kill wants: the error each survivor saw, when its heartbeat learned of the
    abort, the sync's time (and its broadcasts'), the first step's own time."""
    t_kill = raw["t_kill"]
    errs = [p for p in raw["probes"] if p["event"] == "collective_error" and p["t"] >= t_kill]
    syncs = [p for p in raw["probes"] if p["event"] == "sync" and p["t"] >= t_kill]
    aborts = [p["t"] - t_kill for p in raw["probes"] if p["event"] == "abort_seen" and p["t"] >= t_kill]
    firsts = {}
    for e in raw["steps"]:
        if e["size"] == 2 and e["t"] > t_kill and e["pid"] not in firsts:
            firsts[e["pid"]] = e["dt"]
    before = [e["dt"] for e in raw["steps"] if e["t"] <= t_kill]
    return {"normal_step_dt": pct(before, 0.5) if before else None,
            "errors": sorted({p["why"].split(":")[0] + ": " + p["why"].split(":", 1)[-1][:60] for p in errs}),
            "abort_seen": sorted(aborts), "sync_s": max((p["dt"] for p in syncs), default=None),
            "sync_bcast_s": max((p["bcast_s"] for p in syncs), default=None), "first_step_dt": sorted(firsts.values()),
            "error_spread": (max(p["t"] for p in errs) - min(p["t"] for p in errs)) if errs else None}


def _ms(values: list[float]) -> str:
    return f"{pct(values, 0.5) * 1000:.0f} ms | {pct(values, 0.95) * 1000:.0f} ms"


def table(rows: list[dict[str, float]]) -> str:
    """The survivors' milestones (p50, p95 after the kill; the later survivor's, but the first step) and each
    stage (time since the row's previous milestone present in that kill), then the driver's milestones."""
    lines = ["| survivors' milestone | after the kill, p50 | p95 | stage since the previous, p50 | p95 |",
             "|---|---|---|---|---|"]
    for i, (key, what) in enumerate(MILESTONES):
        at = [r[key] for r in rows if key in r]
        stage = []
        for r in rows:
            prev = next((r[k] for k, _ in reversed(MILESTONES[:i]) if k in r), 0.0)
            if key in r:
                stage.append(r[key] - prev)
        if at:
            lines.append(f"| {what} | {_ms(at)} | {_ms(stage)} |")
    for key, what in DRIVER:
        at = [r[key] for r in rows if key in r]
        if at:
            lines.append(f"| {what} | {_ms(at)} | | |")
    # The survivors' wait on the driver: round formed after the later request arrived; how much of it
    # was the driver still to see the dead worker go (the round cannot form while it is a running member).
    gated = [r["round_formed"] - r["rdzv_sent"] for r in rows if "round_formed" in r and "rdzv_sent" in r]
    late = sum(r["driver_failed"] > r["rdzv_sent"] for r in rows if "driver_failed" in r and "rdzv_sent" in r)
    lines.append(f"\nround formed after the later survivor's rendezvous request: p50 {pct(gated, 0.5) * 1000:.0f} ms, "
                 f"p95 {pct(gated, 0.95) * 1000:.0f} ms; the driver saw the dead worker go only after that request "
                 f"in {late} of {len(rows)} kills")
    return "\n".join(lines)


def summary(kills: list[dict[str, Any]]) -> str:
    out = [table([k["milestones"] for k in kills])]
    for key in ("sync_s", "sync_bcast_s", "normal_step_dt"):
        vals = [k[key] for k in kills if k[key] is not None]
        if vals:
            out.append(f"{key}: p50 {pct(vals, 0.5) * 1000:.0f} ms, p95 {pct(vals, 0.95) * 1000:.0f} ms")
    firsts = [max(k["first_step_dt"]) for k in kills if k["first_step_dt"]]
    out.append(f"first step at size 2, its own time (slower survivor): p50 {pct(firsts, 0.5) * 1000:.0f} ms, "
               f"p95 {pct(firsts, 0.95) * 1000:.0f} ms")
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--kills", type=int, default=10)
    p.add_argument("--heartbeat-timeout", type=float, default=5.0)
    p.add_argument("--bound", type=float, default=60.0, help="seconds the survivors get to step again")
    p.add_argument("--out", default=str(HERE / "kill_profile.json"))
    p.add_argument("--table", action="store_true", help="print the table of the kills in --out; run nothing")
    args = p.parse_args()
    out = Path(args.out)
    if args.table:
        print(summary(json.loads(out.read_text())["kill_profile"]["kills"]))
        return
    results = load(out)
    results["machine"] = machine()
    kills: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.kills):
            load_before = os.getloadavg()[0]
            # 23, 27, 21, 25, 29, ...: as run_peers.py varies the kill's step.
            raw = one_kill(Path(tmp), 21 + (4 * i + 2) % 10, args.heartbeat_timeout, args.bound)
            row = {"milestones": milestones(raw), **details(raw), "load_before": round(load_before, 2), "raw": raw}
            kills.append(row)
            ms = row["milestones"]
            print(f"kill {i + 1}: " + ", ".join(f"{k} {ms[k] * 1000:.0f}" for k, _ in MILESTONES if k in ms)
                  + f" ms; load {load_before:.1f}; {row['errors']}", flush=True)
            record(out, results, "kill_profile", {"heartbeat_timeout_s": args.heartbeat_timeout, "kills": kills})
    print(summary(kills))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
