"""Figures and the markdown tables of the peer comparison, from ``results.json``.

    python benchmarks/peers/plots.py [RESULTS] [--no-draw]
        -> docs/images/peers_{step_time,recovery,allreduce,commit,model_size}.png; markdown tables on stdout
    (the recovery figure also shows the host-added stall from ``host_added.json`` beside RESULTS)
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
IMAGES = REPO / "docs" / "images"


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile (a miss is inf, so a p95 over a miss is a miss)."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def ok(x: float) -> bool:
    return not math.isnan(x)


def step_ratios(per_round: dict[str, list[float]], base: str = "ddp") -> dict[str, list[float]]:
    """name -> per round, its value / DDP's in the same round (rounds where both stepped)."""
    return {name: [a / b for a, b in zip(rounds, per_round[base]) if ok(a) and ok(b)]
            for name, rounds in per_round.items()}


def seconds(t: float, bound: float | None) -> str:
    return f"miss (> {bound:.0f} s)" if math.isinf(t) else f"{t:.2f} s"


def fault_table(rows: dict[str, dict], what: str) -> list[str]:
    lines = [f"| system (3 workers, 3 loopback hosts) | {what} → survivors' next step, p50 | p95 | each repeat | steps lost |",
             "|---|---|---|---|---|"]
    for name, r in rows.items():
        t, b = r["recovery_s"], r.get("bound_s")
        each = ", ".join("miss" if math.isinf(x) else f"{x:.2f}" for x in t)
        lost = ", ".join("–" if n < 0 else str(n) for n in r["steps_lost"])
        lines.append(f"| {name} | {seconds(pct(t, .5), b)} | {seconds(pct(t, .95), b)} | {each} | {lost} |")
    return lines + [""]


ELASTIC_EVERY_STEP = "cloud-elastic, commit every step"


def size_rows(sizes: dict) -> list[tuple[float, float, float, list[float], list[float]]]:
    """Per width, widest last: (state MiB, DDP's median step s, cloud-elastic's, rounds, ratios, CPU ratios)."""
    out = []
    for _, row in sorted(sizes.items(), key=lambda kv: int(kv[0])):
        wall, cpu = row["wall"], row["cpu"]
        med = [statistics.median([x for x in wall[n] if ok(x)] or [math.nan]) for n in ("ddp", ELASTIC_EVERY_STEP)]
        out.append((row["state_bytes"] / 2**20, *med, step_ratios(wall)[ELASTIC_EVERY_STEP],
                    step_ratios(cpu)[ELASTIC_EVERY_STEP]))
    return out


def size_table(sizes: dict, when: str) -> list[str]:
    lines = [f"model_size ({when}):",
             "| MLP hidden width | state (parameters + momentum) | DDP step (median, sliced) | cloud-elastic, commit "
             "every step | / DDP, median of rounds (middle half) | CPU per step / DDP's |", "|---|---|---|---|---|---|"]
    for (hidden, _), (mib, ddp, ce, r, c) in zip(sorted(sizes.items(), key=lambda kv: int(kv[0])), size_rows(sizes)):
        rat = f"{statistics.median(r):.3f}× ({pct(r, .25):.3f}–{pct(r, .75):.3f}, {len(r)} rounds)" if r else "n/a"
        crat = f"{statistics.median(c):.3f}×" if c else "n/a"
        lines.append(f"| {hidden} | {mib:.0f} MiB | {ddp * 1000:.1f} ms | {ce * 1000:.1f} ms | {rat} | {crat} |")
    return lines + [""]


def log2_axes(ax, xlabel: str, ylabel: str, log_y: bool = False, legend_size: int = 7) -> None:
    """Sizes along a log-2 x axis, the labels and the legend."""
    ax.set_xscale("log", base=2)
    if log_y:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=legend_size)


