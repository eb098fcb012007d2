"""What a host's notice watcher costs a training step: the same steps with the AWS IMDS watcher polling and without.

One process trains a small MLP (one OpenMP thread, as workers on a shared host
run) in alternating slices: the watcher polls a fake IMDSv2 service (in a
process of its own, as the real one is off the host's CPU) at its default
interval during one slice and is stopped during the next. Each pair of
adjacent slices gives a ratio of median step times; the result is the median
ratio over the pairs, written to docs/benchmarks.md (section "Notice watcher
cost per step").

    .venv/bin/python benchmarks/watcher_cost.py [--pairs 20] [--slice 2] [--quick] [--doc PATH]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

import docsection
from common import REPO, stamp

sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from cloud_elastic.notices._polling import POLL_INTERVAL_S  # noqa: E402
from cloud_elastic.notices.aws_imds import AWSMetadataWatcher  # noqa: E402

_SERVE = ("import sys, time; sys.path.insert(0, sys.argv[1]);"
          "from tests.emulator.fake_metadata import FakeAWSMetadata\n"
          "with FakeAWSMetadata() as fake:\n"
          "    print(fake.url, flush=True)\n"
          "    time.sleep(3600)\n")


def slice_steps(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, seconds: float) -> list[float]:
    """Train for ``seconds``; the duration of each step after the first."""
    times, end = [], time.perf_counter() + seconds
    while True:
        t = time.perf_counter()
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
        times.append(time.perf_counter() - t)
        if t > end:
            return times[1:]


def measure(pairs: int, slice_s: float) -> tuple[list[float], float, int]:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64, 256)
    server = subprocess.Popen([sys.executable, "-c", _SERVE, str(REPO)], stdout=subprocess.PIPE, text=True)
    try:
        url = server.stdout.readline().strip()
        slice_steps(model, opt, x, 1.0)  # warm-up
        ratios, base_steps = [], []
        for i in range(pairs):
            order = (True, False) if i % 2 == 0 else (False, True)  # alternate which comes first
            medians = {}
            for watching in order:
                watcher = AWSMetadataWatcher(url) if watching else None
                if watcher is not None:
                    watcher.start(lambda _notice: None)
                steps = slice_steps(model, opt, x, slice_s)
                if watcher is not None:
                    watcher.close()
                medians[watching] = statistics.median(steps)
                if not watching:
                    base_steps.append(medians[watching])
            ratios.append(medians[True] / medians[False])
        reads = int(pairs * slice_s / POLL_INTERVAL_S)
        return ratios, statistics.median(base_steps), reads
    finally:
        server.kill()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=None, help="pairs of slices (default 20; 3 with --quick)")
    p.add_argument("--slice", type=float, default=None, help="seconds per slice (default 2; 1 with --quick)")
    docsection.add_arguments(p)
    args = p.parse_args()
    pairs, slice_s = args.pairs or (3 if args.quick else 20), args.slice or (1.0 if args.quick else 2.0)
    ratios, step, cycles = measure(pairs, slice_s)
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    text = (f"{stamp(f'benchmarks/watcher_cost.py --pairs {pairs} --slice {slice_s:g}')} One process, an MLP step "
            f"of {step * 1000:.1f} ms (one thread), in alternating slices with the AWS IMDS watcher polling a fake "
            f"IMDSv2 service every {POLL_INTERVAL_S:g} s (about {cycles} poll cycles in all) and without it. "
            f"Step time with the watcher / without, median of {len(ratios)} pairs: "
            f"**{statistics.median(ratios):.3f}×** (middle half {q[0]:.3f}–{q[2]:.3f}).")
    docsection.publish(args, "watcher-cost", "Notice watcher cost per step", text)


if __name__ == "__main__":
    main()
