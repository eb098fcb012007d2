"""Allreduce bandwidth: ``cloud_elastic.torch.allreduce`` and DistributedOptimizer's gradient path
against raw ``torch.distributed`` on the same group, 1 KB to 64 MB; into results.json.

    python benchmarks/peers/allreduce_bw.py [--quick]      (run.sh runs it under flock /tmp/bench.lock)

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
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from peer_results import load, record, run_two_workers  # this folder is on sys.path when the script runs

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SIZES = [1 << 10, 4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]


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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--out", default=None, help="default: results.json, or results-quick.json with --quick")
    args = ap.parse_args()
    args.out = args.out or str(HERE / ("results-quick.json" if args.quick else "results.json"))
    if args.worker:
        worker(args.quick)
        return
    data = run_two_workers(__file__, "ALLREDUCE ", args.quick, timeout_s=600)
    out = Path(args.out)
    record(out, load(out), "allreduce", data)
    for size, row in data.items():
        print(size, {k: f"{int(size) / v / 1e6:.0f} MB/s" for k, v in row.items()})


if __name__ == "__main__":
    main()