def size_figure(plt, sizes: dict) -> None:
    """Step time against model size: cloud-elastic / DDP per round (median, middle half), and both steps."""
    rows = [r for r in size_rows(sizes) if r[3]]
    if not rows:
        return
    mib = [r[0] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    med = [statistics.median(r[3]) for r in rows]
    left.errorbar(mib, med, yerr=[[m - pct(r[3], .25) for m, r in zip(med, rows)],
                                  [pct(r[3], .75) - m for m, r in zip(med, rows)]], marker="o", capsize=4,
                  label="cloud-elastic, commit every step / DDP\n(median of rounds, bars: middle half)")
    left.axhline(1.0, color="gray", linestyle=":")
    left.axhline(1.03, color="tab:green", linestyle="--", label="target 1.03×")
    state = "state: parameters + momentum (MiB, log scale)"
    log2_axes(left, state, "step time / DDP's in the same round")
    right.plot(mib, [r[1] * 1000 for r in rows], marker="s", label="DDP (torchrun)")
    right.plot(mib, [r[2] * 1000 for r in rows], marker="o", label="cloud-elastic, commit every step")
    log2_axes(right, state, "median step, slowest of 2 workers (ms)", log_y=True)
    fig.tight_layout()
    fig.savefig(IMAGES / "peers_model_size.png", dpi=110)
    plt.close(fig)


def tables(results: dict) -> str:
    lines = []
    for key in [k for k in results if k.startswith("step_time") and not k.endswith("_alone")]:
        # One table per step-time run ("step_time", or e.g. "step_time_torchft" from --steps-key).
        wall, cpu = results[key], results.get(key.replace("step_time", "step_cpu"), {})
        ratios, cpu_ratios = step_ratios(wall), step_ratios(cpu) if cpu else {}
        alone = results.get(key + "_alone", {})
        paused = results.get(key.replace("step_time", "paused_cpu_s"), {})
        lines.append(f"{key} ({results.get('when', {}).get(key, '')}):")
        lines += ["| system (2 workers, one host) | median step (sliced) | / DDP, median of rounds (middle half) "
                  "| CPU per step / DDP's | step run alone | CPU used while paused |", "|---|---|---|---|---|---|"]
        for name, rounds in wall.items():
            good = [r for r in rounds if ok(r)]
            r = ratios[name]
            med = f"{statistics.median(good) * 1000:.1f} ms" if good else "n/a"
            rat = (f"{statistics.median(r):.3f}× ({pct(r, .25):.3f}–{pct(r, .75):.3f}, {len(r)} rounds)" if r else "n/a")
            c = cpu_ratios.get(name) or []
            crat = f"{statistics.median(c):.3f}×" if c else "n/a"
            a = alone.get(name)
            al = f"{a * 1000:.1f} ms" if a is not None and ok(a) else "n/a"
            lines.append(f"| {name} | {med} | {rat} | {crat} | {al} | {paused.get(name, float('nan')):.2f} s |")
        lines.append("")
    if "model_size" in results:
        lines += size_table(results["model_size"], results.get("when", {}).get("model_size", ""))
    if "recovery" in results:
        lines += fault_table(results["recovery"], "kill -9")
    if "silent_loss" in results:
        lines += fault_table(results["silent_loss"], "SIGSTOP")
    if "allreduce" in results:
        data = results["allreduce"]
        names = list(next(iter(data.values())))
        lines += ["| size | " + " | ".join(names) + " | hvd.allreduce_ / raw | DistributedOptimizer / raw after the same backward |",
                  "|---" * (len(names) + 3) + "|"]
        for size, row in data.items():
            n = int(size)
            label = f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"
            bw = " | ".join(f"{n / row[k] / 1e6:.3g} MB/s ({row[k] * 1e6:.0f} µs)" for k in names)
            lines.append(f"| {label} | {bw} | {row['raw'] / row['hvd.allreduce_']:.2f} | "
                         f"{row['raw, after the same backward'] / row['DistributedOptimizer']:.2f} |")
        lines.append("")
    if "commit_bandwidth" in results:
        lines += ["| state | copying commit | its bandwidth | memcpy | torch copy_ | copying commit / memcpy | "
                  "DistributedOptimizer step alone | + commit in place (default loop) | + kept commit (snapshot mode) |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for row in results["commit_bandwidth"]:
            b = row["state_bytes"]
            gbs = lambda s: b / s / 1e9  # noqa: E731
            alone = row["step_without_commit_s"]
            kept = row.get("step_kept_commit_s")
            lines.append(f"| {b / 2**20:.0f} MiB | {row['copying_commit_s'] * 1e3:.1f} ms | {gbs(row['copying_commit_s']):.2f} GB/s "
                         f"| {gbs(row['memcpy_s']):.2f} GB/s | {gbs(row['torch_copy_s']):.2f} GB/s "
                         f"| {row['memcpy_s'] / row['copying_commit_s']:.2f} | {alone * 1e3:.1f} ms "
                         f"| {(row['step_with_commit_s'] - alone) * 1e3:+.1f} ms "
                         f"| {'n/a' if kept is None else f'{(kept - alone) * 1e3:+.1f} ms'} |")
    return "\n".join(lines)


def stall_panel(ax, rows: dict) -> None:
    """Host added (``host_added.py``): the running workers' stall, p50 bars and p95 marks, in ms."""
    names = list(rows)
    stalls = [[f["stall_s"] * 1000 for f in rows[n]["figures"]] or [math.inf] for n in names]
    p50, p95 = [pct(v, .5) for v in stalls], [pct(v, .95) for v in stalls]
    cap = 10 * max([v for v in p95 if not math.isinf(v)] or [100])
    y = list(range(len(names)))
    ax.barh(y, [min(v, cap) for v in p50], color=["tab:red" if math.isinf(v) else "tab:blue" for v in p50],
            label="p50 (red: no step within the bound)")
    ax.errorbar([min(v, cap) for v in p95], y, fmt="|", color="black", markersize=14, label="p95")
    for i, n in enumerate(names):
        if math.isinf(p50[i]):  # the bar's length means nothing: say what happened
            ax.text(cap, i, f"newcomer not stepping within {rows[n].get('bound_s', 90):.0f} s ",
                    ha="right", va="center", fontsize=7, color="white")
    ax.axvline(20, color="tab:green", linestyle=":", label="target 20 ms")
    ax.set_yticks(y, [n.replace(" (", "\n(") for n in names], fontsize=7)
    ax.set_xscale("log")
    ax.set_xlabel("host added: running workers' longest step gap − normal step (ms, log scale)")
    ax.invert_yaxis()
    ax.legend(loc="upper right", fontsize=7)


def draw(results: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    IMAGES.mkdir(parents=True, exist_ok=True)
    faults = [(k, t) for k, t in (("recovery", "kill -9"), ("silent_loss", "SIGSTOP"), ("host_added", "host added"))
              if k in results]
    if faults:
        fig, axes = plt.subplots(len(faults), 1, figsize=(9, 2.2 + 0.55 * sum(len(results[k]) for k, _ in faults)))
        for ax, (key, title) in zip([axes] if len(faults) == 1 else axes, faults):
            names = list(results[key])
            if key == "host_added":
                stall_panel(ax, results[key])
                continue
            bound = max(r.get("bound_s", 300) for r in results[key].values())
            p50 = [pct(results[key][n]["recovery_s"], .5) for n in names]
            p95 = [pct(results[key][n]["recovery_s"], .95) for n in names]
            y = list(range(len(names)))
            ax.barh(y, [min(v, bound) for v in p50], color=["tab:red" if math.isinf(v) else "tab:blue" for v in p50],
                    label="p50 (red: no step within the bound)")
            ax.errorbar([min(v, bound) for v in p95], y, fmt="|", color="black", markersize=14, label="p95")
            ax.set_yticks(y, [n.replace(" (", "\n(") for n in names], fontsize=7)
            ax.set_xscale("log")
            ax.set_xlabel(f"{title} of one worker → survivors' next completed step (s, log scale; bound {bound:.0f} s)")
            ax.invert_yaxis()
            ax.legend(loc="lower right", fontsize=7)
        fig.tight_layout()
        fig.savefig(IMAGES / "peers_recovery.png", dpi=110)
        plt.close(fig)
    if "step_time" in results:
        ratios = {n: r for n, r in step_ratios(results["step_time"]).items() if len(r) >= 3}
        for key in [k for k in results if k.startswith("step_time_") and not k.endswith("_alone")]:
            # A later run of some variants (--steps-key): its rows, with their own DDP as the base.
            for n, r in step_ratios(results[key]).items():
                if n != "ddp" and len(r) >= 3:
                    ratios[f"{n} ({key.removeprefix('step_time_')} run)"] = r
        names = [n for n in ratios if n != "ddp"]
        fig, ax = plt.subplots(figsize=(9, 1.2 + 0.3 * len(names)))
        ax.boxplot([ratios[n] or [float("nan")] for n in names], orientation="horizontal")
        ax.set_yticks(range(1, len(names) + 1), names, fontsize=8)
        ax.axvline(1.0, color="gray", linestyle=":")
        ax.set_xlabel("step time / plain DDP's in the same round (2 workers; a named run: its own model)")
        ax.invert_yaxis()
        fig.tight_layout()
        fig.savefig(IMAGES / "peers_step_time.png", dpi=110)
        plt.close(fig)
    if "model_size" in results:
        size_figure(plt, results["model_size"])
    if "allreduce" in results:
        data = results["allreduce"]
        sizes = [int(s) for s in data]
        fig, ax = plt.subplots(figsize=(8, 4))
        for name in next(iter(data.values())):
            ax.plot(sizes, [s / data[str(s)][name] / 1e6 for s in sizes], marker="o", markersize=3, label=name)
        log2_axes(ax, "bytes per allreduce (2 workers, one host, Gloo)", "MB/s (bytes / median time)", log_y=True)
        fig.tight_layout()
        fig.savefig(IMAGES / "peers_allreduce.png", dpi=110)
        plt.close(fig)
    if "commit_bandwidth" in results:
        rows = results["commit_bandwidth"]
        sizes = [r["state_bytes"] / 2**20 for r in rows]
        fig, ax = plt.subplots(figsize=(8, 4))
        ax.plot(sizes, [r["state_bytes"] / r["copying_commit_s"] / 1e9 for r in rows], marker="o", label="copying commit")
        ax.plot(sizes, [r["state_bytes"] / r["memcpy_s"] / 1e9 for r in rows], marker="s", linestyle="--", label="memcpy")
        ax.plot(sizes, [r["state_bytes"] / r["torch_copy_s"] / 1e9 for r in rows], marker="^", linestyle=":", label="torch copy_")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("state (parameters + momentum), MiB")
        ax.set_ylabel("GB/s of state copied")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(IMAGES / "peers_commit.png", dpi=110)
        plt.close(fig)


if __name__ == "__main__":
    # plots.py [RESULTS] [--no-draw]: --no-draw prints the tables only (a smoke run's, say).
    names = [a for a in sys.argv[1:] if not a.startswith("--")]
    path = Path(names[0]) if names else HERE / "results.json"
    results = json.loads(path.read_text())
    host_added = HERE / "host_added.json"  # host_added.py keeps its own file
    if path == HERE / "results.json" and host_added.exists():
        results["host_added"] = json.loads(host_added.read_text()).get("host_added", {})
    if "--no-draw" not in sys.argv:
        draw(results)
    print(tables(results))
