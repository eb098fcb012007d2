"""Recovery: ``kill -9`` (a lost worker) and SIGSTOP (a silent one) of one worker of three, to the survivors' next step.

    .venv/bin/python benchmarks/recovery.py [--kills 8] [--stops 3] [--peers] [--quick]

Three loopback "hosts", one worker each (``workload.py``: an MLP of 4 hidden
layers of width 1024, SGD with momentum, batch 64, one OpenMP thread per worker,
a commit every step), a fresh job per fault. Once every worker has passed step
21-29 (varied per repeat, so that a fault does not always fall right after a
checkpoint step), rank 1 gets the fault and the benchmark waits for the
survivors' first completed step at the smaller size (for torchrun, whose agents
restart every worker, the restarted group's first step). Steps lost = steps
completed before the fault that the group trains again. Each repeat is bounded
(``--bound``): a system that has not stepped by then is recorded as a miss.

cloud-elastic runs at its default heartbeat timeout (5 s) and at 1 s (SIGSTOP
only: nothing but the heartbeat finds a stopped worker). ``--peers`` adds
torchrun elastic (c10d, monitor 0.1 s, last call 1 s, a checkpoint every 10
steps) and torchft 0.2 (Lighthouse + Manager, one replica group per worker, at
its defaults and at faster settings); they need ``requirements/bench.txt``.

Prints the tables and writes them into docs/benchmarks.md (``docsection``:
section ``recovery`` and its glance rows), and draws ``recovery.png``.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import tempfile
import time
from typing import Callable

import docsection
from common import PY, JobExited, Miss, Procs, WORKLOAD, command, pct, save, stamp, subplots, torchrun_elastic_cmds, where

MODEL = ["--features", "256", "--hidden", "1024", "--layers", "4", "--batch-size", "64"]
HOSTS = "127.0.0.1:1,127.0.0.2:1,127.0.0.3:1"
SECTION = "Recovery from a lost or silent worker"
KILL_TARGET_S, STOP_TARGET_S = 0.5, 2.0
GLANCE_KILL = "`kill -9` of one worker of three → survivors' next step ≤ 0.5 s p95, 0 steps lost"
GLANCE_STOP = "SIGSTOP of one worker of three → survivors' next step ≤ 2 s p95, at the default heartbeat timeout"
CE_KILL = "cloud-elastic (heartbeat timeout 5 s, the default)"
CE_STOP_FAST = "cloud-elastic (heartbeat timeout 1 s)"


def elastic_cmd(heartbeat_s: float) -> list[str]:
    return [PY, "-m", "cloud_elastic.cli", "run", "-np", "3", "--min-np", "2", "--max-np", "3", "-H", HOSTS,
            "--heartbeat-timeout", str(heartbeat_s), "--blacklist-cooldown-range", "300", "300",
            PY, WORKLOAD, "elastic", *MODEL, "--step-log", "--commit-every", "1"]


def systems(ckpt_root: str, fault: str, peers: bool, quick: bool) -> dict[str, Callable[[], Procs]]:
    """name -> factory of a fresh three-worker job. ``fault`` is "kill" (``kill -9``) or "stop" (SIGSTOP:
    a silent worker, as a hung host or a network partition looks). ``quick``: cloud-elastic's defaults only."""
    common = [*MODEL, "--step-log"]

    def ce(heartbeat_s: float):
        return lambda: Procs([elastic_cmd(heartbeat_s)], {})

    def te(*extra: str):
        return lambda: Procs(torchrun_elastic_cmds(3, 1, [*common, "--checkpoint-every", "10", *extra],
                                                   tempfile.mkdtemp(dir=ckpt_root), 0.1, 1), {})

    def ft(*extra: str):
        return lambda: Procs([[PY, WORKLOAD, "torchft", "--replicas", "3", *common, *extra]], {})

    fast_ft = ("--lighthouse-heartbeat-ms", "1000", "--lighthouse-tick-ms", "10")
    if fault == "kill":
        out = {CE_KILL: ce(5.0)}
        if peers:
            out.update({
                "torchrun elastic (monitor 0.1 s, last call 1 s, checkpoint every 10)": te(),
                "torchft (defaults)": ft(),
                # Without torchft.DistributedDataParallel, whose comm hook can assert on the error a dead
                # peer raises (see workload.py): gradients through Manager.allreduce.
                "torchft (heartbeat 1 s, tick 10 ms, Manager.allreduce)": ft(*fast_ft, "--torchft-manual-allreduce"),
            })
        return out
    out = {CE_KILL: ce(5.0)} if quick else {CE_KILL: ce(5.0), CE_STOP_FAST: ce(1.0)}
    if peers:
        out.update({
            "torchrun elastic (fast settings, collective timeout 10 s)": te("--pg-timeout-s", "10"),
            # Manual allreduce: torchft's own DDP wrapper crashes the survivors on a timeout (see workload.py).
            "torchft (defaults: heartbeat 5 s, collective timeout 10 s)": ft("--torchft-manual-allreduce"),
            "torchft (heartbeat 1 s, tick 10 ms, collective timeout 2 s)": ft(*fast_ft, "--pg-timeout-s", "2",
                                                                              "--torchft-manual-allreduce"),
        })
    return out


