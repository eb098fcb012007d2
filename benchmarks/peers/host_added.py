"""Host added: the running workers' stall, and the newcomer's time to its first step, against the peers.

    flock /tmp/bench.lock python benchmarks/peers/host_added.py [--repeats 6] [--systems NAME ...] [--no-probe]

Two workers train a small MLP (issue 15's: 3 hidden layers of width 256, batch 64,
SGD with momentum, one OpenMP thread each) and a third is admitted, a fresh job
per repeat, each system as it admits one:

* cloud-elastic: a discovery script lists 127.0.0.1 and 127.0.0.2; once both
  workers are past the warm-up, 127.0.0.3 is added to its answer. The driver
  finds it at its next discovery (every 1 s, the default), starts a worker
  there, and admits it at the running workers' next commit (every step here).
  The workers print ``PROBE`` lines (``stall_probe.py``) with the time of each
  stage of the change.
* torchft 0.2: a Lighthouse in this process and one replica group of one
  worker per process; the third replica group's process is started here.
* torchrun elastic (``--nnodes 2:3``, c10d, monitor 0.1 s, last call 1 s, a
  checkpoint every 10 steps): a third agent is started; the running agents
  restart all their workers to admit it.

Per repeat: the *normal step* (median interval between a survivor's consecutive
completed steps over the 2 s before the host was added), the *longest gap*
between consecutive completed steps of a survivor from the host's addition to
0.5 s after the first step at size 3 (for torchrun, whose workers are all
restarted: from the old group's last step to the new group's first), the
*switch gap* (the interval that ends at a survivor's first step at size 3), the
*admitting step's gap* (the longest gap ending within 0.1 s of the first step at
size 3: torchft reports the admitted replica only from the step after the one
that admits it) and the newcomer's time from its process start (and from the
host's appearance in the discovery answer; for torchft the two are the same) to
its first completed step. For cloud-elastic, where each worker's PROBE lines
say where the switch went, a breakdown per repeat too.
Results into ``host_added.json`` beside this file; a markdown table and the
breakdown on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

from peer_results import load, record  # this folder is on sys.path when the script runs
from run_peers import PY, QUIET, REPO, WORKLOAD, Procs, machine, parse, pct, torchrun_elastic_cmds

sys.path.insert(0, str(REPO))
from tests.chaos.schedule import ChaosDiscovery  # noqa: E402

HERE = Path(__file__).resolve().parent
SMALL = ["--features", "256", "--hidden", "256", "--layers", "3", "--batch-size", "64"]
HOSTS = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
WARM_STEPS = 150  # steps of both workers before the host is added (about 1 s at this size)
AFTER_STEPS = 40  # steps at size 3 the survivors make before the repeat ends
ADMISSION_WINDOW_S = 0.1  # the admitting step ends this close to the first step at size 3


class Group(Procs):
    """Procs to which a process can be added later (the newcomer), and that keeps PROBE lines."""

    probes: list[dict]

    def __post_init__(self) -> None:
        self.probes = []
        super().__post_init__()

    def add(self, cmd: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=dict(os.environ, **QUIET, **(env or {})), start_new_session=True)
        self.procs.append(proc)
        threading.Thread(target=self._read, args=(proc,), daemon=True).start()
        return proc

    def _read(self, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            with self.cond:
                self.lines.append(line)
                self.logs.extend(parse(line))
                i = line.find("PROBE {")
                if i >= 0:
                    try:
                        self.probes.append(json.loads(line[i + 6:]))
                    except json.JSONDecodeError:  # glued to another worker's output
                        pass
        # No notify per line: a waiter woken ~450 times a second to rescan every log line
        # would take CPU from the workers whose stall is measured; wait() polls instead.

    def wait(self, pred, timeout: float, what: str):
        deadline = time.monotonic() + timeout
        while True:
            with self.cond:
                v = pred()
                if v:
                    return v
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{what}: not within {timeout}s:\n{''.join(self.lines[-30:])}")
            time.sleep(0.05)


def parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def process_start(pid: int) -> float:
    """Wall-clock start of a process (/proc, 10 ms resolution).

    The start is kept in clock ticks since boot; /proc/stat's ``btime`` is whole
    seconds, so the boot's wall time comes from CLOCK_BOOTTIME instead.
    """
    ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    booted = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
    return booted + ticks / os.sysconf("SC_CLK_TCK")


# ------------------------------------------------------------------------------ the three systems
class Scenario:
    """One system's job: ``start()`` two workers, ``add()`` the third; ``stop()`` ends everything."""

    job: Group
    restarts_all = False  # torchrun: the running workers are replaced, not kept

    def is_newcomer(self, pid: int, before: set[int]) -> bool:
        """Whether the worker ``pid`` is the admitted one (its first step at size 3 ends the wait)."""
        return pid not in before

    def stop(self) -> None:
        self.job.stop()


