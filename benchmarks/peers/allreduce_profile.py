"""Where the time of an allreduce goes: each path of allreduce_bw.py split into its parts, per call.

    python benchmarks/peers/allreduce_profile.py [--quick] [--out FILE.json]

Run under ``flock /tmp/bench.lock``. Two workers under ``cloud-elastic run -np 2`` (as
allreduce_bw.py); sizes 1 KiB to 16 MiB; per size and repetition one call of each path
in turn (so drifts in the shared machine's speed hit all of them alike), all summing.
Each path is measured twice: *whole*, the product call alone, timed around it; and
*parts*, the same product code with perf_counter stamps between its steps (wrappers
set on the instances for that one call, then removed). Minor page faults
(``getrusage(...).ru_minflt``) are counted per call in the calling thread and in the
whole process (the rest is Gloo's and the heartbeat's threads).

Paths:

- ``raw``: ``pg.allreduce([t])`` (launch) then ``.wait()``.
- ``allreduce_``: ``hvd.allreduce_(t)``; parts: ``ctx.group`` (abort check + commit
  window), launch, ``ctx.wait`` (the abort-aware wait loop).
- ``allreduce``: ``hvd.allreduce(t)`` (Horovod's out-of-place call, a clone then
  ``allreduce_``); parts: clone, group, launch, wait, then freeing the result.
- ``reused buffer`` (the page-fault control): ``buf.copy_(t)`` into one buffer kept across
  calls, then ``hvd.allreduce_(buf)``: the same bytes copied, no fresh memory.
- ``DistributedOptimizer``: ``backward`` (its hook launches the bucket's allreduce),
  ``synchronize()``, ``_ce_clear()`` as in allreduce_bw.py; parts: accumulate (autograd
  without the hook), hook (Python around the parts below), update_pending,
  ``launch_tensor`` (copy into the bucket + the flag element), launch, then in
  synchronize: swap_update, wait, hand-back (views, flag ``.item()``), the rest.
- ``raw after backward``: the same backward on a parameter the optimizer does not
  know, then the raw allreduce (the optimizer row's baseline).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from peer_results import run_two_workers  # this folder is on sys.path when the script runs

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SIZES = [1 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20]
_THREAD = resource.RUSAGE_THREAD
_SELF = resource.RUSAGE_SELF
_clock = time.perf_counter


def _faults() -> tuple[int, int]:
    return resource.getrusage(_THREAD).ru_minflt, resource.getrusage(_SELF).ru_minflt


class Parts:
    """Named durations (and page faults) of one call."""

    def __init__(self) -> None:
        self.t: dict[str, float] = {}
        self.f: dict[str, int] = {}

    def add(self, name: str, dt: float, faults: int = 0) -> None:
        self.t[name] = self.t.get(name, 0.0) + dt
        self.f[name] = self.f.get(name, 0) + faults

    def timed(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            f0 = resource.getrusage(_THREAD).ru_minflt
            t0 = _clock()
            try:
                return fn(*args, **kwargs)
            finally:
                self.add(name, _clock() - t0, resource.getrusage(_THREAD).ru_minflt - f0)
        return wrapper


@contextmanager
def wrapped(obj: Any, parts: Parts, names: dict[str, str]) -> Iterator[None]:
    """Time ``obj``'s methods (attribute -> part name) for one call, through instance attributes."""
    for attr, label in names.items():
        setattr(obj, attr, parts.timed(label, getattr(obj, attr)))
    try:
        yield
    finally:
        for attr in names:
            delattr(obj, attr)


class _PgProxy:
    """Stands in for ``ctx.pg`` during one profiled call: times the launch of ``allreduce``."""

    def __init__(self, pg: Any, parts: Parts) -> None:
        self._pg, self._parts = pg, parts

    def allreduce(self, *args: Any) -> Any:
        return self._parts.timed("launch", self._pg.allreduce)(*args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pg, name)


@contextmanager
def proxied_pg(ctx: Any, parts: Parts) -> Iterator[None]:
    pg = ctx.pg
    ctx.pg = _PgProxy(pg, parts)
    try:
        yield
    finally:
        ctx.pg = pg


def worker(quick: bool) -> None:
    import cloud_elastic.torch as hvd
    from cloud_elastic.worker.context import get_context

    hvd.init()

    @hvd.elastic.run
    def measure(state: hvd.elastic.ObjectState) -> None:
        _measure(hvd, get_context(), quick)

    measure(hvd.elastic.ObjectState(done=False))


