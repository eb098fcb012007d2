"""Where an admission's milliseconds go on the running workers: host_added's job, traced.

    .venv/bin/python benchmarks/admission_profile.py [--repeats 3] [--state-mb 0,1000] [--device-ms 0,30]

Runs ``host_added.py``'s cloud-elastic admission (two workers of the small MLP,
a third added; follow mode on, ``CLOUD_ELASTIC_FOLLOW=1``, unless the
environment says otherwise) with ``workload.py --trace``: every worker prints
the spans of the admission path's calls (``admission_trace.py``) and each
step's phases. Per admission and running worker it splits three intervals:

* the *switch*: from the end of the running worker's last step at size 2 (the
  admitting step, whose commit raised the interrupt) to the end of its first
  step at size 3: the rendezvous (in it, the group's adoption), the sync (the
  sync facts' gather, the small parts' broadcast, ``follow.start``, holding the
  synced state), the reset, then the first step's phases (forward and backward,
  the emulated device time, the optimizer step, which waits for the gradients'
  allreduce, and the commit);
* the *window* (follow mode): each commit's ``follow.at_commit`` (the pace
  broadcast, the pieces, the digests) and the steps' phases while the newcomer
  follows;
* the *end*: the step whose commit ends the window (the model buffers, the
  fingerprint, the activation allgather: ``FollowerActivated``), and the gap
  from it to the next step (the second interrupt, its reset and the training
  function's re-entry);

and names the longest gap (host_added's stall) with the spans inside it. It
also prints the newcomer's own path (its shed, sync, first step). Prints a
Markdown summary (medians over the admissions and running workers, ms) and,
with ``--out``, writes every admission's raw spans and steps as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import host_added
from admission_trace import parse as parse_span
from common import Miss, JobExited

SWITCH = ["rendezvous", "form or adopt the group", "sync", "sync facts gather", "small parts: built and broadcast",
          "small parts broadcast", "small parts encoded", "small parts decoded", "tensor broadcast", "follow.start",
          "hold the synced state", "reset"]
PHASES = ["device", "backward", "optimizer step", "commit"]
WINDOW = ["follow.at_commit", "pace broadcast", "pieces sent/received", "piece digest"]
END = ["model buffers", "fingerprint (window end)", "activation allgather", "shapes gathered", "waits for a collective"]


def clipped(spans: list[dict], pid: int, label: str, a: float, b: float) -> float:
    """Seconds of ``label``'s spans of ``pid`` inside ``[a, b]``."""
    return sum(max(0.0, min(b, s["t1"]) - max(a, s["t0"])) for s in spans if s["pid"] == pid and s["l"] == label)


def phases(step: dict) -> dict[str, float]:
    """The step's phases as durations (its ``phase NAME`` entries are their ends, from its start)."""
    out, prev = {}, 0.0
    for name in PHASES:
        end = step.get(f"phase {name}")
        if end is not None:
            out[name], prev = end - prev, end
    return out


def profile(raw: dict[str, Any], steps: list[dict], spans: list[dict]) -> dict[str, Any]:
    """One admission's figures, seconds (see the module docstring)."""
    by_pid: dict[int, list[dict]] = {}
    for e in sorted(steps, key=lambda e: e["t"]):
        by_pid.setdefault(e["pid"], []).append(e)
    out: dict[str, Any] = {"survivors": {}, "newcomer": {}}
    for pid in raw["survivors"]:
        v = by_pid[pid]
        i3 = next(i for i, e in enumerate(v) if e["size"] == 3)
        last2, first3 = v[i3 - 1], v[i3]
        a, b = last2["t"], first3["t"]
        start3 = b - first3["dt"]
        sw = {"gap": b - a, **{k: clipped(spans, pid, k, a, b) for k in SWITCH},
              "before the first step at 3 (all)": start3 - a, **{f"first step: {k}": x for k, x in phases(first3).items()}}
        mine = sorted((s for s in spans if s["pid"] == pid and a <= s["t0"] <= b), key=lambda s: s["t0"])
        rdv = next((s for s in mine if s["l"] == "rendezvous"), None)
        syn = next((s for s in mine if s["l"] == "sync"), None)
        if rdv is not None and syn is not None:
            sw.update({"admitting step's end → rendezvous call": rdv["t0"] - a,
                       "rendezvous end → sync call": syn["t0"] - rdv["t1"],
                       "sync end → first step's start": start3 - syn["t1"]})
        window = [e for e in v[i3:] if e["following"]]
        ends = [i for i, e in enumerate(v) if i >= i3 and not e["following"]]
        wi = {}
        if window:
            w0, w1 = window[0]["t"] - window[0]["dt"], window[-1]["t"]
            commits = [s for s in spans if s["pid"] == pid and s["l"] == "follow.at_commit" and w0 <= s["t0"] <= w1]
            wi = {"steps": len(window), "step (median)": statistics.median(e["dt"] for e in window),
                  "step (max)": max(e["dt"] for e in window),
                  **{f"{k} (median)": statistics.median([s["t1"] - s["t0"] for s in spans if s["pid"] == pid and
                                                         s["l"] == k and w0 <= s["t0"] <= w1] or [0.0])
                     for k in WINDOW},
                  **{f"{k} (max)": max([s["t1"] - s["t0"] for s in spans if s["pid"] == pid and s["l"] == k and
                                        w0 <= s["t0"] <= w1] or [0.0]) for k in WINDOW},
                  "commits with pieces": len(commits),
                  **{f"step phase {k} (median)": statistics.median(phases(e).get(k, 0.0) for e in window)
                     for k in PHASES}}
        end = {}
        if window and ends and ends[0] + 1 < len(v):
            last, nxt = v[ends[0]], v[ends[0] + 1]
            a2 = last["t"] - last["dt"]
            end = {"closing step": last["dt"], **{k: clipped(spans, pid, k, a2, last["t"]) for k in END},
                   "after it: gap to the next step's end": nxt["t"] - last["t"],
                   "after it: reset": clipped(spans, pid, "reset", last["t"], nxt["t"]),
                   "after it: to the next step's start": (nxt["t"] - nxt["dt"]) - last["t"],
                   **{f"after it: next step {k}": x for k, x in phases(nxt).items()}}
        # host_added's stall: the longest gap of this survivor from the host's addition
        active = raw["first_active"]
        pairs = [(p, q) for p, q in zip(v, v[1:]) if q["t"] >= raw["t_add"] and p["t"] <= active + 0.5]
        p, q = max(pairs, key=lambda pq: pq[1]["t"] - pq[0]["t"])
        inside = {}
        for s in spans:
            if s["pid"] == pid:
                x = max(0.0, min(q["t"], s["t1"]) - max(p["t"], s["t0"]))
                if x > 0:
                    inside[s["l"]] = inside.get(s["l"], 0.0) + x
        longest = {"gap": q["t"] - p["t"], "ends after the first step at 3": q["t"] - raw["steps_first3"],
                   "size": q["size"], "following": q["following"], **{f"span {k}": x for k, x in inside.items()},
                   **{f"step {k}": x for k, x in phases(q).items()}}
        out["survivors"][pid] = {"switch": sw, "window": wi, "end": end, "longest": longest}
    nc = raw["newcomer_pid"]
    mine = [s for s in spans if s["pid"] == nc]
    first = by_pid[nc][0]
    out["newcomer"] = {**{k: sum(s["t1"] - s["t0"] for s in mine if s["l"] == k)
                          for k in ["newcomer sheds its own state", *SWITCH[2:]]},
                       **{f"first step: {k}": x for k, x in phases(first).items()}, "first step": first["dt"]}
    return out