class CloudElastic(Scenario):
    #: Whether the workers print their PROBE lines (a dozen lines per change; off to check they cost nothing).
    probe = True

    def __init__(self, tmp: Path) -> None:
        self.discovery = ChaosDiscovery(tmp, HOSTS[:2])
        self.cmd = [PY, "-m", "cloud_elastic.cli", "run", "-np", "2", "--min-np", "2", "--max-np", "3",
                    "--host-discovery-script", str(self.discovery.script), "--blacklist-cooldown-range", "300", "300",
                    PY, WORKLOAD, "elastic", *SMALL, "--step-log", "--commit-every", "1",
                    *(["--probe"] if self.probe else [])]

    def start(self) -> None:
        self.job = Group([self.cmd], {})

    def add(self) -> None:
        self.discovery.set(HOSTS)


class TorchFT(Scenario):
    def __init__(self, tick_ms: int) -> None:
        self.tick_ms = tick_ms

    def _cmd(self, replica: int) -> list[str]:
        return [PY, WORKLOAD, "torchft-worker", *SMALL, "--step-log", "--replica-id", str(replica),
                "--lighthouse", self.lighthouse.address()]

    def start(self) -> None:
        from torchft._torchft import LighthouseServer

        # torchft's defaults but the tick: 5 s heartbeat timeout, 60 s join timeout, at least one replica.
        self.lighthouse = LighthouseServer(bind="[::]:0", min_replicas=1, join_timeout_ms=60000,
                                           heartbeat_timeout_ms=5000, quorum_tick_ms=self.tick_ms)
        self.job = Group([self._cmd(0), self._cmd(1)], {})

    def add(self) -> None:
        self.job.add(self._cmd(2))

    def stop(self) -> None:
        super().stop()
        self.lighthouse.shutdown()


class TorchrunElastic(Scenario):
    restarts_all = True

    def __init__(self, tmp: Path) -> None:
        self.cmds = torchrun_elastic_cmds(3, 1, [*SMALL, "--step-log", "--checkpoint-every", "10"],
                                          str(tmp), monitor_s=0.1, last_call_s=1)

    def start(self) -> None:
        self.job = Group(self.cmds[:2], {})

    def add(self) -> None:
        self.agent = self.job.add(self.cmds[2]).pid
        self._mine: dict[int, bool] = {}

    def is_newcomer(self, pid: int, before: set[int]) -> bool:
        """Every worker is new after the restart: the admitted one is the third agent's child."""
        if pid not in self._mine:
            up, hops = pid, 0
            while up > 1 and up != self.agent and hops < 4:
                up, hops = parent(up), hops + 1
            self._mine[pid] = up == self.agent
        return self._mine[pid]


SYSTEMS: dict[str, Callable[[Path], Scenario]] = {
    "cloud-elastic (commit every step)": CloudElastic,
    "torchft (defaults: 100 ms quorum tick)": lambda tmp: TorchFT(100),
    "torchft (10 ms quorum tick)": lambda tmp: TorchFT(10),
    "torchrun elastic (monitor 0.1 s, last call 1 s, checkpoint every 10)": TorchrunElastic,
}


