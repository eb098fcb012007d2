"""Sharded training at host granularity (``hvd.shard``) against plain FSDP2 HSDP: step time and memory.

    .venv/bin/python benchmarks/sharded.py [--quick] [--steps N] [--slice S]

Two loopback hosts of two workers each, the same model (residual blocks of
LayerNorm + Linear, each an FSDP2 unit; AdamW) two ways, side by side in
round-robin slices (``common.interleaved_step_times``: SIGSTOP/SIGCONT, ratios
per round, median over rounds): cloud-elastic with ``hvd.shard`` and a commit
every step (``cloud-elastic run --whole-hosts --slots-per-host 2``), and plain
FSDP2 HSDP on a ``("replicate", "shard")`` mesh of the same shape under
torchrun, no commits. Memory is each worker's peak RSS (``VmHWM``), summed,
against HSDP's, and the bytes of model and optimizer state a worker holds (the
same in both: the same shards). The worker script is ``sharded_worker.py``.
Prints a Markdown table and writes it into docs/benchmarks.md (``docsection``:
section ``sharded`` and its glance rows). Issue 27's targets: step time <= 1.03x
and memory per worker <= 1.05x plain FSDP2. The healing stall of a newcomer
host is not measured here (yet).
"""

from __future__ import annotations

import argparse
import statistics

import docsection
from common import PY, REPO, command, interleaved_step_times, median_and_middle_half, round_ratios, stamp, where

WORKER = str(REPO / "benchmarks" / "sharded_worker.py")
ELASTIC = [PY, "-m", "cloud_elastic.cli", "run", "--whole-hosts", "--slots-per-host", "2", "-np", "4",
           "-H", "127.0.0.1:2,127.0.0.2:2", "--heartbeat-timeout", "60", PY, WORKER]
HSDP = [PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4", WORKER, "--hsdp",
        "--slots-per-host", "2"]
SECTION = "Sharded training (FSDP2 inside a host) vs plain FSDP2 HSDP"
STEP_TARGET, RSS_TARGET = 1.03, 1.05
GLANCE_STEP = "Sharded: step time, commit every step ≤ 1.03× plain FSDP2 HSDP"
GLANCE_RSS = "Sharded: peak memory per worker ≤ 1.05× plain FSDP2 HSDP"


def measure(steps: int, warmup: int, slice_s: float, width: int, layers: int) -> dict:
    common = ["--steps", str(steps), "--width", str(width), "--layers", str(layers)]
    variants = {"elastic": (ELASTIC + common, {}), "hsdp": (HSDP + common, {"OMP_NUM_THREADS": "1"})}
    rows: dict[str, list[dict]] = {}
    per_round = interleaved_step_times(variants, slice_s=slice_s, warmup=warmup, rows_out=rows, workers=4)
    return {
        "ratios": round_ratios(per_round, "elastic", base="hsdp"),
        "cpu": round_ratios(per_round, "elastic", base="hsdp", which=1),
        "rss": {n: sum(r["peak_rss"] for r in rows[n]) for n in rows},
        "held": {n: max(r["held"] for r in rows[n]) for n in rows},
        "hsdp_ms": statistics.median(w for w, _ in per_round["hsdp"] if w == w) * 1e3,
        "params": width * width * layers,
    }


def table(r: dict) -> str:
    rss, held = r["rss"], r["held"]
    return "\n".join([
        "| model | step time, commit every step / HSDP (middle half) | its CPU per step / HSDP's | "
        "peak RSS / HSDP's (4 workers) | state a worker holds (params + AdamW) | HSDP step |",
        "|---|---|---|---|---|---|",
        f"| {r['params'] / 1e6:.1f} M parameters, 2 hosts × 2 slots | **{median_and_middle_half(r['ratios'])}** | "
        f"{statistics.median(r['cpu']):.3f}× | **{rss['elastic'] / rss['hsdp']:.3f}×** "
        f"({rss['elastic'] / 2**20:.0f} / {rss['hsdp'] / 2**20:.0f} MiB) | "
        f"{held['elastic'] / 2**20:.1f} MiB (HSDP: {held['hsdp'] / 2**20:.1f} MiB) | {r['hsdp_ms']:.1f} ms |",
    ])


def glance(r: dict, quick: bool) -> list[list[str]]:
    step = statistics.median(r["ratios"])
    rss = r["rss"]["elastic"] / r["rss"]["hsdp"]
    note = " (quick run)" if quick else ""
    return [
        [GLANCE_STEP, f"{step:.3f}×{note}", f"{step / STEP_TARGET:.2f}", where(SECTION),
         docsection.verdict(step <= STEP_TARGET)],
        [GLANCE_RSS, f"{rss:.3f}×{note}", f"{rss / RSS_TARGET:.2f}", where(SECTION),
         docsection.verdict(rss <= RSS_TARGET)],
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slice", type=float, default=6.0, help="seconds each job runs per round")
    ap.add_argument("--steps", type=int, default=0, help="steps per job (default 300, 60 with --quick)")
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--layers", type=int, default=16)
    docsection.add_arguments(ap)
    args = ap.parse_args()
    steps, warmup = (60, 10) if args.quick else (300, 30)
    if args.steps:
        steps, warmup = args.steps, max(5, args.steps // 10)
    result = measure(steps, warmup, args.slice, args.width, args.layers)
    text = f"{stamp(command())}\n\n{table(result)}"
    docsection.publish(args, "sharded", SECTION, text, glance(result, args.quick))


if __name__ == "__main__":
    main()
