"""Step time of DistributedOptimizer(AdamW) on the 400-tensor model in one process (standalone).

    .venv/bin/python benchmarks/peers/every10_alone.py

Three loops, three times each, median step time (the first 20 steps of each run dropped):
commit every step (commits kept in place), every 10 steps (commits kept whole, updates out of
place), and every 10 with the out-of-place update used only on the update right after a
commit. A check of one explanation of the AdamW commit-every-10 row of docs/benchmarks.md.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F

import cloud_elastic.torch as hvd
from cloud_elastic.worker.context import get_context
from cloud_elastic.worker.window import CommitWindow


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(200):
        layers += [torch.nn.Linear(128, 128), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(128, 1))


def run(every: int, swap_only_after_commit: bool, steps: int = 200) -> float:
    hvd.init()
    ctx = get_context()
    ctx.window = CommitWindow(ctx.settings.commit_mode)  # each run learns its loop afresh
    m = model()
    opt = hvd.DistributedOptimizer(torch.optim.AdamW(m.parameters(), lr=1e-3))
    if swap_only_after_commit:
        swap = opt._ce_swap_update
        opt._ce_swap_update = lambda: swap() if any(s._snap._pending for s in opt._ce_snapshots) else None
    state = hvd.elastic.TorchState(m, opt, step=0)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(64, 128, generator=g), torch.randn(64, 1, generator=g)
    times = []
    for i in range(steps):
        t = time.perf_counter()
        opt.zero_grad()
        F.mse_loss(m(x), y).backward()
        opt.step()
        if i % every == every - 1:
            state.commit()
        times.append(time.perf_counter() - t)
    return statistics.median(times[20:])


def main() -> None:
    torch.set_num_threads(1)
    loops = {"commit every step": (1, False), "commit every 10": (10, False),
             "commit every 10, out of place only after a commit": (10, True)}
    results: dict[str, list[float]] = {name: [] for name in loops}
    for _ in range(3):
        for name, (every, patched) in loops.items():
            results[name].append(run(every, patched))
    for name, values in results.items():
        print(f"{name}: {statistics.median(values) * 1e3:.1f} ms (runs: "
              + ", ".join(f"{v * 1e3:.1f}" for v in values) + ")")


if __name__ == "__main__":
    main()