# ------------------------------------------------------------------------------ one admission
def one_admission(scenario: Scenario, bound_s: float) -> dict[str, Any]:
    """Start two workers, add the third, and return the raw times of this repeat (see the module docstring)."""
    scenario.start()
    job = scenario.job
    try:
        job.wait(lambda: len({e["pid"] for e in job.logs if e["step"] >= WARM_STEPS and e["size"] == 2}) >= 2, 300,
                 "two workers past the warm-up")
        time.sleep(1.0)  # a steady stretch for the normal step
        with job.cond:
            before = {e["pid"] for e in job.logs}
        t_add = time.time()
        scenario.add()

        def newcomer_step():
            return next((e for e in job.logs if e["size"] == 3 and scenario.is_newcomer(e["pid"], before)), None)

        first = job.wait(newcomer_step, bound_s, "the newcomer's first step")

        def enough() -> bool:
            counts: dict[int, int] = {}
            for e in job.logs:
                if e["size"] == 3:
                    counts[e["pid"]] = counts.get(e["pid"], 0) + 1
            return sum(1 for n in counts.values() if n >= AFTER_STEPS) >= 3

        job.wait(enough, 60, "three workers stepping at size 3")
        with job.cond:
            logs, probes = list(job.logs), list(job.probes)
        if scenario.restarts_all:
            survivors = {e["pid"] for e in logs if e["size"] == 3 and e["pid"] != first["pid"]}
        else:
            survivors = {e["pid"] for e in logs if e["pid"] in before and e["size"] == 2}
        started = process_start(first["pid"])
        return {"t_add": t_add, "newcomer_pid": first["pid"], "newcomer_started": started,
                "newcomer_first_step": first["t"], "survivors": sorted(survivors), "before_pids": sorted(before),
                "steps": pack_steps([(e["t"], e["pid"], e["size"]) for e in logs if e["t"] >= t_add - 3], t_add),
                "probes": [p for p in probes if p["t"] >= t_add - 3]}
    finally:
        scenario.stop()


def pack_steps(steps: list[tuple[float, int, int]], t0: float) -> dict[str, dict[str, str]]:
    """(time, pid, size) per completed step -> pid -> size -> the step end times in ms after ``t0``,
    space-separated (tens of thousands of steps per run: one JSON value per step would be megabytes)."""
    out: dict[str, dict[str, list[str]]] = {}
    for t, pid, size in steps:
        out.setdefault(str(pid), {}).setdefault(str(size), []).append(f"{(t - t0) * 1000:.2f}")
    return {pid: {size: " ".join(ts) for size, ts in by_size.items()} for pid, by_size in out.items()}


def unpack_steps(packed: dict[str, dict[str, str]], t0: float) -> list[tuple[float, int, int]]:
    """The inverse of :func:`pack_steps`, sorted by time."""
    return sorted((t0 + float(ms) / 1000, int(pid), int(size))
                  for pid, by_size in packed.items() for size, ts in by_size.items() for ms in ts.split())


def analyse(raw: dict[str, Any], restarts_all: bool) -> dict[str, float]:
    """The repeat's figures, in seconds, from its raw step times."""
    t_add, steps = raw["t_add"], unpack_steps(raw["steps"], raw["t_add"])
    by_pid: dict[int, list[tuple[float, int]]] = {}
    for t, pid, size in steps:
        by_pid.setdefault(pid, []).append((t, size))
    first3 = min(t for t, pid, size in steps if size == 3)
    normal = max(statistics.median(b[0] - a[0] for a, b in zip(v, v[1:]) if t_add - 2 <= a[0] and b[0] <= t_add)
                 for pid, v in by_pid.items() if pid in raw["before_pids"] and len(v) > 2)
    after = max(statistics.median(b[0] - a[0] for a, b in zip(v, v[1:]) if a[1] == 3 and b[0] <= first3 + 3)
                for pid, v in by_pid.items() if pid in raw["survivors"])
    if restarts_all:  # the old group's last step to the new group's first
        last2 = max(t for t, _pid, size in steps if size == 2 and t < first3)
        gap = switch = first3 - last2
    else:
        gaps, switches, admits = [], [], []
        for pid in raw["survivors"]:
            v = by_pid[pid]
            pairs = [(a, b) for a, b in zip(v, v[1:]) if b[0] >= t_add and a[0] <= first3 + 0.5]
            gaps.append(max((b[0] - a[0], b[0] - first3) for a, b in pairs))
            switches.append(next(b[0] - a[0] for a, b in pairs if b[1] == 3))
            # torchft's admitting step is reported at size 2 (the healing replica is not yet counted),
            # one step before the first at size 3: the longest gap ending near that first step.
            admits.append(max(b[0] - a[0] for a, b in pairs if abs(b[0] - first3) <= ADMISSION_WINDOW_S))
        (gap, where), switch, admit = max(gaps), max(switches), max(admits)
    return {"normal_step_s": normal, "normal_step_at_3_s": after, "longest_gap_s": gap, "switch_gap_s": switch,
            "admission_gap_s": gap if restarts_all else admit,
            # Where the longest gap ended, from the first step at size 3 (0: it is the switch itself).
            "longest_gap_end_after_switch_s": 0.0 if restarts_all else where,
            "stall_s": gap - normal, "start_to_first_step_s": raw["newcomer_first_step"] - raw["newcomer_started"],
            "added_to_first_step_s": raw["newcomer_first_step"] - t_add}


