"""What committing every step costs, per optimizer, next to plain DDP: step time and peak memory.

    flock /tmp/bench.lock .venv/bin/python benchmarks/commit_cost.py [--quick] [--only blocks:adamw,...]

For each (model, optimizer) case, four jobs run side by side in
round-robin slices, as ``run_benchmarks.py`` does (SIGSTOP/SIGCONT, ratios
per round, median over rounds): cloud-elastic committing every step (the
default: commits kept in place, see ``worker/window.py``), the same with
``CLOUD_ELASTIC_COMMIT_MODE=snapshot`` (every commit kept whole: what a loop
with a collective between ``step()`` and ``commit()`` pays), cloud-elastic
never committing, and the same model under torchrun + DDP.
Memory is the peak RSS (``VmHWM``) of each worker process, summed over the
two workers, against DDP's. The worker script
is ``benchmarks/commit_cost_worker.py``. Prints a Markdown table; with
``--out`` it replaces the "Commit cost per optimizer" section of that file.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_benchmarks import PY, REPO, interleaved_step_times, machine, pct, round_ratios  # noqa: E402

WORKER = str(REPO / "benchmarks" / "commit_cost_worker.py")
ELASTIC = [PY, "-m", "cloud_elastic.cli", "run", "-np", "2", "-H", "127.0.0.1:2", "--heartbeat-timeout", "60", PY, WORKER]
DDP = [PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", WORKER, "--ddp"]
#: Every optimizer on issue 13's model (blocks) and on docs/benchmarks.md's first model (mlp); AdamW with 1,202 tensors.
OPTIMIZER_NAMES = ["adamw", "adam", "sgd", "sgd-momentum", "adagrad", "rmsprop", "adamw-foreach", "adamw-fused"]
CASES = [f"{model}:{name}" for model in ("blocks", "mlp") for name in OPTIMIZER_NAMES] + ["many:adamw"]
SECTION = "## Commit cost per optimizer"
NOTES = """
Models (`benchmarks/commit_cost_worker.py`): *blocks* is issue 13's (40 residual blocks of
Linear 256 + LayerNorm, 162 parameter tensors, 2.6 M parameters, batch 32); *mlp* is the
model of the table above (3.4 M parameters, batch 64); *many* has 1,202 small parameter
tensors (300 blocks of width 32, batch 32), where per-tensor Python work shows. Two
workers on one host, one OpenMP thread each; the four jobs of a row (commit every step,
the same with `CLOUD_ELASTIC_COMMIT_MODE=snapshot`, never committing, DDP under torchrun)
run side by side in round-robin slices as described above, and a row's ratio is the
median over rounds of the per-round ratio. Peak RSS is `VmHWM` summed over both workers.

Reading the rows: "commit every step" is the default loop (forward, backward, `step()`,
`commit()`): from the first commit after the first step on, commits keep nothing of the
parameters and optimizer state, and the update is the optimizer's own, in place, after
every gradient has arrived (`worker/window.py`, docs/architecture.md "In-place
commits"). "kept commits" is what a loop with a collective between `step()` and
`commit()` (or several steps per commit) gets: each commit keeps the parameters and
optimizer state until the next (out of place for SGD, Adam, AdamW, Adagrad and RMSprop,
copied for the others), one more copy of them in memory.
"""


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
        lines.append(f"| {r['case'].replace(':', ' : ')} | **{statistics.median(e):.3f}×** ({pct(e, .25):.3f}–{pct(e, .75):.3f}, "
                     f"{len(e)} rounds) | {statistics.median(r['cpu']) if r.get('cpu') else float('nan'):.3f}× "
                     f"| **{rss['elastic'] / ddp_rss:.3f}×** ({rss['elastic'] / 2**20:.0f} / "
                     f"{ddp_rss / 2**20:.0f} MiB) | {statistics.median(c):.3f}×, {rss['kept'] / ddp_rss:.3f}× | "
                     f"{statistics.median(n):.3f}× | {r['ddp_ms']:.1f} ms |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default="", help="comma-separated model:optimizer cases")
    ap.add_argument("--out", default="", help="Markdown file whose commit-cost section is replaced (created if missing)")
    ap.add_argument("--slice", type=float, default=1.5, help="seconds each job runs per round")
    ap.add_argument("--steps", type=int, default=0, help="steps per job (default 300, 120 with --quick)")
    args = ap.parse_args()
    steps, warmup = (120, 30) if args.quick else (300, 50)
    if args.steps:
        steps, warmup = args.steps, args.steps // 6
    cases = args.only.split(",") if args.only else CASES
    results = []
    for case in cases:
        results.append(measure(case, steps, warmup, args.slice))
        print(table(results[-1:]).splitlines()[-1], flush=True)
    text = (f"{SECTION}\n\nMeasured {datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')} by "
            f"`benchmarks/commit_cost.py{' --quick' if args.quick else ''}` on {machine()}.\n\n{table(results)}\n{NOTES}")
    print(text)
    if args.out:
        path = Path(args.out)
        old = path.read_text() if path.exists() else ""  # a file of its own (benchmarks/peers/run.sh's)
        m = re.search(rf"^{re.escape(SECTION)}\n.*?(?=^## |\Z)", old, flags=re.S | re.M)
        head = old[: m.start()] if m else old.rstrip("\n") + "\n\n" if old else ""
        tail = old[m.end():] if m else ""
        path.write_text(head + text + ("\n" + tail if tail else ""))


if __name__ == "__main__":
    main()
