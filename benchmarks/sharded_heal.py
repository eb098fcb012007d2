"""Healing a new host: the running hosts' stall while it joins, sharded (``hvd.shard``) against replicas.

    .venv/bin/python benchmarks/sharded_heal.py [--repeats 3] [--width 2048] [--layers 22] [--quick]

The same model (``sharded_worker.py``: residual blocks of LayerNorm + Linear(width, width),
AdamW; 2048 x 22 blocks is 92 M parameters, 1.1 GB of parameters and AdamW state) trained
two ways, a fresh job per repeat, the two taking turns:

* **sharded**: ``cloud-elastic run --whole-hosts --slots-per-host 2``, two loopback hosts of
  two workers (``hvd.shard``: each worker holds half of the state), a commit every step;
  a third host is added to the discovery script's answer once both have trained a few
  steps. Its local rank *i* receives shard *i* from the first host's local rank *i*, point
  to point; the second host takes no part.
* **replicas**: the same job without ``hvd.shard``, hosts of one slot (one worker holds the
  whole state, so a host holds the same state as a sharded host); the newcomer gets it by
  the round's broadcast from rank 0, which the running worker of the second host receives too.

Per repeat, from every running worker's step times (a step's time ends with its commit; the
commit at which the new host is admitted counts as the last step at two hosts): the *gap*
between its last step at two hosts and its first at three, which holds the round's change,
the transfer, and the first step with the new host; the *normal step* at two hosts and at
three (medians of the intervals between consecutive steps, the first at each size left
out); and the *stall*, the gap minus the normal step at three hosts: what the admission
added to the step it interrupted. On this machine every host shares the same two cores, so a
step at three hosts is slower than at two for a reason a real cluster does not have; the
step at three is the gap's fair baseline. The stall is also given in normal steps at two
hosts (issue 27's target: ≤ 2). Prints a Markdown table and writes it into docs/benchmarks.md
(``docsection``: section ``sharded-heal`` and its glance row).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import docsection
from common import PY, REPO, JobExited, Miss, Procs, command, stamp, where

WORKER = str(REPO / "benchmarks" / "sharded_worker.py")
HOSTS = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
SECTION = "Healing a new host: sharded (point to point) vs replicas (broadcast)"
GLANCE = "Sharded: a new host heals with the running hosts' stall ≤ 2 normal steps (1 GB of state a host)"
TARGET_STEPS = 2.0
AFTER = 4  # steps at three hosts each running worker makes before the repeat ends
SYSTEMS = {
    "sharded (hvd.shard, 2 slots a host)": (2, []),
    "replicas (1 slot a host)": (1, ["--replica"]),
}


def discovery(directory: Path, slots: int) -> tuple[Path, callable]:
    """A discovery script printing ``hosts.txt``, and a function that sets the hosts it lists."""
    listing, script = directory / "hosts.txt", directory / "discover.sh"
    script.write_text(f"#!/bin/sh\ncat '{listing}'\n")
    script.chmod(0o755)

    def set_hosts(hosts: list[str]) -> None:
        tmp = listing.with_suffix(".tmp")
        tmp.write_text("".join(f"{h}:{slots}\n" for h in hosts))
        tmp.replace(listing)

    set_hosts(HOSTS[:2])
    return script, set_hosts


def one_heal(directory: Path, slots: int, extra: list[str], model: list[str], warm: int, bound_s: float) -> dict:
    script, set_hosts = discovery(directory, slots)
    workers = 2 * slots
    cmd = [PY, "-m", "cloud_elastic.cli", "run", "--slots-per-host", str(slots), "--whole-hosts",
           "-np", str(workers), "--min-np", str(workers), "--max-np", str(3 * slots),
           "--host-discovery-script", str(script), "--heartbeat-timeout", "120",
           PY, WORKER, "--steps", "0", "--step-log", *model, *extra]
    job = Procs([cmd], {})
    try:
        job.wait(lambda: len({e["pid"] for e in job.logs if e["step"] >= warm and e["size"] == 2}) >= workers,
                 bound_s, "the running workers past the warm-up")
        with job.cond:
            before = {e["pid"] for e in job.logs}
            t_add = max(e["t"] for e in job.logs)
        set_hosts(HOSTS)
        try:
            first = job.wait(lambda: min((e["t"] for e in job.logs if e["size"] == 3), default=None),
                             bound_s, "the first step at three hosts")
            job.wait(lambda: all(sum(1 for e in job.logs if e["pid"] == pid and e["size"] == 3) >= AFTER
                                 for pid in before), bound_s, f"{AFTER} steps of the running workers at three hosts")
        except (TimeoutError, JobExited) as exc:
            raise Miss(str(exc).splitlines()[0]) from exc
        with job.cond:
            logs = list(job.logs)
    finally:
        job.stop()
    normal2, normal3, gaps = [], [], []
    for pid in before:
        times = sorted((e["t"], e["size"]) for e in logs if e["pid"] == pid)
        pre, post = [t for t, size in times if size == 2], [t for t, size in times if size == 3]
        normal2.append(statistics.median(b - a for a, b in zip(pre[1:], pre[2:])))
        normal3.append(statistics.median(b - a for a, b in zip(post, post[1:])))
        gaps.append(post[0] - pre[-1])
    n2, n3, gap = statistics.median(normal2), statistics.median(normal3), max(gaps)
    return {"normal_2_s": n2, "normal_3_s": n3, "gap_s": gap, "stall_s": gap - n3, "stall_steps": (gap - n3) / n2,
            "added_to_first_at_3_s": first - t_add}


def held_gb(width: int, layers: int) -> float:
    params = layers * (width * width + 3 * width) + width + 1
    return params * 12 / 1e9  # parameters and AdamW's two moments, fp32


def table(rows: dict[str, list[dict]], misses: dict[str, int], width: int, layers: int) -> str:
    lines = [f"{layers} blocks of width {width}: {held_gb(width, layers):.2f} GB of parameters and AdamW state "
             "a host; two hosts running, a third added.", "",
             "| system | normal step, 2 hosts / 3 hosts | gap, median (max) | stall (gap − normal step at 3), "
             "median (max) | stall in normal steps at 2 hosts, median (max) | repeats |", "|---|---|---|---|---|---|"]
    for name, figures in rows.items():
        if not figures:
            lines.append(f"| {name} | – | miss | miss | miss | 0 of {misses[name]} |")
            continue
        col = lambda k: [f[k] for f in figures]  # noqa: E731
        med = lambda k: statistics.median(col(k))  # noqa: E731
        lines.append(f"| {name} | {med('normal_2_s'):.2f} s / {med('normal_3_s'):.2f} s | {med('gap_s'):.2f} s "
                     f"({max(col('gap_s')):.2f} s) | {med('stall_s'):.2f} s ({max(col('stall_s')):.2f} s) | "
                     f"**{med('stall_steps'):.2f}** ({max(col('stall_steps')):.2f}) | "
                     f"{len(figures)} of {len(figures) + misses[name]} |")
    return "\n".join(lines)


def glance(rows: dict[str, list[dict]], quick: bool) -> list[list[str]]:
    figures = rows[next(iter(SYSTEMS))]
    if not figures:
        return [[GLANCE, "no admission within the bound", "–", where(SECTION), docsection.verdict(False)]]
    worst = max(f["stall_steps"] for f in figures)
    replicas = [f["stall_s"] for f in rows[list(SYSTEMS)[1]]]
    versus = (f"; replicas' broadcast: {statistics.median(replicas):.2f} s" if replicas else "")
    note = " (quick run)" if quick else ""
    return [[GLANCE, f"{worst:.2f} normal steps at most (median stall "
             f"{statistics.median(f['stall_s'] for f in figures):.2f} s{versus}){note}",
             f"{worst / TARGET_STEPS:.2f}", where(SECTION), docsection.verdict(worst <= TARGET_STEPS)]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=0, help="admissions per system (default 3; 1 with --quick)")
    ap.add_argument("--width", type=int, default=0, help="block width (default 2048; 512 with --quick)")
    ap.add_argument("--layers", type=int, default=22)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--bound", type=float, default=300.0, help="seconds each phase of a repeat may take")
    docsection.add_arguments(ap)
    args = ap.parse_args()
    repeats, width = args.repeats or (1 if args.quick else 3), args.width or (512 if args.quick else 2048)
    model = ["--width", str(width), "--layers", str(args.layers), "--batch-size", str(args.batch_size)]
    rows: dict[str, list[dict]] = {name: [] for name in SYSTEMS}
    misses = {name: 0 for name in SYSTEMS}
    with tempfile.TemporaryDirectory() as root:
        for i in range(repeats):
            for name, (slots, extra) in SYSTEMS.items():
                try:
                    fig = one_heal(Path(tempfile.mkdtemp(dir=root)), slots, extra, model, 3, args.bound)
                except Miss as exc:
                    print(f"{name}: repeat {i + 1}: {exc}", flush=True)
                    misses[name] += 1
                    continue
                rows[name].append(fig)
                print(f"{name}: repeat {i + 1}: " + ", ".join(f"{k} {v:.3f}" for k, v in fig.items()), flush=True)
    text = f"{stamp(command())} {table(rows, misses, width, args.layers)}"
    docsection.publish(args, "sharded-heal", SECTION, text, glance(rows, args.quick))


if __name__ == "__main__":
    main()