def probe_breakdown(raw: dict[str, Any]) -> dict[str, float]:
    """cloud-elastic only: where a survivor's switch gap goes, from its PROBE lines (the slower survivor)."""
    out: dict[str, float] = {}
    worst = -1.0
    for pid in raw["survivors"]:
        mine = [p for p in raw["probes"] if p["pid"] == pid and p["t"] >= raw["t_add"]]
        steps = [(t, size) for t, p, size in unpack_steps(raw["steps"], raw["t_add"]) if p == pid]
        ev = {p["event"]: p for p in mine}
        if not {"interrupt", "rendezvous", "form_group", "sync", "hold_synced", "reset"} <= ev.keys():
            continue
        t_int = ev["interrupt"]["t"]
        prev = max(t for t, size in steps if t < t_int)  # the step before the interrupted one (logged after it)
        first3 = min(t for t, size in steps if size == 3)
        end = {k: ev[k]["t"] + ev[k].get("dt", 0) for k in ev}
        parts = {
            "interrupted step (compute, commit, flag)": t_int - prev,
            "interrupt -> rendezvous call": ev["rendezvous"]["t"] - t_int,
            "rendezvous (driver forms the round)": ev["rendezvous"]["dt"],
            "rendezvous reply -> form_group": ev["form_group"]["t"] - end["rendezvous"],
            "form_group (Gloo group of 3)": ev["form_group"]["dt"],
            "form_group: in the Gloo constructor": ev["new_group"]["dt"] if "new_group" in ev else float("nan"),
            "sync (broadcast of rank 0's state)": ev["sync"]["dt"],
            "hold_synced (commit-sequence broadcast, save)": ev["hold_synced"]["dt"],
            "reset callbacks": ev["reset"]["dt"],
            "first step in the new group": first3 - end["hold_synced"] - ev["reset"]["dt"],
            "update seen -> interrupt": t_int - ev["update_seen"]["t"] if "update_seen" in ev else float("nan"),
            "sync: in broadcast_ calls": ev["sync"].get("bcast_s", float("nan")),
            "sync: encoding/decoding": ev["sync"].get("codec_s", float("nan")),
        }
        if first3 - t_int > worst:
            worst, out = first3 - t_int, parts
    new = {p["event"]: p for p in raw["probes"] if p["pid"] == raw["newcomer_pid"]}
    if {"main", "register", "rendezvous", "form_group"} <= new.keys():
        out.update({
            "newcomer: process start -> main (python, torch import)": new["main"]["t"] - raw["newcomer_started"],
            "newcomer: main -> register reply": new["register"]["t"] + new["register"]["dt"] - new["main"]["t"],
            "newcomer: preload torch._dynamo": new.get("preload", {}).get("dt", float("nan")),
            "newcomer: waiting at rendezvous": new["rendezvous"]["dt"],
            "newcomer: form_group": new["form_group"]["dt"],
            "newcomer: sync": new.get("sync", {}).get("dt", float("nan")),
            "newcomer: sync, model tensors": new.get("sync:_ModelHandler", {}).get("dt", float("nan")),
            "newcomer: sync, optimizer": new.get("sync:_OptimizerHandler", {}).get("dt", float("nan")),
            "newcomer: sync, plain attributes": new.get("sync:objects", {}).get("dt", float("nan")),
            "newcomer: sync, in broadcast_ calls": new.get("sync", {}).get("bcast_s", float("nan")),
            "newcomer: sync, number of broadcast_ calls (not ms)": new.get("sync", {}).get("broadcasts", 0) / 1000,
            "newcomer: sync, encoding/decoding": new.get("sync", {}).get("codec_s", float("nan")),
            "newcomer: hold_synced": new.get("hold_synced", {}).get("dt", float("nan")),
            "newcomer: form_group end -> first step": raw["newcomer_first_step"] - new["form_group"]["t"]
            - new["form_group"]["dt"],
        })
    return out


