"""What a sharded checkpoint costs the steps: written in the background (the default) or synchronously.

    .venv/bin/python benchmarks/sharded_checkpoint.py [--repeats 2] [--steps 20] [--interval 12] [--quick]

``sharded_worker.py``'s model (2048 x 22 blocks: 1.1 GB of parameters and AdamW state a
host) on two loopback hosts of two workers (``hvd.shard``), a commit every step, three jobs
a repeat, one after another: no ``--checkpoint-dir``; ``--checkpoint-dir`` (a local folder)
with ``--checkpoint-interval 12`` written in the background; the same with
``CLOUD_ELASTIC_SHARDED_CHECKPOINT_WRITES=sync``. Per job, rank 0's mean interval between
consecutive steps over ``--steps`` steps (the first step left out), and the checkpoints the
driver logged as saved; the *cost of a checkpoint* is (mean step − mean step of the job
without checkpoints, same repeat) × steps / checkpoints. On this machine the background
writer shares the two cores with the four workers, so its CPU time is taken from training;
a host with cores to spare pays only for the copy. Prints a Markdown table and writes it
into docs/benchmarks.md (``docsection``: section ``sharded-checkpoint``).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import docsection
from common import PY, REPO, Procs, command, stamp

WORKER = str(REPO / "benchmarks" / "sharded_worker.py")
SECTION = "Sharded checkpoints: written in the background vs synchronously"
VARIANTS = {"no checkpoints": None, "background (the default)": "background", "synchronous": "sync"}


def one_job(directory: Path, writes: str | None, steps: int, interval: float, model: list[str]) -> tuple[float, int]:
    """Rank 0's mean step over ``steps`` steps after the first, and the checkpoints saved meanwhile."""
    ckpt = ["--checkpoint-dir", str(directory / "ckpt"), "--checkpoint-interval", str(interval)] if writes else []
    cmd = [PY, "-m", "cloud_elastic.cli", "run", "--whole-hosts", "--slots-per-host", "2", "-np", "4",
           "-H", "127.0.0.1:2,127.0.0.2:2", "--heartbeat-timeout", "120", *ckpt,
           PY, WORKER, "--steps", "0", "--step-log", *model]
    job = Procs([cmd], {"CLOUD_ELASTIC_SHARDED_CHECKPOINT_WRITES": writes} if writes else {})
    try:
        first = job.wait(lambda: job.logs[0]["pid"] if job.logs else None, 600, "the first step")
        job.wait(lambda: sum(1 for e in job.logs if e["pid"] == first) >= steps + 1, 1200, f"{steps + 1} steps")
        with job.cond:
            times = [e["t"] for e in job.logs if e["pid"] == first][: steps + 1]
            saved = sum(1 for line in job.lines if "checkpoint of step" in line and " saved by " in line)
    finally:
        job.stop()
    return (times[-1] - times[0]) / steps, saved


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=0, help="default 2; 1 with --quick")
    ap.add_argument("--steps", type=int, default=0, help="steps timed per job (default 20; 6 with --quick)")
    ap.add_argument("--interval", type=float, default=12.0, help="--checkpoint-interval, seconds")
    ap.add_argument("--width", type=int, default=0, help="block width (default 2048; 512 with --quick)")
    ap.add_argument("--layers", type=int, default=22)
    docsection.add_arguments(ap)
    args = ap.parse_args()
    repeats, steps = args.repeats or (1 if args.quick else 2), args.steps or (6 if args.quick else 20)
    width = args.width or (512 if args.quick else 2048)
    model = ["--width", str(width), "--layers", str(args.layers)]
    rows: dict[str, list[tuple[float, int, float]]] = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory() as root:
        for i in range(repeats):
            base = None
            for name, writes in VARIANTS.items():
                mean, saved = one_job(Path(tempfile.mkdtemp(dir=root)), writes, steps, args.interval, model)
                base = mean if writes is None else base
                cost = (mean - base) * steps / saved if writes and saved else float("nan")
                rows[name].append((mean, saved, cost))
                print(f"{name}: repeat {i + 1}: mean step {mean:.3f} s, {saved} checkpoint(s), "
                      f"{cost:.2f} s a checkpoint", flush=True)
    params = args.layers * (width * width + 3 * width) + width + 1
    lines = [f"{args.layers} blocks of width {width}: {params * 12 / 1e9:.2f} GB of parameters and AdamW state a "
             f"host, written by host 0's two workers; 2 hosts x 2 workers, a commit every step, "
             f"`--checkpoint-interval {args.interval:g}`, {steps} steps a job.", "",
             "| writes | mean step, each repeat | checkpoints saved | cost of a checkpoint, each repeat |",
             "|---|---|---|---|"]
    for name, got in rows.items():
        costs = " / ".join("–" if c != c else f"{c:.2f} s" for _m, _s, c in got)
        lines.append(f"| {name} | {' / '.join(f'{m:.2f} s' for m, _s, _c in got)} | "
                     f"{' / '.join(str(s) for _m, s, _c in got)} | {costs} |")
    medians = {n: statistics.median(c for _m, _s, c in got) for n, got in rows.items() if VARIANTS[n]}
    print("median cost of a checkpoint: " + ", ".join(f"{n} {c:.2f} s" for n, c in medians.items()), flush=True)
    docsection.publish(args, "sharded-checkpoint", SECTION, f"{stamp(command())} " + "\n".join(lines))


if __name__ == "__main__":
    main()