def _paths(hvd: Any, ctx: Any, n: int) -> dict[str, Callable[[Parts | None], None]]:
    """One size's paths; each takes a Parts (profiled) or None (whole call only)."""
    import torch

    from cloud_elastic.worker import optimizer as optmod

    pg = ctx.pg
    t = torch.ones(n)
    buf = torch.empty(n)
    g = torch.ones(n)
    p_whole, p_prof, q = (torch.nn.Parameter(torch.zeros(n)) for _ in range(3))
    opt_whole = hvd.DistributedOptimizer(torch.optim.SGD([p_whole], lr=0.0), named_parameters=[("p", p_whole)], op=hvd.Sum)
    # The hook is registered as a bound method at construction: wrap the class's function first.
    parts_box: list[Parts | None] = [None]
    plain_hook = optmod._DistributedOptimizer._ce_hook

    def hook(self: Any, p: Any) -> None:
        box = parts_box[0]
        return plain_hook(self, p) if box is None else box.timed("hook", plain_hook)(self, p)

    optmod._DistributedOptimizer._ce_hook = hook
    try:
        opt_prof = hvd.DistributedOptimizer(torch.optim.SGD([p_prof], lr=0.0), named_parameters=[("p", p_prof)], op=hvd.Sum)
    finally:
        optmod._DistributedOptimizer._ce_hook = plain_hook
    bucket = opt_prof._ce_buckets[0]

    def raw(parts: Parts | None) -> None:
        if parts is None:
            pg.allreduce([t]).wait()
            return
        work = parts.timed("launch", pg.allreduce)([t])
        parts.timed("wait", work.wait)()

    def inplace(parts: Parts | None) -> None:
        if parts is None:
            hvd.allreduce_(t, op=hvd.Sum)
            return
        with wrapped(ctx, parts, {"group": "group", "wait": "wait"}), proxied_pg(ctx, parts):
            hvd.allreduce_(t, op=hvd.Sum)

    def copy(parts: Parts | None) -> None:
        if parts is None:
            hvd.allreduce(t, op=hvd.Sum)
            return
        # hvd.allreduce is allreduce_(tensor.detach().clone(), ...): the same two steps, stamped apart.
        c = parts.timed("clone", t.detach().clone)()
        with wrapped(ctx, parts, {"group": "group", "wait": "wait"}), proxied_pg(ctx, parts):
            hvd.allreduce_(c, op=hvd.Sum)
        f0 = resource.getrusage(_THREAD).ru_minflt
        t0 = _clock()
        del c
        parts.add("free", _clock() - t0, resource.getrusage(_THREAD).ru_minflt - f0)

    def reused(parts: Parts | None) -> None:
        if parts is None:
            buf.copy_(t)
            hvd.allreduce_(buf, op=hvd.Sum)
            return
        parts.timed("copy into buffer", buf.copy_)(t)
        with wrapped(ctx, parts, {"group": "group", "wait": "wait"}), proxied_pg(ctx, parts):
            hvd.allreduce_(buf, op=hvd.Sum)

    def opt_whole_call(parts: Parts | None) -> None:
        p_whole.grad = None
        torch.autograd.backward(p_whole, g)
        opt_whole.synchronize()
        opt_whole._ce_clear()

    def opt_parts(parts: Parts | None) -> None:
        assert parts is not None
        parts_box[0] = parts
        try:
            p_prof.grad = None
            with wrapped(ctx, parts, {"update_pending": "update_pending", "wait": "wait"}), \
                    wrapped(bucket, parts, {"launch_tensor": "launch_tensor"}), proxied_pg(ctx, parts), \
                    wrapped(opt_prof, parts, {"_ce_swap_update": "swap_update", "_ce_wait_buckets": "wait_buckets"}):
                parts.timed("backward", torch.autograd.backward)(p_prof, g)
                parts.timed("synchronize", opt_prof.synchronize)()
            parts.timed("clear", opt_prof._ce_clear)()
        finally:
            parts_box[0] = None

    def raw_after_backward(parts: Parts | None) -> None:
        q.grad = None
        if parts is None:
            torch.autograd.backward(q, g)
            pg.allreduce([q.grad]).wait()
            return
        parts.timed("backward", torch.autograd.backward)(q, g)
        work = parts.timed("launch", pg.allreduce)([q.grad])
        parts.timed("wait", work.wait)()

    return {"raw": raw, "allreduce_": inplace, "allreduce": copy, "reused buffer": reused,
            "DistributedOptimizer": lambda parts: (opt_whole_call if parts is None else opt_parts)(parts),
            "raw after backward": raw_after_backward}