# ------------------------------------------------------------------------------ report
def table(rows: dict[str, dict]) -> str:
    ms = lambda x: f"{x * 1000:.0f} ms"  # noqa: E731
    s = lambda x: f"{x:.2f} s"  # noqa: E731
    lines = ["| system (2 workers + 1 admitted) | normal step | longest gap, p50 / p95 | stall (gap − normal step), "
             "p50 / p95 | admitting step's gap, p50 / p95 | newcomer: process start → first step, p50 / p95 | "
             "host added → first step, p50 | repeats |", "|---|---|---|---|---|---|---|---|"]
    for name, r in rows.items():
        a = r["figures"]
        if not a:
            lines.append(f"| {name} | – | miss | miss | – | miss | miss | 0 of {len(r['misses'])} |")
            continue
        col = lambda k: [x[k] for x in a]  # noqa: E731
        lines.append(
            f"| {name} | {ms(statistics.median(col('normal_step_s')))} | {ms(pct(col('longest_gap_s'), .5))} / "
            f"{ms(pct(col('longest_gap_s'), .95))} | {ms(pct(col('stall_s'), .5))} / {ms(pct(col('stall_s'), .95))} | "
            f"{ms(pct(col('admission_gap_s'), .5))} / {ms(pct(col('admission_gap_s'), .95))} | "
            f"{s(pct(col('start_to_first_step_s'), .5))} / "
            f"{s(pct(col('start_to_first_step_s'), .95))} | {s(pct(col('added_to_first_step_s'), .5))} | "
            f"{len(a)} of {len(a) + len(r['misses'])} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=6)
    p.add_argument("--bound", type=float, default=90.0, help="seconds the newcomer gets to its first step")
    p.add_argument("--systems", action="append", default=None, help="only the systems whose name contains this")
    p.add_argument("--out", default=str(HERE / "host_added.json"))
    p.add_argument("--no-probe", action="store_true",
                   help="cloud-elastic's workers without their PROBE lines (its row is then named so)")
    args = p.parse_args()
    if args.no_probe:
        CloudElastic.probe = False
        SYSTEMS["cloud-elastic (commit every step, no probe)"] = SYSTEMS.pop("cloud-elastic (commit every step)")
    os.environ.setdefault("RUST_LOG", "warn")  # the Lighthouse in this process logs every quorum at info
    out = Path(args.out)
    results = load(out)
    results["machine"], results["model"] = machine(), SMALL
    rows: dict[str, dict] = dict(results.get("host_added", {}))
    chosen = {n: f for n, f in SYSTEMS.items() if not args.systems or any(w in n for w in args.systems)}
    with tempfile.TemporaryDirectory() as root:
        # Rounds over the systems, so that a slow minute of the shared machine hits each of them.
        for n in chosen:
            rows[n] = {"figures": [], "raw": [], "misses": [], "breakdown": [], "bound_s": args.bound}
        for i in range(args.repeats):
            for name, make in chosen.items():
                scenario = make(Path(tempfile.mkdtemp(dir=root)))
                try:
                    raw = one_admission(scenario, args.bound)
                except TimeoutError as exc:
                    print(f"{name}: repeat {i + 1}: {str(exc).splitlines()[0]}", flush=True)
                    rows[name]["misses"].append([l[:300] for l in str(exc).splitlines() if "STEPLOG" not in l][-25:])
                    continue
                fig = analyse(raw, scenario.restarts_all)
                rows[name]["figures"].append(fig)
                rows[name]["raw"].append(raw)
                if isinstance(scenario, CloudElastic) and scenario.probe:
                    rows[name]["breakdown"].append(probe_breakdown(raw))
                print(f"{name}: repeat {i + 1}: " + ", ".join(f"{k} {v * 1000:.1f} ms" for k, v in fig.items()),
                      flush=True)
            record(out, results, "host_added", rows)
    print(table(rows))
    for name, r in rows.items():
        if r.get("breakdown"):
            keys = r["breakdown"][0].keys()
            print(f"\n{name}: median over repeats of the slower survivor's switch, and the newcomer's start:")
            for k in keys:
                vals = [b[k] for b in r["breakdown"] if k in b]
                print(f"  {k}: {statistics.median(vals) * 1000:.1f} ms (each: "
                      + ", ".join(f"{v * 1000:.1f}" for v in vals) + ")")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
