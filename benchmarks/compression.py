"""Gradient compression: bytes per step, step time and loss, uncompressed against fp16 and bf16.

    python benchmarks/compression.py [--quick]

Starts one ``cloud-elastic run -np 2 -H 127.0.0.1:2`` job (one OpenMP thread
per worker) whose workers train three copies of ``docs/benchmarks.md``'s
model (``commit_cost_worker.py``'s ``mlp``: 4 hidden layers of width 1024,
3.4 M parameters, batch 64, SGD with momentum), one per compression, side
by side: each step runs the three variants one after another, in an order
that rotates every step, so all three see the same machine. Each variant is
timed around its loop body (batch, forward, backward, ``step()``); the bytes
its gradient allreduces hand to the process group are counted; every variant
sees the same batches from the same initial weights, so their losses compare.
Last, the allreduce alone is timed on a buffer as large as the gradients in
each dtype sent. Prints a Markdown table (``--quick``: 40 steps instead of 300).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import docsection
from common import command, run_two_workers, stamp, where

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # commit_cost_worker (the model)
sys.path.insert(0, str(HERE.parent))  # this checkout's cloud_elastic, for the workers too

MARKER = "COMPRESSION "
VARIANTS = ("none", "fp16", "bf16")


class CountingGroup:
    """Stands in for the round's process group and adds up the bytes handed to each allreduce."""

    def __init__(self, pg: Any) -> None:
        self.pg = pg
        self.bytes = 0

    def allreduce(self, tensors: list[Any], *args: Any) -> Any:
        self.bytes += sum(t.numel() * t.element_size() for t in tensors)
        return self.pg.allreduce(tensors, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.pg, name)


def worker(steps: int) -> None:
    import torch
    import torch.nn.functional as F

    import cloud_elastic.torch as hvd
    from cloud_elastic.worker.context import get_context
    from commit_cost_worker import SHAPES, batch, make_model

    torch.set_num_threads(1)
    hvd.init()
    features, size = SHAPES["mlp"]
    runs = {}
    for name in VARIANTS:
        model = make_model("mlp")  # the same seed: the same initial weights for every variant
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                                       compression=getattr(hvd.Compression, name))
        runs[name] = {"model": model, "opt": opt, "wall": [], "bytes": [], "loss": []}
    counter = CountingGroup(get_context().pg)
    get_context().pg = counter

    @hvd.elastic.run
    def train(state: Any) -> None:
        for step in range(steps):
            x, y = batch(features, size, step, hvd.rank())
            for i in range(len(VARIANTS)):
                run = runs[VARIANTS[(step + i) % len(VARIANTS)]]
                before = counter.bytes
                t0 = time.perf_counter()
                run["opt"].zero_grad()
                loss = F.mse_loss(run["model"](x), y)
                loss.backward()
                run["opt"].step()
                run["wall"].append(time.perf_counter() - t0)
                run["bytes"].append(counter.bytes - before)
                run["loss"].append(float(hvd.allreduce(loss.detach(), name="loss")))

    train(hvd.elastic.ObjectState())
    get_context().pg = counter.pg
    numel = sum(p.numel() for p in runs["none"]["model"].parameters())
    # The collective alone, on a buffer the size of the gradients, in each dtype sent: what the cast saves or costs.
    bare = {}
    for name, dtype in (("none", torch.float32), ("fp16", torch.float16), ("bf16", torch.bfloat16)):
        flat = torch.ones(numel, dtype=dtype)
        times = []
        for _ in range(3 if steps < 100 else 20):
            t0 = time.perf_counter()
            get_context().pg.allreduce([flat]).wait()
            times.append(time.perf_counter() - t0)
        bare[name] = statistics.median(times)
    if hvd.rank() == 0:
        skip = steps // 5  # warm-up
        result = {"steps": steps, "params": numel}
        for name, run in runs.items():
            result[name] = {"median_step_s": statistics.median(run["wall"][skip:]), "bare_allreduce_s": bare[name],
                            "bytes_per_step": statistics.median(run["bytes"]),
                            "first_loss": statistics.mean(run["loss"][:5]), "last_loss": statistics.mean(run["loss"][-5:]),
                            "loss_gap": max(abs(a - b) for a, b in zip(run["loss"], runs["none"]["loss"]))}
        ratios = {name: statistics.median(c / b for c, b in zip(runs[name]["wall"][skip:], runs["none"]["wall"][skip:]))
                  for name in VARIANTS}
        result["ratio"] = ratios
        print(MARKER + json.dumps(result), flush=True)


def table(result: dict[str, Any]) -> str:
    none = result["none"]
    rows = ["| compression | allreduce bytes per step | median step | step / uncompressed (median of per-step ratios) "
            f"| the allreduce alone | loss, first 5 steps → last 5 of {result['steps']} (largest gap to none) |",
            "|---|---|---|---|---|---|"]
    for name in VARIANTS:
        r = result[name]
        rows.append(f"| {name} | {r['bytes_per_step'] / 1e6:.2f} MB ({r['bytes_per_step'] / none['bytes_per_step']:.2f}×) "
                    f"| {r['median_step_s'] * 1e3:.1f} ms | {result['ratio'][name]:.3f}× "
                    f"| {r['bare_allreduce_s'] * 1e3:.1f} ms | {r['first_loss']:.4f} → {r['last_loss']:.4f} ({r['loss_gap']:.1e}) |")
    return "\n".join(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    docsection.add_arguments(p)
    args = p.parse_args()
    steps = 40 if args.quick else 300
    if args.worker:
        worker(steps)
        return
    result = run_two_workers(str(Path(__file__).resolve()), MARKER, args.quick, timeout_s=1800)
    text = (f"{stamp(command())} {result['params'] / 1e6:.2f} M parameters, 2 workers, one loopback host, "
            f"{steps} steps each.\n\n{table(result)}")
    halved = max(result[name]["bytes_per_step"] / result["none"]["bytes_per_step"] for name in VARIANTS if name != "none")
    glance = [["Gradient compression (fp16, bf16) sends ≤ 0.5× the bytes of none, training alike",
               f"{halved:.2f}× the bytes; losses within {max(result[n]['loss_gap'] for n in VARIANTS):.0e}",
               f"{halved / 0.5:.2f}", where("Gradient compression"), docsection.verdict(halved <= 0.5 + 1e-3)]]
    docsection.publish(args, "compression", "Gradient compression", text, glance)


if __name__ == "__main__":
    main()