def _derive(name: str, parts: Parts) -> None:
    """Nested parts: report each outer step net of what is stamped inside it."""
    t = parts.t
    if name == "DistributedOptimizer":
        launches = t.get("launch", 0.0)
        t["hook (own Python)"] = t.get("hook", 0.0) - t.get("update_pending", 0.0) - t.get("launch_tensor", 0.0) - launches
        t["accumulate (autograd)"] = t.get("backward", 0.0) - t.get("hook", 0.0)
        t["hand-back (views, flag .item())"] = t.get("wait_buckets", 0.0) - t.get("wait", 0.0)
        # launch_ready(force=True) (nothing left to launch), the round check, the snapshots' flush (none here).
        t["synchronize (rest)"] = t.get("synchronize", 0.0) - t.get("swap_update", 0.0) - t.get("wait_buckets", 0.0)


def _measure(hvd: Any, ctx: Any, quick: bool) -> None:
    import torch

    out: dict[str, Any] = {"malloc_env": {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")},
                           "torch": torch.__version__, "sizes": {}}
    for size in SIZES:
        n = size // 4
        paths = _paths(hvd, ctx, n)
        reps = 3 if quick else max(15, min(100, (64 << 20) // size // 4))
        rows: dict[str, dict[str, list[float]]] = {}
        for i in range(reps + 3):
            for name, fn in paths.items():
                for mode in ("whole", "parts"):
                    parts = Parts() if mode == "parts" else None
                    ft0, fs0 = _faults()
                    t0 = _clock()
                    fn(parts)
                    dt = _clock() - t0
                    ft1, fs1 = _faults()
                    if i < 3:  # warm-up: buffers allocated, buckets built, malloc's thresholds settled
                        continue
                    row = rows.setdefault(f"{name} [{mode}]", {})
                    row.setdefault("total", []).append(dt)
                    row.setdefault("faults: calling thread", []).append(ft1 - ft0)
                    row.setdefault("faults: other threads", []).append((fs1 - fs0) - (ft1 - ft0))
                    if parts is not None:
                        _derive(name, parts)
                        for k, v in parts.t.items():
                            row.setdefault(k, []).append(v)
                        for k, v in parts.f.items():
                            row.setdefault(f"faults in {k}", []).append(v)
        out["sizes"][size] = {path: {k: {"median": statistics.median(v), "mean": statistics.fmean(v), "max": max(v),
                                                   "nonzero": sum(1 for x in v if x), "n": len(v)} for k, v in row.items()}
                              for path, row in rows.items()}
    if hvd.rank() == 0:
        print("PROFILE " + json.dumps(out), flush=True)


def _fmt_size(size: int) -> str:
    return f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB"


def table(data: dict[str, Any]) -> str:
    """Markdown: per size and path, median total and median parts (µs), page faults."""
    lines = []
    for size, paths in data["sizes"].items():
        lines.append(f"\n#### {_fmt_size(int(size))}\n\n| path | median µs | parts (median µs) | minor faults / call, median (max): calling thread; other threads |\n|---|---|---|---|")
        for path, row in paths.items():
            skip = {"total", "faults: calling thread", "faults: other threads", "hook", "backward", "synchronize",
                    "wait_buckets"}
            parts = ", ".join(f"{k} {row[k]['median'] * 1e6:.0f}" for k in row
                              if k not in skip and not k.startswith("faults"))
            infaults = ", ".join(f"{k[len('faults in '):]} {row[k]['median']:.0f} (max {row[k]['max']:.0f}, "
                                 f"in {row[k]['nonzero']}/{row[k]['n']} calls)" for k in row
                                 if k.startswith("faults in ") and row[k]["max"] > 0)
            faults = (f"{row['faults: calling thread']['median']:.0f} (max {row['faults: calling thread']['max']:.0f}); "
                      f"{row['faults: other threads']['median']:.0f} (max {row['faults: other threads']['max']:.0f})")
            if infaults:
                faults += f" (in {infaults})"
            lines.append(f"| {path} | {row['total']['median'] * 1e6:.0f} | {parts} | {faults} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--out", default=None, help="raw medians as JSON (default: none)")
    ap.add_argument("--show", default=None, help="print the tables of an earlier --out file; measure nothing")
    args = ap.parse_args()
    if args.show:
        print(table(json.loads(Path(args.show).read_text())))
        return
    if args.worker:
        worker(args.quick)
        return
    data = run_two_workers(__file__, "PROFILE ", args.quick, timeout_s=1200)
    if args.out:
        Path(args.out).write_text(json.dumps(data, indent=1))
    print(f"malloc env: {data['malloc_env'] or 'default'}; torch {data['torch']}")
    print(table(data))


if __name__ == "__main__":
    main()
