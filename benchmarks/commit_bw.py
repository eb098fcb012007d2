"""Commit time and copy bandwidth against the size of the state, up to 1 GB, next to the machine's
memory-copy bandwidth measured in the same run.

    .venv/bin/python benchmarks/commit_bw.py [--quick] [--max-mb N]

One process (``cloud_elastic.torch`` outside ``cloud-elastic run`` is rank 0 of 1, so no
other worker shares the cores). The state is a model of 4 MiB float32 tensors and SGD
with momentum: state size = parameters + momentum. Per size:

- *copying commit*: ``TorchState.commit()`` with a plain ``torch.optim.SGD``: every
  tensor of the state is copied into the snapshot's reused buffers at commit time;
  the time of ``commit()`` itself.
- *DistributedOptimizer, commit every step*: the path training takes (``step()`` then
  ``commit()``): in place (the default loop's commits keep nothing, see
  ``cloud_elastic/worker/ledger.py``) and kept (``CLOUD_ELASTIC_COMMIT_MODE=snapshot``;
  for SGD the update after a commit writes into the snapshot's spare buffers instead of
  copying, see ``cloud_elastic/worker/optim/zerocopy.py``); the commit's cost is the median of
  (step + commit) minus the median of a step of the same optimizer never committing.
- *memcpy*: libc ``memcpy`` (ctypes.memmove) and ``torch.Tensor.copy_`` of one
  buffer as large as the state, best of the repetitions.

Bandwidth = bytes of state / seconds (a copy reads and writes each byte once).
Prints the table and writes it into docs/benchmarks.md (``docsection``: section
``commit-bandwidth`` and its glance row), and draws ``commit_bandwidth.png``.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import sys
import time

import docsection
from common import REPO, command, save, span, stamp, subplots, where

sys.path.insert(0, str(REPO))
TENSOR = 1 << 20  # float32 elements per parameter tensor: 4 MiB
STATE_MB = [16, 64, 256, 1024]
SECTION = "Commit time and copy bandwidth"
TARGET = 2 / 3
GLANCE = "Commit bandwidth ≥ 2/3 of memcpy"


def memcpy_s(nbytes: int, reps: int) -> tuple[float, float]:
    """Best seconds to copy ``nbytes`` with libc memcpy, and with torch's copy_."""
    import torch

    src = torch.ones(nbytes // 4)
    dst = torch.empty_like(src)
    dst.fill_(0)  # fault the pages in before timing
    libc, torch_ = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        ctypes.memmove(dst.data_ptr(), src.data_ptr(), nbytes)
        libc.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        dst.copy_(src)
        torch_.append(time.perf_counter() - t0)
    return min(libc), min(torch_)


def make(state_mb: int, distributed: bool):
    import torch

    import cloud_elastic.torch as hvd

    count = max(1, state_mb * (1 << 20) // 2 // (TENSOR * 4))
    model = torch.nn.Module()
    model.ps = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(TENSOR)) for _ in range(count)])
    opt = torch.optim.SGD(model.parameters(), lr=1e-6, momentum=0.9)
    if distributed:
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    for p in model.parameters():
        p.grad = torch.full_like(p, 1e-3)
    opt.step()  # momentum buffers exist before the state is taken
    state = hvd.elastic.TorchState(model, opt, step=0)
    return model, opt, state, count * TENSOR * 4 * 2


def _timed_steps(mb: int, reps: int, mode: str, *, commit: bool) -> list[float]:
    """Seconds of ``step()`` (+ ``commit()``) with DistributedOptimizer, each loop a new training loop."""
    from cloud_elastic.worker.context import get_context
    from cloud_elastic.worker.ledger import CommitWindow

    get_context().ledger.window = CommitWindow(mode)  # what this loop does decides how its commits are kept
    model, opt, state, _ = make(mb, distributed=True)  # its warm-up step precedes the state: no window
    times = []
    for i in range(reps + 2):  # the first two steps teach the loop (and allocate what they keep)
        t0 = time.perf_counter()
        opt.step()
        if commit:
            state.commit()
        if i >= 2:
            times.append(time.perf_counter() - t0)
    del model, opt, state
    return times