class Crashed(Miss):
    """The job exited instead of stepping again: no step, as a miss, but said as the crash it was."""

    def __init__(self, message: str, code: int | None) -> None:
        super().__init__(message)
        self.code = code


def one_fault(make: Callable[[], Procs], fault: str, warm_steps: int, bound_s: float) -> tuple[float, int]:
    """Start a job, hit rank 1 with the fault once three ranks passed ``warm_steps``, and return
    (seconds from the fault to the survivors' next completed step, steps lost). Miss past ``bound_s``."""
    job = make()
    try:
        job.wait(lambda: len({e["rank"] for e in job.logs if e["step"] >= warm_steps}) == 3, 300, "three ranks stepping")
        with job.cond:
            victim = next(e["pid"] for e in reversed(job.logs) if e["rank"] == 1)
            before_pids = {e["pid"] for e in job.logs}
        t_fault = time.time()
        os.kill(victim, signal.SIGKILL if fault == "kill" else signal.SIGSTOP)

        def next_step():
            for e in job.logs:
                if e["t"] <= t_fault or e["pid"] == victim:
                    continue
                # A survivor's step in the new group (size 2), or the restarted group's first step (torchrun).
                if e["size"] == 2 or e["pid"] not in before_pids:
                    return e
            return None

        try:
            nxt = job.wait(next_step, bound_s, f"the first step after the {fault}")
        except JobExited as exc:
            raise Crashed(str(exc), next((c for c in exc.codes if c), exc.codes[0] if exc.codes else None)) from exc
        except TimeoutError as exc:
            raise Miss(str(exc)) from exc
        with job.cond:
            last = max(e["step"] for e in job.logs if e["t"] <= t_fault)
        return nxt["t"] - t_fault, max(0, last - (nxt["step"] - 1))
    finally:
        job.stop()  # SIGKILL: also ends a stopped worker


def faults(ckpt_root: str, fault: str, repeats: int, bound_s: float, peers: bool, quick: bool) -> dict[str, dict]:
    """Every system's repeats of one fault; a miss of the bound is recorded (inf), not fatal."""
    out = {}
    for name, make in systems(ckpt_root, fault, peers, quick).items():
        times, lost, crashes = [], [], []
        for i in range(repeats):
            crash = None
            try:
                # 23, 27, 21, 25, 29, ...: the fault lands at different distances from a checkpoint every 10.
                t, n = one_fault(make, fault, warm_steps=21 + (4 * i + 2) % 10, bound_s=bound_s)
            except Miss as exc:
                print(f"{name}: {fault} {i + 1}: {str(exc).splitlines()[0]}", flush=True)
                t, n = math.inf, -1
                if isinstance(exc, Crashed):
                    crash = f"crashed (exit {exc.code})"
            times.append(t)
            lost.append(n)
            crashes.append(crash)
            print(f"{name}: {fault} {i + 1}: next step after {t:.3f}s, {n} steps lost, "
                  f"load {os.getloadavg()[0]:.1f}", flush=True)
        out[name] = {"recovery_s": times, "steps_lost": lost, "bound_s": bound_s, "crashes": crashes}
    return out


def _seconds(t: float, bound: float, no_step: str | None = None) -> str:
    if not math.isinf(t):
        return f"{t:.2f} s"
    return no_step or f"miss (> {bound:.0f} s)"


def _no_step(r: dict) -> str:
    """What a percentile that found no step says: the bound missed, the crash (when every such repeat crashed
    alike), or both counted."""
    crashes = [c for t, c in zip(r["recovery_s"], r.get("crashes") or [None] * len(r["recovery_s"])) if math.isinf(t)]
    if all(c is None for c in crashes):
        return f"miss (> {r['bound_s']:.0f} s)"
    if len(set(crashes)) == 1:
        return crashes[0]
    crashed = sum(c is not None for c in crashes)
    return f"no step ({crashed} crashed, {len(crashes) - crashed} past {r['bound_s']:.0f} s)"


