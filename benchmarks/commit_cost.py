"""What committing every step costs, per optimizer, next to plain DDP: step time and peak memory.

    .venv/bin/python benchmarks/commit_cost.py [--quick] [--only blocks:adamw,...] [--steps N] [--slice S]

For each (model, optimizer) case, four jobs run side by side in round-robin
slices (``common.interleaved_step_times``: SIGSTOP/SIGCONT, ratios per round,
median over rounds): cloud-elastic committing every step (the default: commits
kept in place, see ``worker/ledger.py``), the same with
``CLOUD_ELASTIC_COMMIT_MODE=snapshot`` (every commit kept whole: what a loop
with a collective between ``step()`` and ``commit()`` pays), cloud-elastic
never committing, and the same model under torchrun + DDP.
Memory is the peak RSS (``VmHWM``) of each worker process, summed over the
two workers, against DDP's. The worker script is ``commit_cost_worker.py``.
Prints a Markdown table and writes it into docs/benchmarks.md (``docsection``:
section ``commit-cost`` and its glance rows); ``--quick`` measures one case.
"""

from __future__ import annotations

import argparse
import statistics
import sys

import docsection
from common import PY, REPO, command, interleaved_step_times, median_and_middle_half, round_ratios, span, stamp, where

WORKER = str(REPO / "benchmarks" / "commit_cost_worker.py")
ELASTIC = [PY, "-m", "cloud_elastic.cli", "run", "-np", "2", "-H", "127.0.0.1:2", "--heartbeat-timeout", "60", PY, WORKER]
DDP = [PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", WORKER, "--ddp"]
#: Every optimizer on issue 13's model (blocks) and on the MLP of the peers' workload (mlp); AdamW with 1,202 tensors.
OPTIMIZER_NAMES = ["adamw", "adam", "sgd", "sgd-momentum", "adagrad", "rmsprop", "adamw-foreach", "adamw-fused"]
CASES = [f"{model}:{name}" for model in ("blocks", "mlp") for name in OPTIMIZER_NAMES] + ["many:adamw"]
QUICK_CASES = ["blocks:adamw"]
SECTION = "Commit cost per optimizer"
STEP_TARGET, RSS_TARGET = 1.03, 1.05
GLANCE_STEP = "Step time, commit every step ≤ 1.03× DDP (every optimizer)"
GLANCE_RSS = "Peak memory, commit every step ≤ 1.05× DDP's"


def measure(case: str, steps: int, warmup: int, slice_s: float) -> dict:
    model, optimizer = case.split(":")
    common = ["--model", model, "--optimizer", optimizer, "--steps", str(steps)]
    variants = {
        "elastic": (ELASTIC + common + ["--commit-every", "1"], {}),
        # The same with every commit kept whole (a loop whose windows hold a collective gets this).
        "kept": (ELASTIC + common + ["--commit-every", "1"], {"CLOUD_ELASTIC_COMMIT_MODE": "snapshot"}),
        "no_commit": (ELASTIC + common + ["--commit-every", str(10**9)], {}),
        "ddp": (DDP + common, {"OMP_NUM_THREADS": "1"}),
    }
    rows: dict[str, list[dict]] = {}
    per_round = interleaved_step_times(variants, slice_s=slice_s, warmup=warmup, rows_out=rows)
    ratios = {n: round_ratios(per_round, n) for n in ("elastic", "kept", "no_commit")}
    # CPU seconds per step: a cross-check that CPU taken by other jobs on the machine does not reach.
    cpu = round_ratios(per_round, "elastic", which=1)
    rss = {n: sum(r["peak_rss"] for r in rows[n]) for n in rows}
    ddp_ms = statistics.median(w for w, _ in per_round["ddp"] if w == w) * 1e3
    return {"case": case, "ratios": ratios, "cpu": cpu, "rss": rss, "ddp_ms": ddp_ms}


def table(results: list[dict]) -> str:
    lines = ["| model : optimizer | step time, commit every step / DDP (middle half) | its CPU per step / DDP's | "
             "peak RSS / DDP's | kept commits (snapshot mode) / DDP: step, peak RSS | never committing / DDP | DDP step |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        e, c, n = r["ratios"]["elastic"], r["ratios"]["kept"], r["ratios"]["no_commit"]
        rss, ddp_rss = r["rss"], r["rss"]["ddp"]
        lines.append(f"| {r['case'].replace(':', ' : ')} | **{median_and_middle_half(e)}** | "
                     f"{statistics.median(r['cpu']) if r.get('cpu') else float('nan'):.3f}× "
                     f"| **{rss['elastic'] / ddp_rss:.3f}×** ({rss['elastic'] / 2**20:.0f} / "
                     f"{ddp_rss / 2**20:.0f} MiB) | {statistics.median(c):.3f}×, {rss['kept'] / ddp_rss:.3f}× | "
                     f"{statistics.median(n):.3f}× | {r['ddp_ms']:.1f} ms |")
    return "\n".join(lines)


def glance(results: list[dict], quick: bool) -> list[list[str]]:
    steps = {r["case"]: statistics.median(r["ratios"]["elastic"]) for r in results}
    rss = {r["case"]: r["rss"]["elastic"] / r["rss"]["ddp"] for r in results}
    of = f"{len(results)} case(s){', quick run' if quick else ''}"
    over = [f"{case} {ratio:.3f}×" for case, ratio in steps.items() if ratio > STEP_TARGET]
    return [
        [GLANCE_STEP, f"{span(list(steps.values()))}× ({of})"
         + (f"; above: {', '.join(over)}" if over else ""),
         f"{max(steps.values()) / STEP_TARGET:.2f}", where(SECTION), docsection.verdict(not over)],
        [GLANCE_RSS, f"{span(list(rss.values()))}× ({of})", f"{max(rss.values()) / RSS_TARGET:.2f}",
         where(SECTION), docsection.verdict(max(rss.values()) <= RSS_TARGET)],
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="comma-separated model:optimizer cases")
    ap.add_argument("--slice", type=float, default=1.5, help="seconds each job runs per round")
    ap.add_argument("--steps", type=int, default=0, help="steps per job (default 300, 80 with --quick)")
    docsection.add_arguments(ap)
    args = ap.parse_args()
    steps, warmup = (80, 20) if args.quick else (300, 50)
    if args.steps:
        steps, warmup = args.steps, args.steps // 6
    cases = args.only.split(",") if args.only else QUICK_CASES if args.quick else CASES
    results = []
    for case in cases:
        results.append(measure(case, steps, warmup, args.slice))
        print(table(results[-1:]).splitlines()[-1], flush=True)
    text = f"{stamp(command())}\n\n{table(results)}"
    docsection.publish(args, "commit-cost", SECTION, text, glance(results, args.quick))


if __name__ == "__main__":
    main()
