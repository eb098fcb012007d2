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
same in both: the same shards), at the step-time model's size and at a larger
one (33.6 M parameters: the state is a third of a worker's live memory there,
so a copy of it in the process would show; the first commit window's copy,
written to a file in ``TMPDIR`` when training on CPU, is not in RSS). The
timed size's gradient shards (512 KiB) are all packed for the cross-host
average; the larger size's (8 MiB) are averaged in place, and that size is not
timed. Two figures:

- *live memory*: each job run alone to its end with glibc's
  ``MALLOC_MMAP_THRESHOLD_`` fixed at 64 KiB, so a freed tensor goes back to the
  system and peak RSS is the most memory live at once (as
  ``torch.cuda.max_memory_allocated`` is on a GPU). This is the target's figure.
  Setting glibc's variable also turns off cloud-elastic's own allocator tuning
  (``worker/memory.py``: up to 1 GiB of freed heap kept for the next step);
- *as run*: glibc's and cloud-elastic's defaults (the timed runs' peaks at the
  small size, a run alone at the larger one). It includes what the allocators
  keep freed for reuse and their fragmentation, which moved one job's workers'
  peaks by 10-20% between runs here.

The worker script is ``sharded_worker.py``.
Prints a Markdown table and writes it into docs/benchmarks.md (``docsection``:
section ``sharded`` and its glance rows). Issue 27's targets: step time <= 1.03x
and memory per worker <= 1.05x plain FSDP2. The healing stall of a newcomer
host is ``sharded_heal.py``.
"""

from __future__ import annotations

import argparse
import statistics

import docsection
from common import (PY, REPO, PausableJob, command, interleaved_step_times, median_and_middle_half, round_ratios,
                    stamp, where)

WORKER = str(REPO / "benchmarks" / "sharded_worker.py")
ELASTIC = [PY, "-m", "cloud_elastic.cli", "run", "--whole-hosts", "--slots-per-host", "2", "-np", "4",
           "-H", "127.0.0.1:2,127.0.0.2:2", "--heartbeat-timeout", "60", PY, WORKER]
HSDP = [PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4", WORKER, "--hsdp",
        "--slots-per-host", "2"]
SECTION = "Sharded training (FSDP2 inside a host) vs plain FSDP2 HSDP"
STEP_TARGET, RSS_TARGET = 1.03, 1.05
GLANCE_STEP = "Sharded: step time, commit every step ≤ 1.03× plain FSDP2 HSDP"
GLANCE_RSS = "Sharded: peak memory per worker ≤ 1.05× plain FSDP2 HSDP"
#: Peak RSS then measures live memory (module docstring); the same for both jobs.
MALLOC = {"MALLOC_MMAP_THRESHOLD_": "65536"}
#: The larger model of the memory measurement: 8 blocks of width 2048.
LARGE = (2048, 8)


def variants(steps: int, width: int, layers: int, env: dict[str, str]) -> dict[str, tuple[list[str], dict[str, str]]]:
    common = ["--steps", str(steps), "--width", str(width), "--layers", str(layers)]
    return {"elastic": (ELASTIC + common, dict(env)), "hsdp": (HSDP + common, {"OMP_NUM_THREADS": "1", **env})}


def peak_memory(steps: int, width: int, layers: int, env: dict[str, str]) -> dict:
    """Each job run alone to its end: its workers' peak RSS summed, and the state a worker holds."""
    out: dict = {"rss": {}, "held": {}}
    for name, (cmd, job_env) in variants(steps, width, layers, env).items():
        job = PausableJob(name, cmd, job_env, workers=4)
        job.run_for(900)
        if not job.done():
            job.kill()
            raise SystemExit(f"{name} did not finish its {steps} steps in 900 s")
        rows = job.rows()
        out["rss"][name] = sum(r["peak_rss"] for r in rows)
        out["held"][name] = max(r["held"] for r in rows)
    return out


def measure(steps: int, warmup: int, slice_s: float, width: int, layers: int, memory_steps: int) -> dict:
    rows: dict[str, list[dict]] = {}
    per_round = interleaved_step_times(variants(steps, width, layers, {}), slice_s=slice_s, warmup=warmup,
                                       rows_out=rows, workers=4)
    return {
        "ratios": round_ratios(per_round, "elastic", base="hsdp"),
        "cpu": round_ratios(per_round, "elastic", base="hsdp", which=1),
        "hsdp_ms": statistics.median(w for w, _ in per_round["hsdp"] if w == w) * 1e3,
        "sizes": [
            {"params": width * width * layers, "live": peak_memory(memory_steps, width, layers, MALLOC),
             "as_run": {"rss": {n: sum(r["peak_rss"] for r in rows[n]) for n in rows}}},
            {"params": LARGE[0] ** 2 * LARGE[1], "live": peak_memory(memory_steps, *LARGE, MALLOC),
             "as_run": peak_memory(memory_steps, *LARGE, {})},
        ],
    }


def _ratio(m: dict) -> float:
    return m["rss"]["elastic"] / m["rss"]["hsdp"]


def _rss_cell(m: dict, bold: bool) -> str:
    rss, mark = m["rss"], "**" if bold else ""
    return f"{mark}{_ratio(m):.3f}×{mark} ({rss['elastic'] / 2**20:.0f} / {rss['hsdp'] / 2**20:.0f} MiB)"


def table(r: dict) -> str:
    lines = [
        "| model (2 hosts × 2 slots) | step time, commit every step / HSDP (middle half) | its CPU per step / HSDP's | "
        "peak live memory / HSDP's (4 workers) | peak RSS as run / HSDP's | state a worker holds (params + AdamW) | "
        "HSDP step |",
        "|---|---|---|---|---|---|---|",
    ]
    for i, size in enumerate(r["sizes"]):
        held = size["live"]["held"]
        timed = (f"**{median_and_middle_half(r['ratios'])}** | {statistics.median(r['cpu']):.3f}×" if i == 0
                 else "(memory only) | ")
        hsdp_step = f"{r['hsdp_ms']:.1f} ms" if i == 0 else ""
        lines.append(f"| {size['params'] / 1e6:.1f} M parameters | {timed} | {_rss_cell(size['live'], True)} | "
                     f"{_rss_cell(size['as_run'], False)} | {held['elastic'] / 2**20:.1f} MiB "
                     f"(HSDP: {held['hsdp'] / 2**20:.1f} MiB) | {hsdp_step} |")
    return "\n".join(lines)


def glance(r: dict, quick: bool) -> list[list[str]]:
    step = statistics.median(r["ratios"])
    rss = max(_ratio(size["live"]) for size in r["sizes"])  # the worse of the two sizes
    note = " (quick run)" if quick else ""
    return [
        [GLANCE_STEP, f"{step:.3f}×{note}", f"{step / STEP_TARGET:.2f}", where(SECTION),
         docsection.verdict(step <= STEP_TARGET)],
        [GLANCE_RSS, f"{rss:.3f}× (live memory, the worse of two model sizes){note}", f"{rss / RSS_TARGET:.2f}",
         where(SECTION), docsection.verdict(rss <= RSS_TARGET)],
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
    result = measure(steps, warmup, args.slice, args.width, args.layers, memory_steps=10 if args.quick else 30)
    text = f"{stamp(command())}\n\n{table(result)}"
    docsection.publish(args, "sharded", SECTION, text, glance(result, args.quick))


if __name__ == "__main__":
    main()
