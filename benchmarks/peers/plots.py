"""Figures and the markdown tables of the peer comparison, from ``results.json``.

    python benchmarks/peers/plots.py     -> docs/images/peers_recovery.png, peers_step_time.png; tables on stdout
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
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def step_ratios(step_time: dict[str, list[float]], base: str = "ddp") -> dict[str, list[float]]:
    """name -> per round, its step time / DDP's in the same round (rounds where both stepped)."""
    out = {}
    for name, rounds in step_time.items():
        out[name] = [a / b for a, b in zip(rounds, step_time[base]) if not math.isnan(a) and not math.isnan(b)]
    return out


def tables(results: dict) -> str:
    lines = []
    if "step_time" in results:
        ratios = step_ratios(results["step_time"])
        lines += ["| system (2 workers, one host) | median step | / DDP, median of rounds (range) |", "|---|---|---|"]
        for name, rounds in results["step_time"].items():
            ok = [r for r in rounds if not math.isnan(r)]
            r = ratios[name]
            med = f"{statistics.median(ok) * 1000:.1f} ms" if ok else "n/a"
            rat = f"{statistics.median(r):.3f}× ({min(r):.3f}–{max(r):.3f}, {len(r)} rounds)" if r else "n/a"
            lines.append(f"| {name} | {med} | {rat} |")
        lines.append("")
    if "recovery" in results:
        lines += ["| system (3 workers, 3 loopback hosts) | kill -9 → next step, p50 | p95 | max | steps lost (each kill) |",
                  "|---|---|---|---|---|"]
        for name, r in results["recovery"].items():
            t = r["recovery_s"]
            lines.append(f"| {name} | {pct(t, .5):.2f} s | {pct(t, .95):.2f} s | {max(t):.2f} s | "
                         f"{', '.join(map(str, r['steps_lost']))} |")
    return "\n".join(lines)


def draw(results: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    IMAGES.mkdir(parents=True, exist_ok=True)
    if "recovery" in results:
        names = list(results["recovery"])
        p50 = [pct(results["recovery"][n]["recovery_s"], .5) for n in names]
        p95 = [pct(results["recovery"][n]["recovery_s"], .95) for n in names]
        fig, ax = plt.subplots(figsize=(9, 3.8))
        y = range(len(names))
        ax.barh(y, p50, color="tab:blue", label="p50")
        ax.errorbar(p95, y, fmt="|", color="black", markersize=14, label="p95")
        ax.set_yticks(list(y), [n.replace(" (", "\n(") for n in names], fontsize=8)
        ax.set_xscale("log")
        ax.set_xlabel("kill -9 of one worker → survivors' next completed step (s, log scale)")
        ax.invert_yaxis()
        ax.legend(loc="lower right")
        fig.tight_layout()
        fig.savefig(IMAGES / "peers_recovery.png", dpi=110)
    if "step_time" in results:
        ratios = step_ratios(results["step_time"])
        names = list(ratios)
        fig, ax = plt.subplots(figsize=(9, 3.5))
        ax.boxplot([ratios[n] or [float("nan")] for n in names], orientation="horizontal")
        ax.set_yticks(range(1, len(names) + 1), names, fontsize=8)
        ax.axvline(1.0, color="gray", linestyle=":")
        ax.set_xlabel("step time / plain DDP's in the same round (2 workers, 3.4 M-parameter MLP)")
        ax.invert_yaxis()
        fig.tight_layout()
        fig.savefig(IMAGES / "peers_step_time.png", dpi=110)


if __name__ == "__main__":
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "results.json"
    results = json.loads(path.read_text())
    draw(results)
    print(tables(results))