def table(rows: dict[str, dict], what: str) -> str:
    lines = [f"| system (3 workers, 3 loopback hosts) | {what} → survivors' next step, p50 | p95 | each repeat | "
             "steps lost |", "|---|---|---|---|---|"]
    for name, r in rows.items():
        t, b, none = r["recovery_s"], r["bound_s"], _no_step(r)
        crashes = r.get("crashes") or [None] * len(t)
        each = ", ".join((c or "miss") if math.isinf(x) else f"{x:.2f}" for x, c in zip(t, crashes))
        lost = ", ".join("–" if n < 0 else str(n) for n in r["steps_lost"])
        lines.append(f"| {name} | {_seconds(pct(t, .5), b, none)} | {_seconds(pct(t, .95), b, none)} | {each} | {lost} |")
    return "\n".join(lines)


def draw(results: dict[str, dict[str, dict]], path) -> None:
    """One panel per fault: p50 bars and p95 marks per system, on a log scale."""
    panels = [(k, t) for k, t in (("kill", "kill -9"), ("stop", "SIGSTOP")) if results.get(k)]
    fig, axes = subplots(len(panels), 1, squeeze=False,
                             figsize=(9, 2.2 + 0.55 * sum(len(results[k]) for k, _ in panels)))
    for ax, (key, title) in zip(axes[:, 0], panels):
        rows = results[key]
        names = list(rows)
        bound = max(r["bound_s"] for r in rows.values())
        p50 = [pct(rows[n]["recovery_s"], .5) for n in names]
        p95 = [pct(rows[n]["recovery_s"], .95) for n in names]
        y = list(range(len(names)))
        ax.barh(y, [min(v, bound) for v in p50], color=["tab:red" if math.isinf(v) else "tab:blue" for v in p50],
                label="p50 (red: no step within the bound)")
        ax.errorbar([min(v, bound) for v in p95], y, fmt="|", color="black", markersize=14, label="p95")
        ax.axvline(KILL_TARGET_S if key == "kill" else STOP_TARGET_S, color="tab:green", linestyle=":", label="target")
        ax.set_yticks(y, [n.replace(" (", "\n(") for n in names], fontsize=7)
        ax.set_xscale("log")
        ax.set_xlim(0.1, bound * 1.1)
        ax.set_xlabel(f"{title} of one worker → survivors' next completed step (s, log scale; bound {bound:.0f} s)")
        ax.invert_yaxis()
        ax.legend(loc="lower right", fontsize=7)
    save(fig, path)


def glance(results: dict[str, dict[str, dict]]) -> list[list[str]]:
    rows = []
    kill = results["kill"].get(CE_KILL)
    if kill:
        t, lost = kill["recovery_s"], max(kill["steps_lost"])
        p95 = pct(t, .95)
        rows.append([GLANCE_KILL, f"p95 {_seconds(p95, kill['bound_s'], _no_step(kill))} over {len(t)} kill(s), {max(lost, 0)} lost",
                     f"{p95 / KILL_TARGET_S:.2f}", where(SECTION), docsection.verdict(p95 <= KILL_TARGET_S and lost == 0)])
    # The SIGSTOP row (GLANCE_STOP) is benchmarks/silence.py's: more stops, after the fast rule's warm-up, and
    # the false-alarm soak that goes with it.
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kills", type=int, default=None, help="kills per system (default 8; 1 with --quick)")
    p.add_argument("--stops", type=int, default=None, help="SIGSTOPs per system (default 3; 1 with --quick)")
    p.add_argument("--bound", type=float, default=None, help="seconds a system gets to step again (default 90; 30 "
                                                            "with --quick)")
    p.add_argument("--peers", action="store_true", help="also torchrun elastic and torchft (requirements/bench.txt)")
    docsection.add_arguments(p)
    args = p.parse_args()
    kills = args.kills if args.kills is not None else 1 if args.quick else 8
    stops = args.stops if args.stops is not None else 1 if args.quick else 3
    bound = args.bound or (30.0 if args.quick else 90.0)
    results = {}
    with tempfile.TemporaryDirectory() as ckpt_root:
        results["kill"] = faults(ckpt_root, "kill", kills, bound, args.peers, args.quick) if kills else {}
        results["stop"] = faults(ckpt_root, "stop", stops, bound, args.peers, args.quick) if stops else {}
    text = "\n\n".join([stamp(command())] + [table(results[k], t) for k, t in (("kill", "kill -9"), ("stop", "SIGSTOP"))
                                           if results[k]])
    images = docsection.images_of(args)
    if images is not None:
        draw(results, images / "recovery.png")
    docsection.publish(args, "recovery", SECTION, text, glance(results))


if __name__ == "__main__":
    main()
