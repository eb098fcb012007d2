"""Kill to full size: ``kill -9`` of one worker of ``-np 3`` to the first step at size 3 again, with and without a spare.

    .venv/bin/python benchmarks/kill_to_full.py [--repeats 5] [--spares 0 1] [--boot-s 20] [--quick]

The job and hosts are the goodput benchmark's (``goodput.py``, ``goodput_worker.py``):
three workers, one per emulated host (loopback addresses), each new worker
process sleeping ``--startup-s`` before it joins (CUDA initialisation, data
loading) and each step ``--device-s`` (device time). With ``--spares N`` the
job starts on 3 + N hosts under ``cloud-elastic run --spares N``.

Per repeat, a fresh job per number of spares (they take turns, so a slow
minute hits each): once three workers step at full size (and, with a spare,
the spare has finished its start-up), the worker of one stepping host is
killed with ``kill -9`` and its host is gone (a worker started there fails at
once, as an ssh to a terminated instance does); a new host, at a new address,
joins the discovery answer ``--boot-s`` after the kill, as a replacement
instance does (in both cases: with a spare it refills the spare). Measured: the
kill to the end of the first step at size 3 that none of the killed host's
workers took part in (``goodput.to_full_size``), and whether the world size
dropped below 3 meanwhile. A repeat with no such step within ``--bound``
seconds is a miss.

Prints the table and writes it into docs/benchmarks.md (``docsection``:
section ``kill-to-full-size``).
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
import time
from pathlib import Path

import docsection
from common import JobExited, command, pct, stamp
from goodput import SIZE, CloudElastic, Trace, TraceEvent, address, has_spares, to_full_size

SECTION = "Kill to full size, with and without a spare"


def one_kill(spares: int, repeat: int, args: argparse.Namespace, worker_args: list[str]) -> dict:
    """One fresh job: kill one stepping worker, bring a new host after the boot; the figures of this repeat."""
    hosts = SIZE + spares
    new = address(hosts)
    trace = Trace(seed=0, events_per_min=0, duration_s=args.bound, boot_s=args.boot_s, lead_s=0.0,
                  initial=tuple(address(i) for i in range(hosts)), events=(TraceEvent(args.boot_s, "back", new),))
    with tempfile.TemporaryDirectory() as tmp:
        system = CloudElastic(trace, Path(tmp), worker_args, spares)
        system.start()
        job = system.job
        try:
            steps = lambda: [r for r in job.logs if "step" in r]  # noqa: E731
            job.wait(lambda: len({r["host"] for r in steps() if r["size"] >= SIZE}) >= SIZE, 300,
                     "three workers stepping at full size")
            # A spare must have finished its start-up (and connected) before the kill, or the figure is its start-up.
            hello = job.wait(lambda: len({r["host"] for r in job.logs if r.get("hello")}) >= hosts and
                             max(r["t"] for r in job.logs if r.get("hello")), 300, "every host's worker started")
            time.sleep(max(3.0, hello + args.startup_s + 3.0 - time.time()))
            with job.cond:
                recent = sorted({r["host"] for r in steps() if r["t"] > time.time() - 2})
            victim = recent[repeat % len(recent)]  # turns among the stepping hosts
            t_kill = time.time()
            system.kill(victim)
            came_back = False
            while True:
                now = time.time()
                if not came_back and now >= t_kill + args.boot_s:
                    system.back(new)
                    came_back = True
                with job.cond:
                    records = steps()
                took = to_full_size(records, t_kill, victim, now)
                if took is not None or now > t_kill + args.bound:
                    break
                if all(p.poll() is not None for p in job.procs):
                    raise JobExited("the job exited:\n" + "".join(job.lines[-30:]))
                time.sleep(0.1)
            smallest = min((r["size"] for r in records if t_kill < r["t"] <= t_kill + (took or args.bound)),
                           default=SIZE)
        finally:
            system.stop()
    return {"kill_to_full_s": math.inf if took is None else took, "smallest_size": smallest, "victim": victim}


def table(rows: dict[int, list[dict]], args: argparse.Namespace) -> str:
    lines = ["| job (`-np 3`) | kill → first step at size 3, p50 / p95 | each (s) | world size meanwhile | repeats |",
             "|---|---|---|---|---|"]
    for spares, runs in rows.items():
        name = (f"cloud-elastic, `--spares {spares}`" if spares else
                f"cloud-elastic, no spare (a new host {args.boot_s:g} s after the kill, start-up {args.startup_s:g} s)")
        if not runs:
            lines.append(f"| {name} | – | – | – | 0 |")
            continue
        t = [r["kill_to_full_s"] for r in runs]
        fmt = lambda x: "miss" if math.isinf(x) else f"{x:.2f}"  # noqa: E731
        low = min(r["smallest_size"] for r in runs)
        meanwhile = f"stayed {SIZE}" if low >= SIZE else f"down to {low}"
        lines.append(f"| {name} | **{fmt(pct(t, .5))} s / {fmt(pct(t, .95))} s** | {', '.join(map(fmt, t))} | "
                     f"{meanwhile} | {len(runs)} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=None, help="kills per number of spares (default 5; 1 with --quick)")
    p.add_argument("--spares", type=int, nargs="+", default=[0, 1], help="cloud-elastic's --spares, a job per N "
                                                                           "(default 0 1)")
    p.add_argument("--boot-s", type=float, default=20.0, help="the new host joins this long after the kill")
    p.add_argument("--startup-s", type=float, default=10.0, help="a new worker process's start-up (slept)")
    p.add_argument("--device-s", type=float, default=0.2, help="device time per step (slept)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--bound", type=float, default=120.0, help="seconds from the kill to a miss")
    docsection.add_arguments(p)
    args = p.parse_args()
    if max(args.spares) > 0 and not has_spares():
        raise SystemExit("this checkout's `cloud-elastic run` has no --spares (issue 41): run with --spares 0")
    repeats = args.repeats or (1 if args.quick else 5)
    worker_args = ["--startup-s", str(args.startup_s), "--device-s", str(args.device_s),
                   "--batch-size", str(args.batch_size)]
    rows: dict[int, list[dict]] = {n: [] for n in args.spares}
    for i in range(repeats):
        for spares in args.spares:
            try:
                r = one_kill(spares, i, args, worker_args)
            except (TimeoutError, JobExited) as exc:
                print(f"{spares} spare(s): repeat {i + 1} failed: {exc}", flush=True)
                r = {"kill_to_full_s": math.inf, "smallest_size": 0, "victim": "?"}
            rows[spares].append(r)
            print(f"{spares} spare(s): repeat {i + 1}: kill of {r['victim']} → full size {r['kill_to_full_s']:.2f} s, "
                  f"smallest size {r['smallest_size']}, load {os.getloadavg()[0]:.1f}", flush=True)
    text = "\n\n".join([
        f"{stamp(command())} Three workers, one per emulated host (goodput's: start-up {args.startup_s:g} s slept, "
        f"{args.device_s:g} s of device time slept per step, batch {args.batch_size}), a fresh job per kill; the "
        f"killed worker's host is gone, a new one joins {args.boot_s:g} s after the kill (with a spare: it refills "
        f"the spare). Full size: the end of the first step at size 3 without the killed host.",
        table(rows, args)])
    docsection.publish(args, "kill-to-full-size", SECTION, text)


if __name__ == "__main__":
    main()
