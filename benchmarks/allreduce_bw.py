"""Allreduce bandwidth: ``cloud_elastic.torch.allreduce`` and DistributedOptimizer's gradient path
against raw ``torch.distributed`` on the same group, 1 KB to 64 MB.

    .venv/bin/python benchmarks/allreduce_bw.py [--quick]

Two workers on one host under ``cloud-elastic run -np 2``. In each worker, per size
and repetition, one call of each path in turn (so drifts in the shared machine's
speed hit all of them alike), all summing (no averaging, so no extra division):

- *raw*: ``pg.allreduce([t]).wait()`` on the round's Gloo process group itself
  (``get_context().pg``, the group every cloud-elastic collective uses);
- *hvd.allreduce_*: in place, through the worker's wait (which turns a dead peer into
  ``CollectiveError`` instead of a hang);
- *hvd.allreduce*: the same on a copy (Horovod's out-of-place call);
- *DistributedOptimizer*: a parameter of that size gets its gradient from autograd
  (``torch.autograd.backward(p, g)``), which fires the optimizer's hook and launches
  its bucket's allreduce; then ``synchronize()`` waits for it and hands the gradient
  back. Below 8 MiB the gradient is packed into a bucket (a copy in and a view out);
  from 8 MiB on it is reduced in place. The raw baseline for this row runs the same
  backward, then ``pg.allreduce([p.grad])``.

Bandwidth is bytes / median time per call (algorithm bandwidth, as nccl-tests' algbw).
Prints the table and writes it into docs/benchmarks.md (``docsection``: section
``allreduce`` and its glance row), and draws ``allreduce.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import docsection
from common import PY, REPO, command, run_two_workers, save, span, stamp, subplots, where

SIZES = [1 << 10, 4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
MARKER = "ALLREDUCE "
SECTION = "Allreduce bandwidth"
TARGET = 0.95
GLANCE = "Allreduce through cloud-elastic ≥ 0.95 of raw Gloo's bandwidth"


def worker(quick: bool) -> None:
    import torch

    import cloud_elastic.torch as hvd
    from cloud_elastic.worker.context import get_context

    hvd.init()

    @hvd.elastic.run  # a worker's work happens in its training function (a rollback would rerun it)
    def measure(state: hvd.elastic.ObjectState) -> None:
        _measure(hvd, get_context().pg, quick)

    measure(hvd.elastic.ObjectState(done=False))


def _measure(hvd, pg, quick: bool) -> None:
    import torch

    out = {}
    for size in SIZES:
        n = size // 4
        t = torch.ones(n)
        p = torch.nn.Parameter(torch.zeros(n))
        g = torch.ones(n)
        opt = hvd.DistributedOptimizer(torch.optim.SGD([p], lr=0.0), named_parameters=[("p", p)], op=hvd.Sum)

        def raw() -> None:
            pg.allreduce([t]).wait()

        def inplace() -> None:
            hvd.allreduce_(t, op=hvd.Sum)

        def copy() -> None:
            hvd.allreduce(t, op=hvd.Sum)

        def opt_grad() -> None:
            p.grad = None
            torch.autograd.backward(p, g)
            opt.synchronize()
            opt._ce_clear()  # what step() does after the update; the update itself is not measured

        calls = {"raw": raw, "hvd.allreduce_": inplace, "hvd.allreduce": copy, "DistributedOptimizer": opt_grad}
        reps = 3 if quick else max(7, min(100, (64 << 20) // size // 4))
        times: dict[str, list[float]] = {k: [] for k in calls}
        for i in range(reps + 2):
            for name, fn in calls.items():
                t0 = time.perf_counter()
                fn()
                dt = time.perf_counter() - t0
                if i >= 2:  # warm-up: buffers allocated, buckets built
                    times[name].append(dt)
        # Raw baseline of the optimizer row: the same backward, then the raw allreduce. The optimizer's
        # hook fires on backward too, so it is measured in a copy of the parameter the optimizer does not know.
        q = torch.nn.Parameter(torch.zeros(n))
        base = []
        for i in range(reps + 2):
            t0 = time.perf_counter()
            q.grad = None
            torch.autograd.backward(q, g)
            pg.allreduce([q.grad]).wait()
            dt = time.perf_counter() - t0
            if i >= 2:
                base.append(dt)
        times["raw, after the same backward"] = base
        out[size] = {k: statistics.median(v) for k, v in times.items()}
    if hvd.rank() == 0:
        print("ALLREDUCE " + json.dumps(out), flush=True)


def _label(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def table(data: dict) -> str:
    names = list(next(iter(data.values())))
    lines = ["| size | " + " | ".join(names) + " | hvd.allreduce_ / raw | hvd.allreduce / raw | "
             "DistributedOptimizer / raw after the same backward |", "|---" * (len(names) + 4) + "|"]
    for size, row in data.items():
        n = int(size)
        bw = " | ".join(f"{n / row[k] / 1e6:.3g} MB/s ({row[k] * 1e6:.0f} µs)" for k in names)
        lines.append(f"| {_label(n)} | {bw} | {row['raw'] / row['hvd.allreduce_']:.2f} | "
                     f"{row['raw'] / row['hvd.allreduce']:.2f} | "
                     f"{row['raw, after the same backward'] / row['DistributedOptimizer']:.2f} |")
    return "\n".join(lines)


def glance(data: dict) -> list[list[str]]:
    paths = {"in place": ("hvd.allreduce_", "raw"), "out of place": ("hvd.allreduce", "raw"),
             "optimizer path": ("DistributedOptimizer", "raw, after the same backward")}
    spans = {name: [row[base] / row[path] for row in data.values()] for name, (path, base) in paths.items()}
    worst = min(min(v) for v in spans.values())
    measured = "; ".join(f"{name} {span(v, 2)}" for name, v in spans.items())
    return [[GLANCE, f"{measured} of raw, {_label(int(min(data, key=int)))}–{_label(int(max(data, key=int)))}",
             f"{worst / TARGET:.2f}", where(SECTION), docsection.verdict(worst >= TARGET)]]


def draw(data: dict, path) -> None:
    sizes = [int(s) for s in data]
    fig, ax = subplots(figsize=(8, 4))
    for name in next(iter(data.values())):
        ax.plot(sizes, [s / data[str(s)][name] / 1e6 for s in sizes], marker="o", markersize=3, label=name)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("bytes per allreduce (2 workers, one host, Gloo)")
    ax.set_ylabel("MB/s (bytes / median time)")
    ax.legend(fontsize=7)
    save(fig, path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    docsection.add_arguments(ap)
    args = ap.parse_args()
    if args.worker:
        worker(args.quick)
        return
    data = {str(k): v for k, v in run_two_workers(__file__, MARKER, args.quick, timeout_s=600).items()}
    images = docsection.images_of(args)
    if images is not None:
        draw(data, images / "allreduce.png")
    text = f"{stamp(command())} Two workers under `cloud-elastic run -np 2`, summing.\n\n{table(data)}"
    docsection.publish(args, "allreduce", SECTION, text, glance(data))


if __name__ == "__main__":
    main()