def table(rows: list[dict]) -> str:
    lines = ["| state | copying commit | its bandwidth | memcpy | torch copy_ | copying commit / memcpy | "
             "DistributedOptimizer step alone | + commit in place (default loop) | + kept commit (snapshot mode) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        b, alone = row["state_bytes"], row["step_without_commit_s"]
        gbs = lambda s: b / s / 1e9  # noqa: E731
        lines.append(f"| {b / 2**20:.0f} MiB | {row['copying_commit_s'] * 1e3:.1f} ms | "
                     f"{gbs(row['copying_commit_s']):.2f} GB/s | {gbs(row['memcpy_s']):.2f} GB/s | "
                     f"{gbs(row['torch_copy_s']):.2f} GB/s | {row['memcpy_s'] / row['copying_commit_s']:.2f} | "
                     f"{alone * 1e3:.1f} ms | {(row['step_with_commit_s'] - alone) * 1e3:+.1f} ms | "
                     f"{(row['step_kept_commit_s'] - alone) * 1e3:+.1f} ms |")
    return "\n".join(lines)


def glance(rows: list[dict]) -> list[list[str]]:
    ratios = [row["memcpy_s"] / row["copying_commit_s"] for row in rows]
    largest = rows[-1]
    extra = (largest["step_with_commit_s"] - largest["step_without_commit_s"]) * 1e3
    met = min(ratios) >= TARGET
    return [[GLANCE, f"the default loop's commit copies nothing ({extra:+.1f} ms a step at "
             f"{largest['state_bytes'] / 2**20:.0f} MiB); a copying commit {span(ratios, 2)} of memcpy",
             f"{min(ratios) / TARGET:.2f}", where(SECTION),
             "met" if met else "met by the default loop; **missed** by a copying commit"]]


def draw(rows: list[dict], path) -> None:
    sizes = [r["state_bytes"] / 2**20 for r in rows]
    fig, ax = subplots(figsize=(8, 4))
    for key, label, style in (("copying_commit_s", "copying commit", "o-"), ("memcpy_s", "memcpy", "s--"),
                              ("torch_copy_s", "torch copy_", "^:")):
        ax.plot(sizes, [r["state_bytes"] / r[key] / 1e9 for r in rows], style, label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("state (parameters + momentum), MiB")
    ax.set_ylabel("GB/s of state copied")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    save(fig, path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-mb", type=int, default=0, help="largest state to measure (MB; 1024, or 64 with --quick)")
    docsection.add_arguments(ap)
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    import cloud_elastic.torch as hvd

    torch.set_num_threads(1)  # as the workers of the other benchmarks: one thread per worker
    hvd.init()
    reps = 3 if args.quick else 7
    rows = []
    limit = args.max_mb or (64 if args.quick else STATE_MB[-1])
    for mb in [m for m in STATE_MB if m <= limit]:
        model, opt, state, nbytes = make(mb, distributed=False)
        state.commit()  # the first commit allocates the snapshot's buffers
        commits = []
        for _ in range(reps):
            opt.step()
            t0 = time.perf_counter()
            state.commit()
            commits.append(time.perf_counter() - t0)
        del model, opt, state

        # The training path, DistributedOptimizer with a commit every step, in place (the default loop's
        # commits: nothing kept, see worker/ledger.py) and kept (CLOUD_ELASTIC_COMMIT_MODE=snapshot: what a
        # loop with collectives between step() and commit() gets), against steps that never commit.
        with_commit = _timed_steps(mb, reps, "auto", commit=True)
        kept = _timed_steps(mb, reps, "snapshot", commit=True)
        without = _timed_steps(mb, reps, "auto", commit=False)

        libc, torch_copy = memcpy_s(nbytes, reps)
        rows.append({"state_bytes": nbytes, "copying_commit_s": statistics.median(commits),
                     "step_with_commit_s": statistics.median(with_commit), "step_kept_commit_s": statistics.median(kept),
                     "step_without_commit_s": statistics.median(without), "memcpy_s": libc, "torch_copy_s": torch_copy})
        print(table(rows).splitlines()[-1], flush=True)
    images = docsection.images_of(args)
    if images is not None:
        draw(rows, images / "commit_bandwidth.png")
    text = (f"{stamp(command())} One process, one thread; copying commit: median of {reps}; memcpy and "
            f"`copy_`: best of {reps}.\n\n{table(rows)}")
    docsection.publish(args, "commit-bandwidth", SECTION, text, glance(rows))


if __name__ == "__main__":
    main()