def run(mb: float, device_ms: float, bound: float) -> tuple[dict, list[dict], list[dict]]:
    scenario = host_added.CloudElastic(Path(tempfile.mkdtemp()), mb, device_s=device_ms / 1000, trace=True)
    raw = host_added.one_admission(scenario, bound)
    lines = list(scenario.job.lines)
    spans = [s for s in map(parse_span, lines) if s is not None]
    steps = [e for e in scenario.job.logs]
    raw["steps_first3"] = min(e["t"] for e in steps if e["size"] == 3)
    return raw, steps, spans


def summary(results: list[dict[str, Any]]) -> str:
    """Medians over admissions and running workers, per part, ms."""
    rows: dict[tuple[str, str], list[float]] = {}
    for r in results:
        for s in r["survivors"].values():
            for part in ("switch", "window", "end", "longest"):
                for k, x in s[part].items():
                    if isinstance(x, (int, float)) and not isinstance(x, bool):
                        rows.setdefault((part, k), []).append(x)
        for k, x in r["newcomer"].items():
            rows.setdefault(("newcomer", k), []).append(x)
    lines = ["| part | what | median | max | n |", "|---|---|---|---|---|"]
    for (part, k), xs in rows.items():
        count = k in ("steps", "commits with pieces", "size")
        fmt = (lambda x: f"{x:.0f}") if count else (lambda x: f"{x * 1000:.1f} ms")
        lines.append(f"| {part} | {k} | {fmt(statistics.median(xs))} | {fmt(max(xs))} | {len(xs)} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--state-mb", default="0,1000", help="MB more state, comma-separated (0: the small model)")
    p.add_argument("--device-ms", default="0,30", help="emulated device time a step, ms, comma-separated")
    p.add_argument("--bound", type=float, default=120.0)
    p.add_argument("--out", type=Path, default=None, help="write every admission's raw spans and steps here (JSON)")
    args = p.parse_args()
    os.environ.setdefault("CLOUD_ELASTIC_FOLLOW", "1")
    sizes = [float(x) for x in args.state_mb.split(",")]
    devices = [float(x) for x in args.device_ms.split(",")]
    results: dict[str, list[dict]] = {}
    dump = []
    for i in range(args.repeats):
        for mb in sizes:
            for ms in devices:
                key = f"+{mb:g} MB, device {ms:g} ms"
                try:
                    raw, steps, spans = run(mb, ms, args.bound)
                except (Miss, TimeoutError, JobExited) as exc:
                    print(f"{key}: repeat {i + 1}: {str(exc).splitlines()[0]}", flush=True)
                    continue
                fig = profile(raw, steps, spans)
                results.setdefault(key, []).append(fig)
                dump.append({"key": key, "repeat": i + 1, "raw": raw, "profile": fig, "spans": spans,
                             "steps": [e for e in steps if e["t"] >= raw["t_add"] - 3]})
                print(f"{key}: repeat {i + 1}: " + json.dumps(fig, default=str), flush=True)
    for key, figs in results.items():
        print(f"\n### {key} ({len(figs)} admission(s))\n\n{summary(figs)}", flush=True)
    if args.out is not None:
        args.out.write_text(json.dumps(dump, default=str))


if __name__ == "__main__":
    sys.exit(main())
